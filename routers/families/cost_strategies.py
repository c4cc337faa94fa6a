"""The cost-predicting routers' switches, each value one small strategy object.

What: every behaviour switch of :class:`~modeswitch.routers.families.cost.CostPredictingRouter`
(``risk_score``, ``limit_risk``, ``risk_calibration``, ``cost_features``, ``quality_rows``)
and of :class:`~modeswitch.routers.families.cost.LightGBMCostRouter` (``cost_regimes``)
names, through a registry here, one strategy: a stateless object that does what that
value means (scores a mode against the threshold, fits an energy or memory head,
recalibrates a risk classifier, picks the cost heads' input columns, the quality heads'
rows, the latency trees' first split). :func:`resolve` looks a value up.

Why: the switches were string comparisons spread through the router's methods, so one
behaviour was scattered over fitting, scoring, explaining and compiling. As a strategy
each is one small unit that can be read and tested alone, and a new value is one class
and one registry entry, not one more branch in every method.

The parameters stay strings: they are the public API (``get_params``/``set_params``,
Optuna's search spaces, study configs, saved configs). The router looks its strategies up
from those strings on use, so a fitted router stores no strategy (nothing new for skops
to trust) and a router saved before these existed loads and decides as it did. Every
strategy is a module-level singleton that never changes after import; what it needs of
the router (its parameters, its model-fitting mechanics) it is handed per call. The
fitted head models (``_RatioRisk``, ``_CalibratedRisk``, ``_Constant``) and the code that
fits them stay in :mod:`~modeswitch.routers.families.cost`, where saved routers name them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import numpy as np
from scipy.special import expit

from modeswitch.dataset.content_features import CONTENT_FEATURES
from modeswitch.dataset.features import CATEGORICAL_FEATURES, feature_columns
from modeswitch.oracle.sweep_quality import PROFILE, RISK, SWEEP
from modeswitch.routers.fitted_state import cut_logit

S = TypeVar("S")


def resolve(registry: Mapping[str, S], param: str, value: Any, owner: str) -> S:
    """The strategy ``registry`` holds for ``value`` (router parameter ``param``'s), else
    the ``ValueError`` naming the value and the known ones (``owner``: the router's class)."""
    if isinstance(value, str) and value in registry:
        return registry[value]
    raise ValueError(f"{owner}: {param}={value!r}; known: " + ", ".join(repr(k) for k in registry))


# --------------------------------------------------------------------- risk_score
class RiskScore:
    """What the router's threshold is compared with, per mode (``risk_score``): how the
    mode's predicted log latency ratio and its risk heads' probabilities become one score,
    the loosest threshold worth certifying, the decision's explanation, and how the
    compiled cost decision encodes the score."""

    #: whether the compiled decision takes the mode's log ratio as one more risk output
    ratio_output = False

    def score(self, ratio: np.ndarray, heads: Sequence[np.ndarray], gates: Sequence[float]) -> np.ndarray:
        """One mode's score per row from its predicted log ratio and its heads'
        probabilities (CONSTRAINTS' order; ``gates``: each head's fixed gate)."""
        raise NotImplementedError

    def loosest_threshold(self, ceiling: float) -> float:
        """The loosest threshold a calibration may certify (``ceiling``: the router's)."""
        raise NotImplementedError

    def usable_threshold(self, threshold: float, ceiling: float) -> float:
        """The threshold the router decides with when set to ``threshold``."""
        return threshold

    def explain(self, ratio: float, risk: float, threshold: float, reference: bool) -> str:
        """Why one row's pick (``reference``: the pick is the reference) was made."""
        raise NotImplementedError

    def compiled_gates(self, gates: Sequence[float], threshold: float) -> tuple[float, ...]:
        """What each risk head's probability is compared with, once, in the compiled
        decision where the head is a constant."""
        raise NotImplementedError

    def logit_shift(self, cut: float, gate: float) -> float:
        """What the compiled decision adds to a head's logit so that the threshold's cut
        (``cut``: its logit) stands for the head's own ``gate``."""
        return 0.0


class ProbabilityScore(RiskScore):
    """``probability``: the mode's largest predicted violation probability, all heads
    under the one threshold. Why: the plain reading of "risk at most the threshold";
    what a certificate then bounds is the rate of broken constraints directly."""

    def score(self, ratio, heads, gates):
        return np.max(heads, axis=0)

    def loosest_threshold(self, ceiling):
        return ceiling

    def explain(self, ratio, risk, threshold, reference):
        if reference:
            return f"no faster mode predicted safe (threshold {threshold:.3g})"
        return (f"predicted {np.exp(ratio):.2f}x the reference's latency, risk "
                f"{risk:.2f} <= {threshold:.3g}")

    def compiled_gates(self, gates, threshold):
        return (threshold,) * len(gates)


class MarginScore(RiskScore):
    """``margin``: the logistic of the mode's predicted log latency ratio (threshold ``t``
    admits modes predicted at most ``t / (1 - t)`` times the reference's latency) where
    every risk head passes its fixed gate, else 1 (never admitted). Why: one threshold
    over every head compares probabilities that mean different things on a new family,
    while what most often breaks a lossless mode's limit is being slower than the
    reference, which the latency head already predicts; the gates are fixed before any
    calibration, so a certified threshold certifies the whole rule."""

    ratio_output = True
    #: the reference's own latency: a looser threshold admits only modes predicted
    #: slower than the reference, which the decision never picks over it
    REFERENCE = 0.5

    def score(self, ratio, heads, gates):
        passes = np.all([h <= g for h, g in zip(heads, gates, strict=True)], axis=0)
        return np.where(passes, expit(ratio), 1.0)

    def loosest_threshold(self, ceiling):
        return self.REFERENCE

    def usable_threshold(self, threshold, ceiling):
        # a mode failing a gate scores 1: no threshold may admit it
        return min(threshold, self.loosest_threshold(ceiling))

    def explain(self, ratio, risk, threshold, reference):
        limit = threshold / (1 - threshold) if 0 < threshold < 1 else 0.0
        if reference:
            return f"no mode predicted at most {limit:.3g}x the reference's latency within its gates"
        return (f"predicted {np.exp(ratio):.2f}x the reference's latency <= {limit:.3g}x, every "
                "risk within its gate")

    def compiled_gates(self, gates, threshold):
        return tuple(gates)

    def logit_shift(self, cut, gate):
        return cut - cut_logit(gate) if np.isfinite(cut) else 0.0


RISK_SCORES: dict[str, RiskScore] = {"probability": ProbabilityScore(), "margin": MarginScore()}


# --------------------------------------------------------------------- limit_risk
class RiskLimit:
    """How an energy or memory head (a limit on a ratio to the reference) is fitted
    (``limit_risk``); the quality heads are always classifiers."""

    def fit(self, router, F, X, col: str, v: np.ndarray, w, unmeasured: np.ndarray):
        """The head's model for one (mode, constraint): ``F`` its input rows, ``col`` the
        table's ratio column, ``v`` the violations, ``w`` the weights, ``unmeasured`` the
        rows the mode was not measured on; None: the classifier every other head has."""
        raise NotImplementedError


class ClassifierLimit(RiskLimit):
    """``classifier``: a classifier on the violation labels, like the quality heads."""

    def fit(self, router, F, X, col, v, w, unmeasured):
        return None


class RatioLimit(RiskLimit):
    """``ratio``: a regressor of the mode's log ratio, its prediction turned into
    P(breaking the limit) by a logistic fitted on predictions for families the regressor
    did not see (``router._fit_ratio_risk``). Why: a limit on a ratio is a threshold on a
    quantity that varies smoothly with the request's size; a regression carries it to a
    new family's sizes, where a classifier's boundary need not hold. A mode unmeasured on
    some row (the regression cannot learn that a missing ratio is a violation), or whose
    ratio model does not fit, keeps the classifier."""

    def fit(self, router, F, X, col, v, w, unmeasured):
        return None if unmeasured.any() else router._fit_ratio_risk(F, X, col, v, w)


RISK_LIMITS: dict[str, RiskLimit] = {"classifier": ClassifierLimit(), "ratio": RatioLimit()}


# --------------------------------------------------------------------- risk_calibration
class RiskCalibration:
    """What becomes of a fitted risk classifier's probabilities (``risk_calibration``)."""

    def calibrate(self, router, clf, F, v: np.ndarray, w, groups):
        """The head's model from classifier ``clf``, fitted on rows ``F`` with violations
        ``v``, weights ``w`` and each row's family ``groups`` (None: no family column)."""
        raise NotImplementedError


class KeepProbabilities(RiskCalibration):
    """``none``: the classifier's own probabilities."""

    def calibrate(self, router, clf, F, v, w, groups):
        return clf


class FamilyHeldOut(RiskCalibration):
    """``family-held-out``: the classifier's logit recalibrated on logits for families it
    did not see (``router._calibrate``). Why: every head is compared with one threshold,
    and a boosted classifier's in-sample probabilities are near 0 or 1 whatever it knows
    about a new family; recalibrated, a probability is what it is worth on a new family.
    With fewer than two families there is nothing to hold out: the classifier stays."""

    def calibrate(self, router, clf, F, v, w, groups):
        if groups is None or len(set(groups)) < 2:
            return clf
        return router._calibrate(clf, F, v, w, groups)


RISK_CALIBRATIONS: dict[str, RiskCalibration] = {"none": KeepProbabilities(),
                                                  "family-held-out": FamilyHeldOut()}


# --------------------------------------------------------------------- cost_features
#: feature set A's raw token counts, each with a log-scale twin in the set
#: (``log_prompt_tokens``, ``log_expected_output_tokens``, and their difference for the
#: ratio), masked from the cost heads under ``cost_features="log-shape"``
RAW_COUNT_FEATURES = ("prompt_tokens", "expected_output_tokens", "output_prompt_ratio")


class CostInputs:
    """Which input columns the latency, energy and memory heads read (``cost_features``):
    the others are set to 0. A constant column is one no LightGBM split and no ridge
    weight reads, so the fitted heads still take the whole row when deciding (and
    compile as they are) but ignore the masked columns. The quality heads read every
    column: content is what tells which output flips.

    ``all``: every column. ``shape``: none of the content columns. Why: a request's cost
    follows its shape (tokens, concurrency, shared prefix); content columns let a latency
    model tell its training families apart, which does not carry to a new family.
    ``log-shape``: ``shape`` without the raw token counts that have log-scale twins
    (:data:`RAW_COUNT_FEATURES`). Why: a linear head extrapolates, and on raw counts a new
    family of unusual lengths lies far outside the training range where on the log
    columns it stays near it; trees split on ranks, so for them it changes nothing."""

    def __init__(self, masked: frozenset[str] = frozenset()):
        self.masked = frozenset(masked)

    def inputs(self, F: np.ndarray, names: Sequence[str]) -> np.ndarray:
        """``F`` (its columns named ``names``) with the masked columns set to 0; ``F``
        itself when none is masked."""
        drop = [i for i, n in enumerate(names) if n in self.masked]
        if not drop:
            return F
        Fc = np.array(F, dtype=float, copy=True)
        Fc[:, drop] = 0.0
        return Fc


COST_INPUTS: dict[str, CostInputs] = {
    "all": CostInputs(),
    "shape": CostInputs(frozenset(CONTENT_FEATURES)),
    "log-shape": CostInputs(frozenset(CONTENT_FEATURES) | frozenset(RAW_COUNT_FEATURES)),
}


# --------------------------------------------------------------------- quality_rows
def _measured(X) -> np.ndarray | None:
    """Which rows' quality was measured (a quality sweep's or the profile's verdict); None
    without the table's ``quality_basis`` column."""
    if "quality_basis" not in X.columns:
        return None
    return X["quality_basis"].isin((SWEEP, PROFILE)).to_numpy()


class QualityRows:
    """Which training rows the quality heads learn from (``quality_rows``)."""

    def rows(self, X, owner: str):
        """The rows of table ``X`` (a slice or a boolean mask); ``owner``: the router's
        class, for errors."""
        raise NotImplementedError


class AllRows(QualityRows):
    """``all``: every row, a verdict the oracle inferred for an unmeasured request too."""

    def rows(self, X, owner):
        return slice(None)


class MeasuredRows(QualityRows):
    """``measured``: only rows whose quality was measured, so the quality head is a
    per-request model of measured outcomes, not of verdicts the oracle inferred."""

    def rows(self, X, owner):
        measured = _measured(X)
        if measured is None:
            raise ValueError(f"{owner}: quality_rows='measured' needs the training "
                             "table's quality_basis column")
        if not measured.any():
            raise ValueError(f"{owner}: quality_rows='measured', but no row's quality "
                             "was measured (build the table with a quality sweep)")
        return measured


class AutoRows(QualityRows):
    """``auto``: ``measured`` where the table's verdicts for unmeasured requests are a
    quality-risk model's (``quality_risk__<mode>`` columns) and some row was measured,
    else ``all``. Why: a model's verdicts are not outcomes, while under the family rule an
    unmeasured request carries its family's measured verdict."""

    def rows(self, X, owner):
        measured = _measured(X)
        inferred = any(c.startswith(f"{RISK}__") for c in X.columns)
        if inferred and measured is not None and measured.any():
            return measured
        return slice(None)


QUALITY_ROWS: dict[str, QualityRows] = {"auto": AutoRows(), "all": AllRows(), "measured": MeasuredRows()}


# --------------------------------------------------------------------- cost_regimes
class CostRegime:
    """The split every tree of a LightGBM latency head (and ratio-risk regressor) takes
    first (``cost_regimes``; LightGBM's forced split), if any."""

    #: (feature, threshold), None for none
    split: tuple[str, float] | None = None

    def forced_split(self, feature_set: str, where: str) -> tuple[int, float] | None:
        """(the split feature's index among feature set ``feature_set``'s numeric columns,
        in their order; threshold), or None for no forced split; ``where``: what an error
        starts with (the router and its parameter)."""
        if self.split is None:
            return None
        feature, threshold = self.split
        numeric = [c for c in feature_columns(feature_set) if c not in CATEGORICAL_FEATURES]
        if feature not in numeric:
            raise ValueError(f"{where} splits on {feature}, which feature set {feature_set} lacks")
        return numeric.index(feature), float(threshold)


class NoRegimes(CostRegime):
    """``none``: the trees choose every split themselves."""


class ForcedSplit(CostRegime):
    """A fixed first split, each side learnt apart. ``concurrency``: a request alone
    against one in company (``concurrent_requests`` at 1.5). Why: the batching modes gain
    nothing alone, whatever the request's size, but a tree that splits on size first
    learns "short prompts batch well" from families whose short prompts all came in
    company, and promises a new family's lone short prompts a speed-up they do not get."""

    def __init__(self, feature: str, threshold: float):
        self.split = (feature, float(threshold))


COST_REGIMES: dict[str, CostRegime] = {"none": NoRegimes(),
                                       "concurrency": ForcedSplit("concurrent_requests", 1.5)}

"""Routers that predict every mode's cost and risk, then pick (``cost_lgbm``, ``cost_linear``).

Why: a classifier can only answer labels it saw. When a held-out family's best
mode never won in training, every classifier misses it. A cost-predicting router
learns, per mode, what the mode costs relative to the reference (the log latency
ratio) and how likely it is to break each constraint (quality, energy, memory),
all from the request's features; it then answers the lowest predicted latency
among modes whose predicted risk is at most the threshold, else the reference. It
can pick a mode for requests whose label it never saw, as long as the mode's cost
was measured (or estimated) on *some* training requests.

``fit(X, y)`` takes the training table's rows as ``X``: besides the features it
reads each mode's ``latency_ms__<mode>`` and ``violates_{quality,energy,memory}__<mode>``
columns (what :mod:`oracle.training_table` writes); ``y`` (the oracle labels) is
not needed. A mode without a latency for a request (unmeasured there) counts as
a risk for every constraint. ``predict`` needs only the features.

Threshold: ``max_risk`` (tuned by Optuna like any hyperparameter). The predicted
risk (or, with ``risk_score="margin"``, the speed-up margin) is the router's risk score: :class:`routers.certified.CertifiedRouter` certifies
the threshold actually used (``threshold_``) on calibration requests held out of the
training rows by Learn then Test, the per-mode models then fitted on the other rows
only.

Decisions: ``route(request)`` goes through the pipeline (milliseconds);
``compile()`` (numeric feature sets: A, C) hands both variants to the C kernel's cost decision
(:meth:`fitted_state` describes it for :mod:`routers.compiler`): the linear one as one matrix of
weights, the LightGBM one as one ensemble of every model's trees under a region
tree, each one C call per decision with the same answers.

Switches: ``risk_score``, ``limit_risk``, ``risk_calibration``, ``cost_features``,
``quality_rows`` and ``cost_regimes`` stay string parameters; each value names a small
strategy in :mod:`~modeswitch.routers.families.cost_strategies`, looked up on use, that
does what the value means.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.special import expit
from sklearn.base import ClassifierMixin
from sklearn.compose import ColumnTransformer
from sklearn.linear_model import LogisticRegression, Ridge
from sklearn.model_selection import GroupKFold, KFold
from sklearn.utils.validation import check_is_fitted

from modeswitch.dataset.features import CATEGORICAL_FEATURES, _shape, feature_columns
from modeswitch.dataset.requests import Request
from modeswitch.engine.modes import reference_mode
from modeswitch.routers.families.base import LearnedRouter, column_prep
from modeswitch.routers.families.cost_strategies import (
    COST_INPUTS,
    COST_REGIMES,
    QUALITY_ROWS,
    RISK_CALIBRATIONS,
    RISK_LIMITS,
    RISK_SCORES,
    CostInputs,
    CostRegime,
    QualityRows,
    RiskCalibration,
    RiskLimit,
    RiskScore,
    resolve,
)
from modeswitch.routers.families.lightgbm_params import LightGBMParameters
from modeswitch.routers.families.logistic_params import LogisticParameters
from modeswitch.routers.families.readers import lightgbm_trees
from modeswitch.routers.fitted_state import (
    CostDecision,
    FittedState,
    InputLayout,
    LinearModel,
    TreeEnsemble,
    cut_logit,
    numeric_layout,
)
from modeswitch.routers.registry import RouterFamily, register_router

CONSTRAINTS = ("quality", "energy", "memory")
#: the constraints that are a limit on a ratio to the reference (``<c>_ratio__<mode>``)
RATIO_LIMITS = ("energy", "memory")
#: fewer training rows than this for a (mode, target): predict the rows' mean instead
MIN_ROWS = 8


#: what the latency, energy and memory heads may read (``cost_features``; each value's
#: columns: :data:`~modeswitch.routers.families.cost_strategies.COST_INPUTS`)
COST_FEATURES = tuple(COST_INPUTS)


class _Constant:
    """A fitted model that predicts one value (a target with one class or few rows)."""

    def __init__(self, value: float):
        self.value = float(value)

    def predict(self, F):
        return np.full(len(F), self.value)


class _RatioRisk:
    """P(a ratio's limit is broken) from a regressor of the log ratio: the logistic
    ``intercept + slope x prediction``, its two numbers fitted on predictions for rows
    the regressor did not see (:meth:`CostPredictingRouter._fit_ratio_risk`)."""

    def __init__(self, regressor, slope: float, intercept: float):
        self.regressor = regressor
        self.slope = float(slope)
        self.intercept = float(intercept)


class _CalibratedRisk:
    """A risk classifier whose logit (its raw score) is recalibrated for families it did
    not see: ``intercept + slope x raw``, the two numbers fitted on raw scores for rows of
    families the classifier was fitted without (:meth:`CostPredictingRouter._calibrate`)."""

    def __init__(self, classifier, slope: float, intercept: float):
        self.classifier = classifier
        self.slope = float(slope)
        self.intercept = float(intercept)


def _held_out_logistic(held: np.ndarray, v: np.ndarray, w) -> tuple[float, float] | None:
    """(slope, intercept) of P(violates) = logistic(intercept + slope x score), fitted on
    scores ``held`` predicted for rows the scoring model did not see (NaN: not predicted);
    None when those rows are of one class or the scores do not rank the violations
    (slope <= 0). Shared by the ratio risk and the recalibrated classifiers."""
    seen = np.isfinite(held)
    if not seen.any() or v[seen].all() or not v[seen].any():
        return None
    # v is boolean with both values here: classes_ is [False, True], the logit is of True
    cal = LogisticRegression(C=1e4, max_iter=2000).fit(held[seen, None], v[seen],
                                                        sample_weight=None if w is None else w[seen])
    slope, intercept = float(cal.coef_[0, 0]), float(cal.intercept_[0])
    return None if slope <= 0 else (slope, intercept)


class CostPredictingRouter(ClassifierMixin, LearnedRouter):
    """Shared machinery; variants define ``_regressor``, ``_classifier`` and their space.

    ``max_risk``: the largest predicted risk a mode may have to be picked.
    ``quality_rows``: the rows the quality-risk models learn from: ``all``; ``measured``,
    only rows whose quality was measured (``quality_basis`` ``measured ...``: a quality
    sweep's or the profile's), so the quality head is a per-request risk model of
    measured outcomes (:mod:`oracle.quality_risk`'s question, asked of the router's own
    features), not of verdicts the oracle inferred for unmeasured requests; ``auto``
    (default): ``measured`` where the table's verdicts for unmeasured requests are a
    quality-risk model's (it has ``quality_risk__<mode>`` columns), else ``all`` (under
    the family rule an unmeasured request carries its family's measured verdict).
    ``limit_risk``: how the energy and memory risks are predicted: ``classifier``, one
    classifier per (mode, constraint) on the violation labels; ``ratio``, a regressor of
    the mode's log energy (memory) ratio to the reference, the same kind as the latency
    head, whose prediction a one-input logistic turns into the probability of breaking
    the limit, fitted on predictions for families the regressor did not see (each
    family's rows predicted by a regressor fitted without it). Why: the limit is a
    threshold on a quantity that varies smoothly with the request's size; a regression
    carries that to a new family's sizes, where a classifier's boundary learnt on other
    families' sizes need not hold, and the logistic's spread is the family-to-family
    error, not the in-sample one. A (mode, constraint) without the ratio column or with
    a request missing it (the mode not measured there), or whose held-out predictions
    do not rank its violations (slope <= 0), keeps the classifier.
    ``risk_calibration``: ``none`` keeps each risk classifier's own probabilities;
    ``family-held-out`` recalibrates each one on predictions for families it did not
    see (its rows' families in three group folds; a one-input logistic on the logit).
    Why: the routers compare every (mode, constraint)'s risk with one threshold, and a
    boosted classifier's in-sample probabilities are near 0 or 1 whatever it knows
    about a new family, so an overconfident head (a lossy mode's quality on a family
    it never saw) takes the threshold's whole budget; recalibrated, each head's
    probability is what it is worth on a new family, and one threshold means the same
    for all. A head whose held-out logits do not rank its violations (slope <= 0), or
    whose held-out rows are of one class, predicts its rows' (weighted) violation rate.
    Without a ``family`` column, or with one family, there is nothing to hold out and
    the classifiers are kept as they are.

    ``risk_score``: what the threshold (``max_risk``, or the certified one) is compared
    with. ``probability`` (default): every mode's largest predicted violation
    probability. ``margin``: the mode's predicted latency ratio to the reference, as
    ``ratio / (1 + ratio)`` (the logistic of the log ratio: threshold ``t`` admits modes
    predicted at most ``t / (1 - t)`` times the reference's latency, 0.5 the reference's
    own), for modes whose every risk head passes its fixed gate (quality heads at most
    ``quality_gate``, energy and memory heads at most ``limit_gate``; a mode that fails
    a gate scores 1, never admitted). Why: one threshold over every head compares
    probabilities that mean different things on a new family (a lossy mode's quality
    head, ranked badly there, takes the whole budget), while what most often breaks a
    lossless mode's energy or memory limit is being slower than the reference (on CPUs
    energy is CPU time), which the latency head already predicts. A certified threshold
    is then a certified speed-up margin: a mode is picked only when predicted faster
    than the reference by a margin that held on held-out rows, gates included. The gates
    are fixed before calibration, so the certificate covers the whole rule.
    ``cost_features``: the columns the latency heads and the energy and memory heads
    read: ``all`` of the feature set, or ``shape`` (the feature set without its content
    columns, which are masked to a constant, so no split or weight reads them; feature
    set B's family one-hots stay; the compiled router still takes the whole row). Why: a request's cost follows its
    shape (tokens, concurrency, shared prefix); content columns let a latency model learn
    its training families apart, which does not carry to a new family. ``log-shape``:
    ``shape`` without the raw token counts that have log-scale twins in feature set A
    (:data:`~modeswitch.routers.families.cost_strategies.RAW_COUNT_FEATURES`). Why: a linear head extrapolates; on raw counts a new
    family of long answers to short prompts lies many standard deviations out in
    ``output_prompt_ratio`` and gets speed-ups its modes do not have, so requests are
    admitted to modes that break a limit, while on the log columns it stays near the
    training range (docs/results.md holds the held-out-family runs that showed it).
    Trees split on ranks, so for them it changes nothing. The
    quality heads read every column: content is what tells which output flips."""

    #: defaults of parameters added later, read by get_params on routers saved before them
    limit_risk = "classifier"
    risk_calibration = "none"
    risk_score = "probability"
    quality_gate = 0.05
    limit_gate = 0.5
    cost_features = "all"

    def __init__(self, *, max_risk=0.2, quality_rows="auto", limit_risk="classifier", risk_calibration="none",
                 risk_score="probability", quality_gate=0.05, limit_gate=0.5, cost_features="all", **shared):
        super().__init__(**shared)
        self.max_risk = max_risk
        self.quality_rows = quality_rows
        self.limit_risk = limit_risk
        self.risk_calibration = risk_calibration
        self.risk_score = risk_score
        self.quality_gate = quality_gate
        self.limit_gate = limit_gate
        self.cost_features = cost_features

    def _regressor(self):  # pragma: no cover - abstract
        raise NotImplementedError

    def _regressor_for(self, F):
        """The unfitted regressor for rows ``F`` (a variant may shape it to its rows)."""
        return self._regressor()

    def _classifier(self):  # pragma: no cover - abstract
        raise NotImplementedError

    @classmethod
    def _search_space(cls, trial) -> dict:  # pragma: no cover - abstract
        raise NotImplementedError

    #: 2: ``limit_gate`` joined the search space
    search_space_version = 2

    @classmethod
    def search_space(cls, trial) -> dict:
        """The family's own parameters, ``max_risk``, and ``limit_gate``. Why the gate:
        under ``risk_score="margin"`` it and the certified margin share one budget (a
        stricter energy and memory gate lets a looser margin certify), and which split
        of it keeps most depends on the families: on the per-request CPU study a
        stricter gate kept more leaving one family out and less on the group split
        (``scripts/certificates_per_family.py``; docs/results.md). What moves it is
        the energy heads' gate. So each split's tuning chooses; unused under
        ``risk_score="probability"``."""
        return {**cls._search_space(trial),
                "max_risk": trial.suggest_float("max_risk", 0.02, 0.6, log=True),
                "limit_gate": trial.suggest_float("limit_gate", 0.15, 0.6)}

    # -- each switch's strategy, looked up from its string on use (cost_strategies): a
    # fitted router stores none, so a saved one loads (skops) and decides as before ------
    @property
    def _limit_risk_strategy(self) -> RiskLimit:
        return resolve(RISK_LIMITS, "limit_risk", self.limit_risk, type(self).__name__)

    @property
    def _risk_calibration_strategy(self) -> RiskCalibration:
        return resolve(RISK_CALIBRATIONS, "risk_calibration", self.risk_calibration, type(self).__name__)

    @property
    def _risk_score_strategy(self) -> RiskScore:
        return resolve(RISK_SCORES, "risk_score", self.risk_score, type(self).__name__)

    @property
    def _cost_features_strategy(self) -> CostInputs:
        return resolve(COST_INPUTS, "cost_features", self.cost_features, type(self).__name__)

    @property
    def _quality_rows_strategy(self) -> QualityRows:
        return resolve(QUALITY_ROWS, "quality_rows", self.quality_rows, type(self).__name__)

    # ------------------------------------------------------------- fitting
    def _prep(self, X) -> ColumnTransformer:
        wanted = list(feature_columns(self.feature_set))
        missing = [c for c in wanted if c not in X.columns]
        if missing:
            raise ValueError(f"{type(self).__name__}: feature frame lacks {', '.join(missing)}")
        # dense output whatever the number of categories: the per-mode models, the sample
        # and the scores all index rows of one array
        return column_prep([c for c in wanted if c not in CATEGORICAL_FEATURES],
                           [c for c in wanted if c in CATEGORICAL_FEATURES], self._scale).set_params(
                               sparse_threshold=0.0)

    def fit(self, X, y=None, sample_weight=None):
        """Learn each mode's latency ratio and risks from the training table ``X`` (its
        per-mode cost columns); ``y`` is not needed."""
        if not hasattr(X, "columns"):
            raise ValueError(f"{type(self).__name__}.fit needs the training table (per-mode cost columns)")
        X = X.reset_index(drop=True)
        # the switches' strategies, each resolved before any work: an unknown value is
        # refused naming the known ones (quality_rows once the table's columns are read)
        limit, _, _, cost_inputs = (self._limit_risk_strategy, self._risk_calibration_strategy,
                                    self._risk_score_strategy, self._cost_features_strategy)
        for name in ("quality_gate", "limit_gate"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{type(self).__name__}: {name}={getattr(self, name)!r} must lie in [0, 1]")
        ref = reference_mode().name
        modes = sorted(c.split("__", 1)[1] for c in X.columns if c.startswith("latency_ms__"))
        if ref not in modes:
            raise ValueError(f"{type(self).__name__}.fit: the table has no latency_ms__{ref} "
                             "(the reference mode's cost every ratio is taken to)")
        w = None if sample_weight is None else np.asarray(sample_weight, dtype=float)
        self.prep_ = self._prep(X).fit(X)
        F = self.prep_.transform(X)
        Fc = cost_inputs.inputs(F, self._feature_names())  # the latency, energy and memory heads' rows
        quality_rows = self._quality_rows_strategy.rows(X, type(self).__name__)  # the quality heads'
        lat_ref = X[f"latency_ms__{ref}"].to_numpy(float)
        self.ratio_models_, self.risk_models_ = {}, {}
        for m in modes:
            if m == ref:
                continue
            lat = X[f"latency_ms__{m}"].to_numpy(float)
            ratio = np.log(lat / lat_ref)
            ok = np.isfinite(ratio)
            self.ratio_models_[m] = self._fit_reg(Fc[ok], ratio[ok], None if w is None else w[ok])
            unmeasured = ~np.isfinite(lat)
            self.risk_models_[m] = {}
            for c in CONSTRAINTS:
                col = f"violates_{c}__{m}"
                v = X[col].astype("boolean").fillna(True).to_numpy(bool) if col in X else np.zeros(len(X), bool)
                rows = quality_rows if c == "quality" else slice(None)
                inputs = F if c == "quality" else Fc
                model = (limit.fit(self, inputs, X, f"{c}_ratio__{m}", v, w, unmeasured)
                         if c in RATIO_LIMITS else None)
                if model is None:
                    groups = X["family"].astype(str).to_numpy()[rows] if "family" in X else None
                    model = self._fit_clf(inputs[rows], (v | unmeasured)[rows], None if w is None else w[rows],
                                          groups)
                self.risk_models_[m][c] = model
        self.reference_ = ref
        self.modes_ = modes
        self.classes_ = np.array(modes, dtype=object)
        self.n_features_in_ = F.shape[1]
        self.X_sample_ = np.asarray(F[self._sample_rows(len(F))], dtype=np.float64)
        self.set_risk_threshold(float(self.max_risk))
        return self

    def _feature_names(self) -> list[str]:
        """The input columns' feature names (the column preparation's prefixes dropped)."""
        return [n.split("__", 1)[-1] for n in self.prep_.get_feature_names_out()]

    def _fit_reg(self, F, t, w):
        if len(t) < MIN_ROWS:
            return _Constant(np.mean(t) if len(t) else 0.0)
        return self._regressor_for(F).fit(F, t, sample_weight=w)

    def _fit_ratio_risk(self, F, X, col: str, v: np.ndarray, w) -> _RatioRisk | None:
        """A :class:`_RatioRisk` for one (mode, constraint), or None to keep the classifier."""
        if col not in X:
            return None
        t = np.log(X[col].to_numpy(float))
        # a missing ratio is a violation to the classifier (fillna(True)); a regression
        # cannot learn that, so such a (mode, constraint) keeps the classifier
        if not np.isfinite(t).all() or len(t) < 2 * MIN_ROWS or v.all() or not v.any():
            return None
        held = np.full(len(t), np.nan)
        groups = X["family"].astype(str).to_numpy() if "family" in X else None
        if groups is not None and len(set(groups)) >= 2:
            folds = GroupKFold(n_splits=min(3, len(set(groups)))).split(F, t, groups)
        else:
            folds = KFold(n_splits=3, shuffle=True, random_state=self.random_state).split(F)
        for tr, te in folds:
            if len(tr) >= MIN_ROWS:
                held[te] = self._regress(self._regressor_for(F[tr]).fit(F[tr], t[tr], sample_weight=None if w is None
                                                                else w[tr]), F[te])
        fitted = _held_out_logistic(held, v, w)
        if fitted is None:
            return None
        return _RatioRisk(self._regressor_for(F).fit(F, t, sample_weight=w), *fitted)

    def _fit_clf(self, F, v, w, groups=None):
        if len(v) < MIN_ROWS or v.all() or not v.any():
            return _Constant(v.mean() if len(v) else 1.0)
        clf = self._classifier().fit(F, v, sample_weight=w)
        return self._risk_calibration_strategy.calibrate(self, clf, F, v, w, groups)

    def _calibrate(self, clf, F, v, w, groups):
        """``clf`` recalibrated on logits for families it did not see (``risk_calibration``)."""
        held = np.full(len(v), np.nan)
        for tr, te in GroupKFold(n_splits=min(3, len(set(groups)))).split(F, v, groups):
            if len(tr) >= MIN_ROWS and v[tr].any() and not v[tr].all():
                fold = self._classifier().fit(F[tr], v[tr], sample_weight=None if w is None else w[tr])
                held[te] = self._raw(fold, F[te])
        fitted = _held_out_logistic(held, v, w)
        if fitted is None:  # the logits do not rank a new family's violations: the rate
            return _Constant(float(np.average(v, weights=w)))
        return _CalibratedRisk(clf, *fitted)

    # -- the risk score a certification calibrates (routers.certified) ------------------
    #: the threshold at which only the reference is allowed
    strictest_threshold = -1.0
    #: every threshold below this allows the reference only (a risk score is a probability,
    #: or the logistic of a log ratio: never negative); where an adapted threshold's strict
    #: end lies (routers.adaptive), so its steps are not spent in [-1, 0)
    reference_only_below = 0.0
    #: the loosest threshold a calibration may certify (a risk of 1 is no guard at all)
    max_risk_ceiling = 0.99

    def loosest_threshold(self) -> float:
        # under the margin score a looser threshold than 0.5 admits only modes predicted
        # slower than the reference, which the argmin never picks over it: no change
        return self._risk_score_strategy.loosest_threshold(self.max_risk_ceiling)

    def risk_scores(self, X) -> np.ndarray:
        """What the threshold is compared with: every other mode's risk score (its largest
        predicted violation probability; under ``risk_score="margin"``, its speed-up margin
        or 1 where a gate fails)."""
        return self.scores(X)[1][:, self._others()].ravel()

    def set_risk_threshold(self, threshold: float | None):
        """Decide with ``threshold`` from now on (None: nothing certified, the reference)."""
        threshold = self.strictest_threshold if threshold is None else float(threshold)
        # under the margin score capped at 0.5: a mode failing a gate scores 1, never admitted
        self.threshold_ = self._risk_score_strategy.usable_threshold(threshold, self.max_risk_ceiling)
        return self

    # ------------------------------------------------------------ deciding
    def _others(self) -> list[int]:
        return [i for i, m in enumerate(self.modes_) if m != self.reference_]

    def _features(self, X) -> np.ndarray:
        return self.prep_.transform(X)

    def scores(self, X) -> tuple[np.ndarray, np.ndarray]:
        """(n, modes) predicted log latency ratio to the reference and risk score (the
        largest of the constraints' predicted violation probabilities; under
        ``risk_score="margin"``, the logistic of the log ratio where every gate passes,
        else 1); the reference's column is 0 in both."""
        check_is_fitted(self, "ratio_models_")
        return self._scores_of(self._features(X))

    def _scores_of(self, F: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        n = F.shape[0]
        ratio = np.zeros((n, len(self.modes_)))
        risk = np.zeros((n, len(self.modes_)))
        score, gates = self._risk_score_strategy, self._gates()
        for j, m in enumerate(self.modes_):
            if m == self.reference_:
                continue
            ratio[:, j] = self._regress(self.ratio_models_[m], F)
            heads = [self._risk(self.risk_models_[m][c], F) for c in CONSTRAINTS]
            risk[:, j] = score.score(ratio[:, j], heads, gates)
        return ratio, risk

    def _gates(self) -> tuple[float, ...]:
        """Each constraint's fixed gate under ``risk_score="margin"`` (CONSTRAINTS' order)."""
        return tuple(float(self.quality_gate) if c == "quality" else float(self.limit_gate) for c in CONSTRAINTS)

    def _risk(self, model, F) -> np.ndarray:
        if isinstance(model, _RatioRisk):
            return expit(model.intercept + model.slope * self._regress(model.regressor, F))
        if isinstance(model, _CalibratedRisk):
            return expit(model.intercept + model.slope * self._raw(model.classifier, F))
        return self._proba(model, F)

    @staticmethod
    def _regress(model, F) -> np.ndarray:
        return model.predict(F)

    @staticmethod
    def _proba(model, F) -> np.ndarray:
        return _proba(model, F)

    @staticmethod
    def _raw(model, F) -> np.ndarray:
        """A risk classifier's raw score: the logit of P(violates), as the compiled router
        sums it (the labels are boolean with both classes, so classes_[1] is True)."""
        return model.decision_function(F)

    # -- deciding from input rows (routers.certified distils the served decision) -------
    def features(self, X) -> np.ndarray:
        """The model's input rows for a feature frame (its column preparation applied)."""
        check_is_fitted(self, "prep_")
        return self._features(X)

    def row_scores(self, F: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`scores` for ready input rows ``F`` (:meth:`features`)."""
        check_is_fitted(self, "ratio_models_")
        return self._scores_of(np.asarray(F))

    def decide_scores(self, ratio, risk, threshold) -> np.ndarray:
        """Mode indices (into ``modes_``) chosen from :meth:`row_scores` at ``threshold``."""
        return self._decide(ratio, risk, threshold)

    def _decide(self, ratio, risk, threshold) -> np.ndarray:
        allowed = risk <= threshold
        allowed[:, self.modes_.index(self.reference_)] = True
        return np.where(allowed, ratio, np.inf).argmin(axis=1)

    def predict_with_fallback(self, X) -> tuple[np.ndarray, np.ndarray]:
        ratio, risk = self.scores(X)
        idx = self._decide(ratio, risk, self.threshold_)
        # fell back: no mode but the reference was predicted safe enough
        fell = ~(risk[:, self._others()] <= self.threshold_).any(axis=1)
        return self.classes_[idx].astype(object), fell

    def predict(self, X) -> np.ndarray:
        return self.predict_with_fallback(X)[0]

    def explain(self, X) -> list[tuple[str, str]]:
        ratio, risk = self.scores(X)
        idx = self._decide(ratio, risk, self.threshold_)
        score, out = self._risk_score_strategy, []
        for i, j in enumerate(idx):
            m = self.modes_[j]
            why = score.explain(ratio[i, j], risk[i, j], self.threshold_, m == self.reference_)
            out.append((m, f"{type(self).__name__}: {why}"))
        return out

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.two_d_array = False  # fit reads the training table's per-mode cost columns
        tags.target_tags.required = False
        return tags

    def feature_importances(self) -> pd.Series:
        names = self._feature_names()
        vals = np.zeros(len(names))
        for mdl in self.ratio_models_.values():
            if hasattr(mdl, "feature_importances_"):
                vals += np.asarray(mdl.feature_importances_, float)
            elif hasattr(mdl, "coef_"):
                vals += np.abs(np.ravel(mdl.coef_))
        return pd.Series(vals, index=names).sort_values(ascending=False)

    # -- the fitted decision as plain data (what the compiler reads) ----------------
    def fitted_state(self) -> FittedState:
        """Outputs: each mode's predicted log latency ratio, then each (mode, constraint)'s
        risk logit (under ``risk_score="margin"`` shifted by the threshold's logit less
        its gate's, then the mode's log ratio once more as a last "constraint"), under the
        cost decision. A model that predicts a constant (too few rows, one class) becomes
        its output's bias; a constant risk is compared with the threshold (its gate)
        here, once (allowed: -inf, not: +inf)."""
        check_is_fitted(self, "ratio_models_")
        cols = feature_columns(self.feature_set)
        if any(c in CATEGORICAL_FEATURES for c in cols):
            raise ValueError(f"compiled cost-predicting routers take numbers only (feature set {self.feature_set} "
                             "has categories)")
        modes = list(self.modes_)
        score = self._risk_score_strategy
        # under the margin score each mode has one more risk output, its latency ratio
        # itself (allowed: logistic(ratio) <= threshold), and every constraint's logit is
        # shifted so that the threshold's cut stands for the head's fixed gate
        M, C = len(modes), len(CONSTRAINTS) + score.ratio_output
        thr = float(self.threshold_)
        cut = cut_logit(thr)
        gates = score.compiled_gates(self._gates(), thr)
        bias = np.zeros(M * (1 + C))
        fitted = []  # (output, model, scale, offset): the output is scale x the model's raw score + offset
        for j, m in enumerate(modes):
            if m == self.reference_:
                continue
            outputs = [(j, self.ratio_models_[m], None)]
            outputs += [(M + j * C + c, self.risk_models_[m][name], gates[c]) for c, name in enumerate(CONSTRAINTS)]
            if score.ratio_output:
                outputs.append((M + j * C + len(CONSTRAINTS), self.ratio_models_[m], None))
            for k, mdl, gate in outputs:
                shift = 0.0 if gate is None else score.logit_shift(cut, gate)
                if gate is not None and (isinstance(mdl, _Constant) or not np.isfinite(shift)):
                    value = mdl.value if isinstance(mdl, _Constant) else (0.0 if gate >= 1 else 1.0)
                    bias[k] = -np.inf if value <= gate else np.inf  # compared with its gate here, once
                elif isinstance(mdl, _Constant):
                    bias[k] = mdl.value
                elif isinstance(mdl, _RatioRisk):  # the logit is linear in the regressor's output
                    fitted.append((k, mdl.regressor, mdl.slope, mdl.intercept + shift))
                elif isinstance(mdl, _CalibratedRisk):  # and in the classifier's own raw score
                    fitted.append((k, mdl.classifier, mdl.slope, mdl.intercept + shift))
                else:  # a ratio, or a risk's logit of P(True)
                    fitted.append((k, mdl, 1.0 if gate is None or mdl.classes_[1] else -1.0, shift))
        return FittedState(tuple(modes), InputLayout(len(cols), numeric_names=numeric_layout(cols)),
                           self._outputs_state(fitted, bias),
                           CostDecision(M, C, modes.index(self.reference_), thr), self.X_sample_,
                           self.content_table(required=False))

    def _outputs_state(self, fitted: list, bias: np.ndarray):  # pragma: no cover - abstract
        """Every output's model as one description (``fitted``: (output, model, scale, offset))."""
        raise NotImplementedError


def _proba(model, F) -> np.ndarray:
    if isinstance(model, _Constant):
        return model.predict(F)
    p = model.predict_proba(F)
    return p[:, list(model.classes_).index(True)]


class LinearCostRouter(LogisticParameters, CostPredictingRouter):
    """Ridge regression per mode for the latency ratio, logistic regression per (mode,
    constraint) for the risk, on standardised features; compiles to one weight matrix
    (the scaling folded in) per decision."""

    _scale = True

    def __init__(self, *, alpha=1.0, **shared):
        super().__init__(**shared)
        self.alpha = alpha

    def _regressor(self):
        return Ridge(alpha=self.alpha)

    def _classifier(self):
        return LogisticRegression(C=self.C, max_iter=2000, random_state=self.random_state)

    @classmethod
    def _search_space(cls, trial) -> dict:
        return dict(alpha=trial.suggest_float("alpha", 1e-3, 1e2, log=True),
                    C=trial.suggest_float("C", 1e-2, 1e2, log=True))

    def _outputs_state(self, fitted, bias):
        """One weight row per output on the standardised features (constants: a zero row)."""
        W = np.zeros((len(bias), self.n_features_in_))
        bias = bias.copy()
        for k, mdl, scale, offset in fitted:
            W[k] = scale * np.ravel(np.asarray(mdl.coef_, float))
            bias[k] = scale * float(np.ravel(mdl.intercept_)[0]) + offset
        sc = self.prep_.named_transformers_["num"]
        return LinearModel(W, bias, np.asarray(sc.mean_, float), np.asarray(sc.scale_, float))


class LightGBMCostRouter(LightGBMParameters, CostPredictingRouter):
    """LightGBM regressor per mode for the latency ratio, LightGBM classifier per
    (mode, constraint) for the risk.

    ``cost_regimes``: ``"none"``, or ``"concurrency"``: every tree of the latency heads
    (and of the ratio-risk regressors) first splits a request alone from one in company
    (``concurrent_requests`` at 1.5, a LightGBM forced split), and learns each side
    apart. Why: the batching modes gain nothing alone, whatever the request's size, but
    a tree that splits on size first learns "short prompts batch well" from families
    whose short prompts all came in company, and promises a new family's lone short
    prompts continuous batching far faster than the reference, where alone it is
    slower. Leaving one family out, a certificate's calibration rows are decided by
    models that lack two families, where that error is common. At default parameters
    it kept more certified capture leaving one family out and less on the group split
    (``scripts/certificates_per_family.py``; docs/results.md). Neither wins both, so it
    is in the search space (``search_space_version`` 2) and each split's tuning
    chooses. A second forced split, on a shared prefix, did worse in a cruder
    diagnostic."""

    cost_regimes = "none"  # routers saved before the parameter
    #: 2: ``cost_regimes`` joined the search space; 3: ``limit_gate`` (every cost router's)
    search_space_version = 3

    def __init__(self, *, cost_regimes="none", **shared):
        super().__init__(**shared)
        self.cost_regimes = cost_regimes

    @property
    def _cost_regimes_strategy(self) -> CostRegime:
        return resolve(COST_REGIMES, "cost_regimes", self.cost_regimes, type(self).__name__)

    def fit(self, X, y=None, sample_weight=None):
        """:meth:`CostPredictingRouter.fit`, the latency heads with ``cost_regimes``'
        forced splits (LightGBM reads them from a file, written for the fit's length;
        the fitted boosters keep its name among their parameters and are never refitted)."""
        split = self._cost_regimes_strategy.forced_split(
            self.feature_set, f"{type(self).__name__}: cost_regimes={self.cost_regimes!r}")
        if split is None:
            return super().fit(X, y, sample_weight)
        column, threshold = split  # the numeric columns come first, in order (column_prep)
        with tempfile.TemporaryDirectory(prefix="modeswitch-regimes-") as d:
            path = Path(d) / "forced_splits.json"
            path.write_text(json.dumps({"feature": column, "threshold": float(threshold)}))
            # (the file, the column, the threshold): _regressor_for checks the rows
            self._forced_splits = (str(path), column, float(threshold))
            try:
                return super().fit(X, y, sample_weight)
            finally:
                self._forced_splits = None

    def _regressor(self, forced: str | None = None):
        from lightgbm import LGBMRegressor  # heavy (~0.3 s): only when a LightGBM router is built

        return LGBMRegressor(**self._lightgbm_kwargs(), **({"forcedsplits_filename": forced} if forced else {}))

    def _regressor_for(self, F):
        """With ``cost_regimes`` (while fit runs), the forced split where ``F`` has at least
        ``min_child_samples`` rows on each side of it, else none: LightGBM 4.7 crashes the
        process (a segmentation fault) on a forced split with a side smaller than that, a
        constant column included (every request alone)."""
        forced = getattr(self, "_forced_splits", None)
        if forced is None:
            return self._regressor()
        path, column, threshold = forced
        below = int((np.asarray(F, dtype=float)[:, column] <= threshold).sum())
        need = max(int(self.min_child_samples), 1)
        return self._regressor(path if need <= below <= len(F) - need else None)

    def _classifier(self):
        from lightgbm import LGBMClassifier  # heavy (~0.3 s): only when a LightGBM router is built

        return LGBMClassifier(**self._lightgbm_kwargs())

    @classmethod
    def _search_space(cls, trial) -> dict:
        return {**cls._lightgbm_space(trial, max_leaves=31, max_child_samples=40),
                "cost_regimes": trial.suggest_categorical("cost_regimes", list(COST_REGIMES))}

    def _outputs_state(self, fitted, bias):
        """Every model's trees as one ensemble, each tree scoring its own output (every
        model a constant: the biases are the whole decision)."""
        if not fitted:
            return LinearModel(np.zeros((len(bias), self.n_features_in_)), bias)
        bias = bias.copy()
        for k, _, _, offset in fitted:
            bias[k] += offset
        trees = [t for k, mdl, scale, _ in sorted(fitted, key=lambda f: f[0])
                 for t in lightgbm_trees(mdl.booster_, k, scale)[0]]
        return TreeEnsemble(tuple(trees), len(bias), "sum", False, bias)

    # single decisions skip scikit-learn's input checks: the boosters' own predict on
    # the request's numbers (feature set A is passed through unscaled, in its order)
    @staticmethod
    def _regress(model, F) -> np.ndarray:
        return model.predict(F) if isinstance(model, _Constant) else model.booster_.predict(F)

    @staticmethod
    def _proba(model, F) -> np.ndarray:
        if isinstance(model, _Constant):
            return model.predict(F)
        p = model.booster_.predict(F)  # binary: P(label 1), label 1 = classes_[1]
        return p if bool(model.classes_[1]) else 1 - p

    @staticmethod
    def _raw(model, F) -> np.ndarray:
        return model.booster_.predict(F, raw_score=True)

    def route(self, request: Request) -> str:
        if self.feature_set != "A":
            return super().route(request)
        F = np.array(_shape(request), dtype=np.float64)[None, :]
        ratio, risk = self._scores_of(F)
        return str(self.classes_[self._decide(ratio, risk, self.threshold_)[0]])


register_router(RouterFamily("cost_linear", LinearCostRouter,
                             "cost-predicting: ridge latency ratio + logistic risk per mode"))
register_router(RouterFamily("cost_lgbm", LightGBMCostRouter,
                             "cost-predicting: LightGBM latency ratio + risk per mode"))

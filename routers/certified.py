"""A certified threshold around any router with a risk score (:class:`CertifiedRouter`).

Why one wrapper: the guarded classifiers (threshold on each mode's predicted P(safe))
and the cost-predicting routers (threshold on each mode's predicted risk) certify
their threshold the same way, by Learn then Test on calibration requests held out of
the training rows (:mod:`routers.risk_control` has the maths). So certification is
not a parameter of any family but one estimator around it, as scikit-learn's
``TunedThresholdClassifierCV`` tunes a threshold around any classifier.

A router has a risk score when it offers (see
:class:`~routers.families.classifier.ModeClassifier` and
:class:`~routers.families.cost.CostPredictingRouter`):

* ``strictest_threshold``: the threshold at which it answers only safe defaults;
* ``loosest_threshold()``: the loosest a certificate may reach (None: no risk score);
* ``risk_scores(X)``: the scores its threshold is compared with, on rows ``X``;
* ``set_risk_threshold(t)``: decide with ``t`` from now on (None: nothing certified,
  the reference mode only).

``fit`` splits the rows (stratified by family), fits a clone of the router on one
part, takes candidate thresholds from its scores on that part (fixed before the
calibration rows are seen), and on the other part walks them from the strictest while
the violation rate is certified at most ``target_violation_rate`` with probability
``1 - delta``. A violation is a pick other than the reference that the row's
``safe__<mode>`` label (or ``safe=``) says is unsafe. The calibration share is
``calibration_share`` of the rows, raised to what the target needs to be certifiable at
all (:func:`routers.risk_control.min_calibration`, 230 for 1 % at delta 0.1), at most
half. The per-mode models are fitted on the other rows only: refitting on all would
void the certificate.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from modeswitch.engine.modes import reference_mode
from modeswitch.routers.base import RouterMixin
from modeswitch.routers.risk_control import (
    ALPHA,
    DELTA,
    calibration_split,
    candidate_grid,
    learn_then_test,
)
from sklearn.base import BaseEstimator, ClassifierMixin, clone
from sklearn.utils.validation import check_is_fitted


def has_risk_score(router) -> bool:
    """Whether ``router`` (fitted or not) offers a threshold to certify."""
    loosest = getattr(router, "loosest_threshold", None)
    return loosest is not None and loosest() is not None


def _rows(A, rows):
    return A.iloc[rows] if hasattr(A, "iloc") else np.asarray(A)[rows]


def _safe_matrix(X, safe, modes: list[str]) -> np.ndarray:
    """(n, modes) booleans: is each mode safe for each row (the reference always is; a
    mode without a label is not)."""
    labels = pd.DataFrame(safe).reset_index(drop=True) if safe is not None else pd.DataFrame(
        {c.split("__", 1)[1]: X[c].to_numpy() for c in getattr(X, "columns", []) if str(c).startswith("safe__")})
    ref = reference_mode().name
    cols = [np.ones(len(X), bool) if m == ref else
            labels[m].astype("boolean").fillna(False).to_numpy(bool) if m in labels else np.zeros(len(X), bool)
            for m in modes]
    return np.column_stack(cols) if cols else np.zeros((len(X), 0), bool)


class CertifiedRouter(ClassifierMixin, RouterMixin, BaseEstimator):
    """``router`` with its risk threshold certified by Learn then Test.

    ``target_violation_rate``: the violation rate new requests may have at most, with
    probability ``1 - delta``. ``calibration_share``: the share of rows held out to
    certify (raised to what the target needs). ``random_state``: the split."""

    decision_path = "pipeline"

    def __init__(self, router, *, target_violation_rate=ALPHA, delta=DELTA, calibration_share=0.3,
                 random_state=0):
        self.router = router
        self.target_violation_rate = target_violation_rate
        self.delta = delta
        self.calibration_share = calibration_share
        self.random_state = random_state

    def fit(self, X, y=None, sample_weight=None, safe=None):
        """Fit a clone of the router on part of the rows and certify its threshold on the
        others. ``safe``: per-mode safety labels (default: ``X``'s ``safe__<mode>`` columns),
        also handed to the router's own fit when given."""
        est = clone(self.router)
        if not has_risk_score(est):
            raise ValueError(f"{type(est).__name__} has no risk score to certify (a mode classifier "
                             "needs a safety_threshold)")
        groups = X["family"].astype(str).to_numpy() if hasattr(X, "columns") and "family" in X else None
        fit_rows, cal_rows = calibration_split(len(X), self.calibration_share, self.random_state, groups,
                                               alpha=self.target_violation_rate, delta=self.delta)
        kw = {} if sample_weight is None else {"sample_weight": np.asarray(sample_weight)[fit_rows]}
        if safe is not None:
            kw["safe"] = pd.DataFrame(safe).reset_index(drop=True).iloc[fit_rows]
        est.fit(_rows(X, fit_rows), None if y is None else np.asarray(y)[fit_rows], **kw)
        cal = self._certify(est, _rows(X, fit_rows), _rows(X, cal_rows),
                            _safe_matrix(X, safe, list(est.modes_))[cal_rows])
        est.set_risk_threshold(cal.threshold)
        self.router_ = est
        self.calibration_ = cal.to_dict()  # a plain dict: it travels with the model file
        self.threshold_ = cal.threshold
        self.classes_ = est.classes_
        self.modes_ = list(est.modes_)
        return self

    def _candidates(self, est, X_fit) -> list[float]:
        """Thresholds from the strictest to the loosest, from the fitting rows' scores."""
        strict, loose = est.strictest_threshold, est.loosest_threshold()
        grid = candidate_grid(np.concatenate([np.ravel(est.risk_scores(X_fit)), [0.0, 1.0, loose]]))
        grid = grid[grid >= loose][::-1] if strict > loose else grid[grid <= loose]
        return [strict, *grid]

    def _certify(self, est, X_fit, X_cal, safe_cal: np.ndarray):
        modes = list(est.modes_)
        rows = np.arange(len(X_cal))

        def violations_at(t):
            est.set_risk_threshold(t)
            picks = np.array([modes.index(str(m)) for m in est.predict(X_cal)], dtype=int)
            return int((~safe_cal[rows, picks]).sum())

        return learn_then_test(violations_at, self._candidates(est, X_fit), len(X_cal),
                               self.target_violation_rate, self.delta)

    # -- the Router protocol: the certified router decides --------------------------------
    def predict(self, X):
        check_is_fitted(self, "router_")
        return self.router_.predict(X)

    def predict_with_fallback(self, X):
        check_is_fitted(self, "router_")
        return self.router_.predict_with_fallback(X)

    def route(self, request) -> str:
        return self.router_.route(request)

    def explain(self, X) -> list[tuple[str, str]]:
        return self.router_.explain(X)

    def fitted_state(self):
        """The certified router's decision as plain data (its threshold set)."""
        check_is_fitted(self, "router_")
        return self.router_.fitted_state()

    def compile(self, region_budget: tuple | None = None):
        fast = self.router_.compile(region_budget)
        if fast is None:
            self.compile_reason_ = self.router_.compile_reason_
        return fast

    def feature_importances(self) -> pd.Series:
        return self.router_.feature_importances()

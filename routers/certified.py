"""A certified threshold around any router with a risk score (:class:`CertifiedRouter`).

Why one wrapper: the guarded classifiers (threshold on each mode's predicted P(safe))
and the cost-predicting routers (threshold on each mode's predicted risk) certify
their threshold the same way, by Learn then Test on calibration requests held out of
the training rows (:mod:`modeswitch.routers.risk_control` has the maths). So certification is
not a parameter of any family but one estimator around it, as scikit-learn's
``TunedThresholdClassifierCV`` tunes a threshold around any classifier.

A router has a risk score when it offers (see
:class:`~modeswitch.routers.families.classifier.ModeClassifier` and
:class:`~modeswitch.routers.families.cost.CostPredictingRouter`):

* ``strictest_threshold``: the threshold at which it answers only safe defaults;
* ``loosest_threshold()``: the loosest a certificate may reach (None: no risk score);
* ``risk_scores(X)``: the scores its threshold is compared with, on rows ``X``;
* ``set_risk_threshold(t)``: decide with ``t`` from now on (None: nothing certified,
  the reference mode only).

``fit`` (``calibrate_on="split"``, the default) splits the rows (stratified by
family), fits a clone of the router on one part, takes candidate thresholds from its
scores on that part (fixed before the calibration rows are seen), and on the other
part walks them from the strictest while
the violation rate is certified at most ``target_violation_rate`` with probability
``1 - delta``. A violation is a pick other than the reference that the row's
``safe__<mode>`` label (or ``safe=``) says is unsafe. The calibration share is
``calibration_share`` of the rows, raised to what the target needs to be certifiable at
all (:func:`modeswitch.routers.risk_control.min_calibration`, 230 for 1 % at delta 0.1), at most
half. The per-mode models are fitted on the other rows only: refitting on all would
void the certificate. (``calibrate_on="all"``, below, trades that for power.)

Guarantees that survive a new family. A certificate on pooled calibration rows bounds
the *average* rate; one held-out family can still break it (a certified cost LightGBM
reached 2.08 % against 1 % on the group split, all in one family). Two options, each
alone or together:

* ``group_conditional``: the threshold must be certified in every family at once
  (Mondrian risk control: an intersection-union test over families, small families
  pooled into one cluster as clustered conformal prediction does;
  :func:`modeswitch.routers.risk_control.learn_then_test_groups`);
* ``cross_fit_groups``: each calibration row is decided by a clone fitted without its
  family's rows, so the calibration sees the shift a new family brings (the picks of
  a model that never saw the family), not the rows of families it was fitted on.

``calibrate_on="all"`` (with ``cross_fit_groups``) certifies on *every* training row,
each decided by a clone fitted on the other families' rows, and serves a router fitted
on all of them: leave-one-family-out cross-fitting, as cross-conformal prediction and
jackknife+ (Barber, Candès, Ramdas, Tibshirani, arXiv:1905.02928) use every row both to
fit and to calibrate. Why: a split certificate at 2 % sees only its calibration share
(about 160 rows here), where one violation already fails the binomial test; on all rows
it sees three times as many, and the served router learns from all of them. What it
gives up: the served router is not the one calibrated (neither is it with a split
``cross_fit_groups``: each calibration row's decider was fitted without its family),
and its candidate thresholds come from the served router's scores on the calibration
rows themselves (scores, not outcomes: the grid's resolution, not the test). So the
guarantee is heuristic, the cross-validated one: a new family behaves like a held-out
one, families exchangeable. Jackknife+'s bounds for cross-fitting (coverage, not this
risk) allow up to about twice the target plus a term for few folds, and the binomial
test counts rows as independent while a family's rows share one decider; the scoring
report therefore sets every held-out family's own rate beside the target.

``family_transfer`` (cross-fitted certificates only) also certifies the threshold once
per family *without* that family's rows, and keeps each family's picks at the threshold
certified without it (``transfer_picks_``): how the certificate carries over to a family
it never saw. Tuning judges trials by these picks, not by the certificate's own
(:mod:`modeswitch.routers.training.transfer`). Why: the certified threshold is the loosest that
passes on the calibration rows, so among many tuned trials the one whose certificate
came out loosest on those very rows wins, and its certificate no longer holds (the
winner's curse of selecting on the test's own data: held-out families then break the
target). Each family's transfer picks are decided by a clone that never saw the family,
at a threshold certified without it. It costs no refit: the same deciders, more tests.
What it cannot end: a break that comes from a limit only one family crosses, copied
into many of its rows from a few measurements, is seen by no certificate fitted without
that family (docs/training.md; the study's figures in docs/results.md).
"""

from __future__ import annotations

import inspect

import numpy as np
import pandas as pd
from sklearn.base import BaseEstimator, ClassifierMixin, clone
from sklearn.utils.validation import check_is_fitted

from modeswitch.dataset.features import features_frame
from modeswitch.engine.modes import reference_mode
from modeswitch.routers.base import RouterMixin
from modeswitch.routers.compiler import compile_state
from modeswitch.routers.compiler.distil import Distillation, tree_state
from modeswitch.routers.risk_control import (
    ALPHA,
    DELTA,
    calibration_split,
    candidate_grid,
    learn_then_test,
    learn_then_test_groups,
)
from modeswitch.routers.served_tree import ThresholdTrees, needs_tree


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
    certify (raised to what the target needs). ``random_state``: the split.
    ``group_conditional``: certify the rate in every family (cluster), not only pooled.
    ``cross_fit_groups``: decide each calibration row with a clone fitted without its
    family. ``served_tree``: ``"auto"`` certifies and serves one tree per threshold
    (:mod:`modeswitch.routers.served_tree`) where the router's compiled ensemble would be distilled,
    so the certificate covers what is served; ``"never"`` keeps the ensemble.
    ``calibrate_on``: ``"split"`` (a held-out share certifies) or ``"all"`` (every row,
    cross-fitted by family; needs ``cross_fit_groups``). ``family_transfer``: also record
    each family's picks at the threshold certified without it (``transfer_picks_``,
    ``transfer_thresholds_``), with ``cross_fit_groups``."""

    decision_path = "pipeline"

    def __init__(self, router, *, target_violation_rate=ALPHA, delta=DELTA, calibration_share=0.3,
                 random_state=0, group_conditional=False, cross_fit_groups=False, served_tree="auto",
                 calibrate_on="split", family_transfer=False):
        self.router = router
        self.target_violation_rate = target_violation_rate
        self.delta = delta
        self.calibration_share = calibration_share
        self.random_state = random_state
        self.group_conditional = group_conditional
        self.cross_fit_groups = cross_fit_groups
        self.served_tree = served_tree
        self.calibrate_on = calibrate_on
        self.family_transfer = family_transfer

    def fit(self, X, y=None, sample_weight=None, safe=None):
        """Fit a clone of the router on part of the rows and certify its threshold on the
        others (``calibrate_on="all"``: on all rows, and certify on every row with clones
        fitted without its family). ``safe``: per-mode safety labels (default: ``X``'s ``safe__<mode>`` columns),
        also handed to the router's own fit when given."""
        if not has_risk_score(clone(self.router)):
            raise ValueError(f"{type(self.router).__name__} has no risk score to certify (a mode classifier "
                             "needs a safety_threshold)")
        groups = X["family"].astype(str).to_numpy() if hasattr(X, "columns") and "family" in X else None
        if self.served_tree not in ("auto", "never"):
            raise ValueError(f"served_tree {self.served_tree!r}: choose auto or never")
        if groups is None and (self.group_conditional or self.cross_fit_groups):
            raise ValueError("group-conditional or cross-fitted certification needs the rows' family column")
        if self.calibrate_on not in ("split", "all"):
            raise ValueError(f"calibrate_on {self.calibrate_on!r}: choose split or all")
        if self.family_transfer and (not self.cross_fit_groups or len(np.unique(groups)) < 2):
            raise ValueError("family_transfer needs cross_fit_groups and at least two families: a family's "
                             "transfer picks are a decider's that never saw it")
        if self.calibrate_on == "all":
            if not self.cross_fit_groups or len(np.unique(groups)) < 2:
                raise ValueError("calibrate_on='all' needs cross_fit_groups and at least two families: "
                                 "a row may only calibrate a decider that never saw its family")
            fit_rows = cal_rows = np.arange(len(X))
        else:
            fit_rows, cal_rows = calibration_split(len(X), self.calibration_share, self.random_state, groups,
                                                   alpha=self.target_violation_rate, delta=self.delta)

        def fitted(rows):
            kw = {} if sample_weight is None else {"sample_weight": np.asarray(sample_weight)[rows]}
            if safe is not None:
                kw["safe"] = pd.DataFrame(safe).reset_index(drop=True).iloc[rows]
            return clone(self.router).fit(_rows(X, rows), None if y is None else np.asarray(y)[rows], **kw)

        est = fitted(fit_rows)
        # who decides each calibration row: the router itself, or a clone that never saw its family
        deciders = [(est, np.arange(len(cal_rows)))]
        if self.cross_fit_groups:
            deciders = []
            for g in np.unique(groups[cal_rows]):
                others = fit_rows[groups[fit_rows] != g]
                deciders.append((fitted(others) if len(others) else est, np.flatnonzero(groups[cal_rows] == g)))
        # where the compiled ensemble would be distilled, each decider's picks are its
        # tree's at each threshold (fitted on its own training rows, never the calibration's)
        trees = {}
        if self.served_tree == "auto" and needs_tree(est):
            trees = {id(model): ThresholdTrees(model, self.random_state) for model, _ in deciders}
            trees.setdefault(id(est), ThresholdTrees(est, self.random_state))
        X_cal = _rows(X, cal_rows)
        cal, picks, refused, transfer = self._certify(est, _rows(X, fit_rows), X_cal,
                                             _safe_matrix(X, safe, list(est.modes_))[cal_rows], deciders,
                                             groups[cal_rows] if groups is not None else None, trees)
        if self.family_transfer:  # each family's picks at the threshold certified without it
            self.transfer_picks_, self.transfer_thresholds_ = transfer
        # what the certificate saw: each calibration row's pick at the certified threshold
        # (by the decider that calibrated it); with calibrate_on="all", every row's, decided
        # without its family: what tuning scores (routers.training.trainer)
        self.calibration_rows_ = np.asarray(cal_rows)
        self.calibration_picks_ = picks
        # what stopped the walk: the first candidate refused and the calibration rows'
        # picks there (None where every candidate passed), for the report's "what the
        # certificate refused" (routers.scoring.refusals)
        self.refused_threshold_, self.refused_picks_ = refused
        # the calibration rows by name, so a report can find them in the table again
        self.calibration_request_ids_ = (np.asarray(X["request_id"].iloc[cal_rows]).astype(str)
                                         if hasattr(X, "columns") and "request_id" in X else None)
        est.set_risk_threshold(cal.threshold)
        self.served_tree_, self.distilled_ = None, None
        if trees and cal.threshold is not None:
            served = trees[id(est)]
            self.served_tree_ = served.tree(cal.threshold)
            self.distilled_ = served.report(cal.threshold, est.features(X_cal))
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

    def _test(self, violates, candidates, groups_cal: np.ndarray, keep=None):
        """Learn then Test over ``candidates`` on the calibration rows ``keep`` (all:
        None), pooled or per family (``groups_cal``) as the router certifies."""
        keep = np.ones(len(groups_cal), bool) if keep is None else keep
        if self.group_conditional:
            return learn_then_test_groups(lambda t: violates(t)[keep], candidates, groups_cal[keep],
                                          self.target_violation_rate, self.delta)
        return learn_then_test(lambda t: int(violates(t)[keep].sum()), candidates, int(keep.sum()),
                               self.target_violation_rate, self.delta)

    def _certify(self, est, X_fit, X_cal, safe_cal: np.ndarray, deciders, groups_cal=None, trees=None):
        """The certificate, the calibration rows' picks (mode names) at its threshold
        (the reference where nothing is certified), (the first candidate the test
        refused, the rows' picks there), or (None, None) where none was refused, and
        with ``family_transfer`` (each row's pick at the threshold certified without its
        family, {family: that threshold}), else None."""
        modes = list(est.modes_)
        rows = np.arange(len(X_cal))
        trees = trees or {}
        inputs = {id(model): model.features(_rows(X_cal, part)) for model, part in deciders if id(model) in trees}

        seen: dict[float, np.ndarray] = {}  # the transfer tests revisit thresholds

        def picks_at(t) -> np.ndarray:
            if t in seen:
                return seen[t]
            picks = np.empty(len(X_cal), dtype=int)
            for model, part in deciders:
                if id(model) in trees:  # the tree it would serve at t
                    idx = trees[id(model)].picks(t, inputs[id(model)])
                    picks[part] = [modes.index(str(model.modes_[i])) for i in idx]
                    continue
                model.set_risk_threshold(t)
                picks[part] = [modes.index(str(m)) for m in model.predict(_rows(X_cal, part))]
            seen[t] = picks
            return picks

        def violates(t) -> np.ndarray:
            return ~safe_cal[rows, picks_at(t)]

        candidates = self._candidates(est, X_fit)
        cal = self._test(violates, candidates, groups_cal if groups_cal is not None else np.zeros(len(X_cal)))
        names = np.asarray(modes, dtype=object)
        transfer = None
        if self.family_transfer:
            transfer_picks = np.full(len(X_cal), reference_mode().name, dtype=object)
            thresholds = {}
            for g in np.unique(groups_cal):
                own = groups_cal == g
                t = self._test(violates, candidates, groups_cal, ~own).threshold
                thresholds[str(g)] = t
                if t is not None:  # else: nothing certified without it, the reference
                    transfer_picks[own] = names[picks_at(t)[own]]
            transfer = (transfer_picks, thresholds)
        # the walk stops at the first refused candidate, the last it tested; where it
        # passed them all, that is the certified one
        refused = (None, None)
        if cal.tested and candidates[cal.tested - 1] != cal.threshold:
            t = candidates[cal.tested - 1]
            refused = (float(t), names[picks_at(t)])
        if cal.threshold is None:  # nothing certified: the served router answers the reference
            return cal, np.full(len(X_cal), reference_mode().name, dtype=object), refused, transfer
        return cal, names[picks_at(cal.threshold)], refused, transfer

    # -- the Router protocol: the certified router decides --------------------------------
    def _served_picks(self, X) -> np.ndarray:
        idx = self.served_tree_.predict(np.asarray(self.router_.features(X), dtype=np.float64))
        return np.asarray(self.router_.modes_, dtype=object)[np.asarray(idx, dtype=int)]

    def predict(self, X):
        check_is_fitted(self, "router_")
        if getattr(self, "served_tree_", None) is not None:
            return self._served_picks(X)
        return self.router_.predict(X)

    def predict_with_fallback(self, X):
        check_is_fitted(self, "router_")
        if getattr(self, "served_tree_", None) is not None:
            picks = self._served_picks(X)
            return picks, picks == self.router_.reference_
        return self.router_.predict_with_fallback(X)

    def route(self, request) -> str:
        check_is_fitted(self, "router_")
        if getattr(self, "served_tree_", None) is not None:
            return str(self.predict(features_frame([request], self.router_.feature_set,
                                                   content=self.router_.content_table()))[0])
        return self.router_.route(request)

    def explain(self, X) -> list[tuple[str, str]]:
        out = self.router_.explain(X)
        if getattr(self, "served_tree_", None) is None:
            return out
        picks = self._served_picks(X)
        return [(str(p), f"{why} (served: its certified tree, agreement "
                 f"{self.distilled_['agreement_calibration']:.1%} on calibration rows)")
                for p, (_, why) in zip(picks, out)]

    def fitted_state(self):
        """The certified router's decision as plain data: its served tree where it has
        one, else the router's own (its threshold set)."""
        check_is_fitted(self, "router_")
        if getattr(self, "served_tree_", None) is not None:
            return tree_state(self.router_.fitted_state(), self.served_tree_)
        return self.router_.fitted_state()

    def compile(self, region_budget: tuple | None = None, distil: str = "never"):
        """The compiled served decision: the certified tree where the router has one, else
        the router's ensemble kept exact (``distil="never"``: a tree distilled after
        certifying would be a router the certificate does not cover)."""
        check_is_fitted(self, "router_")
        try:
            if getattr(self, "served_tree_", None) is not None:
                fast = compile_state(self.fitted_state(), region_budget, distil="never")
                d = self.distilled_
                fast.distilled_ = Distillation(d["source_trees"], d["nodes"], d["depth"], d["agreement_train"],
                                               d["agreement_synthetic"])
                return fast
        except (ValueError, TypeError, RuntimeError) as exc:
            self.compile_reason_ = str(exc).splitlines()[0]
            return None
        accepts = "distil" in inspect.signature(self.router_.compile).parameters
        fast = self.router_.compile(region_budget, distil) if accepts else self.router_.compile(region_budget)
        if fast is None:
            self.compile_reason_ = self.router_.compile_reason_
        return fast

    def feature_importances(self) -> pd.Series:
        return self.router_.feature_importances()

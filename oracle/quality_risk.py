"""Per-request quality risk: per lossy mode, P(this request's output fails the quality rule).

Why: a quality sweep measures each lossy mode's output on some requests. The rest of a
training table (the drawn requests the sweep did not run) had only two ways to get a
quality verdict: their family's mean (the study's rule, ``quality_scope="family"``), or
figures interpolated between measured requests of a similar shape. Under the per-request
rule (``quality_scope="request"``) neither says anything about *this* request. A model
fitted on the swept requests' own outcomes gives each unmeasured request a probability
of failing, and the oracle accepts a lossy mode there only when that probability is at
most ``Constraints.max_quality_risk`` (the ``cut``): a per-request margin instead of a
family mean.

A request *fails* a mode when its own output's ROUGE-L against the reference output is
below ``min_rouge_vs_baseline`` or, on a scored benchmark request, the reference
answered right and the mode did not (a drop beyond ``max_accuracy_drop_pp``); a row with
neither signal is left out. Lossless modes are not modelled: the rule does not charge
their divergence (the reference's self-consistency floor, :mod:`modeswitch.oracle.family_rule`).

The question is the oracle's: an unswept request comes from a family the sweep ran, so
each mode's model is validated within families (stratified folds over every family's
swept requests) against the family's own failure rate, and trusted only where it earns
it: a lower out-of-fold Brier score than answering each family's rate, and, among the
requests it puts at or below the cut, an out-of-fold failure rate at or below the cut.
An untrusted mode answers, per family, the one-sided Clopper-Pearson upper bound of the
family's failure rate (``confidence``), so three passes out of three do not make a mode
safe on every other request of the family. The features are the table's numeric request
columns (shape, and the prompt's content and the reference's confidence where it has
them; :func:`modeswitch.oracle.training_table.build_training_table` leaves out the conditions a
batched, untimed sweep never varied).

The estimator follows scikit-learn's API: ``__init__`` stores parameters, ``fit``
returns self, learned attributes end in ``_``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.stats import beta
from sklearn.base import BaseEstimator, clone
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import brier_score_loss, roc_auc_score
from sklearn.model_selection import StratifiedKFold
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from modeswitch.experimental import experimental_class
from modeswitch.oracle.cells import OracleError
from modeswitch.oracle.family_rule import lossless
from modeswitch.oracle.sweep_quality import ESTIMATED, RISK

#: fewer swept requests than this for a mode, or one outcome only: no model, the family bounds
MIN_ROWS = 20
ESTIMATORS = ("logistic", "lgbm")


def failures(sweep: pd.DataFrame, min_rouge: float, max_accuracy_drop_pp: float) -> pd.DataFrame:
    """(request_id, mode, failed) for every lossy, non-reference row of a sweep
    (:func:`modeswitch.engine.quality_sweep.read_sweep`): its own ROUGE-L below ``min_rouge``, or its
    benchmark answer wrong where the reference's was right. Rows with neither signal
    (no ROUGE-L, no scored answer) are left out."""
    s = sweep[sweep["mode"] != sweep["reference_mode"]]
    s = s[~s["mode"].map(lossless).astype(bool)]
    ref = sweep[sweep["mode"] == sweep["reference_mode"]].drop_duplicates("request_id")
    ref_acc = s["request_id"].map(ref.set_index("request_id")["accuracy"])
    drop_pp = (s["accuracy"] - ref_acc) * 100
    failed = (s["rouge_l_vs_baseline"] < min_rouge) | (drop_pp < -max_accuracy_drop_pp)
    checked = s["rouge_l_vs_baseline"].notna() | drop_pp.notna()  # no signal: no outcome, not a pass
    return pd.DataFrame({"request_id": s["request_id"].astype(str).to_numpy(),
                         "mode": s["mode"].to_numpy(), "failed": failed.to_numpy(bool)})[checked.to_numpy()]


def upper_rate(failed: int, n: int, confidence: float) -> float:
    """One-sided Clopper-Pearson upper bound of a failure rate (1 with no rows)."""
    if n == 0 or failed >= n:
        return 1.0
    return float(beta.ppf(confidence, failed + 1, n - failed))


@experimental_class
class QualityRisk(BaseEstimator):
    """Per lossy mode, P(fail) from a request's features where that validates, else
    from its family's failure rate (an upper bound).

    ``features``: the numeric columns read (None: every numeric column of the frame
    given to :meth:`fit`). ``estimator``: ``logistic`` (standardised logistic regression,
    default: a few hundred rows per mode and a weak signal want a low-variance model) or
    ``lgbm`` (LightGBM, small trees). ``min_rouge`` / ``max_accuracy_drop_pp``: the
    quality rule's limits (:class:`modeswitch.oracle.constraints.Constraints`). ``cut``: the risk at
    or below which the oracle accepts a mode (``max_quality_risk``); ``confidence``: of
    the families' upper bounds; ``folds``: of the validation."""

    def __init__(self, features=None, estimator="logistic", min_rouge=0.80,
                 max_accuracy_drop_pp=1.5, cut=0.05, confidence=0.95, folds=5, random_state=0):
        self.features = features
        self.estimator = estimator
        self.min_rouge = min_rouge
        self.max_accuracy_drop_pp = max_accuracy_drop_pp
        self.cut = cut
        self.confidence = confidence
        self.folds = folds
        self.random_state = random_state

    def _model(self):
        if self.estimator == "logistic":
            return make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000, C=1.0))
        if self.estimator == "lgbm":
            from lightgbm import LGBMClassifier  # heavy: only when this estimator is asked for

            return LGBMClassifier(n_estimators=100, num_leaves=7, min_child_samples=10,
                                  learning_rate=0.05, random_state=self.random_state, verbose=-1)
        raise ValueError(f"QualityRisk: unknown estimator {self.estimator!r}; known: {', '.join(ESTIMATORS)}")

    def _columns(self, X: pd.DataFrame) -> list[str]:
        if self.features is not None:
            missing = [c for c in self.features if c not in X.columns]
            if missing:
                raise OracleError(f"quality risk: the feature frame lacks {', '.join(missing)}")
            return list(self.features)
        return [c for c in X.columns if pd.api.types.is_numeric_dtype(X[c]) and not pd.api.types.is_bool_dtype(X[c])]

    def _rows(self, X: pd.DataFrame, sweep: pd.DataFrame):
        fails = failures(sweep, self.min_rouge, self.max_accuracy_drop_pp)
        fails = fails[fails["request_id"].isin(X.index)]
        if fails.empty:
            raise OracleError("quality risk: no swept request is in the feature frame (its index: request ids)")
        return fails

    @staticmethod
    def _groups(ids, groups) -> np.ndarray:
        if groups is None:
            return np.full(len(ids), "all", dtype=object)
        return pd.Index(ids).map(groups).fillna("none").astype(str).to_numpy()

    def fit(self, X: pd.DataFrame, sweep: pd.DataFrame, groups: pd.Series | None = None):
        """Fit from the swept requests' features (``X``, indexed by request id) and the
        sweep's per-request quality; requests of ``X`` the sweep did not run are unused.
        ``groups``: request id -> family (None: one group)."""
        self._model()  # an unknown estimator fails before any work
        self.features_in_ = self._columns(X)
        fails = self._rows(X, sweep)
        self.validation_ = self._validate(X[self.features_in_], fails, groups)
        trusted = dict(zip(self.validation_["mode"], self.validation_["trusted"]))
        self.models_, self.base_rate_, self.group_upper_, self.pooled_upper_ = {}, {}, {}, {}
        for mode, g in fails.groupby("mode", sort=True):
            y = g["failed"].to_numpy(bool)
            grp = self._groups(g["request_id"], groups)
            self.base_rate_[mode] = float(y.mean())
            self.pooled_upper_[mode] = upper_rate(int(y.sum()), len(y), self.confidence)
            self.group_upper_[mode] = {k: upper_rate(int(y[grp == k].sum()), int((grp == k).sum()), self.confidence)
                                       for k in np.unique(grp)}
            if trusted[mode]:
                self.models_[mode] = self._model().fit(X.loc[g["request_id"], self.features_in_].to_numpy(float), y)
        self.uses_model_ = {m: m in self.models_ for m in self.base_rate_}
        self.modes_ = sorted(self.base_rate_)
        return self

    def predict_proba(self, X: pd.DataFrame, groups: pd.Series | None = None) -> pd.DataFrame:
        """P(fail) per request (rows, ``X``'s index) and modelled mode (columns): the
        model's where trusted, else the upper bound of the request's family's failure
        rate (of every swept request's, for a family the sweep did not run)."""
        if not hasattr(self, "modes_"):
            raise OracleError("quality risk: predict before fit")
        F = X[self.features_in_].to_numpy(float)
        grp = self._groups(X.index, groups)
        out = {}
        for m in self.modes_:
            if m in self.models_:
                out[m] = self.models_[m].predict_proba(F)[:, 1]
            else:
                up = self.group_upper_[m]
                out[m] = np.array([up.get(k, self.pooled_upper_[m]) for k in grp], dtype=float)
        return pd.DataFrame(out, index=X.index)

    def validate(self, X: pd.DataFrame, sweep: pd.DataFrame, groups: pd.Series | None = None) -> pd.DataFrame:
        """Out-of-fold quality per mode, within families (stratified folds over every
        family's swept requests): ``auc`` (of failure; 0.5 is no signal), ``brier`` beside
        ``brier_base`` (answering each family's failure rate in the training folds),
        ``below_cut`` (requests the model put at or below ``cut``) and their
        ``below_cut_failure_rate``, and ``trusted`` (Brier better than the base and the
        rate below the cut within the cut). A mode with fewer than :data:`MIN_ROWS` rows
        or one outcome is not validated, and not trusted."""
        return self._validate(X[self._columns(X)], self._rows(X, sweep), groups)

    def _validate(self, X: pd.DataFrame, fails: pd.DataFrame, groups) -> pd.DataFrame:
        """:meth:`validate` on ready feature columns ``X`` and :func:`failures` rows."""
        out = []
        for mode, g in fails.groupby("mode", sort=True):
            y = g["failed"].to_numpy(bool)
            grp = self._groups(g["request_id"], groups)
            row = {"mode": mode, "rows": len(y), "failure_rate": float(y.mean()), "auc": np.nan,
                   "brier": np.nan, "brier_base": np.nan, "below_cut": 0,
                   "below_cut_failure_rate": np.nan, "trusted": False}
            k = min(self.folds, int(y.sum()), int((~y).sum()))
            if len(y) >= MIN_ROWS and k >= 2:
                F = X.loc[g["request_id"]].to_numpy(float)
                p, base = np.empty(len(y)), np.empty(len(y))
                for train, test in StratifiedKFold(k, shuffle=True, random_state=self.random_state).split(F, y):
                    yt, gt = y[train], grp[train]
                    rate = {key: yt[gt == key].mean() for key in np.unique(gt)}
                    base[test] = [rate.get(key, yt.mean()) for key in grp[test]]
                    one_class = yt.all() or not yt.any()
                    p[test] = yt.mean() if one_class else clone(self._model()).fit(F[train], yt).predict_proba(F[test])[:, 1]
                below = p <= self.cut
                row.update(auc=float(roc_auc_score(y, p)), brier=float(brier_score_loss(y, p)),
                           brier_base=float(brier_score_loss(y, base)), below_cut=int(below.sum()),
                           below_cut_failure_rate=float(y[below].mean()) if below.any() else np.nan)
                row["trusted"] = bool(row["brier"] < row["brier_base"]
                                      and (not below.any() or y[below].mean() <= self.cut))
            out.append(row)
        return pd.DataFrame(out)


def attach(est: pd.DataFrame, basis: pd.DataFrame, sweep: pd.DataFrame, features: pd.DataFrame,
           groups: pd.Series, constraints) -> tuple[pd.DataFrame, dict]:
    """``est`` (indexed by unit, mode) with a ``quality_risk`` column: P(fail) for every
    (request whose quality is ``estimated``, modelled lossy mode), NaN elsewhere, from a
    :class:`QualityRisk` fitted on the swept requests of ``features`` (numeric columns,
    indexed by request id; ``groups``: request id -> family). Also returns what the
    table's metadata keeps: the estimator, its features, and per mode its validation and
    whether the model or the family's upper bound answered."""
    model = QualityRisk(estimator=constraints.quality_risk, min_rouge=constraints.min_rouge_vs_baseline,
                        max_accuracy_drop_pp=constraints.max_accuracy_drop_pp, cut=constraints.max_quality_risk)
    model.fit(features, sweep, groups=groups)
    est = est.copy()
    est[RISK] = np.nan
    todo = basis.index[basis["quality_basis"].eq(ESTIMATED)].intersection(features.index)
    if len(todo):
        p = model.predict_proba(features.loc[todo], groups=groups).stack()
        p.index.names = ["unit", "mode"]
        hit = p.index.intersection(est.index)
        est.loc[hit, RISK] = p.loc[hit].to_numpy()
    checked = model.validation_
    info = {"estimator": model.estimator, "features": model.features_in_,
            "max_quality_risk": constraints.max_quality_risk, "requests_judged": int(len(todo)),
            "validation": checked.replace({np.nan: None}).to_dict(orient="records")}
    return est, info

"""What every learned router family shares (:class:`LearnedRouter`).

The families (``dt``, ``rf``, ``lr``, ``lgbm`` and any plug-in) are one module each in
this package: a subclass with its parameters, ``_make_estimator`` and its Optuna
search space (``_search_space``), and a :func:`~routers.registry.register_router`
call. Each is a scikit-learn classifier (``__init__`` stores parameters, ``fit`` returns
self, learned attributes end in ``_``) wrapping a Pipeline: numeric features
(feature set A: request shape) scaled where the model needs it, categorical
features (set B adds family and benchmark suite) one-hot encoded with unknown
categories ignored. Arrays are accepted too (all columns numeric).

Safety guard (``safety_threshold``): ``fit`` also learns, per mode, the probability
that the mode is constraint-safe for a request (from the training table's
``safe__<mode>`` columns, passed as ``safe=``). ``predict`` then takes the most
likely mode whose predicted safety clears the threshold, and otherwise falls
back to the rule baseline (``fallback="rule"``) or the reference
(``fallback="reference"``). With ``target_violation_rate`` the threshold actually
used (``safety_threshold_``) is certified on held-out training rows by Learn then
Test (:mod:`routers.risk_control`); ``safety_threshold`` is then the loosest one
considered.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.compose import ColumnTransformer
from sklearn.dummy import DummyClassifier
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import OneHotEncoder, StandardScaler
from sklearn.tree import DecisionTreeClassifier
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import (
    _check_sample_weight,
    check_array,
    check_is_fitted,
    column_or_1d,
)

from dataset.features import CATEGORICAL_FEATURES, FEATURE_SET_A, FEATURE_SETS, features_frame
from dataset.requests import Request
from engine.modes import reference_mode
from routers.base import RouterMixin
from routers.compiler import compile as compile_router
from routers.fitted_state import FittedState, InputLayout


def column_prep(num: list, cat: list, scale: bool) -> ColumnTransformer:
    """The learned routers' input step: numeric features (scaled where the model needs
    it), categorical ones one-hot encoded with unknown categories ignored."""
    parts = [("num", StandardScaler() if scale else "passthrough", num)]
    if cat:
        parts.append(("cat", OneHotEncoder(handle_unknown="ignore"), cat))
    return ColumnTransformer(parts)


class LearnedRouter(RouterMixin, ClassifierMixin, BaseEstimator):
    """Shared machinery; subclasses define ``_make_estimator``, ``_search_space`` and
    their parameters."""

    _scale = False
    decision_path = "pipeline"
    #: defaults of parameters added later, for routers saved before they existed
    #: (``get_params`` falls back to these class attributes)
    target_violation_rate = None
    delta = 0.1

    def _make_estimator(self):  # pragma: no cover - abstract
        raise NotImplementedError

    @classmethod
    def _search_space(cls, trial) -> dict:  # pragma: no cover - abstract
        """The family's own hyperparameters for one Optuna trial."""
        raise NotImplementedError

    @classmethod
    def search_space(cls, trial) -> dict:
        """Parameters for one Optuna trial: class weighting (every family) + the family's own."""
        cw = trial.suggest_categorical("class_weight", [None, "balanced"])
        return {**cls._search_space(trial), "class_weight": cw}

    def _columns(self, X):
        if not hasattr(X, "columns"):
            return None, None
        wanted = list(FEATURE_SETS[self.feature_set])
        missing = [c for c in wanted if c not in X.columns]
        if len(missing) == len(wanted):
            return None, None  # a frame without our feature names: a plain numeric matrix
        if missing:
            raise ValueError(f"{type(self).__name__}: feature frame lacks {', '.join(missing)} "
                             f"(feature set {self.feature_set})")
        num = [c for c in wanted if c not in CATEGORICAL_FEATURES]
        cat = [c for c in wanted if c in CATEGORICAL_FEATURES]
        return num, cat

    def _pipeline(self, X) -> Pipeline:
        num, cat = self._columns(X)
        if num is None:  # a plain numeric matrix: every column is a number
            n = np.shape(X)[1] if np.ndim(X) == 2 else 0
            prep = column_prep(list(range(n)), [], self._scale)
        else:
            prep = column_prep(num, cat, self._scale)
        return Pipeline([("prep", prep), ("clf", self._make_estimator())])

    def _check_X(self, X):
        if hasattr(X, "columns") and self._columns(X)[0] is not None:
            return X
        allow_nan = self.__sklearn_tags__().input_tags.allow_nan
        return check_array(X, accept_sparse=False, ensure_all_finite="allow-nan" if allow_nan else True)

    def fit(self, X, y, sample_weight=None, safe=None):
        target = getattr(self, "target_violation_rate", None)
        if target and self.safety_threshold is not None:
            return self._fit_certified(X, y, sample_weight, safe, target)
        self._fit(X, y, sample_weight, safe)
        self.safety_threshold_ = self.safety_threshold
        self.calibration_ = None
        return self

    def _fit_certified(self, X, y, sample_weight, safe, target):
        """Fit on part of the rows, then certify the safety threshold on the others
        (Learn then Test, :mod:`routers.risk_control`): the loosest threshold, from
        strict (every pick falls back) to ``safety_threshold``, whose violation rate on
        new requests is at most ``target`` with probability 1 - ``delta``. Nothing
        certified: every decision is the reference."""
        from routers.risk_control import calibration_split, candidate_grid, learn_then_test

        if safe is None:
            raise ValueError("a certified safety threshold needs safe= (per-mode safety labels) in fit")
        groups = X["family"].astype(str).to_numpy() if hasattr(X, "columns") and "family" in X else None
        fit_rows, cal_rows = calibration_split(len(X), 0.3, getattr(self, "random_state", 0) or 0, groups,
                                               alpha=target, delta=self.delta)
        take = (lambda A, r: A.iloc[r]) if hasattr(X, "iloc") else (lambda A, r: np.asarray(A)[r])
        w = None if sample_weight is None else np.asarray(sample_weight)[fit_rows]
        safe = pd.DataFrame(safe).reset_index(drop=True)
        self._fit(take(X, fit_rows), np.asarray(y)[fit_rows], w, safe.iloc[fit_rows])
        Xc = take(X, cal_rows)
        sc = safe.iloc[cal_rows].reset_index(drop=True).fillna(False).astype(bool)
        ref = reference_mode().name
        # candidates from the fitting rows' scores (fixed before calibration is seen)
        p_fit = self.safety_proba(take(X, fit_rows)).ravel()
        cands = candidate_grid(np.concatenate([p_fit, [self.safety_threshold, 1.0]]))
        cands = cands[cands >= self.safety_threshold][::-1]  # strict first

        def violations_at(t):
            self.safety_threshold_ = t
            picks = self.predict(Xc)
            ok = np.array([m == ref or (m in sc and bool(sc[m].iloc[i])) for i, m in enumerate(picks)])
            return int((~ok).sum())

        cal = learn_then_test(violations_at, [np.inf, *cands], len(cal_rows), target, self.delta)
        self.calibration_ = cal.to_dict()
        self.safety_threshold_ = cal.threshold if cal.threshold is not None else None
        return self

    def _fit(self, X, y, sample_weight=None, safe=None):
        X = self._check_X(X)
        y = column_or_1d(np.asarray(y), warn=True)
        check_classification_targets(y)
        if len(y) != len(X):
            raise ValueError(f"X has {len(X)} rows but y has {len(y)}")
        if sample_weight is not None:
            sample_weight = _check_sample_weight(sample_weight, X, ensure_non_negative=True)
            if not np.any(sample_weight > 0):
                raise ValueError("sample_weight is all zero: no sample would count")
            if len(np.unique(y[sample_weight > 0])) < 2 <= len(np.unique(y)):
                raise ValueError("after dropping zero-weight samples only one class is left")
        self.pipeline_ = self._pipeline(X)
        if len(np.unique(y)) < 2:
            # one label in the training part (a small table, or a fold where one mode
            # wins everywhere): the router is that constant, as a tree would learn;
            # logistic regression and LightGBM refuse a single class
            self.pipeline_.steps[-1] = ("clf", DummyClassifier(strategy="most_frequent"))
        params = {} if sample_weight is None else {"clf__sample_weight": sample_weight}
        self.pipeline_.fit(X, y, **params)
        self.classes_ = self.pipeline_.classes_
        self.X_sample_ = self._input_sample(X)
        self.n_features_in_ = self.pipeline_.n_features_in_
        if hasattr(self.pipeline_.named_steps["clf"], "n_iter_"):
            self.n_iter_ = self.pipeline_.named_steps["clf"].n_iter_
        if hasattr(self.pipeline_, "feature_names_in_"):
            self.feature_names_in_ = self.pipeline_.feature_names_in_
        self.safety_ = None
        if self.safety_threshold is not None:
            if safe is None:
                raise ValueError("safety_threshold needs safe= (per-mode safety labels) in fit")
            self.safety_ = self._fit_safety(X, safe)
            if self.fallback == "rule":
                from routers.rule_baseline import RuleBaselineRouter

                self.fallback_ = RuleBaselineRouter(
                    available_modes=sorted(set(self.classes_) | {reference_mode().name}),
                    unavailable="reference").fit()
        self.modes_ = self._modes()
        self.safety_threshold_ = self.safety_threshold
        return self

    def _modes(self) -> list[str]:
        """Every mode a decision can be: the classes, plus the fallback's when guarded."""
        modes = set(map(str, self.classes_))
        if self.safety_threshold is not None:
            fb = getattr(self, "fallback_", None)
            modes |= set(map(str, fb.classes_)) if fb is not None else {reference_mode().name}
        return sorted(modes)

    # -- the Router protocol -------------------------------------------------------
    def route(self, request: Request) -> str:
        """One decision through the scikit-learn pipeline (milliseconds; ``compile()``
        gives the microsecond path)."""
        return self.predict(features_frame([request], self.feature_set))[0]

    def explain(self, X) -> list[tuple[str, str]]:
        picks, fell = self.predict_with_fallback(X)
        name = type(self).__name__
        return [(str(m), f"{name}: no mode looked safe, fallback ({self.fallback}) chose {m}" if f
                 else f"{name}: most likely fastest safe mode {m}") for m, f in zip(picks, fell)]

    def compile(self, region_budget: tuple | None = None):
        """The compiled router (same decisions, C kernel), or None with ``compile_reason_``."""
        try:
            return compile_router(self, region_budget)
        except (ValueError, TypeError, RuntimeError) as exc:  # e.g. a safety-guarded router
            self.compile_reason_ = str(exc).splitlines()[0]
            return None

    # -- the fitted decision as plain data (what the compiler reads) ----------------
    def fitted_state(self) -> FittedState:
        """The fitted decision as plain data (:mod:`routers.fitted_state`): the input
        layout, the classes and the family's model (``_estimator_state``)."""
        check_is_fitted(self, "pipeline_")
        if self.safety_threshold is not None:
            raise ValueError("routers with a safety guard are not compiled yet; compile without it")
        clf = self.pipeline_.named_steps["clf"]
        if isinstance(clf, DummyClassifier):
            raise TypeError("one class in training: a constant router, nothing to compile")
        return FittedState(tuple(self.classes_), self._input_layout(), self._estimator_state(clf),
                           sample=getattr(self, "X_sample_", None))

    def _estimator_state(self, clf):
        """The fitted classifier ``clf`` as a :class:`~routers.fitted_state.TreeEnsemble` or
        :class:`~routers.fitted_state.LinearModel` (see :mod:`routers.families.readers`);
        a family that defines none is served through its pipeline."""
        raise TypeError(f"{type(self).__name__} does not describe its fitted {type(clf).__name__} "
                        "(define _estimator_state to compile it)")

    def _input_layout(self) -> InputLayout:
        """The classifier's input columns: feature set A's numbers, then the one-hot ones."""
        prep = self.pipeline_.named_steps["prep"]
        n_num, fam, suite = 0, (), ()
        for name, trans, cols in prep.transformers_:
            if name == "num":
                n_num = len(cols)
                if isinstance(cols, list) and cols and isinstance(cols[0], str) and \
                        list(cols) != list(FEATURE_SET_A)[: len(cols)]:
                    raise ValueError("compiled routers expect feature set A's column order")
            elif name == "cat":
                for c, cats in zip(cols, trans.categories_):
                    if c == CATEGORICAL_FEATURES[0]:
                        fam = tuple(str(x) for x in cats)
                    else:
                        suite = tuple(str(x) for x in cats)
        return InputLayout(n_num, fam, suite)

    #: training rows kept (model inputs after preprocessing) to tell compile where traffic is
    sample_rows = 2000

    def _input_sample(self, X) -> np.ndarray:
        """Up to ``sample_rows`` training rows as the classifier sees them (numbers and
        one-hot columns; no prompts): :func:`routers.compiler.compile` spends its
        region-tree budget where these rows lie."""
        rng = np.random.default_rng(0)
        idx = np.sort(rng.choice(len(X), size=min(len(X), self.sample_rows), replace=False))
        Xs = X.iloc[idx] if hasattr(X, "iloc") else np.asarray(X)[idx]
        out = self.pipeline_.named_steps["prep"].transform(Xs)
        return np.asarray(out.toarray() if hasattr(out, "toarray") else out, dtype=np.float64)

    def _fit_safety(self, X, safe) -> dict:
        safe = pd.DataFrame(safe)
        models = {}
        for mode in self.classes_:
            y = safe[mode].fillna(False).astype(bool).to_numpy() if mode in safe else np.zeros(len(X), bool)
            if y.all() or not y.any():
                models[mode] = float(y.all())
            else:
                models[mode] = Pipeline([("prep", self._pipeline(X).named_steps["prep"]),
                                         ("clf", DecisionTreeClassifier(max_depth=6, min_samples_leaf=5,
                                                                        random_state=0))]).fit(X, y)
        return models

    def predict_proba(self, X):
        check_is_fitted(self, "pipeline_")
        return self.pipeline_.predict_proba(self._check_X(X))

    def safety_proba(self, X) -> np.ndarray:
        """(n, n_classes) predicted probability that each mode is constraint-safe."""
        check_is_fitted(self, "safety_")
        cols = []
        for mode in self.classes_:
            m = self.safety_[mode]
            if isinstance(m, float):
                cols.append(np.full(len(X), m))
            else:
                p = m.predict_proba(X)
                cols.append(p[:, list(m.classes_).index(True)] if True in m.classes_ else np.zeros(len(X)))
        return np.column_stack(cols)

    def predict_with_fallback(self, X):
        """(modes, fallback mask): which rows fell back because no mode looked safe."""
        X = self._check_X(X) if not hasattr(X, "columns") else X
        proba = self.predict_proba(X)
        if self.safety_threshold is None or self.safety_ is None:
            return self.classes_[proba.argmax(1)], np.zeros(len(proba), bool)
        threshold = getattr(self, "safety_threshold_", self.safety_threshold)  # older saved routers
        if threshold is None:  # a certification found no threshold: the reference only
            return np.full(len(proba), reference_mode().name, dtype=object), np.ones(len(proba), bool)
        ok = self.safety_proba(X) >= threshold
        ranked = np.argsort(-proba, axis=1)
        pick = np.full(len(proba), -1)
        for i in range(len(proba)):
            for j in ranked[i]:
                if ok[i, j]:
                    pick[i] = j
                    break
        out = np.where(pick >= 0, self.classes_[np.maximum(pick, 0)], None).astype(object)
        fell = pick < 0
        if fell.any():
            if self.fallback == "rule":
                Xf = X[fell] if hasattr(X, "iloc") else np.asarray(X)[fell]
                out[fell] = self.fallback_.predict(Xf)
            else:
                out[fell] = reference_mode().name
        return out, fell

    def predict(self, X):
        return self.predict_with_fallback(X)[0]

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        inner = self._make_estimator().__sklearn_tags__()
        tags.input_tags.allow_nan = inner.input_tags.allow_nan and not self._scale
        return tags

    def feature_importances(self) -> pd.Series:
        """Importance per input column after preprocessing (|coef| for linear models)."""
        clf = self.pipeline_.named_steps["clf"]
        names = self.pipeline_.named_steps["prep"].get_feature_names_out()
        if hasattr(clf, "feature_importances_"):
            vals = np.asarray(clf.feature_importances_, dtype=float)
        else:
            vals = np.abs(np.atleast_2d(clf.coef_)).mean(0)
        return pd.Series(vals, index=[n.split("__", 1)[-1] for n in names]).sort_values(ascending=False)

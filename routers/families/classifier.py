"""Learned routers that predict the oracle's label (:class:`ModeClassifier`).

Each is a scikit-learn classifier (``__init__`` stores parameters, ``fit`` returns
self, learned attributes end in ``_``) wrapping a Pipeline: numeric features (feature
set A: request shape) scaled where the model needs it, categorical features (set B
adds family and benchmark suite) one-hot encoded with unknown categories ignored.
Arrays are accepted too (all columns numeric). A family (``dt``, ``rf``, ``lr``,
``lgbm``, a plug-in) adds its parameters, ``_make_estimator``, ``_search_space`` and,
to be compiled, ``_estimator_state`` (its fitted model as plain data, see
:mod:`modeswitch.routers.families.readers`).

Safety guard (``safety_threshold``): ``fit`` also learns, per mode, the probability
that the mode is constraint-safe for a request (from ``safe=``, else the training
table's ``safe__<mode>`` columns). ``predict`` then takes the most likely mode whose
predicted safety clears the threshold, and otherwise falls back to the rule
baseline (``fallback="rule"``) or the reference (``fallback="reference"``). That
probability is the router's risk score: :class:`modeswitch.routers.certified.CertifiedRouter`
certifies the threshold actually used (``safety_threshold_``) by Learn then Test,
``safety_threshold`` then being the loosest one considered.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from sklearn.base import ClassifierMixin
from sklearn.dummy import DummyClassifier
from sklearn.pipeline import Pipeline
from sklearn.tree import DecisionTreeClassifier
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import (
    _check_sample_weight,
    check_array,
    check_is_fitted,
    column_or_1d,
)

from modeswitch.dataset.features import CATEGORICAL_FEATURES
from modeswitch.engine.modes import reference_mode
from modeswitch.routers.families.base import LearnedRouter, column_prep
from modeswitch.routers.fitted_state import FittedState, InputLayout, numeric_layout
from modeswitch.routers.rule_baseline import RuleBaselineRouter


class ModeClassifier(ClassifierMixin, LearnedRouter):
    """Shared machinery; families define ``_make_estimator``, ``_search_space`` and their
    parameters.

    ``class_weight``: the classifier's class weighting (None or ``"balanced"``).
    ``safety_threshold``: None (no guard) or the least predicted P(safe) a pick needs.
    ``fallback``: what a guarded router answers when no mode clears it (``"rule"``: the
    rule baseline; ``"reference"``: the reference mode)."""

    def __init__(self, *, class_weight=None, safety_threshold=None, fallback="rule", **shared):
        super().__init__(**shared)
        self.class_weight = class_weight
        self.safety_threshold = safety_threshold
        self.fallback = fallback

    def _make_estimator(self):  # pragma: no cover - abstract
        raise NotImplementedError

    @classmethod
    def search_space(cls, trial) -> dict:
        """Parameters for one Optuna trial: class weighting (every family) + the family's own."""
        cw = trial.suggest_categorical("class_weight", [None, "balanced"])
        return {**cls._search_space(trial), "class_weight": cw}

    # -- fitting -------------------------------------------------------------------------
    def _pipeline(self, X) -> Pipeline:
        num, cat = self._feature_columns(X)
        if num is None:  # a plain numeric matrix: every column is a number
            n = np.shape(X)[1] if np.ndim(X) == 2 else 0
            prep = column_prep(list(range(n)), [], self._scale)
        else:
            prep = column_prep(num, cat, self._scale)
        return Pipeline([("prep", prep), ("clf", self._make_estimator())])

    def _check_X(self, X):
        if hasattr(X, "columns") and self._feature_columns(X)[0] is not None:
            return X
        allow_nan = self.__sklearn_tags__().input_tags.allow_nan
        return check_array(X, accept_sparse=False, ensure_all_finite="allow-nan" if allow_nan else True)

    def _check_y(self, X, y, sample_weight):
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
        return y, sample_weight

    def fit(self, X, y, sample_weight=None, safe=None):
        """Learn the labels ``y`` of rows ``X``; with a safety guard also each mode's
        P(safe), from ``safe`` (a frame of per-mode booleans), else from ``X``'s
        ``safe__<mode>`` columns."""
        X = self._check_X(X)
        y, sample_weight = self._check_y(X, y, sample_weight)
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
            self.safety_ = self._fit_safety(X, self._safety_labels(X, safe))
            if self.fallback == "rule":
                self.fallback_ = RuleBaselineRouter(
                    available_modes=sorted(set(self.classes_) | {reference_mode().name}),
                    unavailable="reference").fit()
        self.modes_ = self._modes()
        self.safety_threshold_ = self.safety_threshold
        return self

    @staticmethod
    def _safety_labels(X, safe) -> pd.DataFrame:
        if safe is not None:
            return pd.DataFrame(safe).reset_index(drop=True)
        cols = [c for c in getattr(X, "columns", []) if str(c).startswith("safe__")]
        if not cols:
            raise ValueError("safety_threshold needs per-mode safety labels: safe= in fit, or the "
                             "training table's safe__<mode> columns")
        return pd.DataFrame({c.split("__", 1)[1]: X[c].to_numpy() for c in cols})

    def _fit_safety(self, X, safe: pd.DataFrame) -> dict:
        models = {}
        for mode in self.classes_:
            y = safe[mode].fillna(False).astype(bool).to_numpy() if mode in safe else np.zeros(len(X), bool)
            if y.all() or not y.any():
                models[mode] = float(y.all())
            else:
                models[mode] = Pipeline([("prep", self._pipeline(X).named_steps["prep"]),
                                         ("clf", DecisionTreeClassifier(max_depth=6, min_samples_leaf=5,
                                                                        random_state=self.random_state)),
                                         ]).fit(X, y)
        return models

    def _modes(self) -> list[str]:
        """Every mode a decision can be: the classes, plus the fallback's when guarded."""
        modes = set(map(str, self.classes_))
        if self.safety_threshold is not None:
            fb = getattr(self, "fallback_", None)
            modes |= set(map(str, fb.classes_)) if fb is not None else {reference_mode().name}
        return sorted(modes)

    def _input_sample(self, X) -> np.ndarray:
        """Some training rows as the classifier sees them (numbers and one-hot columns;
        no prompts), for the compiler's region tree."""
        idx = self._sample_rows(len(X))
        Xs = X.iloc[idx] if hasattr(X, "iloc") else np.asarray(X)[idx]
        out = self.pipeline_.named_steps["prep"].transform(Xs)
        return np.asarray(out.toarray() if hasattr(out, "toarray") else out, dtype=np.float64)

    # -- deciding ------------------------------------------------------------------------
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

    def explain(self, X) -> list[tuple[str, str]]:
        picks, fell = self.predict_with_fallback(X)
        name = type(self).__name__
        return [(str(m), f"{name}: no mode looked safe, fallback ({self.fallback}) chose {m}" if f
                 else f"{name}: most likely fastest safe mode {m}") for m, f in zip(picks, fell)]

    # -- the risk score a certification calibrates (routers.certified) ------------------
    #: the threshold at which every pick falls back
    strictest_threshold = float("inf")

    def loosest_threshold(self) -> float | None:
        """The loosest threshold a certification may choose; None: no guard, no risk score."""
        return self.safety_threshold

    def risk_scores(self, X) -> np.ndarray:
        """What the threshold is compared with: each mode's predicted P(safe)."""
        return self.safety_proba(X).ravel()

    def set_risk_threshold(self, threshold: float | None):
        """Decide with ``threshold`` from now on (None: nothing certified, the reference)."""
        self.safety_threshold_ = threshold
        return self

    # -- the fitted decision as plain data (what the compiler reads) --------------------
    def fitted_state(self) -> FittedState:
        """The fitted decision as plain data (:mod:`modeswitch.routers.fitted_state`): the input
        layout, the classes and the family's model (``_estimator_state``)."""
        check_is_fitted(self, "pipeline_")
        if self.safety_threshold is not None:
            raise ValueError("routers with a safety guard are not compiled yet; compile without it")
        clf = self.pipeline_.named_steps["clf"]
        if isinstance(clf, DummyClassifier):
            raise TypeError("one class in training: a constant router, nothing to compile")
        return FittedState(tuple(self.classes_), self._input_layout(), self._estimator_state(clf),
                           sample=getattr(self, "X_sample_", None),
                           content=self.content_table(required=False))

    def _estimator_state(self, clf):
        """The fitted classifier ``clf`` as a :class:`~modeswitch.routers.fitted_state.TreeEnsemble` or
        :class:`~modeswitch.routers.fitted_state.LinearModel` (see :mod:`modeswitch.routers.families.readers`);
        a family that defines none is served through its pipeline."""
        raise TypeError(f"{type(self).__name__} does not describe its fitted {type(clf).__name__} "
                        "(define _estimator_state to compile it)")

    def _input_layout(self) -> InputLayout:
        """The classifier's input columns: feature set A's numbers, then the one-hot ones."""
        prep = self.pipeline_.named_steps["prep"]
        n_num, fam, suite, names = 0, (), (), ()
        for name, trans, cols in prep.transformers_:
            if name == "num":
                n_num = len(cols)
                if isinstance(cols, list) and cols and isinstance(cols[0], str):
                    names = numeric_layout(cols)
            elif name == "cat":
                for c, cats in zip(cols, trans.categories_):
                    if c == CATEGORICAL_FEATURES[0]:
                        fam = tuple(str(x) for x in cats)
                    else:
                        suite = tuple(str(x) for x in cats)
        return InputLayout(n_num, fam, suite, names)

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

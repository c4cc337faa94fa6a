"""What every learned router family shares (:class:`LearnedRouter`).

Every learned family is one module in this package: a class with its own parameters
and Optuna search space (``_search_space``), and a
:func:`~modeswitch.routers.registry.register_router` call. They come in two kinds, both
subclasses of :class:`LearnedRouter`:

* mode classifiers (:class:`~modeswitch.routers.families.classifier.ModeClassifier`: ``dt``,
  ``rf``, ``lr``, ``lgbm``, plug-ins): learn the oracle's label;
* cost-predicting routers (:mod:`modeswitch.routers.families.cost`: ``cost_linear``,
  ``cost_lgbm``): learn each mode's cost and risk, then pick.

Parameters are keyword-only and each is declared once, by the class that uses it: a
family's ``__init__`` lists its own and hands the rest (``**shared``) to its base.
scikit-learn reads the parameters from ``__init__``'s signature, so each class's
signature is the union along its bases (:meth:`LearnedRouter.__init_subclass__`):
``get_params``, ``clone``, ``check_estimator`` and Optuna see every parameter, and a
family repeats none. A library's parameters that two kinds share are one mixin
(:mod:`.lightgbm_params`, :mod:`.logistic_params`). A certified threshold is not a
parameter of any family: wrap the router in :class:`modeswitch.routers.certified.CertifiedRouter`.
"""

from __future__ import annotations

import inspect

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.compose import ColumnTransformer
from sklearn.preprocessing import OneHotEncoder, StandardScaler

from modeswitch.dataset.errors import InputError
from modeswitch.dataset.features import (
    CATEGORICAL_FEATURES,
    feature_columns,
    features_frame,
    reads_content,
)
from modeswitch.dataset.requests import Request
from modeswitch.engine.content_table import content_table
from modeswitch.routers.base import RouterMixin
from modeswitch.routers.compiler import compile as compile_router
from modeswitch.routers.fitted_state import FittedState


def column_prep(num: list, cat: list, scale: bool) -> ColumnTransformer:
    """The learned routers' input step: numeric features (scaled where the model needs
    it), categorical ones one-hot encoded with unknown categories ignored."""
    parts = [("num", StandardScaler() if scale else "passthrough", num)]
    if cat:
        parts.append(("cat", OneHotEncoder(handle_unknown="ignore"), cat))
    return ColumnTransformer(parts)


def _keyword_parameters(function) -> list[inspect.Parameter]:
    return [p for p in inspect.signature(function).parameters.values() if p.kind is p.KEYWORD_ONLY]


class LearnedRouter(RouterMixin, BaseEstimator):
    """The parameters every learned family shares, and what they all do alike.

    ``feature_set``: a registered feature set (:data:`modeswitch.dataset.features.FEATURE_SETS`):
    ``"A"`` (request shape), ``"B"`` (A + family and benchmark suite, one-hot encoded),
    ``"C"`` (A + the prompt's content). ``content_model``: the checkpoint folder whose
    content table (:mod:`modeswitch.engine.content_table`) turns a raw request's token ids into
    content features; only a feature set that reads content needs it, and only to
    route raw requests (fitting reads the training table's columns). ``random_state``:
    every random draw of the fit (the model's own, the safety models', the training
    sample the compiler keeps)."""

    decision_path = "pipeline"
    #: numeric features standardised (models that need it)
    _scale = False
    #: training rows kept (model inputs after preprocessing) to tell compile where traffic is
    sample_rows = 2000

    def __init__(self, *, feature_set="A", content_model=None, random_state=0):
        self.feature_set = feature_set
        self.content_model = content_model
        self.random_state = random_state

    def __init_subclass__(cls, **kwargs):
        """Give each class an ``__init__`` whose signature scikit-learn reads its parameters
        from: the keyword-only parameters every class along its bases declares in its own
        ``__init__`` (each hands the rest on as ``**shared``), in that order."""
        super().__init_subclass__(**kwargs)
        init = cls.__dict__.get("__init__")
        cls._own_parameters = tuple(_keyword_parameters(init)) if init is not None else ()
        if init is None:  # parameters from several bases (a mixin's and a kind's): one signature
            def init(self, **params):
                super(cls, self).__init__(**params)

            init.__qualname__ = f"{cls.__qualname__}.__init__"
            cls.__init__ = init
        params, seen = [], set()
        for klass in cls.__mro__:
            for p in klass.__dict__.get("_own_parameters", ()):
                if p.name not in seen:
                    seen.add(p.name)
                    params.append(p)
        self_param = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
        init.__signature__ = inspect.Signature([self_param, *params])

    # -- tuning ------------------------------------------------------------------------
    #: raised when the search space changes, so a family's Optuna studies start anew
    #: (routers.training.trainer names them with it) instead of resuming trials drawn
    #: from the old space, which would count against the new one's budget
    search_space_version = 1

    @classmethod
    def _search_space(cls, trial) -> dict:  # pragma: no cover - abstract
        """The family's own hyperparameters for one Optuna trial."""
        raise NotImplementedError

    @classmethod
    def search_space(cls, trial) -> dict:
        """Parameters for one Optuna trial."""
        return cls._search_space(trial)

    # -- inputs ------------------------------------------------------------------------
    def _feature_columns(self, X) -> tuple[list | None, list | None]:
        """(numeric, categorical) columns of the feature set in frame ``X``; (None, None)
        for an array or a frame without the feature names (all numeric)."""
        if not hasattr(X, "columns"):
            return None, None
        wanted = list(feature_columns(self.feature_set))
        missing = [c for c in wanted if c not in X.columns]
        if len(missing) == len(wanted):
            return None, None
        if missing:
            raise ValueError(f"{type(self).__name__}: feature frame lacks {', '.join(missing)} "
                             f"(feature set {self.feature_set})")
        return ([c for c in wanted if c not in CATEGORICAL_FEATURES],
                [c for c in wanted if c in CATEGORICAL_FEATURES])

    def _sample_rows(self, n: int) -> np.ndarray:
        """Up to ``sample_rows`` of ``n`` training rows (sorted), kept for the compiler:
        it spends its region-tree budget where these lie."""
        rng = np.random.default_rng(0)
        return np.sort(rng.choice(n, size=min(n, self.sample_rows), replace=False))

    # -- the Router protocol -------------------------------------------------------------
    def content_table(self, required: bool = True):
        """The content table a raw request's token ids are read through (None for a
        feature set that reads no content, or without ``content_model`` when not
        ``required``: a compiled router then decides on ready rows only)."""
        if not reads_content(self.feature_set) or (self.content_model is None and not required):
            return None
        if self.content_model is None:
            raise InputError(f"{type(self).__name__}: feature set {self.feature_set} reads the prompt's content; "
                             "give content_model (the checkpoint whose token ids the requests carry)")
        return content_table(str(self.content_model))

    def route(self, request: Request) -> str:
        """One decision through the scikit-learn pipeline (milliseconds; ``compile()``
        gives the microsecond path)."""
        return str(self.predict(features_frame([request], self.feature_set, content=self.content_table()))[0])

    def fitted_state(self) -> FittedState:  # pragma: no cover - abstract
        """The fitted decision as plain data (:mod:`modeswitch.routers.fitted_state`), for the compiler."""
        raise NotImplementedError

    def compile(self, region_budget: tuple | None = None, distil: str = "auto"):
        """The compiled router (same decisions, C kernel; a slow ensemble distilled into
        one tree, its agreement in ``distilled_``: :func:`modeswitch.routers.compiler.compile_state`),
        or None with ``compile_reason_``."""
        try:
            return compile_router(self, region_budget, distil)
        except (ValueError, TypeError, RuntimeError) as exc:  # e.g. a safety guard, no C compiler
            self.compile_reason_ = str(exc).splitlines()[0]
            return None


LearnedRouter._own_parameters = tuple(_keyword_parameters(LearnedRouter.__init__))

"""Routers that learn nothing from features: one fixed mode, and the oracle.

* :class:`FixedModeRouter` always answers one mode. With the default (``mode=None``)
  that is the registry's reference mode: the speedup-1.0 line every router is
  measured against; ``modeswitch serve --router mode:NAME`` uses it as a baseline.
* :class:`OracleRouter` answers each request's oracle label from the training table.
  It is an upper bound, not a deployable router: it needs every mode's measured cost
  of that very request, so ``fit`` takes the table and ``route`` only knows requests
  that were in it.
"""

from __future__ import annotations

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.utils.validation import check_is_fitted

from modeswitch.dataset.errors import InputError
from modeswitch.dataset.requests import Request
from modeswitch.engine.modes import reference_mode
from modeswitch.routers.base import RouterMixin
from modeswitch.routers.registry import RouterFamily, register_router


class FixedModeRouter(RouterMixin, BaseEstimator):
    """Always ``mode`` (default: the reference mode)."""

    def __init__(self, mode: str | None = None):
        self.mode = mode

    def fit(self, X=None, y=None, **fit_params):
        self.mode_ = self.mode if self.mode is not None else reference_mode().name
        self.modes_ = [self.mode_]
        self.classes_ = np.array(self.modes_, dtype=object)
        return self

    def route(self, request: Request) -> str:
        return self.mode_

    def predict(self, X) -> np.ndarray:
        check_is_fitted(self, "mode_")
        return np.full(len(X), self.mode_, dtype=object)

    def explain(self, X) -> list[tuple[str, str]]:
        check_is_fitted(self, "mode_")
        why = "the reference mode" if self.mode is None else "a fixed mode"
        return [(self.mode_, f"always {self.mode_} ({why})")] * len(X)


class OracleRouter(RouterMixin, BaseEstimator):
    """The training table's label per request (``fit(table)``: needs ``request_id`` and
    ``label`` columns)."""

    def fit(self, X, y=None, **fit_params):
        if "label" not in X.columns or "request_id" not in X.columns:
            raise InputError("OracleRouter.fit needs the training table (request_id and label columns)")
        self.labels_ = dict(zip(X["request_id"].astype(str), X["label"].astype(str)))
        self.modes_ = sorted(set(self.labels_.values()))
        self.classes_ = np.array(self.modes_, dtype=object)
        return self

    def route(self, request: Request) -> str:
        check_is_fitted(self, "labels_")
        try:
            return self.labels_[str(request.id)]
        except KeyError:
            raise LookupError(f"the oracle knows only the table's requests; {request.id!r} is not one") from None

    def predict(self, X) -> np.ndarray:
        if "label" in getattr(X, "columns", ()):
            return X["label"].to_numpy(dtype=object)
        check_is_fitted(self, "labels_")
        ids = X["request_id"] if "request_id" in getattr(X, "columns", ()) else X.index
        return np.array([self.labels_[str(i)] for i in ids], dtype=object)

    def explain(self, X) -> list[tuple[str, str]]:
        return [(str(m), "the oracle's label (fastest mode meeting every constraint)")
                for m in self.predict(X)]


register_router(RouterFamily("reference", FixedModeRouter, "always the reference mode (or mode=NAME)",
                             learned=False))
register_router(RouterFamily("oracle", OracleRouter, "the training table's label: an upper bound",
                             learned=False))

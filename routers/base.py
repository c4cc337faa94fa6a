"""The router interface every router implements: rule, learned, fixed-mode and oracle.

Scoring, the overhead timer, export and the server call only what this protocol
names, so they never probe a router's attributes to find out what kind it is:

* ``route(request) -> mode``: one decision from a raw :class:`~modeswitch.dataset.requests.Request`
  (the serving path);
* ``predict(X)`` / ``predict_with_fallback(X)``: decisions for a feature frame (the
  batch path; the second also says which rows fell back to a safe default);
* ``explain(X)``: (mode, reason) per row;
* ``modes_``: every mode the fitted router can answer (fallbacks included);
* ``compile()``: a faster router making the same decisions, or ``None`` with the
  reason in ``compile_reason_`` (the rule and fixed-mode routers are already plain
  Python; learned routers go through :mod:`modeswitch.routers.compiler`).

Every router is a scikit-learn estimator too (``__init__`` stores parameters,
``fit`` returns self), so it can be cloned and tuned.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

from modeswitch.dataset.requests import Request


@runtime_checkable
class Router(Protocol):
    modes_: list[str]
    #: how ``route`` decides: "python" (plain code) or "pipeline" (scikit-learn)
    decision_path: str
    compile_reason_: str

    def fit(self, X=None, y=None, **fit_params) -> Router: ...

    def route(self, request: Request) -> str: ...

    def predict(self, X) -> np.ndarray: ...

    def predict_with_fallback(self, X) -> tuple[np.ndarray, np.ndarray]: ...

    def explain(self, X) -> list[tuple[str, str]]: ...

    def compile(self): ...


class RouterMixin:
    """Defaults for the parts of :class:`Router` most routers share: no fallbacks, one
    reason for every decision, nothing to compile."""

    decision_path = "python"
    #: why ``compile()`` returned None (set by ``compile``)
    compile_reason_ = "plain Python: nothing to compile"

    def predict_with_fallback(self, X) -> tuple[np.ndarray, np.ndarray]:
        picks = np.asarray(self.predict(X), dtype=object)
        return picks, np.zeros(len(picks), dtype=bool)

    def explain(self, X) -> list[tuple[str, str]]:
        name = type(self).__name__
        return [(str(m), f"{name} chose {m}") for m in self.predict(X)]

    def compile(self):
        return None

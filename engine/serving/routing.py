"""One routing decision per request: the router's features, its answer, and the fallback.

A router that raises, exceeds ``route_budget_us`` or answers a mode the engines
here lack does not fail the request: the reference mode serves it, and the
reason is counted (``modeswitch_fallbacks_total``), logged and returned to the
client, so a bad router degrades to the baseline visibly rather than to errors.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from dataset.requests import Request, serving_request
from engine.serving.state import RoutesRequests, ServerState

log = logging.getLogger("modeswitch.serve")


@dataclass(frozen=True)
class Decision:
    mode: str
    route_us: float
    #: why the reference serves instead of the router's answer ("error", "over_budget",
    #: "unknown_mode"); None when the router's answer is served
    fallback: str | None


def request_features(state: ServerState, rid: str, prompt_tokens: int, max_tokens: int,
                     shared_prefix: int, concurrent: int) -> Request:
    """The router's view of a request: taken from the request itself and the server now,
    with the same meaning as in the profiles it was trained on (``max_tokens`` as the
    expected output; memory pressure 0 on CPU, as in the profiler). ``shared_prefix``
    comes from the server's prefix index (a stage of its own: it indexes the prompt too)."""
    return serving_request(rid, prompt_tokens, max_tokens, shared_prefix, concurrent,
                           memory_pressure(state.config.device))


def memory_pressure(device: str) -> float:
    if device.startswith("cuda"):
        import torch

        free, total = torch.cuda.mem_get_info()
        return 1.0 - free / total
    return 0.0  # as in the profiler: no accelerator memory to be short of on CPU


def decide(state: ServerState, router: RoutesRequests, request: Request) -> Decision:
    """The mode to serve ``request`` with, timed; a failed decision becomes the reference's."""
    t0 = time.perf_counter_ns()
    mode, reason = _ask(router, request, state.config.reference)
    us = (time.perf_counter_ns() - t0) / 1e3
    reason = reason or _overruled(state, mode, us)
    if reason:
        mode = state.config.reference
        state.metrics.fallbacks.labels(reason).inc()
    state.metrics.routing.observe(us / 1e6)
    state.metrics.stages["route"].observe(us / 1e6)
    return Decision(mode, us, reason)


def _ask(router: RoutesRequests, request: Request, reference: str) -> tuple[str, str | None]:
    try:
        return str(router.route(request)), None
    except Exception as exc:  # noqa: BLE001 - any router failure sends the request to the reference
        log.warning("router raised %s: %s; using %s", type(exc).__name__, exc, reference)
        return reference, "error"


def _overruled(state: ServerState, mode: str, us: float) -> str | None:
    """Why the router's answer cannot be served, or None when it can."""
    cfg = state.config
    if us > cfg.route_budget_us:
        log.warning("router took %.0f us (budget %.0f us); using %s", us, cfg.route_budget_us, cfg.reference)
        return "over_budget"
    if mode not in state.modes:
        log.warning("router chose %s, which this engine does not offer; using %s", mode, cfg.reference)
        return "unknown_mode"
    return None

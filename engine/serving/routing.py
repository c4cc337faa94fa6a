"""One routing decision per request: the router's features, its answer, and the fallback.

A router that raises, exceeds ``route_budget_us`` or answers a mode the engines
here lack does not fail the request: the reference mode serves it, and the
reason is counted (``modeswitch_fallbacks_total``), logged and returned to the
client, so a bad router degrades to the baseline visibly rather than to errors.

Why :func:`route` is one flat function: under load its code runs once per request
between HTTP parsing, JSON and the engine's own work, so its instructions and data
are no longer in the CPU caches, and each Python frame or global lookup in the timed
window costs several times what it does in a hot loop (``bench/serving_path.py``
times this function warm and cold, and what it records). The features and the
decision share one frame, the memory pressure is read from the state (kept current
off the serving path), and the checks and metrics come after the window. What is
left is the router's ``Request`` (also the engine's input), built inline (a call to
``modeswitch.dataset.requests.serving_request`` would be one more frame, and a frame costs
more cold than warm), and its answer. Under load (``make bench-serve``) the server's
histograms time ``serving_route`` and each of its stages; between runs the machine's
state moves them more than the code left in the window does (figures in
docs/results.md).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from modeswitch.dataset.requests import Request
from modeswitch.engine.serving.state import RoutesRequests, ServerState

log = logging.getLogger("modeswitch.serve")

_clock = time.perf_counter_ns
_new = object.__new__


@dataclass(frozen=True)
class Decision:
    mode: str
    route_us: float
    #: why the reference serves instead of the router's answer ("error", "over_budget",
    #: "unknown_mode"); None when the router's answer is served
    fallback: str | None


def route(state: ServerState, router: RoutesRequests, rid: str, prompt_tokens: int, max_tokens: int,
          shared_prefix: int, concurrent: int, prompt_token_ids=None) -> tuple[Request, Decision]:
    """The router's view of a request and the mode to serve it with, both timed.

    The view is taken from the request itself and the server now, with the same meaning
    as in the profiles the router was trained on (``max_tokens`` as the expected output;
    memory pressure 0 on CPU, as in the profiler; ``shared_prefix`` from the server's
    prefix index, a stage of its own). The ``features`` stage times the view, ``route``
    (and ``modeswitch_routing_seconds``) the decision alone, ``serving_route`` both; a
    failed decision becomes the reference's."""
    t0 = _clock()
    request = _new(Request)  # serving_request's body, inlined: one frame fewer in the window
    d = request.__dict__
    d["id"] = rid
    d["prompt_tokens"] = prompt_tokens
    d["expected_output_tokens"] = max_tokens
    d["shared_prefix_tokens"] = shared_prefix
    d["concurrent_requests"] = concurrent
    d["memory_pressure"] = state.memory_pressure
    d["prompt_token_ids"] = prompt_token_ids  # what a router reading the prompt's content reads
    t1 = _clock()
    try:
        mode = router.route(request)
        reason = None
    except Exception as exc:  # noqa: BLE001 - any router failure sends the request to the reference
        mode, reason = None, exc
    t2 = _clock()
    if reason is None and type(mode) is not str:  # a NumPy str_ from a predict(), or worse
        try:
            mode = str(mode)
        except Exception as exc:  # noqa: BLE001
            reason = exc
    us = (t2 - t1) / 1e3
    stage = state.metrics.stages
    stage["features"].observe((t1 - t0) / 1e9)
    stage["route"].observe(us / 1e6)
    stage["serving_route"].observe((t2 - t0) / 1e9)
    state.metrics.routing.observe(us / 1e6)
    cfg = state.config
    if reason is not None:
        log.warning("router raised %s: %s; using %s", type(reason).__name__, reason, cfg.reference)
        reason = "error"
    else:
        reason = _overruled(state, mode, us)
    if reason:
        mode = cfg.reference
        state.metrics.fallbacks.labels(reason).inc()
    return request, Decision(mode, us, reason)


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


def memory_pressure(device: str) -> float:
    """The fraction of the accelerator's memory taken (0 on CPU, as in the profiler: no
    accelerator memory to be short of)."""
    if device.startswith("cuda"):
        import torch  # lazy: torch is heavy

        free, total = torch.cuda.mem_get_info(torch.device(device))
        return 1.0 - free / total
    return 0.0


def read_memory_pressure(state: ServerState, failed: set[str]) -> None:
    """``state.memory_pressure`` read now; a failed reading is logged (once per kind of
    error in ``failed``) and the last value kept: a reading must never stop the server."""
    try:
        state.memory_pressure = memory_pressure(state.config.device)
    except Exception as exc:  # noqa: BLE001
        if type(exc).__name__ not in failed:
            failed.add(type(exc).__name__)
            log.warning("memory pressure not read (%s: %s); keeping %.2f", type(exc).__name__, exc,
                        state.memory_pressure)


def start_memory_tracking(state: ServerState) -> asyncio.Task | None:
    """On CUDA: ``state.memory_pressure`` read now (the first requests see it too), then
    kept current by :func:`track_memory_pressure`, both logging a failed reading into one
    set (a failing device is logged once, not once at start-up and once by the tracker).
    None on CPU, where it stays 0. Call on the server's loop."""
    if not state.config.device.startswith("cuda"):
        return None
    failed: set[str] = set()
    read_memory_pressure(state, failed)
    return asyncio.create_task(track_memory_pressure(state, failed=failed))


async def track_memory_pressure(state: ServerState, every_s: float = 0.1,
                                failed: set[str] | None = None) -> None:
    """Keep ``state.memory_pressure`` current on CUDA, every ``every_s`` seconds, not per
    request: a ``cudaMemGetInfo`` per request would cost microseconds inside routing, and
    the memory taken moves on the scale of engine loads and KV-cache growth, not
    requests. The first reading is taken at once (before any request is served).
    ``failed``: the kinds of failed reading already logged (shared with a reading taken
    before, so a failing device is logged once, not once there and once here)."""
    failed = set() if failed is None else failed
    while True:
        read_memory_pressure(state, failed)
        await asyncio.sleep(every_s)

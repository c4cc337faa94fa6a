"""Routing overhead measured the way serving pays it.

One decision = feature extraction + prediction from a raw request object, as the
server calls it. All routers are measured in one process on the same request
stream, after warm-up, with the garbage collector paused during timing, the
routers' decisions interleaved in rounds (:func:`time_side_by_side`); the
result is p50/p95/p99 in microseconds plus batch throughput (decisions/s) on a
ready feature frame.

Learned routers are measured in their compiled form by default
(:func:`modeswitch.routers.compiler.compile`); ``compiled=False`` measures the study's path (a
one-row DataFrame through the scikit-learn pipeline), which costs milliseconds, so
it gets fewer decisions.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass

import numpy as np

from modeswitch.dataset.features import features_frame


@dataclass
class Overhead:
    router: str
    path: str
    decisions: int
    p50_us: float
    p95_us: float
    p99_us: float
    batch_per_s: float | None
    #: the compiled decision's model: outputs, trees and nodes in the kernel
    outputs: int | None = None
    trees: int | None = None
    nodes: int | None = None
    #: share of the stream's requests on which the served decision equals the uncompiled
    #: router's (1.0 by construction unless distilled: then measured, never assumed)
    agreement: float | None = None
    #: where the decision was distilled: from what, and its agreement on training and
    #: synthetic rows (routers.compiler.distil)
    distilled: str = ""

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def decision_function(router, compiled: bool = True):
    """(callable(request) -> mode, path description, compiled router or None) for one
    decision from a raw request; the compiled router also serves batch throughput."""
    reason = ""
    if compiled:
        fast = router.compile()
        if fast is not None:
            return fast.route, "compiled (distilled)" if fast.distilled_ else "compiled", fast
        reason = router.compile_reason_
    path = router.decision_path
    if path == "pipeline" and reason:
        path += f" (not compiled: {reason})"
    return router.route, path, None


def time_decisions(fn, requests, n: int, warmup: int = 500) -> np.ndarray:
    """Per-decision wall times in microseconds."""
    m = len(requests)
    for i in range(min(warmup, n)):
        fn(requests[i % m])
    times = np.empty(n, dtype=np.int64)
    gc_was = gc.isenabled()
    gc.disable()
    try:
        for i in range(n):
            r = requests[i % m]
            t0 = time.perf_counter_ns()
            fn(r)
            times[i] = time.perf_counter_ns() - t0
    finally:
        if gc_was:
            gc.enable()
    return times / 1e3


def time_side_by_side(functions: dict, requests, n: int, rounds: int = 10, warmup: int = 500) -> dict:
    """Per-decision wall times (µs) of several decision functions, interleaved: each
    round times ``n / rounds`` decisions of every function in turn, so drift in the
    machine's speed (other tenants, frequency) falls on all of them alike instead of
    on whichever was measured during a slow spell."""
    for fn in functions.values():
        time_decisions(fn, requests, warmup, warmup)
    per = max(1, n // rounds)
    parts = {name: [] for name in functions}
    offset = 0
    for _ in range(rounds):
        for name, fn in functions.items():
            parts[name].append(time_decisions(fn, requests[offset:] + requests[:offset], per, warmup=0))
        offset = (offset + per) % len(requests)
    return {name: np.concatenate(p) for name, p in parts.items()}


def batch_throughput(router, frame, compiled_router=None, min_rows: int = 100_000) -> float | None:
    """Decisions per second on a ready feature frame: the compiled kernel when given,
    else the router's own ``predict``."""
    if compiled_router is not None:
        M = compiled_router.matrix(frame)
        M = np.ascontiguousarray(np.tile(M, (max(1, min_rows // len(M)), 1)))
        compiled_router.predict_matrix(M[:100])
        t0 = time.perf_counter()
        compiled_router.predict_matrix(M)
        return len(M) / (time.perf_counter() - t0)
    router.predict(frame.iloc[:10])
    t0 = time.perf_counter()
    router.predict(frame)
    return len(frame) / (time.perf_counter() - t0)


def agreement(router, compiled_router, frame) -> float | None:
    """Share of ``frame``'s rows on which the compiled decision equals the router's own
    ``predict`` (None without a compiled router)."""
    if compiled_router is None or not len(frame):
        return None
    return float((np.asarray(compiled_router.predict(frame), dtype=object)
                  == np.asarray(router.predict(frame), dtype=object)).mean())


def decision_functions(routers: dict, compiled: bool = True) -> dict:
    """name -> (fn, path, compiled router or None) for every router; built once, shared by
    the overhead and live measurements."""
    return {name: decision_function(r, compiled) for name, r in routers.items()}


def measure(routers: dict, requests, decisions: int = 20_000, pipeline_decisions: int = 300,
            compiled: bool = True, progress=None,
            functions: dict | None = None, frame=None) -> dict[str, Overhead]:
    """Overhead of every router (name -> fitted router) on the same request stream;
    ``functions`` reuses :func:`decision_functions` already built. ``frame``: the
    requests' rows for batch throughput and agreement (the training table's rows, which
    hold content columns too); default: their shape features."""
    frame = features_frame(requests, "B", with_context=True) if frame is None else frame
    functions = functions if functions is not None else decision_functions(routers, compiled)
    fast = {name: f[0] for name, f in functions.items() if not f[1].startswith("pipeline")}
    if progress is not None and fast:
        progress(f"routing overhead: {', '.join(fast)} side by side ({decisions} decisions each)")
    times = time_side_by_side(fast, requests, decisions, warmup=min(500, decisions)) if fast else {}
    out = {}
    for name, (fn, path, comp) in functions.items():
        if name not in times:
            n = min(decisions, pipeline_decisions)
            if progress is not None:
                progress(f"routing overhead: {name} ({path}, {n} decisions)")
            times[name] = time_decisions(fn, requests, n, warmup=min(500, n))
        t = times[name]
        size = comp.size_ if comp is not None else {}
        out[name] = Overhead(name, path, len(t), float(np.percentile(t, 50)), float(np.percentile(t, 95)),
                             float(np.percentile(t, 99)), batch_throughput(routers[name], frame, comp),
                             size.get("outputs"), size.get("trees"), size.get("nodes"),
                             agreement(routers[name], comp, frame),
                             comp.distilled_.describe() if comp is not None and comp.distilled_ else "")
    return out

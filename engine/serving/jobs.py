"""One request's life on the server between its body and its response: admitted (counted
in flight, routed), given its mode's engine, and finished (counted out, measured).

An admitted request is counted out exactly once, whether served, failed or its
client gone mid-stream: by :func:`finish` once it has its engine, by
:func:`acquire_engine` when that fails to load. So ``in_flight`` (a routing
feature) never drifts.
"""

from __future__ import annotations

import time
import uuid
from contextlib import AbstractAsyncContextManager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fastapi import HTTPException
from fastapi.concurrency import run_in_threadpool

from modeswitch.dataset.requests import Request
from modeswitch.engine.serving.config import ServerConfig
from modeswitch.engine.serving.routing import Decision, route
from modeswitch.engine.serving.state import ServerState

if TYPE_CHECKING:
    from modeswitch.engine.backends.base import Engine


@dataclass
class Job:
    """An admitted request: what the response builders and its bookkeeping need."""

    id: str
    endpoint: str
    chat: bool
    ids: list[int]
    max_tokens: int
    request: Request
    decision: Decision
    #: after routing: request latency counts the engine's part (routing has its own metric)
    started: float = field(default_factory=time.perf_counter)

    @property
    def mode(self) -> str:
        return self.decision.mode

    @property
    def headers(self) -> dict[str, str]:
        return {"x-modeswitch-mode": self.mode, "x-modeswitch-route-us": f"{self.decision.route_us:.2f}",
                "x-modeswitch-request-id": self.id}

    @property
    def info(self) -> dict:
        """The ``modeswitch`` field of the response body."""
        d = self.decision
        return {"mode": d.mode, "route_us": round(d.route_us, 3), "fallback": d.fallback}


def check_limits(cfg: ServerConfig, ids: list[int], max_tokens: int, context: int | None = None) -> None:
    if not ids:
        raise HTTPException(400, "the prompt is empty")
    if max_tokens > cfg.max_tokens_limit:
        raise HTTPException(400, f"max_tokens {max_tokens} exceeds this server's limit {cfg.max_tokens_limit}")
    if context is not None and len(ids) + max_tokens > context:
        raise HTTPException(400, f"the prompt ({len(ids)} tokens) and max_tokens ({max_tokens}) exceed the "
                                 f"model's context of {context} tokens")


class Busy(HTTPException):
    """Every admission slot is taken: 503 with Retry-After, before any work is done."""

    def __init__(self, limit: int):
        super().__init__(503, f"the server is at its limit of {limit} requests at once; retry shortly",
                         headers={"Retry-After": "1"})


def check_capacity(state: ServerState) -> None:
    if state.in_flight >= state.config.max_in_flight:
        state.metrics.errors.labels("busy").inc()
        raise Busy(state.config.max_in_flight)


def admit(state: ServerState, endpoint: str, ids: list[int], max_tokens: int, chat: bool) -> Job:
    """Count the request in and route it, with the router installed now (a reload while it
    runs does not change it)."""
    concurrent = state.enter()
    try:
        router = state.router
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        t0 = time.perf_counter_ns()
        shared = state.prefix.observe(ids)
        t1 = time.perf_counter_ns()
        request, decision = route(state, router, rid, len(ids), max_tokens, shared, concurrent, ids)
    except BaseException:
        state.leave()
        raise
    if state.ledger is not None and callable(getattr(router, "observe", None)):
        state.ledger.issue(rid, router)  # its pick may be fed back, once (engine.serving.feedback)
    state.metrics.stages["prefix"].observe((t1 - t0) / 1e9)
    return Job(rid, endpoint, chat, ids, max_tokens, request, decision)


async def acquire_engine(state: ServerState, job: Job) -> Engine:
    """The job's engine: taken on the event loop when it is loaded (every request but a
    mode's first), else loaded in a thread (loading takes seconds). A load failure counts
    the job out before it propagates."""
    t0 = time.perf_counter()
    eng = state.pool.try_acquire(job.mode)
    if eng is not None:
        state.metrics.stages["load"].observe(time.perf_counter() - t0)
        return eng
    try:
        eng = await run_in_threadpool(state.pool.acquire, job.mode)
        state.metrics.stages["load"].observe(time.perf_counter() - t0)
        return eng
    except BaseException as exc:  # a cancelled wait too: the count must not drift
        state.leave()
        if isinstance(exc, Exception):
            state.metrics.errors.labels("engine_load").inc()
        raise


def run_gate(state: ServerState, job: Job, engine: Engine) -> AbstractAsyncContextManager:
    """Held around ``engine.run``: nothing for a batching engine, whose running batch takes
    concurrent requests in (``batch_across_requests``); the mode's lock otherwise, as
    generation on the other engines is not re-entrant."""
    shared = state.config.batch_across_requests and engine.concurrent_runs
    return nullcontext() if shared else state.pool.lock(job.mode)


def finish(state: ServerState, job: Job) -> None:
    """Give the engine back and count the job out and served."""
    state.pool.release(job.mode)
    state.leave()
    state.metrics.requests.labels(job.mode, job.endpoint).inc()
    state.metrics.latency.labels(job.mode).observe(time.perf_counter() - job.started)

"""What every handler shares: one :class:`ServerState` per app, built at start-up.

Handlers get it through the :data:`State` dependency rather than closing over
``create_app``'s locals, so each handler is a plain module-level function and the
tests and benches can read the same typed state (``app.state.serving``).
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, Protocol

import psutil
from fastapi import Depends
from fastapi import Request as HttpRequest
from fastapi.concurrency import run_in_threadpool

from modeswitch.dataset.requests import Request
from modeswitch.engine.serving.config import (
    EngineFactory,
    ServerConfig,
    backend_engine_factory,
    supported_modes,
)
from modeswitch.engine.serving.feedback import FeedbackLedger
from modeswitch.engine.serving.metrics import Metrics
from modeswitch.engine.serving.pool import EnginePool, PrefixTracker


class RoutesRequests(Protocol):
    """All the server asks of a router (``modeswitch.routers.base.Router`` has it; ``engine`` never
    imports ``routers``, so an exported MLflow model or a test double plugs in too)."""

    def route(self, request: Request) -> str: ...


@dataclass(frozen=True)
class LoadedRouter:
    """A router with how it decides (e.g. ``"compiled"`` or ``"pipeline"``), for ``/health``.

    Only the loader knows how the router it loaded decides, so a loader that wants it
    reported returns this; a bare router is reported with no path.
    """

    router: RoutesRequests
    path: str | None = None

    @classmethod
    def of(cls, loaded: RoutesRequests | LoadedRouter) -> LoadedRouter:
        return loaded if isinstance(loaded, LoadedRouter) else cls(loaded)


#: ``router_loader()``: called at start-up and on every ``POST /admin/reload``
RouterLoader = Callable[[], "RoutesRequests | LoadedRouter"]


@dataclass
class ServerState:
    config: ServerConfig
    #: Hugging Face tokenizer of the served model (prompts in, streamed text out)
    tokenizer: Any
    #: the modes the engines here offer; a router's answer outside them falls back
    modes: list[str]
    router: RoutesRequests
    router_path: str | None
    load_router: RouterLoader
    pool: EnginePool
    metrics: Metrics
    prefix: PrefixTracker = field(default_factory=PrefixTracker)
    #: requests admitted and not finished (a routing feature, and ``/health``)
    in_flight: int = 0
    #: ids issued to requests an adapting router routed (``POST /admin/feedback``)
    ledger: FeedbackLedger | None = None
    #: the served model's context in tokens (prompt + max_tokens must fit in it)
    context_tokens: int = 4096
    #: the router's ``memory_pressure`` feature: 0 on CPU; on CUDA kept current by
    #: ``routing.track_memory_pressure`` every 100 ms (read, not measured, per request)
    memory_pressure: float = 0.0

    def install(self, loaded: RoutesRequests | LoadedRouter) -> None:
        """Serve new requests with ``loaded``; requests in flight keep the router they took."""
        loaded = LoadedRouter.of(loaded)
        self.router, self.router_path = loaded.router, loaded.path

    def enter(self) -> int:
        """Count a request in; returns the count with it (its ``concurrent_requests``)."""
        self.in_flight += 1
        self.metrics.in_flight.inc()
        return self.in_flight

    def leave(self) -> None:
        self.in_flight -= 1
        self.metrics.in_flight.dec()


async def start_state(cfg: ServerConfig, metrics: Metrics, router_loader: RouterLoader,
                      engine_factory: EngineFactory | None = None, tokenizer=None,
                      modes: list[str] | None = None, on_load: Callable[[], None] | None = None,
                      on_unload: Callable[[], None] | None = None) -> ServerState:
    """The state at start-up: tokenizer, offered modes and router loaded once; engines are
    loaded by the pool on their mode's first request (``on_load`` / ``on_unload``: the
    pool's hooks after an engine is loaded / unloaded engines are closed). Anything not
    given comes from the configured backend (the tests pass small fakes instead)."""
    tokenizer = tokenizer if tokenizer is not None else _load_tokenizer(cfg.model_path)
    modes = list(modes) if modes is not None else supported_modes(cfg)
    loaded = LoadedRouter.of(await run_in_threadpool(router_loader))
    pool = EnginePool(engine_factory or backend_engine_factory(cfg, asyncio.get_running_loop()),
                      cfg.memory_budget_mb, base_mb=process_base_mb(cfg.device), on_load=on_load,
                      on_unload=on_unload)
    return ServerState(config=cfg, tokenizer=tokenizer, modes=modes, router=loaded.router,
                       router_path=loaded.path, load_router=router_loader, pool=pool, metrics=metrics,
                       context_tokens=cfg.context_tokens or _context_of(cfg.model_path),
                       ledger=FeedbackLedger(cfg.feedback_window_s))


def _context_of(model_path: str) -> int:
    """The model's context length from its config; 4,096 when it does not say."""
    try:
        from transformers import AutoConfig  # lazy: transformers pulls torch

        conf = AutoConfig.from_pretrained(model_path)
    except (OSError, ValueError):
        return 4096
    for name in ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length"):
        v = getattr(conf, name, None)
        if isinstance(v, int) and v > 0:
            return v
    return 4096


def _load_tokenizer(model_path: str):
    from transformers import AutoTokenizer  # lazy: transformers pulls torch

    return AutoTokenizer.from_pretrained(model_path)


def server_state(request: HttpRequest) -> ServerState:
    return request.app.state.serving


async def _state_dependency(request: HttpRequest) -> ServerState:
    """The dependency form, ``async``: FastAPI runs a plain ``def`` dependency in its
    thread pool, so every request waited for a free thread (40, shared with generation)
    before its handler started."""
    return request.app.state.serving


#: a handler parameter typed ``State`` receives the app's :class:`ServerState`
State = Annotated[ServerState, Depends(_state_dependency)]


def freeze_heap() -> None:
    """Move every object alive now out of the garbage collector's reach, as ``vllm serve``
    does after its start-up (``vllm.utils.gc_utils.freeze_gc_heap``): at start-up the heap
    is torch, transformers, the tokenizer and the router, which live until the server
    stops, and a full collection walks all of it, stalling every request in flight. The
    garbage is collected first, so none is kept. Engines load later and are frozen after
    their load; the heap is thawed, collected and frozen again after the pool unloads one
    (``app._FrozenHeap``). The app's shutdown calls ``gc.unfreeze()``."""
    gc.collect()
    gc.freeze()


def process_base_mb(device: str) -> float:
    """The server's own memory before any engine loads, in MiB: its resident set on CPU
    (where engines share that memory), 0 on CUDA (the budget counts device memory there)."""
    return 0.0 if device.startswith("cuda") else process_rss_mb()


def process_rss_mb() -> float:
    return psutil.Process().memory_info().rss / 2**20

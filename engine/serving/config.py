"""What the server is started with, and what it asks the backend registry from it.

The server knows backends only by name: the modes it offers and the engines it
builds both come from :func:`engine.backends.registry.get_backend`, so a backend
added as a plug-in is served with no edit here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING

from engine.backends.base import EngineSettings
from engine.modes import reference_mode

if TYPE_CHECKING:
    from engine.backends.base import Engine

#: ``factory(mode)``: that mode's engine, loaded and warmed up
EngineFactory = Callable[[str], "Engine"]


@dataclass
class ServerConfig:
    model_path: str
    draft_path: str | None = None
    backend: str = "transformers"
    device: str = "cpu"
    api_key: str | None = None
    #: a slower routing decision sends the request to the reference mode
    route_budget_us: float = 5_000.0
    #: the server's memory: on CPU its own resident set before any engine plus the
    #: engines' weights and reserved KV caches (on CUDA the engines' device memory);
    #: least recently used engines are unloaded first to stay within it (an engine's
    #: ``memory_mb`` where it has one, else its weights)
    memory_budget_mb: float = 4_096.0
    max_tokens_limit: int = 1_024
    served_name: str = "modeswitch"
    #: the fallback mode; the registry's reference, so a renamed reference needs no edit here
    reference: str = field(default_factory=lambda: reference_mode().name)
    #: concurrent requests routed to a continuous-batching engine join its running batch
    batch_across_requests: bool = True
    #: a request body larger than this is refused (413) before it is parsed
    max_body_bytes: int = 8 * 1024 * 1024
    #: requests admitted at once (running or waiting for their engine); more get 503 + Retry-After
    max_in_flight: int = 256
    #: the model's context in tokens (prompt + max_tokens must fit); None: read from the
    #: model's config (``max_position_embeddings``) at start-up
    context_tokens: int | None = None

    def engine_settings(self) -> EngineSettings:
        return EngineSettings(self.model_path, self.draft_path, self.device)


def supported_modes(cfg: ServerConfig) -> list[str]:
    """Every mode the configured backend can serve here, the reference first.

    The registry applies the backend's capabilities and the one draft-model check
    (``ModeConfig.missing_draft``), as the profiler does, so the server never offers
    a mode the profiler would skip.
    """
    from engine.backends.registry import get_backend

    return get_backend(cfg.backend).runnable_modes(cfg.engine_settings())


def backend_engine_factory(cfg: ServerConfig, loop=None) -> EngineFactory:
    """``factory(mode)`` building the configured backend's engine for that mode, loaded and
    warmed up (the first request to a mode pays for its load, later ones do not);
    ``loop``: the server's event loop, which engines that can serve on it use."""
    from engine.backends.registry import get_backend

    return partial(get_backend(cfg.backend).load, settings=cfg.engine_settings(), loop=loop)

"""What the server is started with, and what it asks the backend registry from it.

The server knows backends only by name: the modes it offers and the engines it
builds both come from :func:`modeswitch.engine.backends.registry.get_backend`, so a backend
added as a plug-in is served with no edit here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from functools import partial
from typing import TYPE_CHECKING

from modeswitch.dataset.errors import InputError
from modeswitch.engine.backends import registry
from modeswitch.engine.backends.base import EngineSettings
from modeswitch.engine.modes import reference_mode

if TYPE_CHECKING:
    from modeswitch.engine.backends.base import Engine

#: ``factory(mode)``: that mode's engine, loaded and warmed up
EngineFactory = Callable[[str], "Engine"]


@dataclass
class ServerConfig:
    model_path: str
    draft_path: str | None = None
    backend: str = "transformers"
    device: str = "cpu"
    #: weights per format (``EngineSettings.checkpoints``): vLLM's pre-quantized
    #: checkpoints of the quantized modes, llama.cpp's GGUF types
    checkpoints: dict = field(default_factory=dict)
    api_key: str | None = None
    #: ``POST /admin/feedback`` needs this key (not the API key); None: feedback is off
    admin_key: str | None = None
    #: an outcome is taken for a request at most this long after it was routed
    feedback_window_s: float = 600.0
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
    #: a connection's request headers must be complete this long after it opens (or after
    #: its previous response), else it is closed (:mod:`modeswitch.engine.serving.connections`)
    header_timeout_s: float = 10.0
    #: a request's whole body must arrive this long after its headers, else it is closed
    body_timeout_s: float = 30.0
    #: connections one address may hold; beyond it the address's oldest connection
    #: without a request in progress is closed
    max_connections_per_peer: int = 256
    #: connections sending a request body at once (over all addresses); one more closes
    #: the one that has been sending longest. Such a connection holds no request slot
    max_receiving_bodies: int = 1024
    #: ``/v1/completions`` sends the prompt as written; by default an instruct model (one
    #: with a chat template) gets it as one user turn in its template, as every other
    #: path here (profiler, live scoring, chat) sends it: what the router's features
    #: and the profile describe
    raw_completions: bool = False

    def __post_init__(self):
        """Refuse a limit no server could run with before anything starts (a negative
        memory budget or a max_tokens of 0 started, then refused every request)."""
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name not in _POSITIVE or value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or value <= 0:
                raise InputError(f"--{f.name.replace('_', '-')} {value!r}: must be a positive, finite number")
            if isinstance(value, int) and value > _LARGEST:
                raise InputError(f"--{f.name.replace('_', '-')} {value:,}: larger than this machine can count "
                                 f"({_LARGEST:,})")

    def engine_settings(self) -> EngineSettings:
        return EngineSettings(self.model_path, self.draft_path, self.device, checkpoints=dict(self.checkpoints))


#: the fields that must be positive and finite (their option is --<field-name>)
_POSITIVE = ("route_budget_us", "memory_budget_mb", "max_tokens_limit", "max_body_bytes", "max_in_flight",
             "context_tokens", "header_timeout_s", "body_timeout_s", "max_connections_per_peer",
             "max_receiving_bodies", "feedback_window_s")
#: the largest count a limit may hold (a 64-bit index: larger ones cannot be allocated)
_LARGEST = 2**63 - 1


def supported_modes(cfg: ServerConfig) -> list[str]:
    """Every mode the configured backend can serve here, the reference first.

    The registry applies the backend's capabilities and the one draft-model check
    (``ModeConfig.missing_draft``), as the profiler does, so the server never offers
    a mode the profiler would skip.
    """
    return registry.get_backend(cfg.backend).runnable_modes(cfg.engine_settings())


def backend_engine_factory(cfg: ServerConfig, loop=None) -> EngineFactory:
    """``factory(mode)`` building the configured backend's engine for that mode, loaded and
    warmed up (the first request to a mode pays for its load, later ones do not);
    ``loop``: the server's event loop, which engines that can serve on it use."""
    return partial(registry.get_backend(cfg.backend).load, settings=cfg.engine_settings(), loop=loop)

"""What a backend can run: one :class:`ModeSupport` per registered mode.

Every backend publishes a :class:`BackendCapabilities` so that the profiler can say
which modes it skipped and why, routers can map modes the backend lacks to their
nearest substitute, and profiles record the reference mode and its precision
explicitly (FP16 on GPUs; a CPU backend's native precision, fp32).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

from modeswitch.dataset.requests import Request
from modeswitch.engine.modes import ModeConfig, get_mode, list_modes
from modeswitch.engine.results import Generation


@dataclass(frozen=True)
class ModeSupport:
    mode: str
    supported: bool
    how: str = ""
    reason: str = ""

    def __post_init__(self):
        if self.supported and not self.how:
            raise ValueError(f"{self.mode}: a supported mode must say how it is implemented")
        if not self.supported and not self.reason:
            raise ValueError(f"{self.mode}: an unsupported mode must say why")


@dataclass(frozen=True)
class BackendCapabilities:
    backend: str
    reference_mode: str
    reference_precision: str
    modes: dict[str, ModeSupport] = field(default_factory=dict)

    def __post_init__(self):
        get_mode(self.reference_mode)
        for name in self.modes:
            get_mode(name)
        if not self.support(self.reference_mode).supported:
            raise ValueError(f"{self.backend}: the reference mode must be supported")

    def support(self, mode: str) -> ModeSupport:
        get_mode(mode)
        return self.modes.get(
            mode, ModeSupport(mode, False, reason=f"{self.backend} does not implement {mode}")
        )

    def supported_modes(self) -> list[str]:
        """Supported modes in registry order."""
        return [m.name for m in list_modes() if self.support(m.name).supported]

    def unsupported(self) -> dict[str, str]:
        return {m.name: self.support(m.name).reason for m in list_modes()
                if not self.support(m.name).supported}


# ------------------------------------------------------------------ the engine interface
@dataclass(frozen=True)
class EngineSettings:
    """What every engine of one backend is built with: one model on one machine.

    The profiler, live scoring and the server build engines from this and a mode
    name only (``Backend.engine(mode, settings)``), so each works with every backend.
    Backend-specific settings are ignored by backends that have no use for them.
    """

    model_path: str
    draft_path: str | None = None
    device: str = "cpu"
    #: torch threads (transformers); None: torch's choice
    threads: int | None = None
    #: weights per format, keyed by ``CHECKPOINT_KEYS``: pre-quantized checkpoints of the
    #: quantized modes, e.g. {"int8": PATH} (vLLM), or GGUF types or files (llama.cpp)
    checkpoints: dict = field(default_factory=dict)
    #: fraction of accelerator memory taken before the engine starts (vLLM on CUDA)
    memory_pressure: float = 0.0
    #: the longest sequence (prompt + answer) the engines are sized for, in tokens; None:
    #: the backend's default (a server does not know its traffic). A profile or a live
    #: check knows its requests (:func:`context_for`), and a continuous-batching KV cache
    #: sized for 16 x 8,192 tokens is 6.7 GB on SmolLM2-135M for prompts of 512 tokens
    max_context: int | None = None


def kv_values_per_token(folder) -> int:
    """Keys and values one cached token holds over every layer of the checkpoint in
    ``folder`` (elements, not bytes), read from its ``config.json``; 0 where it does not say.
    Standard attention: a model whose layers share or compress their cache (MLA,
    sliding-window groups) holds less than this per token."""
    try:
        conf = json.loads((Path(folder) / "config.json").read_text())
    except (OSError, ValueError):
        return 0
    conf = conf.get("text_config", conf)
    heads = int(conf.get("num_attention_heads") or 0)
    kv_heads = int(conf.get("num_key_value_heads") or heads)
    head_dim = int(conf.get("head_dim") or (int(conf.get("hidden_size") or 0) // max(heads, 1)))
    return 2 * int(conf.get("num_hidden_layers") or 0) * kv_heads * head_dim


def context_for(requests, page: int = 256, margin: float = 1.5) -> int:
    """A context budget for these requests: the longest prompt + answer, with room for
    the chat template and real text running past its target length (``margin``), rounded
    up to whole ``page``s."""
    longest = max((int(r.prompt_tokens) + int(r.expected_output_tokens) for r in requests), default=0)
    return max(page, -(-int(longest * margin + page) // page) * page)


@runtime_checkable
class Engine(Protocol):
    """One mode of one model, loaded: what the profiler, live scoring and the server use."""

    mode: ModeConfig
    tokenizer: object
    #: what the profile records about how it ran (precision, graph capture, ...)
    info: dict

    @property
    def concurrent_runs(self) -> bool:
        """True when overlapping ``run`` calls share one batch (continuous batching)."""

    @property
    def weights_mb(self) -> float:
        """Resident weights in MiB (fixed once loaded)."""

    def load(self) -> Engine: ...

    def warmup(self) -> None: ...

    def run(self, group: list[tuple[Request, list[int]]], ignore_eos: bool = True,
            on_token: Callable | None = None) -> list[Generation]: ...

    # Optional: ``async def arun(group, ignore_eos=True, on_token=None)``, the same as
    # ``run`` awaited on the caller's event loop without holding a thread for the call
    # (the server uses it where an engine has it: vLLM's AsyncLLM, the continuous-batching
    # manager). Cancelling the awaiting task stops the group's requests.
    #
    # Optional: ``astream(request, ids)``, one request's new token ids as the engine makes
    # them (an async iterator of lists), to be iterated by the caller's own task on the
    # running loop, or None where the engine does not serve on that loop. The server's
    # streams read it directly, without a task of their own between the engine and the
    # response (vLLM's AsyncLLM). Closing the iterator early stops the request.

    # Optional: ``reset_prefix_cache()``, empty the engine's prefix cache (see
    # :func:`start_unit`).

    def weights_bytes(self) -> int: ...

    def close(self) -> None: ...


def start_unit(engine, prime: list[tuple[Request, list[int]]], ignore_eos: bool) -> None:
    """Bring ``engine`` to the state a timed unit starts from: its prefix cache emptied,
    then warmed by the unit's untimed ``prime`` (its shared prefix), if any.

    Why: a prefix cache otherwise keeps whatever the requests before this one left, so
    a unit's latency in a prefix-caching mode would depend on the order of the run (the
    profile's interleaving, a live stream's order, the trial before). The profiler and
    live scoring both start each unit here, so a live run measures what the table did."""
    reset = getattr(engine, "reset_prefix_cache", None)
    if reset is not None:
        reset()
    if prime:
        engine.run(prime, ignore_eos=ignore_eos)

"""Backend registry: ``name -> capabilities, engine class``.

The profiler, live scoring and the server choose a backend by name here and use
only :class:`Backend`'s methods, so a new backend is one module that calls
:func:`register_backend` (the built-in ones are ``transformers_backend`` and
``vllm_backend``; a backend in your own package is found through
``$MODESWITCH_PLUGINS``). Heavy imports (torch, vLLM) stay inside the engines, so
listing backends is cheap.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from modeswitch.dataset.registry import Registry, discover_package
from modeswitch.engine.backends.base import BackendCapabilities, Engine, EngineSettings
from modeswitch.engine.modes import get_mode


@dataclass(frozen=True)
class Backend:
    """A registered backend.

    ``capabilities(settings)`` says how it runs each mode or why not;
    ``engine(mode, settings)`` builds an engine (not loaded yet).
    ``child_processes``: the engine computes in child processes, so CPU energy and
    memory are measured over them too. ``memory_ballast``: on CUDA the engine applies
    a request's memory pressure as memory taken before it starts, so each pressure
    level needs its own engine. ``set_threads(n)``: the engines compute on a
    process-wide CPU thread pool of settable size (torch's), so the profiler can
    measure which size to profile with (None: nothing to tune).
    """

    name: str
    description: str
    capabilities: Callable[[EngineSettings], BackendCapabilities]
    engine: Callable[[str, EngineSettings], Engine]
    child_processes: bool = False
    memory_ballast: bool = False
    set_threads: Callable[[int], None] | None = None

    def applies_ballast(self, device: str) -> bool:
        return self.memory_ballast and device.startswith("cuda")

    def plan(self, settings: EngineSettings, wanted=None) -> tuple[BackendCapabilities, list[str], dict]:
        """(capabilities, modes to run with the reference first, skipped mode -> why)."""
        caps = self.capabilities(settings)
        wanted = list(wanted) if wanted else caps.supported_modes()
        runnable, skipped = [], {}
        for m in wanted:
            s = caps.support(m)
            no_draft = get_mode(m).missing_draft(settings.draft_path)
            if not s.supported:
                skipped[m] = s.reason
            elif no_draft:
                skipped[m] = no_draft
            else:
                runnable.append(m)
        ref = caps.reference_mode
        return caps, [ref] + [m for m in runnable if m != ref], skipped

    def runnable_modes(self, settings: EngineSettings) -> list[str]:
        """Every mode an engine of this backend can serve with these settings."""
        return self.plan(settings)[1]

    def load(self, mode: str, settings: EngineSettings, loop=None) -> Engine:
        """An engine for ``mode``, loaded and warmed up. ``loop``: the server's event loop,
        for an engine that can serve on it (``use_loop``: vLLM's AsyncLLM)."""
        engine = self.engine(mode, settings)
        if loop is not None and hasattr(engine, "use_loop"):
            engine.use_loop(loop)
        engine.load()
        engine.warmup()
        return engine


#: helper modules here are not backends (two import torch at module level: kept off --help)
BACKENDS: Registry[Backend] = Registry("backend", discover_package(
    "modeswitch.engine.backends", skip=("base", "registry", "prefix_cache", "quantize")))


def register_backend(backend: Backend) -> Backend:
    return BACKENDS.register(backend.name, backend)


def get_backend(name: str) -> Backend:
    return BACKENDS.get(name)


def backend_names() -> list[str]:
    return BACKENDS.names()

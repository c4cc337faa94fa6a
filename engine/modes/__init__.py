"""Mode registry: every serving mode registered by name.

Adding a mode is one small file in this package calling :func:`register_mode`
(see ``study.py``); modules here are discovered on first use, as
lm-evaluation-harness discovers tasks.
"""

from __future__ import annotations

from modeswitch.dataset.registry import Registry, UnknownNameError, discover_package
from modeswitch.engine.modes.config import ModeConfig, SpeculativeConfig

#: an unknown mode name (a ``KeyError`` whose message lists the registered modes)
UnknownModeError = UnknownNameError

MODES: Registry[ModeConfig] = Registry("mode", discover_package(__name__, skip=("config",)))


def register_mode(mode: ModeConfig) -> ModeConfig:
    return MODES.register(mode.name, mode)


def get_mode(name: str) -> ModeConfig:
    return MODES.get(name)


def list_modes() -> list[ModeConfig]:
    """All registered modes, in registration order."""
    return MODES.values()


def mode_names() -> list[str]:
    return [m.name for m in list_modes()]


def reference_mode() -> ModeConfig:
    refs = [m for m in list_modes() if m.is_reference]
    if len(refs) != 1:
        raise RuntimeError(f"exactly one reference mode must be registered, found {len(refs)}")
    return refs[0]


def resolve_mode(name: str, available) -> str:
    """The mode to run for ``name`` on a backend offering ``available`` modes.

    Walks the mode's ``substitutes`` (nearest first). Raises when none is
    available rather than falling back to the reference silently.
    """
    available = set(available)
    if name in available:
        return name
    mode = get_mode(name)
    for sub in mode.substitutes:
        if sub in available:
            return sub
    raise LookupError(
        f"mode {name!r} is not available on this backend and none of its substitutes "
        f"({', '.join(mode.substitutes) or 'none declared'}) is; available: {sorted(available)}"
    )


__all__ = [
    "MODES",
    "ModeConfig",
    "SpeculativeConfig",
    "UnknownModeError",
    "get_mode",
    "list_modes",
    "mode_names",
    "reference_mode",
    "register_mode",
    "resolve_mode",
]

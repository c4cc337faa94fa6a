"""Mode registry: every serving mode registered by name.

Adding a mode is one small file in this package calling :func:`register_mode`
(see ``study.py``); modules here are discovered on first use, as
lm-evaluation-harness discovers tasks.
"""

from __future__ import annotations

import importlib
import pkgutil

from engine.modes.config import ModeConfig, SpeculativeConfig

_REGISTRY: dict[str, ModeConfig] = {}
_loaded = False


class UnknownModeError(KeyError):
    def __str__(self):
        return self.args[0]


def register_mode(mode: ModeConfig) -> ModeConfig:
    if mode.name in _REGISTRY and _REGISTRY[mode.name] != mode:
        raise ValueError(f"mode {mode.name!r} is registered twice with different settings")
    _REGISTRY[mode.name] = mode
    return mode


def _load_all() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        if info.name != "config":
            importlib.import_module(f"{__name__}.{info.name}")


def get_mode(name: str) -> ModeConfig:
    _load_all()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownModeError(
            f"unknown mode {name!r}; registered modes: {', '.join(_REGISTRY)}"
        ) from None


def list_modes() -> list[ModeConfig]:
    """All registered modes, in registration order."""
    _load_all()
    return list(_REGISTRY.values())


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

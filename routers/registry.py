"""Router registry: routers are built by name (``rule``, later ``dt``, ``rf``, ...).

Adding a router is one small module in ``routers/`` that calls
:func:`register_router` with a factory; modules listed in ``_MODULES`` are
imported on first lookup.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

_REGISTRY: dict[str, tuple[Callable, str]] = {}
_MODULES = ("routers.rule_baseline", "routers.learned")
_loaded = False


def register_router(name: str, factory: Callable, description: str = "") -> None:
    _REGISTRY[name] = (factory, description)


def _load() -> None:
    global _loaded
    if not _loaded:
        _loaded = True
        for mod in _MODULES:
            importlib.import_module(mod)


def get_router(name: str, **params):
    _load()
    try:
        factory, _ = _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown router {name!r}; registered: {', '.join(sorted(_REGISTRY))}") from None
    return factory(**params)


def list_routers() -> dict[str, str]:
    _load()
    return {k: v[1] for k, v in _REGISTRY.items()}

"""Router registry: every router family by name (``rule``, ``reference``, ``oracle``,
``dt``, ``rf``, ``lr``, ``lgbm``, and any plug-in).

Adding a router family is one small module that defines the estimator and calls
:func:`register_router` with a :class:`RouterFamily`: a learned family's class
carries its own Optuna search space (``search_space(trial)``), so training, scoring,
export and serving need no other edit. Modules in ``routers/families/`` are found by
themselves; a family in your own package is found through ``$MODESWITCH_PLUGINS``
(see :mod:`dataset.registry`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from modeswitch.dataset.registry import Registry, discover_package

#: built-in families, imported in this order (listing order); other modules in
#: routers/families/ follow, sorted by name
_BUILTIN = ("modeswitch.routers.rule_baseline", "modeswitch.routers.reference", "modeswitch.routers.families.dt",
            "modeswitch.routers.families.rf", "modeswitch.routers.families.lr", "modeswitch.routers.families.lgbm")


@dataclass(frozen=True)
class RouterFamily:
    """A registered router family.

    ``factory(**params)`` builds an unfitted estimator. ``learned`` families are
    trained by ``modeswitch train`` (their class has ``search_space(trial) -> params``);
    the others (rule, reference, oracle) are scored beside them.
    """

    name: str
    factory: Callable
    description: str = ""
    learned: bool = True


def _discover() -> None:
    for mod in _BUILTIN:
        importlib.import_module(mod)
    discover_package("modeswitch.routers.families")()


ROUTERS: Registry[RouterFamily] = Registry("router", _discover)


def register_router(family: RouterFamily) -> RouterFamily:
    return ROUTERS.register(family.name, family)


def get_family(name: str) -> RouterFamily:
    return ROUTERS.get(name)


def get_router(name: str, **params):
    """An unfitted router of family ``name`` with ``params``."""
    return ROUTERS.get(name).factory(**params)


def list_routers() -> dict[str, str]:
    """name -> description, in registration order."""
    return {name: f.description for name, f in ROUTERS.items()}


def learned_families() -> list[str]:
    return [name for name, f in ROUTERS.items() if f.learned]

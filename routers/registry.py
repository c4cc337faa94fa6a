"""Router registry: every router family by name (``rule``, ``reference``, ``oracle``,
``dt``, ``rf``, ``lr``, ``lgbm``, and any plug-in).

Adding a router family is one small module that defines the estimator and calls
:func:`register_router` with a :class:`RouterFamily`: a learned family's class
carries its own Optuna search space (``search_space(trial)``), so training, scoring,
export and serving need no other edit. Modules in ``routers/families/`` are found by
themselves; a family in your own package is found through ``$MODESWITCH_PLUGINS``
(see :mod:`modeswitch.dataset.registry`).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass

from modeswitch.dataset.errors import InputError
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


#: parameters a training run sets itself (its --feature-set, the table's content model)
SET_BY_TRAINING = ("feature_set", "content_model")


def check_router_params(router_params: dict) -> None:
    """Refuse fixed router parameters (``{family: {name: value}}``, what ``train
    --router-params`` and study.toml's ``[train.router_params.FAMILY]`` give) that name
    an unknown family, a parameter its estimator does not take, or one training sets
    itself; before any work, not when the family's turn comes."""
    for family, params in router_params.items():
        try:
            factory = get_family(family).factory
        except (KeyError, ValueError) as exc:
            raise InputError(f"router parameters for {family!r}: {exc}") from None
        if not isinstance(params, dict):
            raise InputError(f"router parameters for {family}: expected a table of NAME = VALUE")
        takes = inspect.signature(factory).parameters
        unknown = [k for k in params if k not in takes]
        if unknown:
            raise InputError(f"router parameters for {family}: {family} takes no {', '.join(unknown)}")
        own = [k for k in params if k in SET_BY_TRAINING]
        if own:
            raise InputError(f"router parameters for {family}: {', '.join(own)} is set by training "
                             "(--feature-set; the table's content model)")


def list_routers() -> dict[str, str]:
    """name -> description, in registration order."""
    return {name: f.description for name, f in ROUTERS.items()}


def learned_families() -> list[str]:
    return [name for name, f in ROUTERS.items() if f.learned]

"""One registry type for everything registered by name: modes, workloads, importers,
routers and backends.

As in lm-evaluation-harness, adding an item is one small module that calls the
registry's ``register`` when it is imported; the registry imports its package's
modules (``discover``) on first lookup. The rules are the same everywhere:

* registering the same name twice with an equal item is a no-op (a module imported
  twice, e.g. through two paths, is harmless);
* registering a name again with a different item is an error (two plug-ins must not
  silently replace each other);
* an unknown name is a :class:`UnknownNameError` (a ``KeyError``) listing what is
  registered.

Plug-ins are loaded by every registry on first lookup too, so a researcher's own
router, backend or workload in their own package is found by the CLI without editing
this project. Two ways, both supported:

* an installed package declares an entry point in the group ``modeswitch.plugins``
  (the Python way, as vLLM, pytest and MLflow find theirs)::

      [project.entry-points."modeswitch.plugins"]
      knn = "mylab.knn_router"            # a module: importing it registers
      lite = "mylab.backends:register"    # or a function, called once with no arguments

* the environment variable ``MODESWITCH_PLUGINS`` names importable modules
  (comma-separated), for a module that is not an installed package.

This module lives in ``dataset/`` (the room that imports no other) so every room can
use it.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import warnings
from collections.abc import Callable
from importlib.metadata import entry_points
from types import ModuleType
from typing import Generic, TypeVar

T = TypeVar("T")

PLUGINS_ENV = "MODESWITCH_PLUGINS"
#: the entry-point group installed plug-ins declare themselves in
PLUGINS_GROUP = "modeswitch.plugins"

#: entry points already loaded (name, value): a function plug-in is called once
_loaded_entry_points: set[tuple[str, str]] = set()


class UnknownNameError(KeyError):
    """A name no registry entry has; its message lists the registered names."""

    def __str__(self):
        return self.args[0]


class RegistrationError(ValueError):
    """A name registered twice with different items."""


def import_plugins() -> None:
    """Load the installed ``modeswitch.plugins`` entry points, then import the modules
    named in ``$MODESWITCH_PLUGINS`` (each once)."""
    load_entry_point_plugins()
    for name in os.environ.get(PLUGINS_ENV, "").split(","):
        if name.strip():
            importlib.import_module(name.strip())


def load_entry_point_plugins() -> list[str]:
    """Load every entry point of the ``modeswitch.plugins`` group not loaded yet; return
    their names.

    An entry point naming a module registers by being imported; one naming a callable
    is called once with no arguments. A plug-in that fails to load is reported as a
    warning naming it and skipped, as vLLM does: an installed package that is broken
    must not stop every command of the CLI (a module named in ``$MODESWITCH_PLUGINS``,
    asked for explicitly, still raises)."""
    names = []
    for ep in entry_points(group=PLUGINS_GROUP):
        key = (ep.name, ep.value)
        if key in _loaded_entry_points:
            continue
        _loaded_entry_points.add(key)
        try:
            obj = ep.load()
            if callable(obj) and not isinstance(obj, ModuleType):
                obj()
        except Exception as exc:  # noqa: BLE001 -- any error in foreign code: skip it, say so
            warnings.warn(f"modeswitch plug-in {ep.name!r} ({ep.value}) failed to load and is "
                          f"skipped: {type(exc).__name__}: {exc}", RuntimeWarning, stacklevel=2)
            continue
        names.append(ep.name)
    return names


def discover_package(package: str, skip: tuple[str, ...] = ()) -> Callable[[], None]:
    """A ``discover`` callable importing every module of ``package`` but ``skip``, sorted
    by name (registration order, hence listing order, is stable)."""

    def discover() -> None:
        pkg = importlib.import_module(package)
        for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda i: i.name):
            if info.name not in skip:
                importlib.import_module(f"{package}.{info.name}")

    return discover


class Registry(Generic[T]):
    """Items of one kind by name, in registration order."""

    def __init__(self, kind: str, discover: Callable[[], None] | None = None):
        self.kind = kind
        self._items: dict[str, T] = {}
        self._discover = discover
        self._loaded = discover is None

    def register(self, name: str, item: T) -> T:
        if not name or not isinstance(name, str):
            raise RegistrationError(f"a {self.kind} needs a non-empty name, got {name!r}")
        old = self._items.get(name)
        if old is not None and old != item:
            raise RegistrationError(
                f"{self.kind} {name!r} is registered twice with different settings "
                f"({old!r} and {item!r}); give the new one another name")
        self._items[name] = item
        return item

    def unregister(self, name: str) -> None:
        """Remove an entry (for tests that register temporary items)."""
        self._items.pop(name, None)

    def load(self) -> None:
        if not self._loaded:
            self._loaded = True  # before importing: the modules call register()
            if self._discover is not None:
                self._discover()
            import_plugins()

    def get(self, name: str) -> T:
        self.load()
        try:
            return self._items[name]
        except KeyError:
            raise UnknownNameError(
                f"unknown {self.kind} {name!r}; registered: {', '.join(self._items) or 'none'}"
            ) from None

    def names(self) -> list[str]:
        self.load()
        return list(self._items)

    def values(self) -> list[T]:
        self.load()
        return list(self._items.values())

    def items(self) -> list[tuple[str, T]]:
        self.load()
        return list(self._items.items())

"""``modeswitch``: one CLI for every step of the pipeline.

One module per command or command group, as vLLM's ``entrypoints/cli/``:
:mod:`.registries` (``modes``, ``workloads``, ``requests``), :mod:`.profiles`
(``import-profiles``, ``validate``), :mod:`.label`, :mod:`.route`, :mod:`.dataset`
(``dataset build``), :mod:`.costmodel` (``costmodel validate|fit``), :mod:`.engine` (the
model, profiling, serving), :mod:`.routers` (train, score, export) and :mod:`.study`;
:mod:`.common` holds the ``app`` they register on and what they share,
:mod:`.oracle_options` the constraint and cost-model options of ``label`` and
``dataset build``. Heavy libraries are imported inside each command, so ``modeswitch
--help`` is quick. Errors in user input print one clear line (file, row, field) and
exit 2; other errors keep their traceback, and ``--debug`` shows it for input errors
too.

``modeswitch.cli:main`` is the console script; ``python -m modeswitch`` runs it too.
"""

from __future__ import annotations

from modeswitch.cli import (  # noqa: F401  (importing a module registers its commands)
    costmodel,
    dataset,
    engine,
    label,
    profiles,
    registries,
    route,
    routers,
    study,
)
from modeswitch.cli.common import app

#: ``modeswitch --help`` lists commands in pipeline order, whichever module holds them
_ORDER = ("modes", "workloads", "requests", "import-profiles", "validate", "label", "costmodel", "route",
          "profile", "train", "score", "export", "serve", "study", "model", "dataset")


def _position(info) -> int:
    return _ORDER.index(info.name) if info.name in _ORDER else len(_ORDER)


app.registered_commands.sort(key=_position)
app.registered_groups.sort(key=_position)


def main():
    app()


__all__ = ["app", "main"]

if __name__ == "__main__":
    main()

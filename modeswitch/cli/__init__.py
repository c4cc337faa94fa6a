"""``modeswitch``: one CLI for every step of the pipeline.

The commands live in one module per part of the pipeline: :mod:`.data` (registries,
requests, profiles, labels, training tables), :mod:`.engine` (the model,
profiling, serving) and :mod:`.routers` (train, score, export); :mod:`.common`
holds the ``app`` they register on and what they share. Heavy libraries are
imported inside each command, so ``modeswitch --help`` is quick. Errors in user
input print one clear line (file, row, field) and exit 2; other errors keep their
traceback, and ``--debug`` shows it for input errors too.

``modeswitch.cli:main`` is the console script; ``python -m modeswitch`` runs it too.
"""

from __future__ import annotations

from modeswitch.cli import data, engine, routers, study  # noqa: F401  (registers the commands)
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

"""``modeswitch``: one CLI for every step of the pipeline.

One module per command or command group, as vLLM's ``entrypoints/cli/``:
:mod:`.registries` (``modes``, ``workloads``, ``requests``), :mod:`.profiles`
(``import-profiles``, ``validate``), :mod:`.label`, :mod:`.route`, :mod:`.dataset`
(``dataset build``), :mod:`.costmodel` (``costmodel validate|fit``), :mod:`.model`
(``model build``), :mod:`.profile`, :mod:`.serve`, :mod:`.train`, :mod:`.score`,
:mod:`.export` and :mod:`.study`;
:mod:`.common` holds the root ``app`` and what they share,
:mod:`.oracle_options` the constraint and cost-model options of ``label`` and
``dataset build``. Errors in user input print one clear line (file, row, field) and
exit 2; other errors keep their traceback, and ``--debug`` shows it for input errors
too.

``modeswitch --help`` imports none of them: :mod:`.lazy` lists the commands from a
table and imports a command's module only when that command runs (or shows its own
help), so each module imports what it uses at its top.

``modeswitch.cli:main`` is the console script; ``python -m modeswitch`` runs it too.
"""

from __future__ import annotations

from modeswitch.cli.common import app


def main():
    app()


__all__ = ["app", "main"]

if __name__ == "__main__":
    main()

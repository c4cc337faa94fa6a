"""Commands load when they run: ``modeswitch --help`` imports no command module.

The root group lists :data:`COMMANDS` (name, module, one line of help) without
importing anything, and imports a command's module only when that command is
resolved, to run or to show its own help: the pattern of click's "lazily loading
subcommands" and of vLLM's ``entrypoints/cli/``. So each command module imports
what it uses at its top, pandas and the oracle included, and ``--help`` stays quick.

Each command module holds its own ``app`` (a :class:`typer.Typer`) and registers its
commands and groups on it, under the names this table gives them.
``tests/test_cli.py`` checks the table against the modules: every name resolves, and
its line of help is the first paragraph of the command's own help, so neither drifts.
"""

from __future__ import annotations

import importlib

from typer.core import TyperCommand, TyperGroup
from typer.main import get_command

#: name -> (module under ``modeswitch.cli``, the first paragraph of its help), in the
#: order of the pipeline (``modeswitch --help`` lists them so)
COMMANDS: dict[str, tuple[str, str]] = {
    "modes": ("registries", "List the registered inference modes (or show one, with overrides)."),
    "workloads": ("registries", "List the registered workloads (request populations)."),
    "requests": ("registries", "Draw a request population from registered workloads (shape spread included)."),
    "model": ("model", "The default model (converted from its PyPI wheel) or the project's own test model."),
    "profile": ("profile", "Measure modes on workloads and write a validated, resumable profile table."),
    "import-profiles": ("profiles",
                        "Convert external measurements (e.g. the study's A100 CSVs) into a profile table."),
    "validate": ("profiles",
                 "Validate profile files against the schema; report every problem with row and column."),
    "quality-sweep": ("sweep", "Measure each lossy mode's quality per request (ROUGE-L against the reference, "
                               "accuracy), batched."),
    "label": ("label", "Label each unit (or request) with the fastest mode that meets every constraint."),
    "costmodel": ("costmodel",
                  "Per-mode cost models fitted from measured requests, validated against the interpolation."),
    "dataset": ("dataset", "Training tables: requests, features, oracle labels, per-mode costs."),
    "route": ("route", "Route requests with a router and print the chosen mode per request."),
    "train": ("train", "Tune and train learned routers with Optuna; track everything in MLflow."),
    "score": ("score", "Score trained routers against the rule baseline: overhead, violations, speedup, "
                         "energy, quality."),
    "export": ("export", "Register a trained router in MLflow as a pyfunc model and alias it `champion`."),
    "serve": ("serve", "Serve an OpenAI-compatible API with the router in front of one engine per mode."),
    "study": ("study", "The study end to end, from one TOML file; resumable."),
}


def load_command(name: str):
    """Import the module that holds ``name`` and return its command (or group), as
    Typer builds it (on the click Typer carries inside it, not the installed one)."""
    module, _ = COMMANDS[name]
    built = get_command(importlib.import_module(f"modeswitch.cli.{module}").app)
    # a module's Typer with one command and no group becomes that command itself
    command = built.commands.get(name) if isinstance(built, TyperGroup) else built
    if command is None:
        raise LookupError(f"modeswitch.cli.{module} registers no command {name!r} (see COMMANDS)")
    return command


class LazyGroup(TyperGroup):
    """The root group: lists :data:`COMMANDS` from the table, loads one when resolved."""
    def list_commands(self, ctx) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx, cmd_name: str):
        # for listing (help, suggestions): a stand-in that carries the name and the line
        if cmd_name not in COMMANDS:
            return None
        return TyperCommand(cmd_name, help=COMMANDS[cmd_name][1])

    def resolve_command(self, ctx, args: list[str]):
        name, command, rest = super().resolve_command(ctx, args)
        return name, (load_command(name) if command is not None else None), rest

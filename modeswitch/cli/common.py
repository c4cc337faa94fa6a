"""What every command module shares: the Typer ``app``, the error policy, option helpers.

Error policy. A mistake in the user's input (a bad file, an unknown name, an option
combination that cannot work) prints one red line and exits 2; everything else is
a bug and keeps its full traceback, so it is never dressed up as an input error.
Which exceptions count as input errors is one list, :func:`input_errors`: the
project's own input-error types plus ``FileExistsError`` / ``FileNotFoundError``;
an OS error the user can fix (read-only folder, full disk, a directory where a file
belongs: :func:`os_error_line`) is one line too, wherever it is raised.
``--debug`` (or ``MODESWITCH_DEBUG=1``) shows the traceback of input errors too.

Help that names heavy things. ``modeswitch --help`` must not import the engine or
pandas, yet an option's help should show the default its config dataclass
really has and the names a registry really holds. :func:`deferred_help` fills
``{name}`` placeholders in option help (and metavars) only when that command's
help is shown.

Core options first. Each command's default options panel holds the core pipeline's
options; research options (:mod:`modeswitch.experimental`) sit in an "Advanced" panel
below them (``rich_help_panel=ADVANCED``), and giving one on the command line emits
one ``ExperimentalWarning`` (:class:`AdvancedOptionsCommand`, the class of every
command that has such options).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import os
from collections.abc import Callable
from contextlib import contextmanager
from typing import Annotated, Literal

import typer
from rich.markup import escape
from typer.core import TyperCommand

from modeswitch.cli.lazy import LazyGroup
from modeswitch.dataset.errors import InputError, InputFileError
from modeswitch.dataset.io import USER_ERRNOS
from modeswitch.dataset.registry import RegistrationError, UnknownNameError
from modeswitch.display import err_console
from modeswitch.engine.modes.config import CHECKPOINT_KEYS

DEBUG_ENV = "MODESWITCH_DEBUG"
#: the help panel of research options (modeswitch.experimental): below the core ones
ADVANCED = "Advanced"
#: help of ``--tracking-uri`` (train, score, export)
TRACKING_HELP = ("MLflow tracking store, e.g. http://HOST:5000 (an `mlflow server`, PostgreSQL "
                 "backend for several writers) [$MLFLOW_TRACKING_URI, else SQLite in --mlruns].")

app = typer.Typer(
    name="modeswitch",
    help="Learned routers over LLM inference modes: profile -> label -> train -> score -> "
    "export -> serve.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=LazyGroup,  # lists modeswitch.cli.lazy.COMMANDS; imports a command's module when it runs
)

_debug_flag = False


@app.callback()
def _root(
    debug: Annotated[bool, typer.Option(
        "--debug", help=f"Show the full traceback of every error, input errors too (or set {DEBUG_ENV}=1).")] = False,
):
    # set on every invocation, so one in-process run (a test's) never leaks into the next
    global _debug_flag
    _debug_flag = debug


def debug_enabled() -> bool:
    """``--debug`` was given, or ``$MODESWITCH_DEBUG`` is set to something true."""
    env = os.environ.get(DEBUG_ENV, "").strip().lower()
    return _debug_flag or env not in ("", "0", "false", "no", "off")


# ------------------------------------------------------------------ errors
def input_errors() -> tuple[type[BaseException], ...]:
    """The exception types that mean "the user's input is wrong" (imported when needed)."""
    from modeswitch.oracle.cells import (
        OracleError,  # the oracle pulls pandas: only once an error is raised
    )

    return (InputError, InputFileError, OracleError, UnknownNameError, RegistrationError,
            FileExistsError, FileNotFoundError)


def friendly_errors(fn):
    """Print input errors as one red line and exit 2; let every other exception through."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            if debug_enabled():
                raise
            if isinstance(exc, input_errors()):
                report = getattr(exc, "report", None)
                message = report() if report else str(exc)
            elif (message := os_error_line(exc)) is None:
                raise
            err_console.print(f"[red]error:[/red] {escape(message)}")
            raise typer.Exit(2) from None

    return wrapper


def os_error_line(exc: BaseException) -> str | None:
    """One line for an OS error the user can fix (a read-only folder, a full disk, a
    directory where a file belongs, no permission: ``modeswitch.dataset.io.USER_ERRNOS``), naming
    the path; None for any other exception, which keeps its traceback."""
    if not isinstance(exc, OSError) or exc.errno not in USER_ERRNOS:
        return None
    where = " -> ".join(str(f) for f in (exc.filename, exc.filename2) if f is not None)
    return f"{where}: {exc.strerror}" if where else f"{exc.strerror or exc}"


@contextmanager
def reading(path):
    """Around the one call that parses a user's file: a ``ValueError`` from the parser
    (tomllib, pandas, pyarrow: bad TOML, JSON, CSV or parquet) is about that file, so
    it becomes an input error naming it. Input errors pass unchanged."""
    try:
        yield
    except ValueError as exc:
        if isinstance(exc, input_errors()):
            raise
        raise InputFileError(path, None, None,
                             f"cannot be read ({type(exc).__name__}: {exc})") from exc


# ----------------------------------------------------------------- options
def _split(values: list[str] | None) -> list[str]:
    """Repeated and comma-separated option values as one list (``-p a,b -p c``)."""
    out = []
    for v in values or []:
        out.extend(p.strip() for p in v.split(",") if p.strip())
    return out


CheckpointOption = Annotated[list[str] | None, typer.Option(
    "--checkpoint", help="Weights per format, KEY=VALUE with KEY int8, gptq_4bit, awq_4bit (or, on llama.cpp, "
    "reference); repeatable. vLLM: a pre-quantized checkpoint (`modeswitch model quantize` makes them); "
    "llama.cpp: a GGUF type (F16, Q8_0, Q4_K_M, Q4_0) or a .gguf file.")]


def parse_checkpoints(items: list[str] | None) -> dict[str, str]:
    """``--checkpoint KEY=VALUE`` options (repeated or comma-separated) as a mapping."""
    checkpoints = {}
    for item in _split(items):
        key, sep, value = item.partition("=")
        if not sep or key not in CHECKPOINT_KEYS or not value:
            raise InputError(f"--checkpoint {item!r}: expected KEY=VALUE with KEY one of {', '.join(CHECKPOINT_KEYS)}")
        checkpoints[key] = value
    return checkpoints


#: choices fixed by the code that consumes them; tests/test_cli_options.py checks
#: each against its source (``modeswitch.routers.training.splits.SPLITS`` and so on)
Split = Literal["random", "group", "lofo"]
FeatureSet = Literal["A", "B", "C"]
Fallback = Literal["rule", "reference"]
Incomplete = Literal["error", "skip"]
MissingQuality = Literal["unsafe", "pass"]
#: ``--quality-scope``: where the quality limits are judged (oracle.Constraints.quality_scope)
QualityScope = Annotated[Literal["family", "request"] | None, typer.Option(rich_help_panel=ADVANCED,
    help="Judge the quality limits on each (mode, family)'s mean, as the study does, or on every "
         "request's own figures [{quality_scope}].")]
Labels = Literal["all", "measured"]
TuningObjective = Literal["regret", "capture"]
LofoTuning = Literal["nested", "pooled"]
Certificate = Literal["pooled", "per-family", "family-held-out", "per-family-held-out", "family-cross-fit",
                      "per-family-cross-fit"]


def backend_names() -> list[str]:
    """The registered engine backends (importing the registry only when asked)."""
    from modeswitch.engine.backends.registry import (
        backend_names as names,  # numpy: only when help is shown
    )

    return names()


def backend_name(value: str) -> str:
    """Typer parser for ``--backend``: a registered backend, else a usage error (exit 2)
    listing them. A parser, not a ``Literal``, because plug-ins register backends and
    reading the registry for every command would slow ``modeswitch --help``."""
    names = backend_names()
    if value not in names:
        raise typer.BadParameter(f"{value!r} is not one of {', '.join(map(repr, names))}")
    return value


def config_defaults(target: str) -> dict[str, object]:
    """Field defaults of the dataclass at ``"module:Class"`` (factories called)."""
    module, _, name = target.partition(":")
    cls = getattr(importlib.import_module(module), name)
    out = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out


class AdvancedOptionsCommand(TyperCommand):
    """A command that emits one ExperimentalWarning per "Advanced" option it was given (on
    the command line or from the environment), naming the option: those options reach
    research add-ons whose interface and results may change."""

    def invoke(self, ctx):
        given = [p for p in self.params if getattr(p, "rich_help_panel", None) == ADVANCED
                 and _given(ctx.get_parameter_source(p.name))]
        if given:
            # behind the experimental boundary: loaded only when an advanced option is given
            from modeswitch.experimental import warn_experimental

            for p in given:
                warn_experimental(p.opts[0] if p.opts else p.name, stacklevel=3)
        return super().invoke(ctx)


def _given(source) -> bool:
    """Whether a parameter's value came from the user (click's ParameterSource; by name, as
    Typer carries its own click)."""
    return source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP")


def deferred_help(config: str | None = None, **values: Callable[[], object]) -> type[TyperCommand]:
    """A command class whose option help and metavars may hold ``{name}`` placeholders,
    filled when the help is shown: from the field defaults of the dataclass ``config``
    (``"module:Class"``) and from ``values`` (name -> function). So help shows the
    default the code really uses, never a copy of it, at no cost to other commands.
    Lists show as ``a, b`` in help and ``a|b`` in a metavar (``<{backends}>``).

    Help is rich markup: a bracketed default such as ``[error]`` would be read as a
    style tag and vanish, so tag-like brackets in these commands' help are escaped."""

    class DeferredHelpCommand(AdvancedOptionsCommand):
        def format_help(self, ctx, formatter):
            known = config_defaults(config) if config else {}
            known.update({k: f() for k, f in values.items()})
            in_help = {k: _joined(v, ", ") for k, v in known.items()}
            in_metavar = {k: _joined(v, "|") for k, v in known.items()}
            for p in self.params:
                if isinstance(p.help, str):
                    p.help = escape(p.help.format_map(in_help) if "{" in p.help else p.help)
                if isinstance(p.metavar, str) and "{" in p.metavar:
                    p.metavar = p.metavar.format_map(in_metavar)
            return super().format_help(ctx, formatter)

    return DeferredHelpCommand


def _joined(value, sep: str) -> str:
    return sep.join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)


# ------------------------------------------------------------- Ray options
# `profile` and `study run` take the same four; `--ray` is a plain flag because typer
# has no option with an optional value (Ray itself reads $RAY_ADDRESS when none is given)
RayFlag = Annotated[bool, typer.Option("--ray", help="Shard the profiling cells over Ray workers (a local Ray on this machine unless --ray-address or $RAY_ADDRESS names a cluster). Needs the `distributed` extra.")]
RayAddress = Annotated[str | None, typer.Option(help="With --ray: the cluster to join (auto, host:6379, ray://host:10001) [$RAY_ADDRESS, else a local Ray].")]
RayWorkers = Annotated[int | None, typer.Option(min=1, help="With --ray: actors to start (default: one per GPU, or per --ray-cpus-per-worker CPUs).")]
RayCpus = Annotated[int | None, typer.Option(min=1, help="With --ray on CPU: CPUs (and torch threads) per actor [--threads, else 1].")]


def ray_options(ray: bool, address, workers, cpus_per_worker):
    """The :class:`modeswitch.engine.distributed.RayOptions` of a command's Ray options (None: serial)."""
    from modeswitch.engine.distributed import (
        RayOptions,  # the profiler, numpy: only for a command that runs
    )

    if not ray:
        if address is not None or workers is not None or cpus_per_worker is not None:
            raise InputError("--ray-address, --ray-workers and --ray-cpus-per-worker apply to a --ray run only")
        return None
    return RayOptions(address, workers, cpus_per_worker)

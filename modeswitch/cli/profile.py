"""``profile``: measure modes on workloads into a validated, resumable profile table.

Thin over its config dataclass (:class:`modeswitch.engine.profiler.ProfileSpec`): one option per
user-settable field, with the field's default; tests/test_cli_options.py holds it to
that, and lists the fields left out on purpose.
"""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import Progress

import modeswitch.engine.models.resolve as model_resolve
from modeswitch.cli.common import (
    CheckpointOption,
    RayAddress,
    RayCpus,
    RayFlag,
    RayWorkers,
    _split,
    backend_name,
    backend_names,
    deferred_help,
    friendly_errors,
    parse_checkpoints,
    ray_options,
)
from modeswitch.cli.model import describe_card
from modeswitch.dataset.errors import InputError, InputFileError
from modeswitch.dataset.workloads.conditions import ConditionDraw
from modeswitch.display import console, frame_table
from modeswitch.engine.distributed import make_profiler
from modeswitch.engine.models.resolve import MODEL_HELP
from modeswitch.engine.noise import clean_trials
from modeswitch.engine.profiler import ProfileSpec

#: this module's commands; modeswitch.cli.lazy imports the module when one of them runs
app = typer.Typer(add_completion=False)

def _short(name: str) -> str:
    """Compact column labels for wide mode x family tables."""
    return {"short_prompt_short_output": "s/s", "short_prompt_long_output": "s/l",
            "long_prompt_short_output": "l/s", "long_prompt_long_output": "l/l",
            "shared_prefix_chat": "prefix", "memory_pressure_long_context": "mem",
            "batch_pressure": "batch"}.get(name, name)


@app.command("profile", cls=deferred_help("modeswitch.engine.profiler:ProfileSpec", backends=backend_names))
@friendly_errors
def profile_cmd(
    output: Annotated[Path, typer.Option("-o", "--output", help="Profile parquet to write (its journal sits beside it).")],
    backend: Annotated[str, typer.Option(parser=backend_name, metavar="<{backends}>", help="Engine backend.")] = "transformers",
    model: Annotated[str | None, typer.Option(help=MODEL_HELP)] = None,
    draft_model: Annotated[str | None, typer.Option(help="Draft checkpoint for speculative decoding.")] = None,
    modes: Annotated[list[str] | None, typer.Option(help="Modes to measure (default: every supported one).")] = None,
    workloads: Annotated[list[str] | None, typer.Option(help="Workloads [the study's families: {workloads}].")] = None,
    requests: Annotated[int | None, typer.Option(help="Requests (or request groups) per workload [{requests}; quick: 1].")] = None,
    trials: Annotated[int | None, typer.Option(help="Interleaved trials per (request, mode) [{trials}; quick: 1].")] = None,
    max_remeasure: Annotated[int, typer.Option(help="Re-measurements of a contended trial before its flag is kept.")] = 2,
    benchmarks: Annotated[list[str] | None, typer.Option(help="Benchmark JSONL files to draw prompts from.")] = None,
    benchmark_requests: Annotated[int, typer.Option(help="Prompts per benchmark file.")] = 2,
    batch_size: Annotated[int | None, typer.Option(help="Requests per group in concurrent workloads (default: the workload's own).")] = None,
    device: Annotated[str, typer.Option(help="cpu or cuda.")] = "cpu",
    seed: Annotated[int, typer.Option(help="Request population seed.")] = 0,
    quick: Annotated[bool, typer.Option(help="One request per workload, one trial: a fast full sweep.")] = False,
    threads: Annotated[int | None, typer.Option(help="torch threads (default: chosen by a short measurement at the start).")] = None,
    watts_per_core: Annotated[float, typer.Option(help="CPU energy estimate, where no power meter is read: watts per busy core.")] = 4.0,
    cache_dir: Annotated[Path | None, typer.Option(help="Model cache folder.")] = None,
    interleave: Annotated[bool, typer.Option(help="Keep all engines loaded; measure each request in every mode back to back.")] = False,
    checkpoint: CheckpointOption = None,
    conditions: Annotated[Path | None, typer.Option(help="TOML file whose [conditions] table draws each request's concurrency, shared prefix and memory pressure across families (default: each family's own fixed condition).")] = None,
    length_scale: Annotated[float, typer.Option(help="Every family's prompt, output and prefix lengths times this.")] = 1.0,
    ray: RayFlag = False,
    ray_address: RayAddress = None,
    ray_workers: RayWorkers = None,
    ray_cpus_per_worker: RayCpus = None,
):
    """Measure modes on workloads and write a validated, resumable profile table."""
    checkpoints = parse_checkpoints(checkpoint)
    if backend == "vllm" and interleave:
        raise InputError("--interleave keeps every engine loaded; the vLLM backend runs one engine at a time")
    if quick:
        requests = 1 if requests is None else requests
        trials = 1 if trials is None else trials
    # options left at None take the spec's own defaults; the spec checks every value
    # before the model is resolved (which may convert it), the model's path filled in after
    defaults = {"workloads": _split(workloads) or None, "requests": requests, "trials": trials}
    spec = ProfileSpec(
        model=str(model), draft_model=draft_model, backend=backend,
        device=device, modes=_split(modes) or None, max_remeasure=max_remeasure, seed=seed,
        benchmarks=_split(benchmarks), benchmark_requests=benchmark_requests,
        batch_size=batch_size, watts_per_core=watts_per_core, threads=threads,
        interleave=interleave, checkpoints=checkpoints, length_scale=length_scale,
        conditions=_conditions(conditions),
        **{k: v for k, v in defaults.items() if v is not None},
    )
    with Progress(console=console) as progress:
        target, draft, card = model_resolve.resolve_models(model, draft_model, cache_dir, progress, console.print,
                                             modes=spec.modes)
    if card:
        console.print(f"model: {describe_card(card)}")
    spec = dataclasses.replace(spec, model=str(target), draft_model=str(draft) if draft else None)

    ray_opts = ray_options(ray, ray_address, ray_workers, ray_cpus_per_worker)
    profiler = make_profiler(spec, target, draft, output, console=console, ray=ray_opts)
    df = profiler.run()

    summary = clean_trials(df).groupby(["mode", "family"])["latency_ms"].median().unstack("family")
    speed = (summary.loc["fp16_baseline"] / summary).round(2)
    speed.columns = [_short(c) for c in speed.columns]
    console.print(frame_table(speed, title="speedup vs the reference (reference latency / mode latency; >1 is faster)"))
    noise = profiler.noise_.copy()
    noise.index = [_short(c) for c in noise.index]
    console.print(frame_table(noise.round(3), title="noise floor per family (latency CV over a unit's "
                              "clean trials; contended: share of trials flagged; persisting: still "
                              "flagged after re-measuring)"))
    console.print(f"wrote {len(df)} rows ({df['mode'].nunique()} modes x "
                  f"{df['family'].nunique()} workload families) to {output}")


def _conditions(path: Path | None) -> dict | None:
    """The [conditions] table of a TOML file, checked (None: no file)."""
    if path is None:
        return None
    try:
        table = tomllib.loads(path.read_text()).get("conditions")
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise InputFileError(path, None, None, str(exc)) from None
    if table is None:
        raise InputFileError(path, None, "conditions", "no [conditions] table")
    try:
        return ConditionDraw.from_dict(table).to_dict()
    except (TypeError, ValueError) as exc:
        raise InputFileError(path, None, "conditions", str(exc)) from None

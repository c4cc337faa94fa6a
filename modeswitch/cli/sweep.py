"""``quality-sweep``: each lossy mode's quality on many requests, per request, apart
from the latency profile (:mod:`modeswitch.engine.quality_sweep`); ``dataset build --quality``
puts it into the training table."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

import modeswitch.engine.models.resolve as model_resolve
from modeswitch.cli.common import (
    _split,
    backend_name,
    backend_names,
    deferred_help,
    friendly_errors,
    reading,
)
from modeswitch.dataset.limits import finite
from modeswitch.dataset.requests import read_requests
from modeswitch.dataset.workloads.conditions import drawn_requests
from modeswitch.display import console, frame_table
from modeswitch.engine.models.resolve import MODEL_HELP
from modeswitch.engine.profiler import DEFAULT_WORKLOADS
from modeswitch.engine.quality_sweep import FLIP_AT, SweepSpec, flipped_share, run_sweep

#: this module's commands; modeswitch.cli.lazy imports the module when one of them runs
app = typer.Typer(add_completion=False)


@app.command("quality-sweep", cls=deferred_help(backends=backend_names))
@friendly_errors
def quality_sweep_cmd(
    output: Annotated[Path, typer.Option("-o", "--output", help="Sweep parquet to write (its journal sits beside it; a rerun resumes).")],
    requests: Annotated[int, typer.Option(min=1, help="Requests to draw in all, split evenly over the workloads: give `dataset build`'s --requests, --seed and --length-scale, and the table takes these requests' quality.")] = 2000,
    requests_file: Annotated[Path | None, typer.Option(help="Sweep these requests instead (.jsonl/.csv/.parquet, as `modeswitch requests` writes).")] = None,
    workloads: Annotated[list[str] | None, typer.Option(help="Workloads to draw from (default: the study's seven families).")] = None,
    seed: Annotated[int, typer.Option(help="Population seed.")] = 0,
    length_scale: Annotated[float, typer.Option(help="Every family's prompt, output and prefix lengths times this.")] = 1.0,
    modes: Annotated[list[str] | None, typer.Option(help="Modes to sweep (default: every lossy mode the engine runs; the reference always runs).")] = None,
    backend: Annotated[str, typer.Option(parser=backend_name, metavar="<{backends}>", help="Engine backend.")] = "transformers",
    model: Annotated[str | None, typer.Option(help=MODEL_HELP)] = None,
    draft_model: Annotated[str | None, typer.Option(help="Draft checkpoint (for a speculative mode named in --modes).")] = None,
    device: Annotated[str, typer.Option(help="cpu or cuda.")] = "cpu",
    batch_size: Annotated[int, typer.Option(min=1, help="Requests generated together in one call (sequences, with --arrival-groups).")] = 16,
    arrival_groups: Annotated[bool, typer.Option(help="Run each request with the companions that arrive with it and judge the group's joined output, as the profiler and the live check do (a request with concurrency c costs c sequences).")] = False,
    repeats: Annotated[int, typer.Option(min=1, help="Passes over every request, each in batches of other companions; the table keeps each (request, mode)'s worst, and says where the passes disagree (prefix caching and continuous batching turn with the requests served before or beside, a greedy answer near a tie; the other modes on the transformers backend give the same output in any batch).")] = 1,
    threads: Annotated[int | None, typer.Option(min=1, help="torch threads (default: torch's choice; nothing here is timed).")] = None,
    cache_dir: Annotated[Path | None, typer.Option(help="Model cache folder.")] = None,
):
    """Measure each lossy mode's quality per request (ROUGE-L against the reference, accuracy), batched."""
    finite("length_scale", length_scale, positive=True)
    if requests_file is not None:
        with reading(requests_file):
            reqs = read_requests(requests_file)
    else:
        names = _split(workloads) or list(DEFAULT_WORKLOADS)
        reqs = drawn_requests(names, max(1, requests // len(names)), seed, length_scale)
    wanted = _split(modes) or None
    with Progress(console=console) as progress:
        target, draft, _ = model_resolve.resolve_models(model, draft_model, cache_dir, progress, console.print,
                                                        modes=wanted or ())
    spec = SweepSpec(model=str(target), requests=tuple(reqs), draft_model=str(draft) if draft else None,
                     backend=backend, device=device, modes=tuple(wanted) if wanted else None,
                     batch_size=batch_size, threads=threads, arrival_groups=arrival_groups, repeats=repeats)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                  console=console) as progress:
        frame, throughput = run_sweep(spec, output, progress=progress, log=console.print)
    console.print(frame_table(throughput.set_index("mode").round(2),
                              title=f"sweep time and throughput ({len(reqs)} requests, batches of {batch_size})"))
    lossy = frame[frame["mode"] != frame["reference_mode"]]
    if not lossy.empty:
        view = lossy.groupby(["family", "mode"])["rouge_l_vs_baseline"].mean().unstack("mode").round(3)
        console.print(frame_table(view, title="mean ROUGE-L against the reference's output, per family and mode"))
        if repeats > 1:
            console.print(f"the {repeats} repeats disagree on ROUGE-L >= {FLIP_AT} for {flipped_share(frame):.1%} "
                          "of (request, lossy mode) pairs; the table keeps each pair's worst")
    console.print(f"wrote {len(frame)} rows ({frame['request_id'].nunique()} requests x "
                  f"{frame['mode'].nunique()} modes) to {output}")

"""``score``: trained routers against the rule baseline, offline on held-out requests
and live through the real engine: overhead, violations, speedup, energy, quality.

Thin over its config dataclass (:class:`modeswitch.routers.scoring.run.ScoreConfig`): one option
per user-settable field, with the field's default; tests/test_cli_options.py holds it
to that, and lists the fields left out on purpose.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Annotated

import typer

from modeswitch.cli.common import (
    ADVANCED,
    TRACKING_HELP,
    CheckpointOption,
    Labels,
    _split,
    backend_name,
    backend_names,
    deferred_help,
    friendly_errors,
    parse_checkpoints,
)
from modeswitch.dataset.errors import InputError
from modeswitch.display import console, fmt, frame_table
from modeswitch.engine.models.resolve import MODEL_HELP
from modeswitch.engine.profiler.journal import plan_beside, recorded_plan
from modeswitch.oracle.external_table import read_training_table
from modeswitch.oracle.training_table import table_meta
from modeswitch.routers.scoring.run import ScoreConfig, score_routers

#: this module's commands; modeswitch.cli.lazy imports the module when one of them runs
app = typer.Typer(add_completion=False)


@app.command("score", cls=deferred_help("modeswitch.routers.scoring.run:ScoreConfig", backends=backend_names))
@friendly_errors
def score_cmd(
    data: Annotated[Path, typer.Option(help="Training table (or cost table) the routers were trained on.")],
    output: Annotated[Path | None, typer.Option("-o", "--output", help="New report folder [reports/score-<time>].")] = None,
    run: Annotated[list[str] | None, typer.Option(help="Training run id(s) to score (default: latest per family).")] = None,
    live: Annotated[bool, typer.Option(help="Also run a held-out stream through the real engine.")] = False,
    live_requests: Annotated[int | None, typer.Option(help="Requests in the live stream [{live_requests}: --live-per-family per held-out family].")] = None,
    live_per_family: Annotated[int, typer.Option(help="Live requests per held-out family, when --live-requests is not given.")] = 6,
    live_trials: Annotated[int, typer.Option(min=1, help="Interleaved trials per (request, mode) live; medians and intervals over them.")] = 3,
    live_threads: Annotated[int | None, typer.Option(min=1, help="Engine threads live [the profile's, else 1 on CPU].")] = None,
    live_max_remeasure: Annotated[int, typer.Option(min=0, help="Times a contended live trial is measured again.")] = 2,
    backend: Annotated[str, typer.Option(parser=backend_name, metavar="<{backends}>", help="Engine backend for --live.")] = "transformers",
    model: Annotated[str | None, typer.Option(help="Engine model for --live: " + MODEL_HELP)] = None,
    draft_model: Annotated[str | None, typer.Option(help="Draft checkpoint for --live.")] = None,
    device: Annotated[str, typer.Option(help="Device for --live: cpu or cuda.")] = "cpu",
    checkpoint: CheckpointOption = None,
    compile_routers: Annotated[bool, typer.Option("--compile/--no-compile", help="Route with compiled routers or the scikit-learn pipelines.")] = True,
    decisions: Annotated[int, typer.Option(help="Single decisions timed per router.")] = 20_000,
    pipeline_decisions: Annotated[int, typer.Option(help="Single decisions timed per scikit-learn pipeline (slower; at most --decisions).")] = 300,
    mlruns: Annotated[Path, typer.Option(help="MLflow store folder.")] = Path("mlruns"),
    tracking_uri: Annotated[str | None, typer.Option(help=TRACKING_HELP)] = None,
    seed: Annotated[int, typer.Option(help="Live stream seed.")] = 0,
    labels: Annotated[Labels, typer.Option(rich_help_panel=ADVANCED, help="Score on all rows, or only measured labels (as the routers were trained with `train --labels`).")] = "all",
    frontier: Annotated[bool, typer.Option(rich_help_panel=ADVANCED, help="Compute the split's capture / violation ceiling (safety from the request's shape, latencies known) and plot the routers beside it.")] = True,
    adaptive: Annotated[bool, typer.Option(rich_help_panel=ADVANCED, help="Replay each certified cost router over the held-out requests with its threshold adapted online by every pick's outcome (routers.adaptive), beside its certified threshold.")] = True,
    profile_plan: Annotated[Path | None, typer.Option(help="The profiler's journal (PROFILE.journal.jsonl): live, each measured request runs with the prompts the profiler built for it. Default: the one beside the table's profile, where it is still there; else prompts rebuilt from the table's rows.")] = None,
):
    """Score trained routers against the rule baseline: overhead, violations, speedup, energy, quality."""
    out = output or Path("reports") / f"score-{datetime.now():%Y%m%d-%H%M%S}"
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} already holds a report; choose a new folder")
    training = read_training_table(data)
    cfg = ScoreConfig(mlruns=str(mlruns), tracking_uri=tracking_uri, run_ids=_split(run), compiled=compile_routers,
                      decisions=decisions, pipeline_decisions=pipeline_decisions, live=live,
                      live_requests=live_requests, live_per_family=live_per_family, live_trials=live_trials,
                      live_threads=live_threads, live_max_remeasure=live_max_remeasure, model=model, draft_model=draft_model,
                      device=device, backend=backend, checkpoints=parse_checkpoints(checkpoint), seed=seed,
                      name=out.name, labels=labels,
                      frontier=frontier, adaptive=adaptive,
                      profile_plan=_profile_plan(profile_plan, training) if live else None)
    with console.status("scoring") as status:
        res = score_routers(training, cfg, out, progress=lambda m: status.update(m))
    head = res["headline"].copy()
    head.index.name = "router"
    cols = {"overhead_p50_us": "p50 us", "overhead_p99_us": "p99 us",
            "violation_rate_quality": "viol qual", "violation_rate_energy": "viol energy",
            "violation_rate_memory": "viol mem", "speedup": "speedup", "energy_ratio": "energy",
            "rouge_delta": "ROUGE-L d", "accuracy_delta_pp": "acc d pp",
            "oracle_match": "oracle match", "latency_capture": "capture lat",
            "energy_capture": "capture energy"}
    table = head[[c for c in cols if c in head.columns]].rename(columns=cols)
    if "speedup_low" in head:
        at = list(table.columns).index("speedup") + 1
        table.insert(at, "speedup 95% CI", [f"[{a:.2f}, {b:.2f}]" for a, b in
                                            zip(head["speedup_low"], head["speedup_high"])])
    if res["live_summary"] is not None:
        ls = res["live_summary"].set_index("router")
        table["live speedup"] = ls["speedup"].reindex(table.index)
        if "speedup_low" in ls:
            table["live speedup 95% CI"] = [f"[{a:.2f}, {b:.2f}]" if a == a else "-" for a, b in zip(
                ls["speedup_low"].reindex(table.index), ls["speedup_high"].reindex(table.index))]
        table["live energy"] = ls["energy_ratio"].reindex(table.index)
        table["live viol qual"] = ls["violation_rate_quality"].reindex(table.index)
        if "violation_rate_beyond_noise" in ls:
            table["live viol beyond noise"] = ls["violation_rate_beyond_noise"].reindex(table.index)
    console.print(frame_table(table, title=f"routers vs the rule baseline — held-out requests, "
                                           f"equal family weights ({out})"))
    if res["live_summary"] is not None:
        console.print(f"live: {res['live_per']['request_id'].nunique()} requests x {cfg.live_trials} trials; "
                      "profile-estimate latency error "
                      f"(mean absolute %): {fmt(res['live_figures']['estimate_mape_pct'], 1)}"
                      + "".join(f"; {src} {fmt(res['live_figures'].get(f'estimate_mape_pct_{src}'), 1)} "
                                f"({res['live_figures'].get(f'estimate_pairs_{src}', 0)} pairs)"
                                for src in ("measured", "estimated")))
    console.print(f"report: {out}/README.md; MLflow scoring run {res['mlflow_run_id']} (`make ui`)")


def _profile_plan(journal: Path | None, training) -> dict | None:
    """The profiler's plan from its journal: the one named, else the one beside the
    table's profile where it is still there (None: live rebuilds prompts from rows)."""
    if journal is None:
        try:
            source = table_meta(training).get("profile_source")
        except InputError:  # an external table (published cells): no profile of ours to replay
            return None
        return plan_beside(source) if source else None
    return recorded_plan(journal)

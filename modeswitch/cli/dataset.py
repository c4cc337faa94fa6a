"""``dataset build``: the training table (requests drawn from workloads and
benchmarks, their features, oracle labels and every mode's estimated costs)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import pandas as pd
import typer

from modeswitch.cli.common import (
    ADVANCED,
    Incomplete,
    MissingQuality,
    QualityScope,
    _split,
    deferred_help,
    friendly_errors,
    reading,
)
from modeswitch.cli.oracle_options import CONSTRAINTS, constraints, costmodel_for
from modeswitch.dataset.benchmarks import read_benchmark
from modeswitch.dataset.errors import InputError
from modeswitch.dataset.io import write_parquet
from modeswitch.dataset.limits import finite
from modeswitch.dataset.profile_schema import read_profiles
from modeswitch.dataset.prompt_corpus import in_draft_split
from modeswitch.dataset.workloads import list_workloads
from modeswitch.dataset.workloads.conditions import drawn_requests
from modeswitch.display import console, frame_table
from modeswitch.engine.profiler.journal import plan_beside, recorded_plan
from modeswitch.engine.profiler.plan import profiled_leads
from modeswitch.engine.quality_sweep import read_sweep
from modeswitch.oracle.training_table import build_training_table, profiled_requests, table_meta

#: this module's commands; modeswitch.cli.lazy imports the module when one of them runs
app = typer.Typer(add_completion=False)

dataset_app = typer.Typer(help="Training tables: requests, features, oracle labels, per-mode costs.",
                          no_args_is_help=True)
app.add_typer(dataset_app, name="dataset")


@dataset_app.command("build", cls=deferred_help(CONSTRAINTS))
@friendly_errors
def dataset_build_cmd(
    profiles: Annotated[list[str], typer.Option("--profiles", "-p", help="Profile parquet file(s).")],
    output: Annotated[Path, typer.Option("-o", "--output", help="Training table parquet to write.")],
    requests: Annotated[int, typer.Option(help="Requests to draw in all (split evenly over workloads).")] = 2000,
    workloads: Annotated[list[str] | None, typer.Option(help="Workloads to draw from (default: the profile's families that are registered).")] = None,
    benchmarks: Annotated[list[str] | None, typer.Option(help="Benchmark JSONL files to add prompts from.")] = None,
    benchmark_requests: Annotated[int, typer.Option(help="Prompts per benchmark file.")] = 50,
    profiled: Annotated[bool, typer.Option(help="Also add the profile's own measured requests, labelled from their own trials ('measured').")] = True,
    seed: Annotated[int, typer.Option(help="Population seed.")] = 0,
    length_scale: Annotated[float, typer.Option(help="Every family's prompt, output and prefix lengths times this: give the profile's own (`profile --length-scale`), or drawn requests fall outside the measured range and their costs are extrapolated.")] = 1.0,
    config: Annotated[Path | None, typer.Option(help="TOML constraint thresholds.")] = None,
    incomplete: Annotated[Incomplete | None, typer.Option(help="What a missing reference row or metric does: error (stop) or skip [{on_incomplete}].")] = None,
    missing_quality: Annotated[MissingQuality | None, typer.Option(help="A mode with no quality evidence: unsafe (the study's rule) or pass (unchecked) [{missing_quality}].")] = None,
    noise_aware: Annotated[bool | None, typer.Option("--noise-aware/--no-noise-aware", help="Measured units with 2+ trials: a mode replaces a safer one only beyond noise, limits met by the interval [{noise_aware}].")] = None,
    overwrite: Annotated[bool, typer.Option(help="Replace an existing output file.")] = False,
    costmodel: Annotated[str, typer.Option(help="Cost model for estimated requests: a file from `modeswitch costmodel fit`, 'auto' (fit and validate on the profile now) or 'none' (interpolation only). Used per (mode, metric) only where it validated better.")] = "auto",
    content_model: Annotated[Path | None, typer.Option(help="A checkpoint folder (the profiled model): the table also takes each request's prompt token ids, built as the engine builds them, and the content features read from them (what feature set C trains on).")] = None,
    profile_plan: Annotated[Path | None, typer.Option(help="The profiler's journal (PROFILE.journal.jsonl): with --profiled and --content-model, each measured request's prompt is the one the profiler built (its row holds the measured shape, not the budgets the prompt was built from). Default: the journal beside the first profile, where it is there; else prompts rebuilt from the rows.")] = None,
    quality: Annotated[Path | None, typer.Option(help="A quality sweep (`modeswitch quality-sweep`, same --requests, --seed and --length-scale): each swept request's own measured quality per mode, and the family means the rule judges from it.")] = None,
    confidence: Annotated[bool, typer.Option(rich_help_panel=ADVANCED, help="With --content-model: also the reference model's confidence at each prompt's end (entropy, top-2 gap, top-1 probability; one prefill per prompt, cached), which the per-request quality-risk model reads.")] = False,
    quality_scope: QualityScope = None,
    max_quality_risk: Annotated[float | None, typer.Option(rich_help_panel=ADVANCED, help="--quality-scope request with --quality: a request the sweep did not run takes a lossy mode only at a predicted P(fail) <= this [{max_quality_risk}].")] = None,
    quality_risk: Annotated[Literal["logistic", "lgbm", "off"] | None, typer.Option(rich_help_panel=ADVANCED, help="The per-request quality-risk model fitted on the swept requests (trusted per mode only where it beats each family's failure rate out of fold and holds the cut; else the family's rate, 95 % upper bound), or off (interpolated figures) [{quality_risk}].")] = None,
):
    """Draw requests, compute features, label them with the oracle, attach per-mode costs."""
    c = constraints(config, on_incomplete=incomplete, missing_quality=missing_quality,
                     noise_aware=noise_aware, quality_scope=quality_scope,
                     max_quality_risk=max_quality_risk, quality_risk=quality_risk)
    paths = _split(profiles)
    with reading(", ".join(paths)):
        profile = read_profiles(paths)
    registered = {w.name for w in list_workloads()}
    names = _split(workloads) or [f for f in profile["family"].unique() if f in registered]
    if not names:
        raise InputError("no registered workload families in the profile; pass --workloads")
    finite("length_scale", length_scale, positive=True)
    per = max(1, requests // len(names))
    reqs = drawn_requests(names, per, seed, length_scale)
    for f in _split(benchmarks):
        # the draft was distilled on the corpus's draft split: those prompts are no evaluation
        reqs += read_benchmark(f, benchmark_requests, seed=seed, skip=in_draft_split)
    if profiled:
        drawn = {r.id for r in reqs}
        reqs += [r for r in profiled_requests(profile) if r.id not in drawn
                 and (not _split(workloads) or r.family in names)]
    cm = costmodel_for(costmodel, profile, ", ".join(paths))
    sweep = read_sweep(quality) if quality is not None else None
    leads = _profiled_leads(profile_plan, paths[0]) if profiled and content_model is not None else {}
    table = build_training_table(profile, reqs, c, source=", ".join(paths), costmodel=cm, quality=sweep,
                                 content_model=None if content_model is None else str(content_model.resolve()),
                                 confidence=confidence, built_from=leads)
    write_parquet(table, output, overwrite=overwrite)
    counts = table["label"].value_counts()
    console.print(f"wrote {len(table)} requests x {table.shape[1]} columns to {output}")
    console.print("labels: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    if leads:
        console.print(f"content: {table_meta(table).get('prompts_from_plan', 0)} measured requests read "
                      "the prompts the profiler built (its journal's plan)")
    console.print("label source: " + ", ".join(
        f"{k} {v}" for k, v in table["label_source"].value_counts().items()))
    console.print("quality from: " + ", ".join(
        f"{k} {v}" for k, v in table["quality_basis"].value_counts().items()))
    if sweep is not None and not table["quality_basis"].eq("measured (sweep)").any():
        console.print(f"[yellow]no request of {quality} is in the table: sweep the same --requests, --seed "
                      "and --length-scale (or the table's own requests)[/]")
    risk = table_meta(table).get("quality_risk")
    if risk:
        v = pd.DataFrame(risk["validation"]).set_index("mode")[
            ["rows", "failure_rate", "auc", "brier", "brier_base", "below_cut", "below_cut_failure_rate", "trusted"]]
        console.print(f"quality risk: {risk['requests_judged']} unswept requests judged at P(fail) <= "
                      f"{risk['max_quality_risk']}; an untrusted mode answers its family's failure rate "
                      "(95 % upper bound)")
        console.print(frame_table(v, title=f"quality-risk model ({risk['estimator']}), out of fold within families"))
    elif c.quality_scope != "request" and sweep is not None:
        console.print("[dim]quality judged per family (the study's rule): no quality-risk model "
                      "(--quality-scope request fits one)[/]")
    console.print("label latency from: " + ", ".join(
        f"{k} {v}" for k, v in table["latency_basis"].value_counts().items()))
    outside = table["estimate_basis"].astype(str).str.contains("outside measured range").sum()
    if outside:
        # the likelier cause first: a profile of one or two requests per family spans no range
        per_family = profile[profile["family"].isin(names)].groupby("family")["request_id"].nunique()
        fewest = int(per_family.min()) if len(per_family) else 0
        why = (f"the profile measured as few as {fewest} request(s) in a family (`profile --requests` widens "
               "the range)" if 0 < fewest <= 2 else "does --length-scale match the profile's?")
        console.print(f"[yellow]{outside} of {len(table)} requests lie outside the profile's measured "
                      f"range; their costs are extrapolated ({why})[/]")


def _profiled_leads(journal: Path | None, first_profile: str) -> dict:
    """The profiled units' own lead requests from the profiler's journal (the one
    named, else the one beside the first profile where it is there; {}: prompts
    rebuilt from the rows)."""
    return profiled_leads(plan_beside(first_profile) if journal is None else recorded_plan(journal))

"""``label``: the oracle over measured profiles, or over requests given with
``--requests`` (estimated from the measured cells or the cost model)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from modeswitch.cli.common import (
    Incomplete,
    MissingQuality,
    QualityScope,
    _split,
    deferred_help,
    friendly_errors,
    reading,
)
from modeswitch.cli.oracle_options import CONSTRAINTS, constraints, costmodel_for
from modeswitch.dataset.io import write_csv, write_parquet
from modeswitch.dataset.profile_schema import read_profiles
from modeswitch.dataset.requests import read_requests, requests_frame
from modeswitch.display import console, frame_table
from modeswitch.oracle import label_profile, label_requests
from modeswitch.oracle.explain import print_explanations, print_labels
from modeswitch.oracle.family_rule import divergence_rates
from modeswitch.oracle.mode_table import format_mode_table, mode_table
from modeswitch.oracle.quality_floor import self_consistency_floor

#: this module's commands; modeswitch.cli.lazy imports the module when one of them runs
app = typer.Typer(add_completion=False)


@app.command("label", cls=deferred_help(CONSTRAINTS))
@friendly_errors
def label_cmd(
    profiles: Annotated[list[str], typer.Option("--profiles", "-p", help="Profile parquet file(s); repeat or comma-separate.")],
    requests: Annotated[Path | None, typer.Option(help="Requests to label (.jsonl/.csv/.parquet); default: the profile's own units.")] = None,
    output: Annotated[Path | None, typer.Option("-o", "--output", help="Labels parquet to write; candidates go to <stem>.candidates.parquet.")] = None,
    explain: Annotated[bool, typer.Option(help="Show every mode per unit with the constraint and margin that rejected it.")] = False,
    config: Annotated[Path | None, typer.Option(help="TOML file with constraint thresholds ([constraints] table).")] = None,
    max_energy_ratio: Annotated[float | None, typer.Option(help="Energy per token <= this x reference [{max_energy_ratio}].")] = None,
    max_memory_ratio: Annotated[float | None, typer.Option(help="Peak memory <= this x reference [{max_memory_ratio}].")] = None,
    max_accuracy_drop_pp: Annotated[float | None, typer.Option(help="Benchmark accuracy drop allowed, points [{max_accuracy_drop_pp}].")] = None,
    min_rouge_vs_baseline: Annotated[float | None, typer.Option(help="ROUGE-L vs reference-mode output >= this [{min_rouge_vs_baseline}].")] = None,
    max_rouge_vs_reference_drop: Annotated[float | None, typer.Option(help="ROUGE-L vs gold drop allowed [{max_rouge_vs_reference_drop}].")] = None,
    latency_tie_rel: Annotated[float | None, typer.Option(help="Latencies within this relative gap tie [{latency_tie_rel}].")] = None,
    incomplete: Annotated[Incomplete | None, typer.Option(help="What a missing reference row or metric does: error (stop) or skip [{on_incomplete}].")] = None,
    missing_quality: Annotated[MissingQuality | None, typer.Option(help="A mode with no quality evidence: unsafe (the study's rule) or pass (unchecked) [{missing_quality}].")] = None,
    noise_aware: Annotated[bool | None, typer.Option("--noise-aware/--no-noise-aware", help="Measured units with 2+ trials: a mode replaces a safer one only beyond noise, limits met by the interval [{noise_aware}].")] = None,
    quality_scope: QualityScope = None,
    overwrite: Annotated[bool, typer.Option(help="Replace existing output files.")] = False,
    costmodel: Annotated[str, typer.Option(help="Cost model for estimated requests: a file from `modeswitch costmodel fit`, 'auto' (fit and validate on the profile now) or 'none' (interpolation only). Used per (mode, metric) only where it validated better.")] = "auto",
):
    """Label each unit (or request) with the fastest mode that meets every constraint."""
    c = constraints(
        config, max_energy_ratio=max_energy_ratio, max_memory_ratio=max_memory_ratio,
        max_accuracy_drop_pp=max_accuracy_drop_pp, min_rouge_vs_baseline=min_rouge_vs_baseline,
        max_rouge_vs_reference_drop=max_rouge_vs_reference_drop,
        latency_tie_rel=latency_tie_rel, on_incomplete=incomplete, missing_quality=missing_quality,
        noise_aware=noise_aware, quality_scope=quality_scope,
    )
    paths = _split(profiles)
    source = ", ".join(paths)
    with reading(source):
        profile = read_profiles(paths)
    if requests is not None:
        with reading(requests):
            reqs = requests_frame(read_requests(requests))
        cm = costmodel_for(costmodel, profile, source)
        labels, cand, skipped = label_requests(profile, reqs, c, source=source, costmodel=cm)
    else:
        labels, cand, skipped = label_profile(profile, c, source=source)
    modes = mode_table(profile, c, source=source)
    # per (family, mode): the share of requests whose own output diverged, beside the
    # family mean the rule judges (the rule's verdict and the per-request view, apart)
    families = divergence_rates(cand.reset_index(), c.min_rouge_vs_baseline)
    if output is not None:
        cand_path = output.with_name(output.stem + ".candidates.parquet")
        modes_path = output.with_name(output.stem + ".modes.csv")
        families_path = output.with_name(output.stem + ".families.csv")
        for p in (cand_path, modes_path, families_path):
            if p.exists() and not overwrite:
                raise FileExistsError(f"{p} already exists; pass --overwrite to replace it")
        write_parquet(labels.reset_index(), output, overwrite=overwrite)
        write_parquet(cand, cand_path, overwrite=overwrite)
        write_csv(modes, modes_path, overwrite=overwrite)
        write_csv(families, families_path, overwrite=overwrite)
    if explain:
        print_explanations(labels, cand, c, out=console)
    print_labels(labels, skipped, c, out=console)
    console.print(frame_table(format_mode_table(modes), index=False, title=(
        "every mode against the reference: median latency ratio, ROUGE-L of its output against the "
        "reference's, benchmark accuracy (95 % bootstrap intervals over requests); families passing "
        "the quality rule")))
    floor = self_consistency_floor(profile)
    if not floor.empty:
        console.print(frame_table(floor, title="self-consistency floor: the reference against itself in its "
                                               "lossless modes (reported, not charged to a mode)", index=False))
    if output is not None:
        console.print(f"wrote {len(labels)} labels to {output}, the per-mode verdicts to {cand_path}, "
                      f"the mode table to {modes_path} and each family's divergence rates to {families_path}")

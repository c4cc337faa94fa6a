"""Commands on data, no engine needed: registries (``modes``, ``workloads``), request
populations (``requests``), profile tables (``import-profiles``, ``validate``), the
oracle (``label``), the rule baseline (``route``) and training tables (``dataset build``).

They share one rule for constraint thresholds: a flag overrides the TOML file, which
overrides the study's defaults (:class:`oracle.Constraints`); the help shows those
defaults from the dataclass itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from modeswitch.cli.common import (
    Incomplete,
    MissingQuality,
    _split,
    app,
    deferred_help,
    friendly_errors,
    reading,
)
from modeswitch.display import console, frame_table

CONSTRAINTS = "oracle.constraints:Constraints"

#: flags whose name differs from their Constraints field
_FLAG_OF = {"on_incomplete": "--incomplete"}


def _constraints(config: Path | None, **flags):
    """Constraints from the TOML ``config`` (or the defaults), then the non-None flags;
    a flag value the constraints refuse is an input error naming the flag."""
    from pydantic import ValidationError

    from dataset.errors import InputError
    from oracle import Constraints

    if config:
        with reading(config):
            c = Constraints.from_toml(config)
    else:
        c = Constraints()
    try:
        return c.replace(**flags)
    except ValidationError as exc:
        field, msg = _first_error(exc)
        raise InputError(f"{_FLAG_OF.get(field, '--' + field.replace('_', '-'))}: {msg}") from None


def _first_error(exc) -> tuple[str, str]:
    """(dotted field, message) of a pydantic ValidationError's first error: the one line
    to show for a flag value pydantic refuses (its own text spans several)."""
    err = exc.errors()[0]
    return ".".join(map(str, err["loc"])), err["msg"]


# --------------------------------------------------------------------- modes
@app.command("modes")
@friendly_errors
def modes_cmd(
    show: Annotated[str | None, typer.Option(help="Show one mode's full settings.")] = None,
    set_: Annotated[list[str] | None, typer.Option(
        "--set", help="With --show: override a setting, key=value (e.g. speculative.num_speculative_tokens=3).")] = None,
):
    """List the registered inference modes (or show one, with overrides)."""
    import json

    import pandas as pd
    from pydantic import ValidationError

    from dataset.errors import InputError
    from engine.modes import get_mode, list_modes

    if show:
        mode = get_mode(show)
        if set_:
            try:
                mode = mode.with_overrides(list(set_))
            except ValidationError as exc:
                field, msg = _first_error(exc)
                raise InputError(f"--set {field}: {msg}") from None
        console.print_json(json.dumps(mode.to_dict()))
        return
    rows = []
    for m in list_modes():
        rows.append({
            "mode": m.name,
            "quant": m.quantization,
            "speculative": m.speculative.method if m.speculative else "-",
            "prefix": m.prefix_caching,
            "chunked": m.chunked_prefill,
            "batching": m.batching,
            "graphs": "common" if m.graph_capture is None else m.graph_capture,
            "kv": m.kv_cache_dtype,
            "phase": m.primary_phase,
            "substitutes": ", ".join(m.substitutes) or ("(reference)" if m.is_reference else "-"),
        })
    console.print(frame_table(pd.DataFrame(rows).set_index("mode"), title="Registered modes"))


@app.command("workloads")
@friendly_errors
def workloads_cmd():
    """List the registered workloads (request populations)."""
    import pandas as pd

    from dataset.workloads import list_workloads

    df = pd.DataFrame([{
        "workload": w.name, "condition": w.condition, "prompt": w.prompt_tokens,
        "output": w.expected_output_tokens, "shared_prefix": w.shared_prefix_tokens,
        "concurrent": w.concurrent_requests, "mem_pressure": w.memory_pressure,
        "description": w.description,
    } for w in list_workloads()]).set_index("workload")
    console.print(frame_table(df, title="Registered workloads"))


# ------------------------------------------------------------------ requests
@app.command("requests")
@friendly_errors
def requests_cmd(
    output: Annotated[Path, typer.Option("-o", "--output", help="Requests file to write (.jsonl or .parquet).")],
    workloads: Annotated[list[str] | None, typer.Option(help="Workloads to draw from (default: all).")] = None,
    n: Annotated[int, typer.Option("-n", help="Requests per workload.")] = 20,
    seed: Annotated[int, typer.Option(help="Random seed.")] = 0,
    overwrite: Annotated[bool, typer.Option(help="Replace an existing output file.")] = False,
):
    """Draw a request population from registered workloads (shape spread included)."""
    from dataset.io import write_parquet, write_text
    from dataset.requests import requests_frame
    from dataset.workloads import get_workload, list_workloads

    names = _split(workloads) or [w.name for w in list_workloads()]
    reqs = [r for i, name in enumerate(names) for r in get_workload(name).sample(n, seed + i)]
    df = requests_frame(reqs)
    if output.suffix == ".parquet":
        write_parquet(df, output, overwrite=overwrite)
    else:
        write_text(df.to_json(orient="records", lines=True), output, overwrite=overwrite)
    console.print(f"wrote {len(reqs)} requests from {len(names)} workloads to {output}")


# ------------------------------------------------------------------- import
@app.command("import-profiles")
@friendly_errors
def import_profiles_cmd(
    files: Annotated[list[Path], typer.Argument(help="Published measurement CSV files.")],
    output: Annotated[Path, typer.Option("-o", "--output", help="Profile parquet to write.")],
    importer: Annotated[str | None, typer.Option(help="Force an importer (default: detect by columns).")] = None,
    overwrite: Annotated[bool, typer.Option(help="Replace an existing output file.")] = False,
):
    """Convert external measurements (e.g. the study's A100 CSVs) into a profile table."""
    from dataset.importers import import_files
    from dataset.profile_schema import write_profile

    with reading(", ".join(map(str, files))):
        df = import_files(files, importer)
    write_profile(df, output, overwrite=overwrite, source=", ".join(map(str, files)))
    agg = int(df["is_aggregate"].sum())
    console.print(
        f"wrote {len(df)} rows ({len(df) - agg} per-trial, {agg} aggregate) covering "
        f"{df['mode'].nunique()} modes x {df['workload'].nunique()} workloads to {output}"
    )


@app.command("validate")
@friendly_errors
def validate_cmd(
    files: Annotated[list[Path], typer.Argument(help="Profile files (.parquet or .csv).")],
):
    """Validate profile files against the schema; report every problem with row and column."""
    from dataset.profile_schema import read_profile

    for f in files:
        with reading(f):
            df = read_profile(f)
        console.print(f"[green]ok[/green] {f}: {len(df)} rows")


# -------------------------------------------------------------------- label
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
    overwrite: Annotated[bool, typer.Option(help="Replace existing output files.")] = False,
    costmodel: Annotated[str, typer.Option(help="Cost model for estimated requests: a file from `modeswitch costmodel fit`, 'auto' (fit and validate on the profile now) or 'none' (interpolation only). Used per (mode, metric) only where it validated better.")] = "auto",
):
    """Label each unit (or request) with the fastest mode that meets every constraint."""
    from dataset.io import write_parquet
    from dataset.profile_schema import read_profiles
    from dataset.requests import read_requests, requests_frame
    from oracle import label_profile, label_requests
    from oracle.explain import print_explanations, print_labels

    c = _constraints(
        config, max_energy_ratio=max_energy_ratio, max_memory_ratio=max_memory_ratio,
        max_accuracy_drop_pp=max_accuracy_drop_pp, min_rouge_vs_baseline=min_rouge_vs_baseline,
        max_rouge_vs_reference_drop=max_rouge_vs_reference_drop,
        latency_tie_rel=latency_tie_rel, on_incomplete=incomplete, missing_quality=missing_quality,
        noise_aware=noise_aware,
    )
    paths = _split(profiles)
    source = ", ".join(paths)
    with reading(source):
        profile = read_profiles(paths)
    if requests is not None:
        with reading(requests):
            reqs = requests_frame(read_requests(requests))
        cm = _costmodel(costmodel, profile, source)
        labels, cand, skipped = label_requests(profile, reqs, c, source=source, costmodel=cm)
    else:
        labels, cand, skipped = label_profile(profile, c, source=source)
    if output is not None:
        cand_path = output.with_name(output.stem + ".candidates.parquet")
        if cand_path.exists() and not overwrite:
            raise FileExistsError(f"{cand_path} already exists; pass --overwrite to replace it")
        write_parquet(labels.reset_index(), output, overwrite=overwrite)
        write_parquet(cand, cand_path, overwrite=overwrite)
    if explain:
        print_explanations(labels, cand, c, out=console)
    print_labels(labels, skipped, c, out=console)
    from oracle.quality_floor import self_consistency_floor

    floor = self_consistency_floor(profile)
    if not floor.empty:
        console.print(frame_table(floor, title="self-consistency floor: the reference against itself in its "
                                               "lossless modes (reported, not charged to a mode)", index=False))
    if output is not None:
        console.print(f"wrote {len(labels)} labels to {output} and the per-mode verdicts to {cand_path}")


# -------------------------------------------------------------------- route
@app.command("route")
@friendly_errors
def route_cmd(
    requests: Annotated[Path, typer.Option(help="Requests to route (.jsonl/.csv/.parquet).")],
    router: Annotated[str, typer.Option(help="Registered router name.")] = "rule",
    available_modes: Annotated[list[str] | None, typer.Option(help="Modes the target backend has (default: all registered).")] = None,
    explain: Annotated[bool, typer.Option(help="Print the rule or reason behind each decision.")] = False,
):
    """Route requests with a router and print the chosen mode per request."""
    import collections

    import pandas as pd

    from dataset.features import features_frame
    from dataset.requests import read_requests
    from routers import get_router

    with reading(requests):
        reqs = read_requests(requests)
    X = features_frame(reqs)
    params = {"available_modes": _split(available_modes)} if available_modes else {}
    est = get_router(router, **params).fit(X)
    if explain and hasattr(est, "explain"):
        df = pd.DataFrame(est.explain(X), columns=["mode", "reason"], index=X.index)
        console.print(frame_table(df, title=f"{router} decisions"))
    counts = collections.Counter(est.predict(X))
    df = pd.DataFrame(sorted(counts.items()), columns=["mode", "requests"]).set_index("mode")
    console.print(frame_table(df, title=f"{router}: {len(reqs)} requests"))


# ------------------------------------------------------------------ dataset
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
    config: Annotated[Path | None, typer.Option(help="TOML constraint thresholds.")] = None,
    incomplete: Annotated[Incomplete | None, typer.Option(help="What a missing reference row or metric does: error (stop) or skip [{on_incomplete}].")] = None,
    missing_quality: Annotated[MissingQuality | None, typer.Option(help="A mode with no quality evidence: unsafe (the study's rule) or pass (unchecked) [{missing_quality}].")] = None,
    noise_aware: Annotated[bool | None, typer.Option("--noise-aware/--no-noise-aware", help="Measured units with 2+ trials: a mode replaces a safer one only beyond noise, limits met by the interval [{noise_aware}].")] = None,
    overwrite: Annotated[bool, typer.Option(help="Replace an existing output file.")] = False,
    costmodel: Annotated[str, typer.Option(help="Cost model for estimated requests: a file from `modeswitch costmodel fit`, 'auto' (fit and validate on the profile now) or 'none' (interpolation only). Used per (mode, metric) only where it validated better.")] = "auto",
):
    """Draw requests, compute features, label them with the oracle, attach per-mode costs."""
    import dataclasses

    from dataset.benchmarks import read_benchmark
    from dataset.errors import InputError
    from dataset.io import write_parquet
    from dataset.profile_schema import read_profiles
    from dataset.workloads import get_workload, list_workloads
    from oracle.training_table import build_training_table

    c = _constraints(config, on_incomplete=incomplete, missing_quality=missing_quality,
                     noise_aware=noise_aware)
    paths = _split(profiles)
    with reading(", ".join(paths)):
        profile = read_profiles(paths)
    registered = {w.name for w in list_workloads()}
    names = _split(workloads) or [f for f in profile["family"].unique() if f in registered]
    if not names:
        raise InputError("no registered workload families in the profile; pass --workloads")
    per = max(1, requests // len(names))
    # drawn ids are namespaced: a profile's own requests come from the same generators
    reqs = [dataclasses.replace(r, id=f"draw-{r.id}") for i, n in enumerate(names)
            for r in get_workload(n).sample(per, seed=seed * 100 + i)]
    for f in _split(benchmarks):
        reqs += read_benchmark(f, benchmark_requests, seed=seed)
    if profiled:
        from oracle.training_table import profiled_requests

        drawn = {r.id for r in reqs}
        reqs += [r for r in profiled_requests(profile) if r.id not in drawn
                 and (not _split(workloads) or r.family in names)]
    cm = _costmodel(costmodel, profile, ", ".join(paths))
    table = build_training_table(profile, reqs, c, source=", ".join(paths), costmodel=cm)
    write_parquet(table, output, overwrite=overwrite)
    counts = table["label"].value_counts()
    console.print(f"wrote {len(table)} requests x {table.shape[1]} columns to {output}")
    console.print("labels: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    console.print("label source: " + ", ".join(
        f"{k} {v}" for k, v in table["label_source"].value_counts().items()))
    console.print("label latency from: " + ", ".join(
        f"{k} {v}" for k, v in table["latency_basis"].value_counts().items()))


def _costmodel(choice: str, profile, source):
    """The cost model ``--costmodel`` names: a saved one, one fitted now, or none."""
    from oracle.costmodel import CostModel, enough_requests, fit_validated

    if choice == "none":
        return None
    if choice != "auto":
        with reading(choice):
            return CostModel.load(choice)
    why = enough_requests(profile)
    if why:
        console.print(f"cost model: not fitted ({why}); estimates are interpolated")
        return None
    cm = fit_validated(profile, source=source)
    better = sorted({f"{m}:{k}" for (m, _, k) in cm.groups if cm.prefers(m, k)})
    console.print(f"cost model: fitted and validated on the profile; used for {len(better)} "
                  "(mode, metric) pairs where it validated better than the interpolation")
    return cm


# ---------------------------------------------------------------- costmodel
costmodel_app = typer.Typer(help="Per-mode cost models fitted from measured requests, validated against the interpolation.",
                            no_args_is_help=True)
app.add_typer(costmodel_app, name="costmodel")


def _validation_view(table):
    """Wide view of a validation table: per mode, MAPE (and share within 10 %) of the
    cost model and the interpolation, per metric."""
    short = {"latency_ms": "latency", "ttft_ms": "TTFT", "energy_per_token_j": "energy/tok",
             "peak_memory_mb": "memory"}
    out = {}
    for metric, g in table.groupby("metric", sort=False):
        g = g.set_index("mode")
        name = short.get(metric, metric)
        out[f"{name} cm"] = g["mape_costmodel"]
        out[f"{name} interp"] = g["mape_interpolation"]
        out[f"{name} cm<=10%"] = g["within10_costmodel"]
    import pandas as pd

    view = pd.DataFrame(out)
    order = [c for m in ("latency", "TTFT", "energy/tok", "memory")
             for c in (f"{m} cm", f"{m} interp", f"{m} cm<=10%") if c in view]
    view = view[order]
    view.index.name = "mode"
    return view


def _print_validation(table, k: int):
    view = _validation_view(table)
    console.print(frame_table(view, title=f"{k}-fold cross-validation grouped by request: MAPE of the "
                              "cost model (cm) and the Delaunay interpolation (interp) on the same "
                              "folds; cm<=10%: share of held-out requests within 10 %"))
    for metric, limit in (("latency_ms", 0.10), ("ttft_ms", 0.15)):
        g = table[table["metric"] == metric]
        ok = (g["mape_costmodel"] <= limit).sum()
        worst = g.loc[g["mape_costmodel"].idxmax()] if len(g) else None
        line = f"{metric}: cost-model MAPE <= {limit:.0%} for {ok}/{len(g)} modes"
        if worst is not None:
            line += (f" (worst {worst['mode']} {worst['mape_costmodel']:.1%}; interpolation "
                     f"median over modes {g['mape_interpolation'].median():.1%})")
        console.print(line)


@costmodel_app.command("validate")
@friendly_errors
def costmodel_validate_cmd(
    profiles: Annotated[list[str], typer.Option("--profiles", "-p", help="Profile parquet file(s) with measured requests.")],
    folds: Annotated[int, typer.Option(help="Cross-validation folds (grouped by request, stratified by family).")] = 5,
    seed: Annotated[int, typer.Option(help="Fold shuffling seed.")] = 0,
    misfit: Annotated[float, typer.Option(help="Training MAPE above which a monotone boosted model is tried.")] = 0.10,
    output: Annotated[Path | None, typer.Option("-o", "--output", help="Write the validation table (CSV) here; per-request predictions beside it.")] = None,
):
    """K-fold error of the cost model per metric and mode, next to the interpolation."""
    from dataset.io import atomic_path
    from dataset.profile_schema import read_profiles
    from oracle.costmodel import validate

    paths = _split(profiles)
    with reading(", ".join(paths)):
        profile = read_profiles(paths)
    with console.status("cross-validating") as status:
        table, preds = validate(profile, k=folds, seed=seed, misfit=misfit,
                                progress=lambda i, n: status.update(f"cross-validating: fold {i}/{n}"))
    _print_validation(table, folds)
    if output is not None:
        with atomic_path(output) as tmp:
            table.to_csv(tmp, index=False)
        pred_path = output.with_name(output.stem + ".predictions.csv")
        with atomic_path(pred_path) as tmp:
            preds.to_csv(tmp, index=False)
        console.print(f"wrote {output} and {pred_path}")


@costmodel_app.command("fit")
@friendly_errors
def costmodel_fit_cmd(
    profiles: Annotated[list[str], typer.Option("--profiles", "-p", help="Profile parquet file(s) with measured requests.")],
    output: Annotated[Path, typer.Option("-o", "--output", help="Cost model file to write (JSON; its validation table beside it as CSV).")],
    folds: Annotated[int, typer.Option(help="Cross-validation folds (grouped by request, stratified by family).")] = 5,
    seed: Annotated[int, typer.Option(help="Fold shuffling seed.")] = 0,
    misfit: Annotated[float, typer.Option(help="Training MAPE above which a monotone boosted model is tried.")] = 0.10,
    mlruns: Annotated[Path, typer.Option(help="MLflow store folder (SQLite backend inside).")] = Path("mlruns"),
    track: Annotated[bool, typer.Option(help="Log the fit, its validation and the file to MLflow (experiment 'costmodel').")] = True,
):
    """Fit the per-mode cost model on every measured request, with its validation table."""
    from dataset.profile_schema import read_profiles
    from oracle.costmodel import fit_validated
    from oracle.training_table import frame_hash

    paths = _split(profiles)
    with reading(", ".join(paths)):
        profile = read_profiles(paths)
    with console.status("cross-validating, then fitting") as status:
        cm = fit_validated(profile, k=folds, seed=seed, misfit=misfit, source=", ".join(paths),
                           progress=lambda i, n: status.update(f"cross-validating: fold {i}/{n}"))
    cm.save(output)
    _print_validation(cm.validation, folds)
    forms = {}
    for g in cm.groups.values():
        forms[g.form] = forms.get(g.form, 0) + 1
    console.print(f"wrote {output} ({len(cm.groups)} (mode, condition, metric) models: "
                  + ", ".join(f"{k} {v}" for k, v in forms.items()) + ")")
    if track:
        import mlflow

        from routers.training.tracking import setup

        setup(mlruns, "costmodel")
        with mlflow.start_run(run_name=f"costmodel-{cm.backend}") as run:
            mlflow.log_params({"profiles": ", ".join(paths), "profile_hash": frame_hash(profile),
                               "backend": cm.backend, "folds": folds, "seed": seed,
                               "misfit": misfit, "models": len(cm.groups)})
            v = cm.validation
            for r in v.itertuples(index=False):
                for col in ("mape_costmodel", "mape_interpolation", "within10_costmodel"):
                    val = getattr(r, col)
                    if val == val:  # not NaN
                        mlflow.log_metric(f"{col}.{r.metric}.{r.mode}", float(val))
            mlflow.log_artifact(str(output))
            mlflow.log_artifact(str(output.with_suffix(".validation.csv")))
        console.print(f"logged to MLflow run {run.info.run_id} (experiment 'costmodel', {mlruns})")

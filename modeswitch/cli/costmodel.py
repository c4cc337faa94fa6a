"""``costmodel validate`` and ``costmodel fit``: per-mode cost models from measured
requests, cross-validated against the interpolation they may replace."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import pandas as pd
import typer

from modeswitch.cli.common import (
    _split,
    friendly_errors,
    reading,
)
from modeswitch.dataset.io import atomic_path
from modeswitch.dataset.profile_schema import read_profiles
from modeswitch.display import console, frame_table
from modeswitch.oracle.costmodel import fit_validated, validate
from modeswitch.oracle.training_table import frame_hash
from modeswitch.routers.training.tracking import setup

#: this module's commands; modeswitch.cli.lazy imports the module when one of them runs
app = typer.Typer(add_completion=False)

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
        import mlflow  # MLflow only when the fit is tracked

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

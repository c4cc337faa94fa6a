"""``export``: register a trained router in MLflow as a pyfunc model, aliased
``champion`` (by run id, or the best of the latest scoring run by a metric)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import mlflow
import mlflow.sklearn
import typer

from modeswitch.cli.common import TRACKING_HELP, friendly_errors
from modeswitch.dataset.errors import InputError
from modeswitch.display import console
from modeswitch.routers.export import best_from_scoring, export_router
from modeswitch.routers.training.tracking import setup, use_tracking_uri

#: this module's commands; modeswitch.cli.lazy imports the module when one of them runs
app = typer.Typer(add_completion=False)


@app.command("export")
@friendly_errors
def export_cmd(
    run: Annotated[str | None, typer.Option(help="Training run id whose router to export.")] = None,
    best: Annotated[str | None, typer.Option(help="Export the best router of the latest scoring run by this metric (e.g. latency_capture, speedup, oracle_match).")] = None,
    max_violation_rate: Annotated[float | None, typer.Option(help="With --best: skip routers whose summed violation rate exceeds this.")] = None,
    name: Annotated[str, typer.Option(help="Registered model name.")] = "modeswitch-router",
    mlruns: Annotated[Path, typer.Option(help="MLflow store folder.")] = Path("mlruns"),
    tracking_uri: Annotated[str | None, typer.Option(help=TRACKING_HELP)] = None,
):
    """Register a trained router in MLflow as a pyfunc model and alias it `champion`."""
    use_tracking_uri(tracking_uri)

    if (run is None) == (best is None):
        raise InputError("give exactly one of --run RUN_ID or --best METRIC")
    extra = {}
    if best is not None:
        router_name, run, value, score_run = best_from_scoring(best, str(mlruns), max_violation_rate)
        console.print(f"best by {best}: {router_name} ({value:.4g}) from scoring run {score_run}")
        extra = {"selected_by": best, "selected_value": value, "scoring_run_id": score_run}
    setup(mlruns, "modeswitch-export")
    try:
        r = mlflow.MlflowClient().get_run(run)
    except mlflow.exceptions.MlflowException as exc:
        if exc.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise
        raise InputError(f"--run {run}: no such training run in {mlruns} (`modeswitch train` prints run ids; "
                         "or use --best METRIC)") from None
    uri = r.data.tags.get("model_uri") or f"runs:/{run}/model"
    est = mlflow.sklearn.load_model(uri)
    info = export_router(est, name=name, mlruns=str(mlruns), source_run_id=run,
                         backend=r.data.tags.get("backends", "unknown"),
                         extra={"router_family": r.data.tags.get("router_family"), **extra})
    console.print(f"registered {info['name']} version {info['version']} as {info['uri']} "
                  f"(modes: {', '.join(info['meta']['modes'])}; backend {info['meta']['backend']})")

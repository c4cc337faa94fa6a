"""Commands on learned routers: ``train`` (Optuna + MLflow), ``score`` (against the rule
baseline, offline and live) and ``export`` (register one as the ``champion``).

``train`` and ``score`` are thin over their config dataclasses
(:class:`routers.training.trainer.TrainConfig`, :class:`routers.scoring.run.ScoreConfig`):
one option per user-settable field, with the field's default;
tests/test_cli_options.py holds them to that, and lists the fields left out on purpose.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
)

from modeswitch.cli.common import (
    Fallback,
    FeatureSet,
    Labels,
    Split,
    _split,
    app,
    backend_name,
    backend_names,
    deferred_help,
    friendly_errors,
)
from modeswitch.dataset.errors import InputError
from modeswitch.display import console, fmt, frame_table
from modeswitch.engine.models.resolve import MODEL_HELP

TRACKING_HELP = ("MLflow tracking store, e.g. http://HOST:5000 (an `mlflow server`, PostgreSQL "
                 "backend for several writers) [$MLFLOW_TRACKING_URI, else SQLite in --mlruns].")


def _read_table(path: Path):
    """A training table from `dataset build`, or your own per-mode cost table (CSV or
    parquet with the columns of :mod:`oracle.external_table`), labelled here."""
    from modeswitch.oracle.external_table import read_training_table  # lazy: pulls scipy, pandas

    return read_training_table(path)


# -------------------------------------------------------------------- train
@app.command("train", cls=deferred_help("modeswitch.routers.training.trainer:TrainConfig"))
@friendly_errors
def train_cmd(
    data: Annotated[Path, typer.Option(help="Training table from `modeswitch dataset build`, or your own per-mode cost table (CSV/parquet; columns in docs/training.md 'Bring your own labels').")],
    routers: Annotated[str | None, typer.Option(help="Router families, comma-separated [{routers}].")] = None,
    feature_set: Annotated[FeatureSet, typer.Option(help="A (request shape) or B (A + family/suite).")] = "A",
    split: Annotated[Split, typer.Option(help="random, group (by family) or lofo (leave one family out).")] = "group",
    test_size: Annotated[float, typer.Option(help="Share of requests (or families) held out for testing.")] = 0.25,
    trials: Annotated[int, typer.Option(help="Optuna trials per router family.")] = 30,
    seed: Annotated[int, typer.Option(help="Split and sampler seed.")] = 42,
    unsafe_penalty: Annotated[float, typer.Option(help="Objective penalty per unsafe pick.")] = 1.0,
    safety_threshold: Annotated[float | None, typer.Option(help="Only predict modes whose P(safe) >= this.")] = None,
    fallback: Annotated[Fallback, typer.Option(help="What decides when no mode looks safe.")] = "rule",
    labels: Annotated[Labels, typer.Option(help="Train and score on all rows, or only on labels from the requests' own measurements.")] = "all",
    target_violation_rate: Annotated[float, typer.Option(help="Every router with a risk score is certified (routers/certified.py): violation rate on new requests at most this, with 90 % confidence (Learn then Test on held-out training rows); 0: the tuned threshold.")] = 0.01,
    storage: Annotated[str | None, typer.Option(help="Optuna storage URL (default: optuna.db in --mlruns); postgresql://USER:PASS@HOST/DB lets several train processes, here or on other machines, tune one study.")] = None,
    workers: Annotated[int, typer.Option(min=1, help="Local processes tuning each family's study together.")] = 1,
    mlruns: Annotated[Path, typer.Option(help="MLflow/Optuna store folder.")] = Path("mlruns"),
    tracking_uri: Annotated[str | None, typer.Option(help=TRACKING_HELP)] = None,
    preset: Annotated[str | None, typer.Option(help="modeswitch-paper: the study's setup (split, test size, seed, feature set).")] = None,
):
    """Tune and train learned routers with Optuna; track everything in MLflow."""
    # lazy: pulls scikit-learn, scipy, pandas
    from modeswitch.routers.training.trainer import TrainConfig, train

    table = _read_table(data)
    # --routers left out: the config's default, every registered learned family
    families = {"routers": _split([routers])} if routers is not None else {}
    cfg = TrainConfig(feature_set=feature_set, split=split, test_size=test_size, trials=trials,
                      seed=seed, unsafe_penalty=unsafe_penalty, safety_threshold=safety_threshold,
                      fallback=fallback, storage=storage, workers=workers, mlruns=str(mlruns),
                      tracking_uri=tracking_uri, preset=preset,
                      labels=labels, target_violation_rate=target_violation_rate, **families)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeRemainingColumn(), console=console) as progress:
        res = train(table, cfg, progress)
    cols = ["router", "split", "best_validation_objective", "test_objective", "test_oracle_match",
            "test_macro_f1", "test_mean_regret", "test_violation_rate_any", "rule_objective",
            "rule_oracle_match", "rule_violation_rate_any", "n_test"]
    console.print(frame_table(res.set_index("router")[cols[1:]],
                              title=f"best trial per router family (held-out requests; split {cfg.split})"))
    console.print("runs: " + ", ".join(f"{r.router}={r.run_id}" for r in res.itertuples())
                  + " — open them with `make ui`")


# -------------------------------------------------------------------- score
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
    compile_routers: Annotated[bool, typer.Option("--compile/--no-compile", help="Route with compiled routers or the scikit-learn pipelines.")] = True,
    decisions: Annotated[int, typer.Option(help="Single decisions timed per router.")] = 20_000,
    pipeline_decisions: Annotated[int, typer.Option(help="Single decisions timed per scikit-learn pipeline (slower; at most --decisions).")] = 300,
    mlruns: Annotated[Path, typer.Option(help="MLflow store folder.")] = Path("mlruns"),
    tracking_uri: Annotated[str | None, typer.Option(help=TRACKING_HELP)] = None,
    seed: Annotated[int, typer.Option(help="Live stream seed.")] = 0,
    labels: Annotated[Labels, typer.Option(help="Score on all rows, or only measured labels (as the routers were trained with `train --labels`).")] = "all",
):
    """Score trained routers against the rule baseline: overhead, violations, speedup, energy, quality."""
    # lazy: pulls scikit-learn, scipy, pandas
    from modeswitch.routers.scoring.run import ScoreConfig, score_routers

    out = output or Path("reports") / f"score-{datetime.now():%Y%m%d-%H%M%S}"
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} already holds a report; choose a new folder")
    cfg = ScoreConfig(mlruns=str(mlruns), tracking_uri=tracking_uri, run_ids=_split(run), compiled=compile_routers,
                      decisions=decisions, pipeline_decisions=pipeline_decisions, live=live,
                      live_requests=live_requests, live_per_family=live_per_family, live_trials=live_trials,
                      live_threads=live_threads, live_max_remeasure=live_max_remeasure, model=model, draft_model=draft_model,
                      device=device, backend=backend, seed=seed, name=out.name, labels=labels)
    training = _read_table(data)
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


# ------------------------------------------------------------------- export
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
    from modeswitch.routers.training.tracking import use_tracking_uri  # lazy: pulls numpy

    use_tracking_uri(tracking_uri)

    if (run is None) == (best is None):
        raise InputError("give exactly one of --run RUN_ID or --best METRIC")
    import mlflow  # lazy: MLflow is slow to import
    import mlflow.sklearn  # lazy: MLflow is slow to import

    # lazy: pulls MLflow, scikit-learn, scipy
    from modeswitch.routers.export import best_from_scoring, export_router
    from modeswitch.routers.training.tracking import setup  # lazy: pulls numpy

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

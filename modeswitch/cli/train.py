"""``train``: tune and train learned routers with Optuna, tracked in MLflow.

Thin over its config dataclass (:class:`modeswitch.routers.training.trainer.TrainConfig`): one
option per user-settable field, with the field's default; tests/test_cli_options.py
holds it to that, and lists the fields left out on purpose. ``--data`` is a training
table from ``dataset build``, or the user's own per-mode cost table (CSV or parquet
with the columns of :mod:`modeswitch.oracle.external_table`), labelled on reading.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from modeswitch.cli.common import (
    ADVANCED,
    TRACKING_HELP,
    Certificate,
    Fallback,
    FeatureSet,
    Labels,
    LofoTuning,
    Split,
    TuningObjective,
    _split,
    deferred_help,
    friendly_errors,
)
from modeswitch.display import console, frame_table
from modeswitch.oracle.external_table import read_training_table
from modeswitch.routers.training.trainer import TrainConfig, train


def parse_router_params(items: list[str]) -> dict[str, dict]:
    """``FAMILY.NAME=VALUE`` options as {family: {name: value}}; a value is a Python
    literal (31, 0.3, True) where it reads as one, else the text itself."""
    out: dict[str, dict] = {}
    for item in items:
        key, sep, text = item.partition("=")
        family, dot, name = key.partition(".")
        if not sep or not dot or not family or not name:
            raise typer.BadParameter(f"{item!r}: expected FAMILY.NAME=VALUE (e.g. cost_lgbm.risk_score=margin)",
                                     param_hint="--router-params")
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            value = text
        out.setdefault(family.strip(), {})[name.strip()] = value
    return out


#: this module's commands; modeswitch.cli.lazy imports the module when one of them runs
app = typer.Typer(add_completion=False)


@app.command("train", cls=deferred_help("modeswitch.routers.training.trainer:TrainConfig"))
@friendly_errors
def train_cmd(
    data: Annotated[Path, typer.Option(help="Training table from `modeswitch dataset build`, or your own per-mode cost table (CSV/parquet; columns in docs/training.md 'Bring your own labels').")],
    routers: Annotated[str | None, typer.Option(help="Router families, comma-separated [{routers}].")] = None,
    feature_set: Annotated[FeatureSet, typer.Option(help="A (request shape), B (A + family/suite) or C (A + the prompt's content; the table needs `dataset build --content-model`).")] = "A",
    split: Annotated[Split, typer.Option(help="random, group (by family) or lofo (leave one family out).")] = "group",
    test_size: Annotated[float, typer.Option(help="Share of requests (or families) held out for testing.")] = 0.25,
    trials: Annotated[int, typer.Option(help="Optuna trials per router family.")] = 30,
    seed: Annotated[int, typer.Option(help="Split and sampler seed.")] = 42,
    unsafe_penalty: Annotated[float, typer.Option(help="Objective penalty per unsafe pick.")] = 1.0,
    safety_threshold: Annotated[float | None, typer.Option(help="Only predict modes whose P(safe) >= this.")] = None,
    fallback: Annotated[Fallback, typer.Option(help="What decides when no mode looks safe.")] = "rule",
    labels: Annotated[Labels, typer.Option(rich_help_panel=ADVANCED, help="Train and score on all rows, or only on labels from the requests' own measurements.")] = "all",
    target_violation_rate: Annotated[float, typer.Option(help="Every router with a risk score is certified (routers/certified.py): violation rate on new requests at most this, with 90 % confidence (Learn then Test on held-out training rows); 0: the tuned threshold.")] = 0.01,
    certificate: Annotated[Certificate, typer.Option(rich_help_panel=ADVANCED, help="What the certificate bounds: pooled (the calibration rows' rate), per-family (every family's; small families pooled), family-held-out (each calibration row decided by a clone that never saw its family), per-family-held-out (both), family-cross-fit / per-family-cross-fit (the same on every training row, each decided by a clone fitted on the other families).")] = "pooled",
    decision_cost: Annotated[bool, typer.Option(help="Tuning scores each model as it serves: its compiled (or distilled) picks, and its measured decision p50 added to every request's latency.")] = True,
    storage: Annotated[str | None, typer.Option(help="Optuna storage URL (default: optuna.db in --mlruns); postgresql://USER:PASS@HOST/DB lets several train processes, here or on other machines, tune one study.")] = None,
    workers: Annotated[int, typer.Option(min=1, help="Local processes tuning each family's study together.")] = 1,
    mlruns: Annotated[Path, typer.Option(help="MLflow/Optuna store folder.")] = Path("mlruns"),
    tracking_uri: Annotated[str | None, typer.Option(help=TRACKING_HELP)] = None,
    preset: Annotated[str | None, typer.Option(help="modeswitch-paper: the study's setup (split, test size, seed, feature set).")] = None,
    router_params: Annotated[list[str] | None, typer.Option(help="A fixed router parameter, FAMILY.NAME=VALUE (e.g. cost_lgbm.risk_score=margin); repeatable. Beside the tuned ones, and over them where both name one.")] = None,
    tuning_objective: Annotated[TuningObjective, typer.Option(rich_help_panel=ADVANCED, help="What Optuna minimises for routers whose trials are scored as certified (a cross-fitted --certificate with a target): regret (mean latency regret + the unsafe penalty per pick; every request weighs alike) or capture (1 - the pooled share of the oracle's saving kept + the penalty times the violation rate; the score report's figure, long requests weigh most). Other routers minimise regret.")] = "regret",
    lofo_tuning: Annotated[LofoTuning, typer.Option(rich_help_panel=ADVANCED, help="Leaving one family out, where the parameters are tuned: nested (one Optuna study per fold, on its training families only; the held-out family never chooses its own parameters) or pooled (one study on every row: about 7x cheaper with 7 families, but a selection effect).")] = "nested",
):
    """Tune and train learned routers with Optuna; track everything in MLflow."""
    table = read_training_table(data)
    # --routers left out: the config's default, every registered learned family
    families = {"routers": _split([routers])} if routers is not None else {}
    cfg = TrainConfig(feature_set=feature_set, split=split, test_size=test_size, trials=trials,
                      seed=seed, unsafe_penalty=unsafe_penalty, safety_threshold=safety_threshold,
                      fallback=fallback, storage=storage, workers=workers, mlruns=str(mlruns),
                      tracking_uri=tracking_uri, preset=preset,
                      labels=labels, target_violation_rate=target_violation_rate,
                      certificate=certificate, decision_cost=decision_cost,
                      router_params=parse_router_params(router_params or []),
                      tuning_objective=tuning_objective, lofo_tuning=lofo_tuning, **families)
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

"""The Python API: the CLI's train / score / export steps as functions for your own
training scripts (and what ``examples/`` uses).

Why a separate surface: the CLI's commands take files and MLflow run ids; a script
holds DataFrames and fitted estimators. These functions take those, and call the
same code the CLI calls (the trainer, the offline scorer, the overhead timer, the
MLflow export), so a figure from a script and one from ``modeswitch score`` mean
the same thing.

    from modeswitch.dataset.profile_schema import read_profiles
    from modeswitch.oracle import build_training_table, read_cost_table
    from modeswitch.routers import api

    table = read_cost_table("my_costs.csv")            # or build_training_table(profile, requests)
    train, test = api.split(table, "group")
    lgbm = api.fit("lgbm", train)                      # any registered router, or an estimator
    print(api.evaluate({"lgbm": lgbm}, test))          # vs rule, reference and oracle
    run_id = api.log_router(lgbm, train)               # an MLflow training run (dataset, model)
    api.export_router(lgbm, source_run_id=run_id)      # models:/modeswitch-router@champion

Tuning with Optuna is :func:`modeswitch.routers.training.trainer.train` (``TrainConfig``), as
``modeswitch train`` runs it. Every function takes the training table as a frame or as a
:class:`~modeswitch.routers.training.table.TrainingTable` (its labels, per-mode costs and safety
columns, modes, folds and feature columns by name).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from modeswitch.routers.export import export_router, load_router
from modeswitch.routers.reference import OracleRouter
from modeswitch.routers.registry import get_router
from modeswitch.routers.scoring import overhead as oh
from modeswitch.routers.scoring.offline import (
    aggregate_scores,
    offline_intervals,
    requests_from_table,
    score_offline,
)
from modeswitch.routers.scoring.report import headline_table
from modeswitch.routers.scoring.run import ScoreConfig, baselines, score_routers
from modeswitch.routers.training.table import TrainingTable
from modeswitch.routers.training.tracking import git_commit, log_table_input, setup
from modeswitch.routers.training.trainer import TrainConfig, log_model, train

__all__ = ["ScoreConfig", "TrainConfig", "TrainingTable", "evaluate", "export_router", "fit", "load_router",
           "log_router", "score_routers", "split", "train"]


def split(table: pd.DataFrame, how: str = "group", test_size: float = 0.25,
          seed: int = 42) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(training rows, held-out rows) of a training table, split as ``train --split``
    splits it (``random``; ``group``: whole families held out). Both keep the table's
    metadata."""
    if how not in ("random", "group"):
        raise ValueError(f"split {how!r}: choose random or group (lofo is a per-fold loop: "
                         "see TrainingTable.folds)")
    tt = TrainingTable.of(table)
    tr, te = tt.folds(how, test_size, seed)[0]
    return tt.rows(tr).frame, tt.rows(te).frame


def fit(router, table: pd.DataFrame, **params):
    """Fit a router on a training table: ``router`` is a registered name (``"lgbm"``,
    ``"cost_linear"``, a plug-in's name; ``params`` go to its constructor) or an
    unfitted estimator. Classifiers learn the ``label`` column; cost-predicting
    routers read the per-mode cost columns themselves; a router with a safety
    threshold (or a :class:`~modeswitch.routers.certified.CertifiedRouter`) reads the per-mode
    ``safe__<mode>`` labels."""
    est = get_router(router, **params) if isinstance(router, str) else router
    return TrainingTable.of(table).fit(est)


def evaluate(routers: dict, test: pd.DataFrame, decisions: int = 2_000, compiled: bool = True,
             pipeline_decisions: int = 100) -> pd.DataFrame:
    """Score fitted routers on held-out rows ``test`` of a training table beside the
    reference, the rule baseline and the oracle: one row per router with the
    headline figures of ``modeswitch score`` (equal family weights; speedup, energy
    ratio and violation rate with 95 % bootstrap intervals; oracle capture; routing
    overhead measured here, side by side, and charged at its p50)."""
    tt = TrainingTable.of(test)
    test = tt.frame
    everyone = {**baselines(tt.modes), **routers}
    requests = requests_from_table(test, token_ids=True)  # routers reading the prompt route on its ids
    overhead = oh.measure(everyone, requests, decisions, pipeline_decisions, compiled, frame=test)
    everyone["oracle"] = OracleRouter().fit(test)
    per_request = score_offline(test, everyone, {k: v.p50_us for k, v in overhead.items()})
    _, overall = aggregate_scores(per_request)
    return headline_table(overall, overhead, intervals=offline_intervals(per_request))


def log_router(router, table: pd.DataFrame, name: str | None = None, mlruns: str = "mlruns",
               experiment: str = "modeswitch-python") -> str:
    """Log a router fitted in Python as an MLflow training run: its parameters, the
    training table as the run's dataset input, and the model (skops, as ``train``
    logs it), so :func:`export_router` and the MLflow UI treat it like a CLI run.
    Returns the run id."""
    import mlflow  # heavy: only when logging

    setup(Path(mlruns), experiment)
    tt = TrainingTable.of(table)
    family = name or type(router).__name__
    with mlflow.start_run(run_name=family) as run:
        mlflow.set_tags({"router_family": family, "git_commit": git_commit(), "source": "python api",
                         "profile_hash": tt.meta["profile_hash"], "training_table_hash": tt.hash})
        params = {k: v for k, v in router.get_params().items() if not hasattr(v, "get_params")}
        mlflow.log_params({f"param_{k}": v for k, v in params.items()})
        log_table_input(table, "training")
        log_model(router, tt.features)
        return run.info.run_id

"""The Python API: the CLI's train / score / export steps as functions for your own
training scripts (and what ``examples/`` uses).

Why a separate surface: the CLI's commands take files and MLflow run ids; a script
holds DataFrames and fitted estimators. These functions take those, and call the
same code the CLI calls (the trainer, the offline scorer, the overhead timer, the
MLflow export), so a figure from a script and one from ``modeswitch score`` mean
the same thing.

    from dataset.profile_schema import read_profiles
    from oracle import build_training_table, read_cost_table
    from routers import api

    table = read_cost_table("my_costs.csv")            # or build_training_table(profile, requests)
    train, test = api.split(table, "group")
    lgbm = api.fit("lgbm", train)                      # any registered router, or an estimator
    print(api.evaluate({"lgbm": lgbm}, test))          # vs rule, reference and oracle
    run_id = api.log_router(lgbm, train)               # an MLflow training run (dataset, model)
    api.export_router(lgbm, source_run_id=run_id)      # models:/modeswitch-router@champion

Tuning with Optuna is :func:`routers.training.trainer.train` (``TrainConfig``), as
``modeswitch train`` runs it.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from routers.export import export_router, load_router
from routers.registry import get_router
from routers.scoring.run import ScoreConfig, score_routers
from routers.training.trainer import TrainConfig, train

__all__ = ["ScoreConfig", "TrainConfig", "evaluate", "export_router", "fit", "load_router", "log_router",
           "score_routers", "split", "train"]


def split(table: pd.DataFrame, how: str = "group", test_size: float = 0.25,
          seed: int = 42) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(training rows, held-out rows) of a training table, split as ``train --split``
    splits it (``random``; ``group``: whole families held out). Both keep the table's
    metadata."""
    from routers.training.splits import split_indices

    if how not in ("random", "group"):
        raise ValueError(f"split {how!r}: choose random or group (lofo is a per-fold loop: "
                         "see routers.training.splits.split_indices)")
    tr, te = split_indices(table.reset_index(drop=True), how, test_size, seed)[0]
    parts = []
    for rows in (tr, te):
        part = table.iloc[rows].reset_index(drop=True)
        part.attrs = dict(table.attrs)
        parts.append(part)
    return parts[0], parts[1]


def fit(router, table: pd.DataFrame, **params):
    """Fit a router on a training table: ``router`` is a registered name (``"lgbm"``,
    ``"cost_linear"``, a plug-in's name; ``params`` go to its constructor) or an
    unfitted estimator. Classifiers learn the ``label`` column; cost-predicting
    routers read the per-mode cost columns themselves; a router with a safety
    threshold (or a :class:`~routers.certified.CertifiedRouter`) reads the per-mode
    ``safe__<mode>`` labels."""
    est = get_router(router, **params) if isinstance(router, str) else router
    table = table.reset_index(drop=True)
    return est.fit(table, table["label"].astype(str).to_numpy())


def evaluate(routers: dict, test: pd.DataFrame, decisions: int = 2_000, compiled: bool = True,
             pipeline_decisions: int = 100) -> pd.DataFrame:
    """Score fitted routers on held-out rows ``test`` of a training table beside the
    reference, the rule baseline and the oracle: one row per router with the
    headline figures of ``modeswitch score`` (equal family weights; speedup, energy
    ratio and violation rate with 95 % bootstrap intervals; oracle capture; routing
    overhead measured here, side by side, and charged at its p50)."""
    from oracle.training_table import table_meta
    from routers.reference import OracleRouter
    from routers.scoring import overhead as oh
    from routers.scoring.offline import (
        aggregate_scores,
        offline_intervals,
        requests_from_table,
        score_offline,
    )
    from routers.scoring.report import headline_table
    from routers.scoring.run import baselines

    test = test.reset_index(drop=True)
    everyone = {**baselines(table_meta(test)["modes"]), **routers}
    requests = requests_from_table(test)
    overhead = oh.measure(everyone, requests, decisions, pipeline_decisions, compiled)
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
    import mlflow

    from oracle.training_table import frame_hash, table_meta
    from routers.training.tracking import git_commit, log_table_input, setup
    from routers.training.trainer import NOT_FEATURES, log_model

    setup(Path(mlruns), experiment)
    meta = table_meta(table)
    family = name or type(router).__name__
    with mlflow.start_run(run_name=family) as run:
        mlflow.set_tags({"router_family": family, "git_commit": git_commit(), "source": "python api",
                         "profile_hash": meta["profile_hash"], "training_table_hash": frame_hash(table)})
        params = {k: v for k, v in router.get_params().items() if not hasattr(v, "get_params")}
        mlflow.log_params({f"param_{k}": v for k, v in params.items()})
        log_table_input(table, "training")
        log_model(router, table[[c for c in table.columns if "__" not in c and c not in NOT_FEATURES]])
        return run.info.run_id

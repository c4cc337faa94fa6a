"""``train:<split>``: tune and train the study's routers on one split of its training
table (Optuna studies keep their finished trials, so a resumed step continues)."""

from __future__ import annotations

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
)

from modeswitch.routers.training.trainer import TrainConfig, train
from modeswitch.study.steps.dataset import read_table


def run(study, split: str) -> dict:
    c = study.cfg
    families = {"routers": list(c.routers)} if c.routers else {}
    cfg = TrainConfig(feature_set=c.feature_set, split=split, test_size=c.test_size,
                      trials=c.tuning_trials, seed=42 + c.seed, mlruns=c.mlruns, labels=c.labels,
                      target_violation_rate=c.target_violation_rate, certificate=c.certificate,
                      router_params={k: dict(v) for k, v in c.router_params.items()},
                      tuning_objective=c.tuning_objective, lofo_tuning=c.lofo_tuning,
                      workers=c.workers, **families)
    if study.console is None:
        res = train(read_table(study.out), cfg, None)
    else:
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeRemainingColumn(), console=study.console, transient=True) as bar:
            res = train(read_table(study.out), cfg, bar)
    return {"runs": {r.router: r.run_id for r in res.itertuples()},
            "test_oracle_match": {r.router: float(r.test_oracle_match) for r in res.itertuples()}}

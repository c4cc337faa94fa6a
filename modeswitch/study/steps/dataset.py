"""``dataset``: the training table, the profiled requests labelled ``measured`` and the
drawn ones labelled from estimates (their quality from the sweep where it ran)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from modeswitch.dataset.features import reads_content
from modeswitch.dataset.io import write_parquet
from modeswitch.engine.profiler.plan import profiled_leads
from modeswitch.engine.quality_sweep import read_sweep
from modeswitch.oracle.training_table import build_training_table, profiled_requests
from modeswitch.routers.training.table import TrainingTable
from modeswitch.study.steps.costmodel import read_costmodel


def run(study) -> dict:
    cfg = study.cfg
    profile = study._profile()
    reqs = study.drawn_requests() + profiled_requests(profile)
    sweep = study.out / "quality_sweep.parquet"
    table = build_training_table(profile, reqs, cfg.constraint_set(),
                                 source=str(study.out / "profile.parquet"), costmodel=read_costmodel(study.out),
                                 quality=read_sweep(sweep) if cfg.swept_per_family else None,
                                 content_model=study.outputs("model")["target"]
                                 if reads_content(cfg.feature_set) or cfg.confidence else None,
                                 confidence=cfg.confidence, device=cfg.device,
                                 threads=cfg.threads,
                                 built_from=profiled_leads(dataclasses.asdict(
                                     study.profile_spec(*study._models()[:2]))))
    path = study.out / "train.parquet"
    write_parquet(table, path, overwrite=True)
    src = table["label_source"].value_counts()
    study.log(f"training table: {len(table)} requests; label source "
              + ", ".join(f"{k} {v}" for k, v in src.items()))
    return {"table": str(path), "n": len(table),
            "label_source": {str(k): int(v) for k, v in src.items()},
            "labels": {str(k): int(v) for k, v in table["label"].value_counts().items()}}


def read_table(out: Path) -> TrainingTable:
    """The study folder ``out``'s training table (train.parquet), as training and
    scoring read it."""
    return TrainingTable.read(out / "train.parquet")

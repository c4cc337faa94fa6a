"""``labels``: the profiled requests labelled from their own trials (the fastest mode
that meets every constraint)."""

from __future__ import annotations

from modeswitch.dataset.io import write_parquet
from modeswitch.oracle import label_profile


def run(study) -> dict:
    labels, cand, skipped = label_profile(study._profile(), study.cfg.constraint_set(),
                                          source=str(study.out / "profile.parquet"))
    path = study.out / "labels.parquet"
    write_parquet(labels.reset_index(), path, overwrite=True)
    write_parquet(cand, study.out / "labels.candidates.parquet", overwrite=True)
    counts = labels["label"].value_counts()
    study.log("measured labels: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    return {"labels": str(path), "n": len(labels), "skipped": len(skipped),
            "counts": {str(k): int(v) for k, v in counts.items()}}

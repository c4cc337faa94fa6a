"""The ``beside`` step: this study's backend measured on the requests of another
backend's study of the same model (``--beside``), so the report can set both backends'
modes side by side on the same requests (:mod:`modeswitch.study.beside`)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from modeswitch.engine.distributed import make_profiler
from modeswitch.study.beside import BESIDE_PROFILE, beside_spec, other_settings, same_requests


def run(study) -> dict:
    return profile_beside(study, study.beside_requests)


def profile_beside(study, other_dir: Path) -> dict:
    """This backend on the other study's requests (resumable, as the profile step is)."""
    other_dir = Path(other_dir)
    other = pd.read_parquet(other_dir / "profile.parquet")
    target, draft, _ = study._models()
    spec = beside_spec(study.profile_spec(target, draft), other_settings(other_dir), other["mode"].unique())
    path = study.out / BESIDE_PROFILE
    df = make_profiler(spec, target, draft, path, console=study.console).run()
    same = same_requests(df, other)
    return {"beside_profile": str(path), "other": str(other_dir), "rows": len(df),
            "requests": int(df["request_id"].nunique()), "same_requests": len(same)}

"""``profile``: every mode on every family, per-request drawn conditions, ``k``
interleaved trials; the profiler's own journal resumes a half-done sweep."""

from __future__ import annotations

from modeswitch.engine.distributed import make_profiler
from modeswitch.engine.profiler import ProfileSpec


def run(study) -> dict:
    target, draft, _ = study._models()
    path = study.out / "profile.parquet"
    profiler = make_profiler(study.profile_spec(target, draft), target, draft, path,
                             console=study.console, ray=study.ray)
    df = profiler.run()
    noise = profiler.noise_
    return {"profile": str(path), "rows": len(df), "units": int(df["request_id"].nunique()),
            "modes": int(df["mode"].nunique()),
            "contended_share": float(df["contended"].mean()) if "contended" in df else None,
            "noise_floor_median_cv": {str(k): float(v) for k, v in noise["median_cv"].items()}
            if noise is not None and "median_cv" in noise else {}}


def profile_spec(cfg, target, draft) -> ProfileSpec:
    """The profile's settings, as the profiler takes them (and as the training table and
    the score step record what the profile was measured with)."""
    return ProfileSpec(
        model=str(target), draft_model=str(draft) if draft else None, backend=cfg.backend,
        device=cfg.device, checkpoints=dict(cfg.checkpoints), modes=list(cfg.modes) if cfg.modes else None,
        workloads=list(cfg.families),
        requests=cfg.requests_per_family, trials=cfg.trials, max_remeasure=cfg.max_remeasure,
        seed=cfg.seed, threads=cfg.threads, interleave=cfg.interleave,
        conditions=cfg.condition_draw().to_dict(), length_scale=cfg.length_scale)

"""``memory``: memory measured again where the profile measured it the old way.

On CPU, rows without the memory note (:mod:`modeswitch.dataset.profile_memory`) recorded
memory in a way that depended on the run's history; this step runs the profile's
requests once more in every mode, one trial each, no re-measurement (memory needs no
timing hygiene; this pass's timings are not used). Its own journal resumes it. A
profile measured with the current method needs nothing. Every later step reads the
profile through :func:`profile_with_memory`.
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path

from modeswitch.dataset.profile_memory import needs_remeasure, with_memory_from
from modeswitch.dataset.profile_schema import read_profile
from modeswitch.engine.backends import registry as backend_registry
from modeswitch.engine.distributed import make_profiler

#: the memory pass of a profile measured with the old CPU memory method
MEMORY_PASS = "memory_pass.parquet"


def run(study) -> dict:
    cfg = study.cfg
    profile = read_profile(study.out / "profile.parquet")
    stale = needs_remeasure(profile)
    if not stale.any():
        return {"memory": None, "why": "the profile measured memory with the current method"}
    if backend_registry.get_backend(cfg.backend).child_processes:
        study.log(f"memory: the {cfg.backend} backend computes in child processes, whose freed memory "
                  "this process cannot release; its CPU memory stays as the profile measured it")
        return {"memory": None, "why": f"{cfg.backend} engines compute in child processes"}
    target, draft, _ = study._models()
    path = study.out / MEMORY_PASS
    spec = dataclasses.replace(study.profile_spec(target, draft), trials=1, max_remeasure=0)
    study.log(f"memory: {int(stale.sum())} profile rows measured memory the old way (allocator history, "
              f"weights only); measuring it again: {path.name}")
    t0 = time.perf_counter()
    df = make_profiler(spec, target, draft, path, console=study.console, ray=study.ray).run()
    seconds = time.perf_counter() - t0
    merged = with_memory_from(profile, df, path)
    ratio = _memory_ratios(merged)
    study.log(f"memory pass: {df['request_id'].nunique()} requests x {df['mode'].nunique()} modes in "
              f"{seconds / 60:.1f} min; median peak vs the reference: "
              + ", ".join(f"{m} {r:.2f}x" for m, r in ratio.items()))
    return {"memory": str(path), "rows": len(df), "replaced": int(stale.sum()),
            "median_ratio": {str(m): float(r) for m, r in ratio.items()}}


def profile_with_memory(out: Path):
    """The study folder ``out``'s profile, with its memory from the memory pass where it
    was measured again."""
    profile = read_profile(out / "profile.parquet")
    memory = out / MEMORY_PASS
    if needs_remeasure(profile).any() and memory.exists():
        profile = with_memory_from(profile, read_profile(memory), memory)
    return profile


def _memory_ratios(profile) -> dict:
    """Per mode, the median over requests of its peak memory / the reference's."""
    peak = profile.groupby(["request_id", "mode"])["peak_memory_mb"].median().unstack("mode")
    ref = str(profile["reference_mode"].dropna().iloc[0])
    if ref not in peak:
        return {}
    ratio = peak.div(peak[ref], axis=0).median()
    return {m: float(r) for m, r in ratio.drop(ref).sort_values().items() if math.isfinite(r)}

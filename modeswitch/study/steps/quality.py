"""``quality``: measured quality for drawn requests, the reference and every lossy
mode, batched and untimed (:mod:`modeswitch.engine.quality_sweep`); the dataset step
takes each swept request's own ROUGE-L and accuracy, marked ``measured (sweep)``.

Part of the study only where ``[dataset] swept_per_family`` is set. A sweep of other
settings found in the folder is kept aside, never overwritten; its journal stays where
only the number of passes changed, so more passes continue it.
"""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime

from modeswitch.dataset.io import atomic_path
from modeswitch.engine.profiler.journal import journal_identity
from modeswitch.engine.quality_sweep import (
    FLIP_AT,
    SweepSpec,
    flipped_share,
    read_sweep,
    run_sweep,
    sweep_passes,
)
from modeswitch.study.aside import move_aside


def run(study) -> dict:
    target, draft, _ = study._models()
    c = study.cfg
    path = study.out / "quality_sweep.parquet"
    swept = study.swept_requests()
    spec = SweepSpec(model=str(target), requests=tuple(swept),
                     draft_model=str(draft) if draft else None, backend=c.backend, device=c.device,
                     modes=tuple(c.modes) if c.modes else None, threads=c.threads,
                     arrival_groups=c.sweep_arrival_groups, repeats=c.sweep_repeats)
    if path.exists():
        old_frame = read_sweep(path)
        same = set(old_frame["request_id"].astype(str)) == {r.id for r in swept}
        if same and sweep_passes(old_frame) == c.sweep_repeats:  # finished before the state was saved
            return {"sweep": str(path), "requests": int(old_frame["request_id"].nunique())}
        # a redo with other settings: keep the old sweep aside, never overwrite it. Its
        # journal stays where only the passes changed (more passes continue it)
        journal = path.with_name(path.name + ".journal.jsonl")
        kept = journal_identity(journal) == spec.identity()
        throughput_csv = study.out / "quality_sweep_throughput.csv"
        stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
        for old in (path, throughput_csv) + (() if kept else (journal,)):
            if old.exists():
                move_aside(old, f"previous-{stamp}")
        n = sweep_passes(old_frame)
        why = (f"judged {n} pass{'es' * (n != 1)}, {c.sweep_repeats} asked" if same else "swept other requests")
        study.log(f"quality sweep: {path.name} {why}; kept aside as .previous-{stamp}; "
                  + ("its journal continues" if kept else "sweeping anew (no journal of these settings here)"))
    t0 = time.perf_counter()
    frame, throughput = run_sweep(spec, path, log=study.log)
    seconds = time.perf_counter() - t0
    with atomic_path(study.out / "quality_sweep_throughput.csv", overwrite=True) as tmp:
        throughput.to_csv(tmp, index=False)
    n = sweep_passes(frame)
    study.log(f"quality sweep: {frame['request_id'].nunique()} requests x {frame['mode'].nunique()} modes "
              f"({n} pass{'es' * (n != 1)}), {seconds / 60:.1f} min this "
              "run; requests/s per mode over every pass "
              + ", ".join(f"{r.mode} {r.requests_per_s:.2f}" for r in throughput.itertuples()))
    flipped = flipped_share(frame) if c.sweep_repeats > 1 else float("nan")
    if not math.isnan(flipped):  # repeats, and lossy rows
        study.log(f"quality sweep: the {c.sweep_repeats} repeats disagree on ROUGE-L >= {FLIP_AT} for "
                  f"{flipped:.1%} of (request, lossy mode) pairs")
    return {"sweep": str(path), "requests": int(frame["request_id"].nunique()),
            **({"flipped": flipped} if not math.isnan(flipped) else {}),
            "requests_per_s": {r.mode: float(r.requests_per_s) for r in throughput.itertuples()}}

"""The scoring report's bootstrap intervals: vectorised against the pandas resampling it
replaced, side by side in one process.

On a per-request live score frame shaped like a study's (``--requests`` requests of
one router over ``--families`` families), ``--rounds`` interleaved rounds each time
one call of :func:`routers.scoring.intervals.family_bootstrap` (the live figures as
parts, :func:`routers.scoring.live._family_parts`) and one of the old per-resample
pandas bootstrap with the old pandas figures (``tests/helpers.py``:
``pandas_family_bootstrap``, ``pandas_live_figures``; same draws), prints each one's
median seconds and their ratio, and exits 1 when an interval end differs by more than
1e-9 (relative).

    .venv/bin/python bench/score_intervals.py [--requests 840] [--families 7] [--boot 1000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))
from helpers import pandas_family_bootstrap, pandas_live_figures  # noqa: E402

from modeswitch.routers.scoring.intervals import family_bootstrap  # noqa: E402
from modeswitch.routers.scoring.live import INTERVAL_FIGURES, _family_parts  # noqa: E402


def frame(requests: int, families: int, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    ref = rng.uniform(50, 500, requests)
    v = rng.random((requests, 4)) < [0.1, 0.05, 0.1, 0.02]
    return pd.DataFrame({
        "family": rng.integers(0, families, requests).astype(str),
        "reference_latency_ms": ref, "effective_latency_ms": ref / rng.uniform(0.7, 3.0, requests),
        "energy_ratio": rng.uniform(0.3, 1.2, requests), "rouge_delta": -rng.uniform(0, 0.3, requests),
        "violates_quality": v[:, 0], "violates_energy": v[:, 1], "violates_any": v[:, :3].any(axis=1),
        "violates_any_beyond_noise": v[:, 0] | v[:, 3]})


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=840, help="requests per router")
    ap.add_argument("--families", type=int, default=7)
    ap.add_argument("--boot", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    per = frame(args.requests, args.families)

    times = {"vectorised": [], "pandas": []}
    worst_all = 0.0
    for r in range(args.rounds):
        t0 = time.perf_counter()
        new = family_bootstrap(per, _family_parts, INTERVAL_FIGURES, args.boot, seed=r)
        t1 = time.perf_counter()
        old = pandas_family_bootstrap(per, pandas_live_figures, INTERVAL_FIGURES, args.boot, seed=r)
        t2 = time.perf_counter()
        times["vectorised"].append(t1 - t0)
        times["pandas"].append(t2 - t1)
        worst = max(abs(new[k] - old[k]) / max(abs(old[k]), 1e-12) for k in old)
        worst_all = max(worst_all, worst)
        print(f"round {r + 1}: vectorised {t1 - t0:.3f} s, pandas {t2 - t1:.2f} s, "
              f"largest relative difference of an interval end {worst:.1e}", flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"\none router's intervals ({args.requests} requests, {args.families} families, {args.boot} resamples), "
          f"median of {args.rounds} interleaved rounds:")
    print(f"  pandas per resample: {med['pandas']:.2f} s")
    print(f"  vectorised:          {med['vectorised']:.3f} s")
    print(f"  ratio pandas / vectorised: {med['pandas'] / med['vectorised']:.0f}x")
    if worst_all > 1e-9:
        raise SystemExit(f"the intervals differ: largest relative difference {worst_all:.1e}")
    print(f"  same intervals (largest relative difference {worst_all:.1e})")


if __name__ == "__main__":
    main()

"""The examples' shared input: a training table from a profile or from your own costs."""

from __future__ import annotations

import argparse

from modeswitch.dataset.profile_schema import read_profiles
from modeswitch.dataset.workloads import get_workload, list_workloads
from modeswitch.oracle import Constraints, build_training_table
from modeswitch.oracle.external_table import read_training_table


def table_from_args(description: str):
    """Parse ``--profiles PATH`` (a profile from `modeswitch profile` or `import-profiles`)
    or ``--table PATH`` (a training table, or your own per-mode cost table) and return
    (training table, parsed args)."""
    ap = argparse.ArgumentParser(description=description)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--profiles", help="profile parquet (e.g. runs/demo-*/profiles.parquet)")
    src.add_argument("--table", help="training table (dataset build) or cost table (.csv/.parquet)")
    ap.add_argument("--requests", type=int, default=600, help="requests drawn for a profile's table")
    ap.add_argument("--mlruns", default="mlruns")
    args = ap.parse_args()
    if args.table:
        return read_training_table(args.table), args

    profile = read_profiles([args.profiles])
    families = sorted(set(profile["family"]) & {w.name for w in list_workloads()})
    per = max(1, args.requests // len(families))
    requests = [r for i, f in enumerate(families) for r in get_workload(f).sample(per, seed=i)]
    return build_training_table(profile, requests, Constraints(on_incomplete="skip"),
                                source=args.profiles), args

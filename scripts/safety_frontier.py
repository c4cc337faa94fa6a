"""Print the capture / violation frontier of a training table (``routers.scoring.frontier``).

For each split: each mode's out-of-fold safety AUC, and the best capture of the
oracle's latency saving at violation caps 0-10 % for the three decision rules (every
pick's saving, then the safe picks' alone: "safe"), with
every mode's latency known exactly and each rule's knob chosen on the scored
requests (a ceiling for those rules with that safety model and these features).

    .venv/bin/python scripts/safety_frontier.py [--data runs/study/train.parquet]
        [--splits random,group,lofo] [--feature-set A] [--risk-model lgbm|lr] [--all]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from modeswitch.routers.scoring.frontier import RISK_MODELS, frontier


def main():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="runs/study/train.parquet")
    ap.add_argument("--splits", default="random,group,lofo", help="the project's splits (routers.training.splits)")
    ap.add_argument("--feature-set", default="A")
    ap.add_argument("--risk-model", choices=RISK_MODELS, default="lgbm", help="each mode's safety classifier")
    ap.add_argument("--test-size", type=float, default=0.25)
    ap.add_argument("--seed", type=int, default=42, help="the split's seed")
    ap.add_argument("--all", dest="inside", action="store_false",
                    help="score every held-out request, not only those inside the training ranges")
    args = ap.parse_args()

    table = pd.read_parquet(args.data)
    print(f"{args.data}: {len(table)} requests; feature set {args.feature_set}, risk model {args.risk_model}")
    caps = (0.0, 0.01, 0.02, 0.05, 0.10)
    print(f"{'split':<7} {'scored':>6} {'rule':<14} " + " ".join(f"{'<=' + format(c, '.0%'):>6}" for c in caps))
    for split in args.splits.split(","):
        f = frontier(table, split, args.feature_set, args.risk_model, args.inside, args.test_size, args.seed)
        for rule in ("threshold", "relative", "absolute"):
            for safe in (False, True):  # every pick's saving, then the safe picks' alone
                name = f"{rule}{' safe' if safe else ''}"
                print(f"{split:<7} {f.scored:>6} {name:<14} "
                      + " ".join(f"{f.best_capture(c, rule, safe=safe):6.2f}" for c in caps))
        print(f"{'':<7} AUC: " + ", ".join(f"{m} {a:.2f}" for m, a in sorted(f.auc.items(), key=lambda kv: kv[1])))


if __name__ == "__main__":
    main()

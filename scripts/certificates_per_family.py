"""Do certified thresholds hold in every held-out family? Pooled against per-family certificates.

For each split and each certificate (``routers.certificates.CERTIFICATES``: pooled,
per-family, family-held-out, per-family-held-out), a cost-predicting router is fitted
and certified on the training part of a training table, then scored offline on the
held-out part: per held-out family its violation rate (a pick other than the
reference that the table calls unsafe) against the target plus the slack its request
count allows by chance (``routers.risk_control.sampling_slack``), and the share of the
oracle's latency saving it keeps there. Overall capture is printed two ways: pooled
(saved milliseconds over the oracle's, so families of long requests weigh most) and
the mean of the families' own captures (the score report's ``latency_capture``). ``lofo`` fits one router per
held-out family. Everything on the table's own labels; nothing is timed.

    .venv/bin/python scripts/certificates_per_family.py [--data runs/study/train.parquet]
        [--splits group,lofo] [--router cost_lgbm] [--target 0.02] [--param limit_risk=ratio]
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from modeswitch.routers.certificates import CERTIFICATES
from modeswitch.routers.certified import CertifiedRouter
from modeswitch.routers.registry import get_router
from modeswitch.routers.risk_control import sampling_slack
from modeswitch.routers.training.table import TrainingTable


def held_out_scores(router, test: pd.DataFrame, modes: list[str], ref: str) -> pd.DataFrame:
    """Per held-out request: does the pick violate, and the latency it saves against the
    reference next to what the oracle saves."""
    picks = np.asarray(router.predict(test), dtype=object)
    rows = np.arange(len(test))
    safe = np.column_stack([test[f"safe__{m}"].astype("boolean").fillna(False).to_numpy(bool) for m in modes])
    lat = np.column_stack([test[f"latency_ms__{m}"].to_numpy(float) for m in modes])
    idx = np.array([modes.index(p) for p in picks])
    r = modes.index(ref)
    oracle = np.array([modes.index(x) for x in test["label"]])
    return pd.DataFrame({"family": test["family"].astype(str).to_numpy(),
                         "violates": (idx != r) & ~safe[rows, idx],
                         "saved": np.nan_to_num(lat[:, r] - lat[rows, idx]),
                         "oracle_saved": np.nan_to_num(lat[:, r] - lat[rows, oracle])})


def _value(text: str):
    """A parameter's value: a Python literal (31, 0.3, True), else the text itself."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def main():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="runs/study/train.parquet")
    ap.add_argument("--splits", default="group,lofo")
    ap.add_argument("--router", default="cost_lgbm", help="a registered router family with a risk score")
    ap.add_argument("--target", type=float, default=0.02, help="the certified violation-rate target")
    ap.add_argument("--certificates", default=",".join(CERTIFICATES))
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                    help="a router parameter (e.g. limit_risk=ratio, max_risk=0.3); repeatable")
    args = ap.parse_args()

    params = dict(p.split("=", 1) for p in args.param)
    params = {k: _value(v) for k, v in params.items()}
    table = TrainingTable.read(args.data)
    modes, ref = table.modes, str(table.frame["reference_mode"].iloc[0])
    print(f"{args.data}: {len(table)} requests, {table.frame['family'].nunique()} families; "
          f"{args.router}, target {args.target:.0%} at 90 % confidence")
    out = []
    for split in args.splits.split(","):
        folds = table.folds(split, seed=args.seed)
        for cert in args.certificates.split(","):
            parts = []
            for tr, te in folds:
                est = CertifiedRouter(get_router(args.router, **params), target_violation_rate=args.target,
                                      **CERTIFICATES[cert])
                table.fit(est, tr)
                scored = held_out_scores(est, table.frame.iloc[te], modes, ref)
                scored["threshold"] = est.threshold_
                parts.append(scored)
            s = pd.concat(parts, ignore_index=True)
            for fam, g in s.groupby("family"):
                n = len(g)
                rate = float(g["violates"].mean())
                slack = sampling_slack(args.target, n)
                out.append({"split": split, "certificate": cert, "family": fam, "requests": n,
                            "violation_rate": rate, "target_plus_slack": args.target + slack,
                            "met": rate <= args.target + slack,
                            "capture": g["saved"].sum() / g["oracle_saved"].sum() if g["oracle_saved"].sum() > 0
                            else float("nan")})
            allc = s["saved"].sum() / s["oracle_saved"].sum() if s["oracle_saved"].sum() > 0 else float("nan")
            fams = [o for o in out if o["split"] == split and o["certificate"] == cert]
            # the score report's latency_capture weighs families equally: the mean of theirs
            famc = float(np.nanmean([o["capture"] for o in fams]))
            print(f"{split:<6} {cert:<20} violations {s['violates'].mean():6.1%}  capture pooled {allc:6.1%}, "
                  f"family mean {famc:6.1%}  families "
                  f"within target+slack {sum(o['met'] for o in fams)}/{len(fams)}  thresholds "
                  + ", ".join(f"{t:.3g}" if t is not None else "none" for t in s["threshold"].unique()))
    frame = pd.DataFrame(out)
    pd.set_option("display.width", 200)
    print(frame.to_string(index=False, float_format=lambda v: f"{v:.3f}"))


if __name__ == "__main__":
    main()

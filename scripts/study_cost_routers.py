"""The cost-predicting routers on a finished study's training table, at several
certified targets, next to the study's classifiers on the same splits.

Usage: python scripts/study_cost_routers.py [--study runs/study] [--targets 0.01,0.05,0]
       [--splits group,lofo,random] [--live]

For each target (0: no certification, the Optuna-tuned threshold) the cost
routers are trained with their own Optuna storage (a target changes what tuning
optimises), then every split is scored (offline; live with ``--live``) together
with the study's own classifier runs of that split, into
``<study>/cost-<target>-<split>/``. Prints, per split, target and router: oracle
capture, violation rate and speedup on held-out requests inside the training
ranges, on the extrapolated ones, and the certificate.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from modeswitch.routers.scoring.run import ScoreConfig, score_routers
from modeswitch.routers.training.trainer import TrainConfig, train


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--study", default="runs/study")
    ap.add_argument("--targets", default="0.01,0.05,0")
    ap.add_argument("--splits", default="group,lofo,random")
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--live", action="store_true")
    args = ap.parse_args()

    study = Path(args.study)
    state = json.loads((study / "study_state.json").read_text())
    cfg = state["config"]
    table = pd.read_parquet(study / "train.parquet")
    rows = []
    for target in [float(t) for t in args.targets.split(",")]:
        for split in args.splits.split(","):
            out = study / f"cost-{target:g}-{split}"
            if (out / "headline.csv").exists():
                print(f"{out}: scored before, read back")
            else:
                storage = f"sqlite:///{(study / f'optuna-cost-{target:g}.db').resolve()}"
                tc = TrainConfig(routers=["cost_linear", "cost_lgbm"], split=split, trials=args.trials,
                                 seed=42 + cfg["seed"], mlruns=cfg["mlruns"], labels=cfg["labels"],
                                 feature_set=cfg["feature_set"], test_size=cfg["test_size"],
                                 target_violation_rate=target, storage=storage)
                res = train(table, tc)
                runs = list(state["steps"][f"train:{split}"]["outputs"]["runs"].items())
                ids = [r for fam, r in runs if not fam.startswith("cost_")] + list(res["run_id"])
                sc = ScoreConfig(mlruns=cfg["mlruns"], run_ids=ids, decisions=20_000, live=args.live,
                                 live_per_family=cfg["live_per_family"], live_trials=cfg["live_trials"],
                                 model=cfg["model"], seed=cfg["seed"], name=out.name, labels=cfg["labels"])
                score_routers(table, sc, out, progress=print)
            for part in ("inside", "extrapolated"):
                p = out / f"headline_{part}.csv"
                if not p.exists():
                    continue
                h = pd.read_csv(p).set_index("router")
                for r, x in h.iterrows():
                    rows.append({"split": split, "target": target, "part": part, "router": r,
                                 "requests": None, "capture": x["latency_capture"],
                                 "violations": x["violation_rate_any"], "speedup": x["speedup"],
                                 "p50_us": x["overhead_p50_us"]})
            risk = out / "risk_control.csv"
            if risk.exists():
                print(f"\n{out.name}: certificates")
                print(pd.read_csv(risk).round(4).to_string(index=False))
    df = pd.DataFrame(rows)
    df.to_csv(study / "cost_routers_summary.csv", index=False)
    pd.set_option("display.width", 200)
    show = df[df["router"].isin(["rule", "dt", "rf", "lr", "lgbm", "cost_linear", "cost_lgbm", "oracle"])]
    print(show.drop(columns=["requests"]).round(3).to_string(index=False))


if __name__ == "__main__":
    main()

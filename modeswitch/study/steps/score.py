"""``score:<split>``: score the split's trained routers against the rule baseline,
offline and live, into ``score-<split>/``. A report already there (an interrupted
attempt, or a redo's earlier one) is moved aside, never overwritten."""

from __future__ import annotations

import dataclasses
from datetime import datetime

from modeswitch.routers.scoring.run import ScoreConfig, score_routers
from modeswitch.study.aside import move_aside
from modeswitch.study.steps.dataset import read_table


def run(study, split: str) -> dict:
    c = study.cfg
    out = study.out / f"score-{split}"
    if out.exists() and any(out.iterdir()):  # an interrupted earlier attempt, or a redo
        kind = "previous" if f"score:{split}" in study.state.get("redone", []) else "incomplete"
        aside = move_aside(out, f"{kind}-{datetime.now():%Y%m%d-%H%M%S}")
        study.log(f"moved the unfinished report {out} aside to {aside}")
    runs = list(study.outputs(f"train:{split}")["runs"].values())
    table = read_table(study.out)
    cfg = ScoreConfig(mlruns=c.mlruns, run_ids=runs, decisions=c.decisions, live=c.live,
                      live_per_family=c.live_per_family,
                      live_trials=c.live_trials, live_threads=c.threads, live_max_remeasure=c.max_remeasure,
                      model=c.model, draft_model=c.draft_model,
                      device=c.device, backend=c.backend, seed=c.seed, name=f"{c.name}-{split}",
                      labels=c.labels, profile_plan=dataclasses.asdict(study.profile_spec(*study._models()[:2])))
    res = score_routers(table, cfg, out, progress=study.log if study.console is None else None)
    return {"report": str(out), "mlflow_run_id": res["mlflow_run_id"],
            "live_requests": None if res["live_per"] is None else int(res["live_per"]["request_id"].nunique()),
            "live_estimate_mape_pct": res["live_figures"].get("estimate_mape_pct"),
            **{f"live_{k}": v for k, v in res["live_figures"].items()
               if k.startswith(("estimate_mape_pct_", "estimate_median_signed_pct_", "estimate_pairs_"))}}

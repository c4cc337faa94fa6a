"""The study report's "Capture at a violation budget" section.

The question a reader brings: of the latency the oracle saves, how much does each
router keep while breaking a constraint on at most ``BUDGET`` of the held-out requests,
on the splits that hold families (or whole families) out? A certified router meets the
goal when it keeps at least ``GOAL_CAPTURE`` of the oracle's saving, its violation rate
is within the budget, and every family's own rate is within its target plus the slack
its count allows (the split report's ``risk_control_by_family.csv``). Where none does,
the split's measured ceiling at the budget (``frontier.csv``: the best capture any rule
reached with every latency known) says how much was there to keep.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from modeswitch.routers.scoring.capture import capture_and_violations
from modeswitch.study.markdown import md_table

#: the violation budget the section judges captures at
BUDGET = 0.02
#: the share of the oracle's saving a certified router should keep
GOAL_CAPTURE = 0.75
#: the splits whose test requests come from held-out families
HELD_OUT_SPLITS = ("group", "lofo")
#: rows of ``per_request.csv`` that are not routers
NOT_ROUTERS = ("oracle", "reference")


def split_capture(report: Path) -> tuple[pd.DataFrame, dict]:
    """Per router of one split report: capture of the oracle's saving and violation
    rate (request-weighted over every held-out request), families within target + slack
    for the certified ones; and the split's oracle saving and ceiling at the budget."""
    pr = pd.read_csv(report / "per_request.csv")
    rows = []
    by_family = _read(report / "risk_control_by_family.csv")
    for name, g in pr.groupby("router", sort=False):
        if name in NOT_ROUTERS:
            continue
        capture, violations = capture_and_violations(g)
        row = {"router": name, "requests": len(g), "capture": capture, "violations": violations}
        fam = by_family[by_family["router"] == name] if by_family is not None else pd.DataFrame()
        row["certified"] = bool(len(fam))
        row["families_met"] = f"{int(fam['met'].astype(bool).sum())}/{len(fam)}" if len(fam) else "-"
        row["goal"] = _verdict(row, fam) if len(fam) else "-"
        rows.append(row)
    ref = pr[pr["router"] == "oracle"]
    oracle = {"saving": float(1 - ref["oracle_latency_ms"].sum() / ref["reference_latency_ms"].sum())
              if len(ref) else np.nan,
              "ceiling": _ceiling(report / "frontier.csv")}
    return pd.DataFrame(rows), oracle


def capture_section(reports: dict[str, Path]) -> list[str]:
    """The section's markdown over the held-out splits the study scored."""
    splits = [s for s in HELD_OUT_SPLITS if s in reports and (reports[s] / "per_request.csv").exists()]
    if not splits:
        return []
    md = [f"## Capture at <= {BUDGET:.0%} violations (held-out families)", "",
          f"Per split: the share of the reference's latency the oracle saves; per router the share of "
          f"that saving it keeps and its violation rate, over every held-out request. Goal for a "
          f"certified router: >= {GOAL_CAPTURE:.0%} of the oracle's saving at <= {BUDGET:.0%} violations, "
          "every family within its target + slack (`risk_control_by_family.csv`). The ceiling: the best "
          f"capture at <= {BUDGET:.0%} any rule reached with every latency known (`frontier.csv`, requests "
          "inside the training ranges).", ""]
    for split in splits:
        table, oracle = split_capture(reports[split])
        ceiling = oracle["ceiling"]
        met = table[table["goal"] == "met"]["router"].tolist() if len(table) else []
        ceiling_txt = (f"measured ceiling at <= {BUDGET:.0%}: {ceiling:.1%}" if np.isfinite(ceiling)
                       else "no ceiling computed")
        verdict = (f"goal met by {', '.join(met)}" if met else f"goal not met by any certified router; "
                   f"{ceiling_txt}")
        md += [f"### {split}", "", f"The oracle saves {oracle['saving']:.1%} of the reference's latency; "
               f"{verdict}" + (f" ({ceiling_txt})" if met else "") + ".", "",
               md_table(table.assign(capture=table["capture"].map(_pct),
                                     violations=table["violations"].map(_pct))), ""]
    return md


def _verdict(row: dict, fam: pd.DataFrame) -> str:
    ok = (np.isfinite(row["capture"]) and row["capture"] >= GOAL_CAPTURE
          and row["violations"] <= BUDGET + 1e-12 and bool(fam["met"].astype(bool).all()))
    return "met" if ok else "not met"


def _ceiling(path: Path) -> float:
    f = _read(path)
    if f is None or not {"capture", "violations"} <= set(f.columns):
        return np.nan
    under = f[f["violations"] <= BUDGET + 1e-12]["capture"]
    return float(under.max()) if len(under) else np.nan


def _read(path: Path) -> pd.DataFrame | None:
    return pd.read_csv(path) if path.exists() else None


def _pct(x: float) -> str:
    return "-" if not np.isfinite(x) else f"{x:.1%}"

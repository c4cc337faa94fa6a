"""The study report's "Modes on this model" section, and its "Beside another study" one.

Before any router, a reader needs to know what each mode does on this model and this
machine: which pay, which change the answers, and how much the reference disagrees
with itself. The section reads the study's own profile (:mod:`oracle.mode_table`,
:mod:`oracle.quality_floor`), the model's card (provenance, the draft's acceptance
rate) and the hardware line every profile row carries.

``beside`` puts another study's tables next to this one's (for the real model's
answer beside the stdlib model's): per mode the two latency ratios and similarities,
and per split and router the two live speedups and violation rates.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from modeswitch.dataset.io import write_csv
from modeswitch.engine.models.cache import CARD
from modeswitch.oracle.mode_table import format_mode_table, mode_table
from modeswitch.oracle.quality_floor import self_consistency_floor
from modeswitch.study.markdown import md_table as _md
from modeswitch.study.markdown import passing_cell, value_cell


def model_lines(profile: pd.DataFrame, model_dir: str | None, draft_dir: str | None) -> list[str]:
    """Which model, which weights, which machine, which draft."""
    lines = []
    for what, folder in (("model", model_dir), ("draft", draft_dir)):
        card = _card(folder)
        if card:
            keep = {k: card[k] for k in ("model", "source", "weights", "params", "target_params",
                                         "draft_params", "layers", "held_out_acceptance_rate",
                                         "draft_acceptance_rate", "build_seconds") if k in card}
            lines.append(f"- {what}: `{folder}`: " + json.dumps(keep))
        elif folder:
            lines.append(f"- {what}: `{folder}` (no model card)")
    for col in ("model", "hardware", "software"):
        if col in profile and profile[col].notna().any():
            lines.append(f"- {col}: " + "; ".join(sorted(map(str, profile[col].dropna().unique()))))
    return lines


def _card(folder: str | None) -> dict | None:
    if not folder:
        return None
    # the tiny model's card sits above its target/ and draft/ folders
    for p in (Path(folder) / CARD, Path(folder).parent / CARD):
        if p.exists():
            return json.loads(p.read_text())
    return None


def modes_section(profile: pd.DataFrame, constraints, out: Path, model_dir=None,
                  draft_dir=None) -> tuple[list[str], pd.DataFrame]:
    """(markdown lines, the mode table); writes ``modes.csv`` and ``floor.csv`` to ``out``."""
    table = mode_table(profile, constraints)
    write_csv(table, out / "modes.csv", overwrite=True)
    floor = self_consistency_floor(profile)
    write_csv(floor, out / "floor.csv", overwrite=True)
    md = ["## Modes on this model", "", *model_lines(profile, model_dir, draft_dir), "",
          "Every mode against the reference over the profiled requests: median latency ratio "
          "(below 1 is faster), ROUGE-L of its output against the reference's (the study's "
          "similarity; mean and 10th percentile), the share of requests whose own ROUGE-L is below "
          f"{constraints.min_rouge_vs_baseline:.2f} (diverged), benchmark accuracy on requests with a "
          "gold answer; 95 % bootstrap intervals over requests; families in which the study's rule "
          "(per mode and family: mean ROUGE-L, accuracy drop) accepts the mode (`modes.csv`).", "",
          _md(format_mode_table(table)), ""]
    if not floor.empty:
        agg = floor.groupby("mode").agg(requests=("requests", "sum"), diverged=("diverged_share", "mean"),
                                        rouge_l_mean=("rouge_l_mean", "mean"), rouge_l_min=("rouge_l_min", "min"))
        md += ["Self-consistency floor: the reference against itself in its lossless modes (batching, "
               "chunking, cache reuse, speculation change floating-point order; reported, not charged "
               "to a mode; per family in `floor.csv`):", "",
               _md(agg.reset_index().round(3)), ""]
    return md, table


def beside_section(this: pd.DataFrame, this_fig: pd.DataFrame, other_dir: Path) -> list[str]:
    """This study's per-mode and live figures next to another study's (``other_dir``)."""
    other_modes = other_dir / "modes.csv"
    other_fig = other_dir / "figures.csv"
    if not other_modes.exists() or not other_fig.exists():
        return ["## Beside another study", "",
                f"`{other_dir}` has no `modes.csv` / `figures.csv` (run its report step again with "
                "this version: `modeswitch study run --redo report`).", ""]
    om = pd.read_csv(other_modes).set_index("mode")
    tm = this.set_index("mode")
    modes = [m for m in tm.index if m in om.index] + [m for m in om.index if m not in tm.index]
    rows = []
    for m in modes + [m for m in tm.index if m not in modes]:
        a = tm.loc[m] if m in tm.index else None
        b = om.loc[m] if m in om.index else None
        rows.append({"mode": m,
                     "latency ratio (this)": value_cell(a, "latency_ratio"), "latency ratio (other)": value_cell(b, "latency_ratio"),
                     "ROUGE-L (this)": value_cell(a, "rouge_l_mean"), "ROUGE-L (other)": value_cell(b, "rouge_l_mean"),
                     "families passing (this)": passing_cell(a), "families passing (other)": passing_cell(b)})
    md = ["## Beside another study", "", f"The other study: `{other_dir}` (its report: "
          f"`{other_dir / 'README.md'}`).", "", _md(pd.DataFrame(rows)), ""]
    of = pd.read_csv(other_fig)
    keys = ["split", "router"]
    cols = [c for c in ("live_speedup", "live_violation_rate_any", "live_violation_rate_quality",
                        "live_divergence_rate", "speedup", "violation_rate_any") if c in this_fig and c in of]
    if cols:
        j = this_fig[keys + cols].merge(of[keys + cols], on=keys, how="outer", suffixes=(" (this)", " (other)"))
        order = keys + [f"{c} ({w})" for c in cols for w in ("this", "other")]
        md += ["Per split and router, offline and live:", "", _md(j[order]), ""]
    return md

"""Human-readable oracle output: the labels table and per-unit explanations.

Rendering lives beside the oracle (not in the CLI) so that notebooks-free scripts
and the CLI show the same thing.
"""

from __future__ import annotations

import math

import pandas as pd
from rich.console import Console
from rich.table import Table

from modeswitch.oracle.constraints import Constraints

console = Console()


def _f(v, spec=".3f"):
    if v is None or (isinstance(v, float) and math.isnan(v)) or v is pd.NA:
        return "-"
    return format(v, spec)


def explanation_table(unit: str, cand: pd.DataFrame) -> Table:
    rows = cand.sort_values(["safe", "latency_ms"], ascending=[False, True])
    t = Table(title=f"{unit}", title_justify="left", header_style="bold")
    t.add_column("mode", no_wrap=True)
    for col in ("latency ms", "speedup", "energy x", "memory x", "ROUGE vs ref-out", "acc Δpp"):
        t.add_column(col, justify="right")
    t.add_column("verdict", overflow="fold")
    for r in rows.itertuples(index=False):
        style = "bold green" if r.chosen else ("" if r.safe else "red")
        t.add_row(
            r.mode, _f(r.latency_ms, ".1f"), _f(r.speedup, ".2f"), _f(r.energy_ratio),
            _f(r.memory_ratio, ".4f"), _f(r.rouge_l_vs_baseline), _f(r.accuracy_delta_pp, "+.2f"),
            r.reason, style=style,
        )
    return t


def print_explanations(labels: pd.DataFrame, cand: pd.DataFrame, constraints: Constraints,
                       out: Console | None = None) -> None:
    out = out or console
    c = constraints
    out.print(
        f"[bold]Constraints[/bold]: energy/token <= {c.max_energy_ratio:.2f}x ref, peak memory <= "
        f"{c.max_memory_ratio:.2f}x ref, accuracy drop <= {c.max_accuracy_drop_pp} pp, ROUGE-L vs "
        f"reference output >= {c.min_rouge_vs_baseline:.2f}, ROUGE-L vs gold drop <= "
        f"{c.max_rouge_vs_reference_drop:.2f}; a mode without quality evidence: "
        f"{c.missing_quality} (--missing-quality); noise rule: "
        f"{'on' if c.noise_aware else 'off'} ({c.confidence_level:.0%} intervals over paired trials)"
    )
    for unit in labels.index:
        sub = cand[cand["unit"] == unit]
        src = labels.loc[unit, "label_source"] if "label_source" in labels else "measured"
        noise = ""
        if "confidence" in labels and labels.loc[unit, "confidence"] == labels.loc[unit, "confidence"]:
            noise = (f"; {labels.loc[unit, 'noise_rule']}, speedup "
                     f"[{labels.loc[unit, 'speedup_low']:.2f}, {labels.loc[unit, 'speedup_high']:.2f}], "
                     f"confidence {labels.loc[unit, 'confidence']:.2f}")
        out.print(explanation_table(f"{unit} -> {labels.loc[unit, 'label']} ({src}; quality "
                                    f"signals: {labels.loc[unit, 'quality_signals']}{noise})", sub))


def print_labels(labels: pd.DataFrame, skipped: dict, constraints: Constraints,
                 out: Console | None = None, limit: int = 25) -> None:
    out = out or console
    t = Table(title=f"Oracle labels ({len(labels)} units)", header_style="bold")
    for col in ("unit", "family", "label", "source", "speedup", "safe/modes", "quality signals"):
        t.add_column(col, overflow="fold")
    for unit, r in labels.head(limit).iterrows():
        t.add_row(str(unit), str(r.get("family", "-")), r["label"],
                  str(r.get("label_source", "measured")), _f(r["speedup"], ".2f"),
                  f"{int(r['n_safe'])}/{int(r['n_modes'])}", r["quality_signals"])
    out.print(t)
    if len(labels) > limit:
        counts = labels["label"].value_counts()
        out.print("label counts: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    unchecked = labels.index[labels["quality_signals"] == "none"]
    if len(unchecked):
        verdict = ("so every mode but the reference is unsafe for them (missing-quality rule: "
                   "unsafe; --missing-quality pass leaves quality unchecked)"
                   if constraints.missing_quality == "unsafe" else
                   "and quality was not checked for them (--missing-quality pass)")
        out.print(
            f"[yellow]warning:[/yellow] {len(unchecked)} unit(s) have no quality signal, {verdict} "
            "(e.g. per-trial published data carries no ROUGE-L: import the sweep's aggregate "
            "file too)."
        )
    for unit, why in skipped.items():
        out.print(f"[yellow]skipped[/yellow] {unit}: {why}")

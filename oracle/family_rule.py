"""The study's quality rule, per (mode, family): judged on a family's mean, not per request.

ModeSwitch-LLM accepts a mode for a workload family when, over that family's
requests, the mean ROUGE-L of the mode's output against the reference's output is
at least 0.80 and the benchmark accuracy drops by no more than 1.5 points. A
single request whose output diverges does not make the mode unsafe; a family
whose outputs diverge on average does. Judging every request on its own (the
``quality_scope="request"`` rule) is stricter than the study and, on a real model
whose greedy output flips at one near-tied logit, rejects modes the study accepts.

The per-request view stays visible under its own name: ``diverges`` marks a
request whose own ROUGE-L is below the threshold, and the divergence rate is
reported beside the rule's verdict, never folded into it.

Lossless modes (continuous batching, chunked prefill, prefix caching, speculation:
the registry's ``lossless``) compute the reference's function; where their output
differs, floating-point order changed a near-tied token. That is the reference's
self-consistency floor (:mod:`modeswitch.oracle.quality_floor`), reported, not charged to the
mode (``lossless_at_floor``).

Groups are what quality is pooled over (:func:`modeswitch.oracle.cells.quality_key`): the
benchmark suite where a unit has one, else its workload family. The family means
come from measured units only, so an estimated request is judged by its family's
measurements, not by looked-up copies of them.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from modeswitch.engine.modes import get_mode

COLUMNS = ("group_units", "group_rouge_l_mean", "group_accuracy_units", "group_accuracy_delta_pp")


def lossless(mode: str) -> bool:
    """Whether the registry calls ``mode`` lossless (an unknown mode, e.g. an imported
    table's, is not)."""
    try:
        return bool(get_mode(mode).lossless)
    except KeyError:
        return False


def group_of(units: pd.DataFrame) -> pd.Series:
    """unit -> its quality group: the benchmark suite, else the family, else the workload."""
    suite = units.get("benchmark_suite", pd.Series(index=units.index, dtype=object))
    family = units.get("family", pd.Series(index=units.index, dtype=object))
    family = family.where(family.notna() & (family != ""), units.get("workload"))
    return suite.where(suite.notna() & (suite != ""), family).astype(str)


def family_quality(metrics: pd.DataFrame, groups: pd.Series, reference_of: pd.Series) -> pd.DataFrame:
    """Per (group, mode) over measured units: how many units, the mean ROUGE-L against the
    reference output, and the mean paired accuracy change in points (the mode's accuracy
    minus the reference's on the same units). ``metrics`` is indexed by (unit, mode)."""
    m = metrics.reset_index()
    m["group"] = m["unit"].map(groups)
    ref = m[m["mode"] == m["unit"].map(reference_of)].set_index("unit")["accuracy"]
    m["accuracy_delta_pp"] = (m["accuracy"] - m["unit"].map(ref)) * 100
    g = m.groupby(["group", "mode"])
    out = pd.DataFrame({
        "group_units": g.size(),
        "group_rouge_l_mean": g["rouge_l_vs_baseline"].mean(),
        "group_accuracy_units": g["accuracy_delta_pp"].count(),
        "group_accuracy_delta_pp": g["accuracy_delta_pp"].mean(),
    })
    return out


def attach(cand: pd.DataFrame, table: pd.DataFrame, groups: pd.Series) -> None:
    """Add each candidate's group and its group's figures (NaN where the group has no
    measured units for that mode: the request's own figures then stand)."""
    cand["quality_group"] = cand["unit"].map(groups).astype(object)
    key = pd.MultiIndex.from_arrays([cand["quality_group"], cand["mode"]])
    got = table.reindex(key)
    for col in COLUMNS:
        cand[col] = got[col].to_numpy()


def judged_figures(cand: pd.DataFrame, scope: str) -> tuple[pd.Series, pd.Series]:
    """(ROUGE-L vs reference output, accuracy change in points) the rule judges: the
    group's means under ``scope="family"`` where known, else the request's own."""
    rouge, acc = cand["rouge_l_vs_baseline"], cand["accuracy_delta_pp"]
    if scope == "family" and "group_rouge_l_mean" in cand:
        rouge = cand["group_rouge_l_mean"].where(cand["group_rouge_l_mean"].notna(), rouge)
        acc = cand["group_accuracy_delta_pp"].where(cand["group_accuracy_delta_pp"].notna(), acc)
    return rouge, acc


def at_floor(cand: pd.DataFrame, enabled: bool) -> np.ndarray:
    """Candidates whose divergence is the reference's own floor (lossless modes)."""
    if not enabled:
        return np.zeros(len(cand), dtype=bool)
    return cand["mode"].map(lossless).to_numpy(dtype=bool)


def divergence_rates(cand: pd.DataFrame, threshold: float) -> pd.DataFrame:
    """Per (group, mode): the share of units whose own ROUGE-L against the reference
    output is below ``threshold`` (the per-request divergence rate), beside the group's
    mean (the rule's figure). Reference rows are left out."""
    needed = {"quality_group", "mode", "is_reference", "rouge_l_vs_baseline"}
    c = cand[~cand["is_reference"] & cand["rouge_l_vs_baseline"].notna()] if needed <= set(cand) else cand[:0]
    if c.empty:
        return pd.DataFrame(columns=["quality_group", "mode", "units", "divergence_rate",
                                     "rouge_l_mean", "passes_rule"])
    g = c.assign(_div=c["rouge_l_vs_baseline"] < threshold).groupby(["quality_group", "mode"])
    out = pd.DataFrame({"units": g.size(), "divergence_rate": g["_div"].mean(),
                        "rouge_l_mean": g["rouge_l_vs_baseline"].mean()}).reset_index()
    out["passes_rule"] = out["rouge_l_mean"] >= threshold
    return out

"""One row per mode: what it costs and what it does to the answers, against the reference.

The table a researcher reads first about a model on a machine, before any router:
for every mode the profile measured,

* ``latency_ratio``: the median over requests of the mode's latency / the reference's
  (each request's median over its clean trials), with a 95 % bootstrap interval over
  requests; below 1 is faster;
* ``rouge_l_mean`` (with its interval) and ``rouge_l_p10``: ROUGE-L of the mode's
  output against the reference's output, the study's similarity;
* ``divergence_rate``: the share of requests whose own ROUGE-L is below the threshold;
* ``accuracy`` (with its interval) and ``accuracy_delta_pp``: benchmark accuracy on the
  requests with a gold answer, and its paired change against the reference in points;
* ``families_passing``: in how many families the study's rule (mean ROUGE-L, accuracy
  drop) accepts the mode, of how many were measured (a lossless mode's divergence is
  the floor under ``lossless_at_floor``, as in the labels: it passes);
* ``lossless``: whether its divergence is the reference's own floor.

Built from the oracle's own cell summary (:func:`modeswitch.oracle.cells.summarise`), so the
medians and clean trials are the ones the labels were decided on.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from modeswitch.oracle.cells import summarise
from modeswitch.oracle.constraints import Constraints
from modeswitch.oracle.family_rule import family_quality, group_of, lossless
from modeswitch.oracle.uncertainty import bootstrap

COLUMNS = ["mode", "lossless", "requests", "latency_ratio", "latency_ratio_low", "latency_ratio_high",
           "rouge_l_mean", "rouge_l_low", "rouge_l_high", "rouge_l_p10", "divergence_rate",
           "accuracy_requests", "accuracy", "accuracy_low", "accuracy_high", "accuracy_delta_pp",
           "families_passing", "families"]


def mode_table(profile: pd.DataFrame, constraints: Constraints | None = None, source=None,
               n_boot: int = 2000, seed: int = 0) -> pd.DataFrame:
    """One row per mode measured beside its reference (the reference's own row first)."""
    c = constraints or Constraints()
    cells = summarise(profile, source)
    m = cells.metrics.reset_index()
    ref_of = cells.units["reference_mode"]
    ref = m[m["mode"] == m["unit"].map(ref_of)].set_index("unit")
    m["latency_ratio"] = m["latency_ms"] / m["unit"].map(ref["latency_ms"])
    m["accuracy_delta_pp"] = (m["accuracy"] - m["unit"].map(ref["accuracy"])) * 100
    groups = group_of(cells.units)
    fam = family_quality(cells.metrics, groups, ref_of).reset_index()
    fam["passes"] = ((fam["group_rouge_l_mean"].fillna(1.0) >= c.min_rouge_vs_baseline - 1e-9)
                     & (fam["group_accuracy_delta_pp"].fillna(0.0) >= -c.max_accuracy_drop_pp - 1e-9))
    references = set(ref_of)
    rows = []
    for mode, g in m.groupby("mode", sort=False):
        is_ref = mode in references
        lat = bootstrap(g["latency_ratio"], "median", n_boot, seed=seed)
        rouge = bootstrap(g["rouge_l_vs_baseline"], "mean", n_boot, seed=seed)
        acc = bootstrap(g["accuracy"], "mean", n_boot, seed=seed)
        f = fam[fam["mode"] == mode]
        r = g["rouge_l_vs_baseline"].dropna()
        rows.append({
            "mode": mode, "lossless": is_ref or lossless(mode), "requests": int(g["unit"].nunique()),
            "latency_ratio": lat.estimate, "latency_ratio_low": lat.low, "latency_ratio_high": lat.high,
            "rouge_l_mean": rouge.estimate, "rouge_l_low": rouge.low, "rouge_l_high": rouge.high,
            "rouge_l_p10": float(np.quantile(r, 0.10)) if len(r) else np.nan,
            "divergence_rate": float((r < c.min_rouge_vs_baseline - 1e-9).mean()) if len(r) and not is_ref else 0.0,
            "accuracy_requests": acc.n, "accuracy": acc.estimate, "accuracy_low": acc.low,
            "accuracy_high": acc.high, "accuracy_delta_pp": float(g["accuracy_delta_pp"].mean()),
            "families_passing": len(f) if is_ref or (c.lossless_at_floor and lossless(mode))
            else int(f["passes"].sum()), "families": len(f),
        })
    out = pd.DataFrame(rows, columns=COLUMNS)
    out["_ref"] = ~out["mode"].isin(references)
    return out.sort_values(["_ref", "latency_ratio"]).drop(columns="_ref").reset_index(drop=True)


def format_mode_table(table: pd.DataFrame) -> pd.DataFrame:
    """The table as a reader wants it: each figure with its interval in one cell."""
    def ci(est, lo, hi, fmt="{:.2f}"):
        if not np.isfinite(est):
            return "-"
        return (fmt + " [" + fmt + ", " + fmt + "]").format(est, lo, hi)

    return pd.DataFrame({
        "mode": table["mode"],
        "n": table["requests"],
        "latency / reference (median)": [ci(*v) for v in zip(table["latency_ratio"], table["latency_ratio_low"],
                                                               table["latency_ratio_high"])],
        "ROUGE-L vs reference (mean)": [ci(*v) for v in zip(table["rouge_l_mean"], table["rouge_l_low"],
                                                              table["rouge_l_high"])],
        "ROUGE-L p10": table["rouge_l_p10"].map(lambda x: f"{x:.2f}" if np.isfinite(x) else "-"),
        "diverged": table["divergence_rate"].map(lambda x: f"{x:.0%}"),
        "accuracy (n)": [f"{ci(a, lo, hi)} ({n})" if n else "-" for a, lo, hi, n in zip(
            table["accuracy"], table["accuracy_low"], table["accuracy_high"], table["accuracy_requests"])],
        "families passing": [f"{p}/{n}" for p, n in zip(table["families_passing"], table["families"])],
        "lossless": table["lossless"].map({True: "yes", False: ""}),
    })

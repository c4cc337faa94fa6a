"""What a pick costs: latency regret, unsafe picks, and the tuning objective.

For request i with oracle label o_i and a predicted mode p:

    cost_i(p) = max(L_i(p) / L_i(o_i) - 1, 0)  +  lambda * 1[p is unsafe for i]  +  d / L_i(o_i)

where L is the (measured or estimated) latency and "unsafe" means p violates a
quality, energy or memory constraint (or was not measured for i). The tuning
objective is the mean cost over the validation requests; lambda is
``unsafe_penalty`` (default 1.0: an unsafe pick costs as much as doubling the
latency); d is the router's decision cost (its served decision's p50, measured in
tuning), so a model slower than its picks are worth loses the search. Regret sample
weights for training are 1 + the mean cost of the wrong picks for that request,
normalised to mean 1, so requests where a mistake hurts count more.

The objective Optuna minimises is one of :data:`OBJECTIVES` (``--tuning-objective``):

* ``regret`` (the default): the mean of ``cost_i`` above. Every request weighs alike,
  so a 10 % regret on a 40 ms request counts as much as on a 4 s one;
* ``capture``: ``1 - capture + lambda * violation rate``, where capture is the share of
  the oracle's latency saving the picks keep, pooled in milliseconds,
  ``sum_i (L_i(ref) - L_i(p_i) - d) / sum_i (L_i(ref) - L_i(o_i))``, the figure the
  score report gives beside each router's violation rate. Long requests weigh most, as
  they do in that figure. Why: the regret objective and the reported capture can
  disagree; a cost router's option that kept 8 more points of pooled capture on a new
  family lost on mean regret (docs/training.md, "Objective"). Training applies it only
  where a certificate holds the violations (``trainer.objective_of``).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from sklearn.metrics import f1_score

from modeswitch.dataset.errors import InputError
from modeswitch.engine.modes import reference_mode
from modeswitch.oracle.training_table import table_meta

UNSAFE_PENALTY = 1.0
#: what tuning minimises (module docstring)
OBJECTIVES = ("regret", "capture")


def modes_of(table: pd.DataFrame) -> list[str]:
    return table_meta(table)["modes"]


def _matrix(table, prefix, modes, dtype=float):
    return np.column_stack([table[f"{prefix}__{m}"].to_numpy(dtype=dtype, na_value=np.nan)
                            if dtype is float else table[f"{prefix}__{m}"].fillna(False).to_numpy(dtype=bool)
                            for m in modes])


def cost_matrix(table: pd.DataFrame, modes=None, unsafe_penalty: float = UNSAFE_PENALTY) -> np.ndarray:
    """(n_requests, n_modes) cost of picking each mode."""
    modes = modes or modes_of(table)
    lat = _matrix(table, "latency_ms", modes)
    safe = _matrix(table, "safe", modes, dtype=bool)
    label_idx = np.array([modes.index(x) for x in table["label"]])
    best = lat[np.arange(len(table)), label_idx]
    regret = lat / best[:, None] - 1
    # an unsafe mode may be faster than the oracle's pick: that earns nothing
    regret = np.where(np.isnan(regret), 0.0, np.maximum(regret, 0.0))
    return regret + unsafe_penalty * (~safe)


def regret_weights(table: pd.DataFrame, modes=None, unsafe_penalty: float = UNSAFE_PENALTY) -> np.ndarray:
    modes = modes or modes_of(table)
    c = cost_matrix(table, modes, unsafe_penalty)
    label_idx = np.array([modes.index(x) for x in table["label"]])
    mask = np.ones_like(c, dtype=bool)
    mask[np.arange(len(c)), label_idx] = False
    w = 1 + (c * mask).sum(1) / np.maximum(mask.sum(1), 1)
    return w / w.mean()


def pooled_capture(table: pd.DataFrame, pred, modes, overhead_ms: float = 0.0) -> float:
    """The share of the oracle's latency saving that the picks ``pred`` keep, pooled in
    milliseconds over the rows (the score report's capture; overhead paid per request).
    A pick without a measured latency saves nothing, as a fallback to the reference
    would; NaN where the oracle saves nothing."""
    refs = table["reference_mode"].astype(str).to_numpy() if "reference_mode" in table else \
        np.full(len(table), reference_mode().name, dtype=object)
    missing = sorted({r for r in refs if r not in modes})
    if missing:
        raise InputError(f"capture needs the reference mode's latency; the table has no latency_ms__ column "
                         f"for {', '.join(missing)}")
    lat = _matrix(table, "latency_ms", modes)
    rows = np.arange(len(table))
    ref = lat[rows, [modes.index(r) for r in refs]]
    oracle = lat[rows, [modes.index(x) for x in table["label"]]]
    idx = np.array([modes.index(p) if p in modes else -1 for p in np.asarray(pred, dtype=object)])
    picked = np.where(idx >= 0, lat[rows, np.maximum(idx, 0)], np.nan)
    picked = np.where(np.isnan(picked), ref, picked)
    best = np.nansum(ref - oracle)
    return float((np.nansum(ref - picked) - overhead_ms * len(table)) / best) if best > 1e-12 else float("nan")


def unsafe_picks(table: pd.DataFrame, pred, modes) -> np.ndarray:
    """A boolean per row: does the pick violate a constraint (a mode the table has no
    label for counts as unsafe, as in the cost)?"""
    idx = np.array([modes.index(p) if p in modes else -1 for p in np.asarray(pred, dtype=object)], dtype=int)
    safe = _matrix(table, "safe", modes, dtype=bool)
    return ~np.where(idx >= 0, safe[np.arange(len(table)), np.maximum(idx, 0)], False)


def objective_metrics(table: pd.DataFrame, pred, modes=None, unsafe_penalty: float = UNSAFE_PENALTY,
                      overhead_ms: float = 0.0, objective: str = "regret") -> dict:
    """Oracle match, macro-F1, regret, capture, violation rates by type, and the
    objective (``objective``: one of :data:`OBJECTIVES`, the module docstring).

    ``overhead_ms``: the router's decision cost, paid on every request before its mode
    runs; it counts as the score counts it (added to the pick's latency), so each
    request's cost grows by ``overhead_ms / L_i(o_i)`` (``decision_cost`` in the result)."""
    if objective not in OBJECTIVES:
        raise InputError(f"tuning objective {objective!r}: choose one of {', '.join(OBJECTIVES)}")
    modes = modes or modes_of(table)
    pred = np.asarray(pred, dtype=object)
    idx = np.array([modes.index(p) if p in modes else -1 for p in pred])
    rows = np.arange(len(table))
    known = idx >= 0
    c = cost_matrix(table, modes, unsafe_penalty)
    cost = np.where(known, c[rows, np.maximum(idx, 0)], unsafe_penalty)
    lat = _matrix(table, "latency_ms", modes)
    label_idx = np.array([modes.index(x) for x in table["label"]])
    regret = lat[rows, np.maximum(idx, 0)] / lat[rows, label_idx] - 1
    decision = overhead_ms / lat[rows, label_idx]
    decision = np.where(np.isfinite(decision), decision, 0.0)
    out = {
        "objective": float((cost + decision).mean()),
        "decision_cost": float(decision.mean()),
        "oracle_match": float((pred == table["label"].to_numpy(dtype=object)).mean()),
        "macro_f1": float(f1_score(table["label"].astype(str), pred.astype(str), average="macro",
                                   zero_division=0)),
        "mean_regret": float(np.nanmean(np.where(known, regret, np.nan))) if known.any() else float("nan"),
    }
    for kind in ("quality", "energy", "memory"):
        v = _matrix(table, f"violates_{kind}", modes, dtype=bool)
        out[f"violation_rate_{kind}"] = float(np.where(known, v[rows, np.maximum(idx, 0)], False).mean())
    out["violation_rate_any"] = float(unsafe_picks(table, pred, modes).mean())
    if objective == "capture":
        out["capture"] = pooled_capture(table, pred, modes, overhead_ms)
        # nothing to capture (the oracle saves nothing): only the violations count
        missed = 1.0 - out["capture"] if np.isfinite(out["capture"]) else 0.0
        out["objective"] = missed + unsafe_penalty * out["violation_rate_any"]
    return out

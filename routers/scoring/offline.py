"""Offline scoring: every router's picks replayed against the training table's costs.

For each held-out request and router the pick is looked up in the table's
per-mode columns (measured or estimated from profiles) and charged the router's
measured routing overhead (p50, from :mod:`modeswitch.routers.scoring.overhead`):

* ``speedup``: reference latency / (pick latency + overhead), aggregated as the
  ratio of summed latencies (mean latency speedup, as the study reports it);
* ``energy_ratio`` / ``memory_ratio``: the pick's ratio to the reference (mean);
* quality: ``rouge_delta`` (ROUGE-L of the pick's output vs the reference
  output, minus the reference's own 1.0) and, on benchmark requests,
  ``accuracy_delta_pp``;
* ``oracle_match``; ``latency_capture`` = saved latency / the oracle's saved
  latency (both vs the reference, overhead charged to the router); ``energy_capture``
  likewise for energy; ``mean_regret`` = mean(pick latency + overhead) / oracle
  latency - 1;
* violations of each constraint type (quality, energy, memory; a pick the table
  has no numbers for counts as ``unmeasured``), as counts and rates; quality as the
  oracle judged it (the study's rule per mode and family by default), with the
  per-request ``divergence_rate`` beside it under its own name; fallbacks
  (routers with a safety guard that found no safe mode).

An unmeasured pick is never free: it is a violation *and* it is charged the
reference's costs (latency, energy ratio 1, memory ratio 1, the reference's
quality) plus the router's overhead, as if the request had fallen back to the
reference (``charged``). Summing the reference latency over every request but the
pick's only where it exists would reward a router for picking modes nobody measured
(a router could then beat the oracle); every ratio here is taken over rows that have
both sides.

Aggregates exist per workload family, overall with equal family weights (the mean
of the family values: five benchmark requests do not vanish among 600 synthetic
ones, as they did in the study), and request-weighted.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from modeswitch.dataset.requests import Request
from modeswitch.engine.modes import reference_mode
from modeswitch.oracle.content_columns import TOKEN_IDS
from modeswitch.oracle.training_table import table_meta
from modeswitch.routers.scoring.intervals import Parts, family_bootstrap, mean_parts, value

VIOLATION_TYPES = ("quality", "energy", "memory", "unmeasured")


def requests_from_table(table: pd.DataFrame, token_ids: bool = False) -> list[Request]:
    """Request objects for the table's rows (fields the training table carries).

    ``token_ids``: each request also carries its prompt's token ids where the table has
    them (``prompt_token_ids``: what a router reading the prompt routes on). Off by
    default: the engines run a table's request from its shape and id, which rebuilds the
    same prompt with its question's gold answer and companions of their own text
    (``modeswitch.engine.prompts``, ``modeswitch.dataset.workloads.conditions.arrival_group``)."""
    def cat(v):
        return None if v is None or (isinstance(v, float) and np.isnan(v)) or v in ("none", "") else str(v)

    ids = table[TOKEN_IDS].tolist() if token_ids and TOKEN_IDS in table else [None] * len(table)
    out = []
    for row, tok in zip(table.itertuples(index=False), ids):
        out.append(Request(
            prompt_token_ids=None if tok is None else tuple(int(t) for t in tok),
            id=str(row.request_id), prompt_tokens=int(row.prompt_tokens),
            expected_output_tokens=int(row.expected_output_tokens),
            shared_prefix_tokens=int(row.shared_prefix_tokens),
            concurrent_requests=int(row.concurrent_requests),
            memory_pressure=float(row.memory_pressure), family=cat(row.family),
            workload=cat(getattr(row, "workload", None)),
            benchmark_suite=cat(row.benchmark_suite),
            evaluation_mode=cat(getattr(row, "evaluation_mode", None))))
    return out


def predictions(router, X: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(picks, fell-back mask) for a feature/table frame (any :class:`~modeswitch.routers.base.Router`)."""
    picks, fell = router.predict_with_fallback(X)
    return np.asarray(picks, dtype=object), np.asarray(fell, dtype=bool)


# ------------------------------------------------------------------ per request
def _col(table, prefix, mode):
    name = f"{prefix}__{mode}"
    return table[name] if name in table.columns else pd.Series(np.nan, index=table.index)


def _pick(table, prefix, picks, dtype=float):
    """Value of ``prefix__<pick>`` for each row."""
    out = np.full(len(table), np.nan if dtype is float else False, dtype=dtype if dtype is float else object)
    for mode in set(picks):
        rows = picks == mode
        vals = _col(table, prefix, mode).to_numpy()[rows]
        out[rows] = vals
    return out


def score_requests(table: pd.DataFrame, picks, fell=None, overhead_us: float = 0.0,
                   router: str = "router") -> pd.DataFrame:
    """One row per request: the pick and what it costs, overhead included."""
    meta = table_meta(table)
    modes = set(meta["modes"])
    picks = np.asarray(picks, dtype=object)
    ref_mode = table["reference_mode"].to_numpy(dtype=object) if "reference_mode" in table else \
        np.full(len(table), reference_mode().name, dtype=object)
    lat = _pick(table, "latency_ms", picks)
    ref_lat = _pick(table, "latency_ms", ref_mode)
    oracle_lat = _pick(table, "latency_ms", table["label"].to_numpy(dtype=object))
    oh_ms = overhead_us / 1000.0
    eff = lat + oh_ms
    energy = _pick(table, "energy_ratio", picks)
    oracle_energy = _pick(table, "energy_ratio", table["label"].to_numpy(dtype=object))
    measured = np.array([p in modes for p in picks]) & ~np.isnan(lat)
    # the stated cost of an unmeasured pick: the reference's, as a fallback would pay
    lat = np.where(measured, lat, ref_lat)
    eff = lat + oh_ms
    energy = np.where(measured, energy, 1.0)
    memory = np.where(measured, _pick(table, "memory_ratio", picks), 1.0)
    rouge = np.where(measured, _pick(table, "rouge_l_vs_baseline", picks), 1.0)
    acc = np.where(measured, _pick(table, "accuracy_delta_pp", picks),
                   _pick(table, "accuracy_delta_pp", ref_mode))
    df = pd.DataFrame({
        "router": router,
        "request_id": table["request_id"].to_numpy(),
        "family": table["family"].astype(str).to_numpy(),
        "label": table["label"].to_numpy(dtype=object),
        "pick": picks,
        "fallback": np.zeros(len(table), bool) if fell is None else np.asarray(fell, bool),
        "overhead_us": overhead_us,
        "latency_ms": lat, "effective_latency_ms": eff, "reference_latency_ms": ref_lat,
        "oracle_latency_ms": oracle_lat,
        "speedup": ref_lat / eff,
        "energy_ratio": energy, "oracle_energy_ratio": oracle_energy,
        "memory_ratio": memory,
        "rouge_delta": rouge - 1.0,
        "accuracy_delta_pp": acc,
        "charged": ~measured,
        "oracle_match": picks == table["label"].to_numpy(dtype=object),
        "regret": eff / oracle_lat - 1.0,
    })
    for kind in ("quality", "energy", "memory"):
        v = _pick(table, f"violates_{kind}", picks, dtype=object)
        df[f"violates_{kind}"] = np.where(measured, v, False).astype(bool)
    df["violates_unmeasured"] = ~measured
    # the per-request view beside the rule's verdict (tables built before it lack the column)
    div = _pick(table, "diverges", picks, dtype=object)
    df["diverges"] = np.where(measured, pd.Series(div).fillna(False).astype(bool), False)
    df["violates_any"] = df[[f"violates_{k}" for k in VIOLATION_TYPES]].any(axis=1)
    return df


# ------------------------------------------------------------------ aggregates
def _both(g: pd.DataFrame) -> np.ndarray:
    """Rows with the reference's, the pick's and the oracle's latency: every latency ratio
    is taken over these, so a missing number never drops out of one side only."""
    return (np.isfinite(g["reference_latency_ms"]) & np.isfinite(g["effective_latency_ms"])
            & np.isfinite(g["oracle_latency_ms"])).to_numpy()


def _interval_parts(g: pd.DataFrame, both: np.ndarray | None = None) -> Parts:
    """The figures with an interval, as (numerator, denominator) columns
    (:mod:`modeswitch.routers.scoring.intervals`); :func:`_aggregate` takes its speedup and energy
    ratio from here too, so the point estimate and its interval share one definition."""
    both = _both(g) if both is None else both
    return {
        "speedup": (np.where(both, g["reference_latency_ms"], 0.0), np.where(both, g["effective_latency_ms"], 0.0)),
        "energy_ratio": mean_parts(g["energy_ratio"]),
        "violation_rate_any": mean_parts(g["violates_any"]),
    }


def _aggregate(g: pd.DataFrame) -> dict:
    mask = _both(g)
    parts = _interval_parts(g, mask)
    both = g[mask]
    saved = (both["reference_latency_ms"] - both["effective_latency_ms"]).sum()
    best = (both["reference_latency_ms"] - both["oracle_latency_ms"]).sum()
    e_saved = (1 - g["energy_ratio"]).sum()
    e_best = (1 - g["oracle_energy_ratio"]).sum()
    out = {
        "requests": len(g),
        "speedup": value(parts["speedup"]),
        "charged_rate": float(g["charged"].mean()) if "charged" in g else 0.0,
        "energy_ratio": value(parts["energy_ratio"]),
        "memory_ratio": g["memory_ratio"].mean(),
        "rouge_delta": g["rouge_delta"].mean(),
        "accuracy_delta_pp": g["accuracy_delta_pp"].mean(),
        "oracle_match": g["oracle_match"].mean(),
        "latency_capture": saved / best if best > 1e-12 else np.nan,
        "energy_capture": e_saved / e_best if e_best > 1e-12 else np.nan,
        "mean_regret": g["regret"].mean(),
        "fallback_rate": g["fallback"].mean(),
        "divergence_rate": float(g["diverges"].mean()) if "diverges" in g else np.nan,
        "overhead_us": g["overhead_us"].iloc[0] if len(g) else np.nan,
    }
    for kind in VIOLATION_TYPES + ("any",):
        out[f"violations_{kind}"] = int(g[f"violates_{kind}"].sum())
        out[f"violation_rate_{kind}"] = float(g[f"violates_{kind}"].mean())
    return out


def aggregate_scores(per_request: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per-family table, overall table with ``weighting`` in {families, requests})."""
    fam = pd.DataFrame([{"router": r, "family": f, **_aggregate(g)}
                        for (r, f), g in per_request.groupby(["router", "family"], sort=False)])
    rows = []
    num = [c for c in fam.columns if c not in ("router", "family")]
    for r, g in fam.groupby("router", sort=False):
        eq = g[num].mean(numeric_only=True).to_dict()
        eq["requests"] = int(g["requests"].sum())
        for kind in VIOLATION_TYPES + ("any",):
            eq[f"violations_{kind}"] = int(g[f"violations_{kind}"].sum())
        rows.append({"router": r, "weighting": "families", **eq})
        rows.append({"router": r, "weighting": "requests",
                     **_aggregate(per_request[per_request["router"] == r])})
    return fam, pd.DataFrame(rows)


def score_offline(table: pd.DataFrame, routers: dict, overhead_us: dict | None = None) -> pd.DataFrame:
    """Per-request scores for every router (name -> fitted :class:`~modeswitch.routers.base.Router`)."""
    overhead_us = overhead_us or {}
    parts = []
    for name, router in routers.items():
        picks, fell = predictions(router, table)
        parts.append(score_requests(table, picks, fell, float(overhead_us.get(name, 0.0)), name))
    return pd.concat(parts, ignore_index=True)


#: offline figures that get a bootstrap interval in the headline
INTERVAL_FIGURES = ("speedup", "energy_ratio", "violation_rate_any")


def offline_intervals(per_request: pd.DataFrame, n_boot: int = 1000, seed: int = 0) -> pd.DataFrame:
    """Per router, 95 % bootstrap intervals of the family-weighted speedup, energy ratio
    and violation rate (requests resampled within each family)."""
    rows = [{"router": r, **family_bootstrap(g, _interval_parts, INTERVAL_FIGURES, n_boot, seed)}
            for r, g in per_request.groupby("router", sort=False)]
    return pd.DataFrame(rows).set_index("router")

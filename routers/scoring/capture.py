"""Capture of the oracle's saving against the violation rate: the routers' points and
the ceiling's envelope that the report plots (``capture_vs_violations.png``) beside the
split's frontier (:mod:`modeswitch.routers.scoring.frontier`)."""

from __future__ import annotations

import numpy as np
import pandas as pd


def inside_ranges(per_request: pd.DataFrame, marks: pd.DataFrame | None = None) -> pd.DataFrame:
    """The held-out requests inside the training ranges, as :func:`frontier` scores them:
    rows not marked ``extrapolated`` (their own column, else ``marks``' by request id;
    every row where neither says)."""
    pr = per_request
    if "extrapolated" not in pr and marks is not None and "extrapolated" in marks:
        pr = pr.merge(marks[["request_id", "extrapolated"]], on="request_id", how="left")
    if "extrapolated" in pr:
        pr = pr[~pr["extrapolated"].fillna(False).astype(bool)]
    return pr


def capture_and_violations(g: pd.DataFrame) -> tuple[float, float]:
    """(share of the oracle's latency saving kept, violation rate), request-weighted
    (pooled: saved milliseconds over the oracle's), over per-request scores ``g``."""
    best = (g["reference_latency_ms"] - g["oracle_latency_ms"]).sum()
    saved = (g["reference_latency_ms"] - g["latency_ms"]).sum()
    return (saved / best if best > 1e-12 else np.nan,
            float(g["violates_any"].astype(bool).mean()) if len(g) else np.nan)


def router_points(per_request: pd.DataFrame) -> pd.DataFrame:
    """Each scored router as a point beside the frontier: its share of the oracle's
    latency saving and its violation rate, request-weighted over the held-out requests
    inside the training ranges, as :func:`frontier` scores them."""
    rows = []
    for name, g in inside_ranges(per_request).groupby("router", sort=False):
        capture, violations = capture_and_violations(g)
        rows.append({"router": name, "capture": capture, "violations": violations, "requests": len(g)})
    return pd.DataFrame(rows)


def envelope(curve: pd.DataFrame) -> pd.DataFrame:
    """The frontier's upper envelope: the best capture at or below each violation rate
    (and the best ``safe_capture``, where the curve has it: each its own maximum)."""
    c = curve.dropna(subset=["capture", "violations"]).sort_values(["violations", "capture"])
    cols = ["violations", "capture"] + (["safe_capture"] if "safe_capture" in c else [])
    c = c.assign(**{k: c[k].cummax() for k in cols[1:]})
    return c.drop_duplicates("violations", keep="last")[cols]

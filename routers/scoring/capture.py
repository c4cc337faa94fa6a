"""Capture of the oracle's saving against the violation rate: the routers' points and
the ceiling's envelope that the report plots (``capture_vs_violations.png``) beside the
split's frontier (:mod:`routers.scoring.frontier`)."""

from __future__ import annotations

import numpy as np
import pandas as pd


def router_points(per_request: pd.DataFrame) -> pd.DataFrame:
    """Each scored router as a point beside the frontier: its share of the oracle's
    latency saving and its violation rate, request-weighted over the held-out requests
    inside the training ranges, as :func:`frontier` scores them."""
    pr = per_request
    if "extrapolated" in pr:
        pr = pr[~pr["extrapolated"].fillna(False).astype(bool)]
    rows = []
    for name, g in pr.groupby("router", sort=False):
        best = (g["reference_latency_ms"] - g["oracle_latency_ms"]).sum()
        saved = (g["reference_latency_ms"] - g["latency_ms"]).sum()
        rows.append({"router": name, "capture": saved / best if best > 1e-12 else np.nan,
                     "violations": float(g["violates_any"].astype(bool).mean()), "requests": len(g)})
    return pd.DataFrame(rows)


def envelope(curve: pd.DataFrame) -> pd.DataFrame:
    """The frontier's upper envelope: the best capture at or below each violation rate."""
    c = curve.dropna(subset=["capture", "violations"]).sort_values(["violations", "capture"])
    c = c.assign(capture=c["capture"].cummax())
    return c.drop_duplicates("violations", keep="last")[["violations", "capture"]]

"""Each certified router's own capture / violation curve: its threshold swept over the
held-out requests (``router_curves.csv``, the lines of ``capture_vs_violations.png``,
the report's "What the certificate costs").

Why: a certified router's point in the plot says where its certificate put it. Its
curve says what its predictions could keep at every threshold, the threshold chosen in
hindsight on the held-out requests themselves. So the report can split the distance
from the ceiling (:mod:`modeswitch.routers.scoring.frontier`: every latency known) to the router
in two:

* ceiling to the curve's best point at the target: what predicting a new family's
  latencies and risks costs, against knowing them;
* the curve's best point to the certified one: what the certificate costs. It picks
  its threshold from training families only, each decided by a model fitted without
  it, and needs the binomial test to pass there.

A hindsight threshold is no router anyone could serve: it reads the held-out outcomes.
It is a diagnostic, never a result.

The curve is the router's own decision at each threshold: the certified router's
inner model (:class:`~modeswitch.routers.certified.CertifiedRouter`'s ``router_``). Where the
certified router serves a distilled tree, the curve is the ensemble's (``decision``
says which). Leave one family out: every family is decided by its own fold's router,
all at the same threshold.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from modeswitch.experimental import experimental_func
from modeswitch.routers.certified import CertifiedRouter
from modeswitch.routers.risk_control import candidate_grid
from modeswitch.routers.scoring.capture import capture_and_violations, inside_ranges
from modeswitch.routers.scoring.offline import score_requests

#: thresholds swept per router, at most (quantiles of the held-out risk scores)
SWEEP_POINTS = 80


def certified_parts(router) -> dict | None:
    """``{family or None: CertifiedRouter}`` for a certified router (leave one family
    out: one per held-out family, from ``by_family``), None for any other router."""
    by_family = getattr(router, "by_family", None)
    parts = dict(by_family) if by_family is not None else {None: router}
    if not parts or not all(isinstance(r, CertifiedRouter) and hasattr(r, "router_") for r in parts.values()):
        return None
    return parts


def picks_at(certified: CertifiedRouter, X: pd.DataFrame, thresholds) -> np.ndarray:
    """(thresholds, rows) mode names: the certified router's inner model deciding ``X``
    at each threshold (its scores computed once where it offers them)."""
    inner = certified.router_
    modes = np.asarray(inner.modes_, dtype=object)
    out = np.empty((len(thresholds), len(X)), dtype=object)
    if hasattr(inner, "row_scores") and hasattr(inner, "decide_scores"):
        ratio, risk = inner.row_scores(inner.features(X))
        for i, t in enumerate(thresholds):
            out[i] = modes[np.asarray(inner.decide_scores(ratio, risk, float(t)), dtype=int)]
        return out
    try:
        for i, t in enumerate(thresholds):
            inner.set_risk_threshold(float(t))
            out[i] = np.asarray(inner.predict(X), dtype=object)
    finally:  # the served threshold back, whatever happened
        inner.set_risk_threshold(certified.threshold_)
    return out


def _thresholds(parts: dict, frames: dict) -> np.ndarray:
    """The swept thresholds: quantile midpoints of the held-out rows' own risk scores
    (hindsight: the grid may read them), every part's certified threshold, and the
    strictest and loosest, in increasing order."""
    scores, extra = [], []
    for key, r in parts.items():
        inner = r.router_
        scores.append(np.ravel(inner.risk_scores(frames[key])))
        extra += [inner.strictest_threshold, inner.loosest_threshold()]
        if r.threshold_ is not None:
            extra.append(r.threshold_)
    grid = candidate_grid(np.concatenate(scores), SWEEP_POINTS)
    return np.unique(np.concatenate([grid, np.asarray(extra, float)]))


@experimental_func
def router_curves(scored: dict, test: pd.DataFrame, marks: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per certified router and threshold: the share of the oracle's latency saving kept
    and the violation rate over the held-out requests inside the training ranges
    (``marks``' ``extrapolated`` column; all without it), request-weighted as the
    ceiling is. Columns: router, threshold, capture, violations, requests, decision."""
    rows = []
    fam = test["family"].astype(str).to_numpy()
    for name, router in scored.items():
        parts = certified_parts(router)
        if parts is None:
            continue
        frames = {key: test if key is None else test[fam == key] for key in parts}
        frames = {k: f for k, f in frames.items() if len(f)}
        if not frames:
            continue
        parts = {k: parts[k] for k in frames}
        thresholds = _thresholds(parts, frames)
        picks = np.empty((len(thresholds), len(test)), dtype=object)
        for key, r in parts.items():
            picks[:, np.ones(len(test), bool) if key is None else fam == key] = picks_at(r, frames[key], thresholds)
        decision = "ensemble" if any(getattr(r, "served_tree_", None) is not None for r in parts.values()) \
            else "served"
        for t, p in zip(thresholds, picks):
            scored_rows = inside_ranges(score_requests(test, p), marks)
            capture, violations = capture_and_violations(scored_rows)
            rows.append({"router": name, "threshold": float(t), "capture": capture, "violations": violations,
                         "requests": len(scored_rows), "decision": decision})
    return pd.DataFrame(rows, columns=["router", "threshold", "capture", "violations", "requests", "decision"])


@experimental_func
def certificate_price(curves: pd.DataFrame, points: pd.DataFrame, targets: dict,
                      ceiling: pd.DataFrame | None = None, rule_ceiling: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per certified router: its certified point, its curve's best capture at or below
    its target (hindsight), and the ceiling's there (``ceiling``: an envelope with
    violations and capture columns, :func:`~modeswitch.routers.scoring.capture.envelope`).

    ``rule_ceiling``: the envelope of the certified routers' own kind of decision alone
    (the fastest mode under a risk threshold), as ``ceiling_rule_capture``. Why beside the
    ceiling: the ceiling is the best of several rules, and where the oracle saves little
    an absolute-saving rule can pass it by spending the violation budget on the longest
    requests, a saving no router promising safe picks would take."""
    rows = []
    pts = points.set_index("router") if len(points) else points
    for name, c in curves.groupby("router", sort=False):
        target = targets.get(name)
        if target is None or name not in pts.index:
            continue
        ok = c[c["violations"] <= target + 1e-12]
        best = ok.loc[ok["capture"].idxmax()] if len(ok) and ok["capture"].notna().any() else None
        row = {"router": name, "target": target,
               "certified_capture": pts.loc[name, "capture"], "certified_violations": pts.loc[name, "violations"],
               "hindsight_capture": np.nan if best is None else best["capture"],
               "hindsight_violations": np.nan if best is None else best["violations"],
               "hindsight_threshold": np.nan if best is None else best["threshold"]}
        if ceiling is not None and len(ceiling):
            under = ceiling[ceiling["violations"] <= target + 1e-12]
            row["ceiling_capture"] = under["capture"].max() if len(under) else np.nan
            if "safe_capture" in ceiling:  # the safe picks' saving alone (routers.scoring.frontier)
                row["ceiling_safe_capture"] = under["safe_capture"].max() if len(under) else np.nan
        if rule_ceiling is not None and len(rule_ceiling):
            under = rule_ceiling[rule_ceiling["violations"] <= target + 1e-12]
            row["ceiling_rule_capture"] = under["capture"].max() if len(under) else np.nan
        rows.append(row)
    return pd.DataFrame(rows)


def targets_of(scored: dict) -> dict:
    """Each certified router's target violation rate."""
    out = {}
    for name, router in scored.items():
        parts = certified_parts(router)
        if parts:
            out[name] = float(next(iter(parts.values())).target_violation_rate)
    return out

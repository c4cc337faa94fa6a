"""Estimate each mode's metrics at a request's features from measured cells.

Method (documented for users, tested in ``tests/test_oracle_estimate.py``):

1. The request's *condition* (plain, shared prefix, memory pressure, batch
   pressure, benchmark) comes from its registered family, else from its numbers.
   Only profile units measured under the same condition are used (a benchmark
   request uses units of the same benchmark suite). When none exist, the plain
   units are used and the basis says so.
2. Within that pool, each metric of each mode is interpolated linearly over a
   Delaunay triangulation of the measured points in (log(1+prompt tokens),
   log(1+output tokens)); latency, TTFT, throughput, energy per token and memory
   are interpolated in log space (they scale as power laws), quality linearly.
   Points with the same coordinates are averaged first.
3. Outside the measured range (outside the triangulation's hull), or with fewer
   than three non-collinear points, the nearest measured point is used.

A request that coincides with a measured cell gets that cell's values; it is marked
``measured`` when it is that cell's own request (its id), ``estimated`` otherwise (a
drawn request of the same lengths ran other text).

4. With a fitted :class:`modeswitch.oracle.costmodel.CostModel`, each (mode, metric) for
   which the cost model cross-validated better than this interpolation takes the
   cost model's estimate instead; ``latency_basis`` records, per (request, mode),
   where the latency came from (``measured``, ``costmodel`` or ``interpolation``).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.interpolate import LinearNDInterpolator
from scipy.spatial import QhullError

from modeswitch.oracle.cells import METRICS, MODELLED, Cells, OracleError, family_condition

LOG_METRICS = {"latency_ms", "ttft_ms", "tokens_per_s", "energy_per_token_j", "peak_memory_mb"}


def _coords(prompt, output) -> np.ndarray:
    return np.column_stack([np.log1p(np.asarray(prompt, float)),
                            np.log1p(np.asarray(output, float))])


def _nearest(points, query):
    d = ((query[:, None, :] - points[None, :, :]) ** 2).sum(-1)
    return d.argmin(axis=1), d.min(axis=1)


def _interpolate(points, values, query, log: bool):
    """Linear inside the hull, nearest outside; returns (estimates, inside mask)."""
    ok = ~np.isnan(values)
    pts, vals = points[ok], values[ok]
    out = np.full(len(query), np.nan)
    inside = np.zeros(len(query), dtype=bool)
    if len(pts) == 0:
        return out, inside
    if log:
        vals = np.log(np.maximum(vals, 1e-12))
    # average duplicate points
    uniq, inv = np.unique(np.round(pts, 12), axis=0, return_inverse=True)
    inv = inv.reshape(-1)
    vals = np.bincount(inv, weights=vals) / np.bincount(inv)
    pts = uniq
    idx, _ = _nearest(pts, query)
    out = vals[idx]
    if len(pts) >= 3:
        try:
            lin = LinearNDInterpolator(pts, vals)(query)
            inside = ~np.isnan(lin)
            out = np.where(inside, lin, out)
        except QhullError:
            pass
    return (np.exp(out) if log else out), inside


def _pool(cells: Cells, condition: str, suite) -> tuple[pd.Index, str]:
    units = cells.units
    if condition == "benchmark":
        same = units.index[(units["condition"] == "benchmark")
                           & (units["benchmark_suite"] == suite)]
        if len(same):
            return same, f"{suite} cells"
        condition_pool = units.index[units["condition"] == "plain"]
        if len(condition_pool):
            return condition_pool, f"plain cells (no {suite} cells measured)"
        return (units.index[units["condition"] != "benchmark"],
                f"cells of every condition (no {suite} or plain cells measured)")
    same = units.index[units["condition"] == condition]
    if len(same):
        return same, f"{condition} cells"
    plain = units.index[units["condition"] == "plain"]
    if len(plain):
        return plain, f"plain cells (no {condition} cells measured)"
    # conditions drawn per request can leave a condition (even plain) unmeasured in a
    # small profile or a cross-validation fold: the nearest cells of any condition
    anything = units.index[units["condition"] != "benchmark"]
    return anything, f"cells of every condition (no {condition} or plain cells measured)"


def _apply_costmodel(est_df: pd.DataFrame, costmodel, req: pd.DataFrame) -> pd.DataFrame:
    """Overwrite the interpolated (mode, metric)s the cost model validated better on."""
    cm = costmodel.predict(req)
    est_df = est_df.set_index(["unit", "mode"])
    est_df["latency_basis"] = "interpolation"
    cm = cm.reindex(est_df.index)
    for mode in est_df.index.get_level_values("mode").unique():
        at = est_df.index.get_level_values("mode") == mode
        for metric in MODELLED:
            if not costmodel.prefers(mode, metric):
                continue
            vals = cm.loc[at, metric]
            ok = vals.notna().to_numpy()
            idx = est_df.index[at][ok]
            est_df.loc[idx, metric] = vals.to_numpy()[ok]
            if metric == "latency_ms":
                est_df.loc[idx, "tokens_per_s"] = cm.loc[idx, "tokens_per_s"]
                est_df.loc[idx, "latency_basis"] = "costmodel"
    return est_df.reset_index()


def _check_same_shape(req: pd.DataFrame, units: pd.DataFrame, direct: list) -> None:
    """A request that takes a measured unit's numbers by its id must be that unit: the
    same prompt and output lengths (a drawn request that only shares an id would
    silently get another request's measurements)."""
    if not direct:
        return
    r = req.set_index("id").loc[direct]
    u = units.loc[direct]
    for col in ("prompt_tokens", "expected_output_tokens"):
        a, b = r[col].to_numpy(float), u[col].to_numpy(float)
        bad = np.isfinite(a) & np.isfinite(b) & (np.abs(a - b) > 0.5 + 1e-6 * np.abs(b))
        if bad.any():
            rid = direct[int(np.flatnonzero(bad)[0])]
            raise OracleError(
                f"request {rid!r} has the id of a measured unit but another shape ({col} "
                f"{r.loc[rid, col]:g} vs {u.loc[rid, col]:g} measured); give drawn requests "
                "ids of their own")


def estimate(cells: Cells, requests: pd.DataFrame, costmodel=None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per-(request, mode) metric estimates and a per-request basis table.

    ``requests`` needs the Request fields (``id``, shape columns, ``family``,
    ``benchmark_suite``). Requests whose id is a measured unit take that unit's
    measurements.
    """
    metrics = cells.metrics
    units = cells.units
    all_modes = metrics.index.get_level_values("mode").unique()
    rows, basis = [], []
    req = requests.reset_index(drop=True)
    cond = [
        family_condition(r["family"], r["benchmark_suite"], r)
        for r in req.to_dict(orient="records")
    ]
    req = req.assign(condition=cond)
    measured_ids = set(units.index)

    group_key = req["condition"] + "|" + req["benchmark_suite"].fillna("").astype(str)
    for _, grp in req.groupby(group_key, sort=False):
        condition = grp["condition"].iloc[0]
        suite = grp["benchmark_suite"].iloc[0]
        pool, pool_desc = _pool(cells, condition, suite)
        if not len(pool):
            raise OracleError(
                f"no profile cells to estimate {condition!r} requests from "
                "(and no plain cells to fall back on)"
            )
        pool_units = units.loc[pool]
        ref = pool_units["reference_mode"].iloc[0]
        pts = _coords(pool_units["prompt_tokens"], pool_units["expected_output_tokens"])
        if np.isnan(pts).any():
            bad = pool_units.index[np.isnan(pts).any(axis=1)][0]
            raise OracleError(f"unit {bad!r} has no prompt/output token counts to estimate from")
        q = _coords(grp["prompt_tokens"], grp["expected_output_tokens"])
        near_idx, near_d = _nearest(pts, q)
        ref_inside = None
        for mode in all_modes:
            key = [(u, mode) for u in pool]
            m = metrics.reindex(pd.MultiIndex.from_tuples(key, names=["unit", "mode"]))
            if m["latency_ms"].isna().all() and m[list(METRICS)].isna().all().all():
                continue
            est = {}
            for metric in METRICS:
                est[metric], inside = _interpolate(pts, m[metric].to_numpy(float), q,
                                                   metric in LOG_METRICS)
                if metric == "latency_ms" and mode == ref:
                    ref_inside = inside
            for i, rid in enumerate(grp["id"]):
                rows.append({"unit": rid, "mode": mode, **{k: v[i] for k, v in est.items()}})
        for i, rid in enumerate(grp["id"]):
            exact = near_d[i] < 1e-12
            # "measured" means this request's own measurement: another request of the same
            # lengths (a drawn one) takes the cell's numbers but ran other text
            own = exact and rid in measured_ids
            nearest_unit = pool[near_idx[i]]
            if exact:
                how = f"cell {nearest_unit}"
            elif ref_inside is not None and ref_inside[i]:
                how = "interpolated in (log prompt, log output)"
            else:
                how = f"nearest cell {nearest_unit} (outside measured range)"
            basis.append({
                "unit": rid,
                "condition": condition,
                "reference_mode": ref,
                "label_source": "measured" if own else "estimated",
                "estimate_basis": f"{how}; pool: {pool_desc}",
            })
    est_df = pd.DataFrame(rows)
    basis_df = pd.DataFrame(basis).set_index("unit")
    if costmodel is not None:
        est_df = _apply_costmodel(est_df, costmodel, req)
        by_cm = est_df[est_df["latency_basis"] == "costmodel"].groupby("unit").size()
        n_modes = est_df.groupby("unit").size()
        for rid in basis_df.index:
            k = int(by_cm.get(rid, 0))
            if k and basis_df.loc[rid, "label_source"] == "measured":
                # it coincides with a measured cell, but its numbers are the model's now
                basis_df.loc[rid, "label_source"] = "estimated"
            if k:
                basis_df.loc[rid, "estimate_basis"] += (
                    f"; cost model for {k}/{int(n_modes[rid])} modes' latency (where it "
                    "validated better)")
    else:
        est_df["latency_basis"] = "interpolation"
    # requests that are themselves measured units take their measurements
    direct = [rid for rid in req["id"] if rid in measured_ids]
    _check_same_shape(req, units, direct)
    if direct:
        est_df = est_df[~est_df["unit"].isin(direct)]
        measured = metrics.loc[metrics.index.get_level_values("unit").isin(direct)].reset_index()
        measured = measured.drop(columns=["n_rows", "latency_cv", "n_clean_trials"])
        est_df = pd.concat([est_df, measured.assign(latency_basis="measured")], ignore_index=True)
        for rid in direct:
            basis_df.loc[rid, "label_source"] = "measured"
            basis_df.loc[rid, "estimate_basis"] = "measured request"
            basis_df.loc[rid, "reference_mode"] = units.loc[rid, "reference_mode"]
    est_df = est_df.set_index(["unit", "mode"]).sort_index()
    return est_df, basis_df

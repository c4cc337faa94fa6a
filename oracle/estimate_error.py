"""How far an estimated request's gain can be trusted: the estimator's own
cross-validated error, as an interval around each mode's estimated ratios.

Why: the noise rule (:mod:`modeswitch.oracle.noise_aware`) holds a measured request's label to
its paired trials, but a request the profile did not measure would have no interval
at all, so a lossless mode estimated a few percent faster than the reference would
become its label. Live, such a mode runs near parity and breaks the energy limit, and
estimated requests given such picks made most of the oracle's live violations beyond
noise (docs/results.md). An estimate is a measurement of *other* requests; its error
is what the labels must clear.

Method:

1. The measured requests are split into K folds (grouped by request, stratified by
   family: :func:`modeswitch.oracle.costmodel.grouped_folds`). Each held-out request is
   estimated from the other folds by the estimator the labels use
   (:func:`modeswitch.oracle.estimate.estimate`: the interpolation, and with a cost model one
   refitted on the fold, taken where the full model validated better).
2. Per held-out (request, mode), the residuals of the two ratios the oracle decides
   on, in log space: ``log(measured speedup / estimated speedup)`` (speedup: the
   reference's latency over the mode's) and ``log(measured energy ratio / estimated
   energy ratio)``. The measured side is the request's median over its clean
   trials, so the residual holds the estimator's error and a rerun's noise alike,
   which is what a live run of an estimated request meets.
3. Per (mode, latency basis), the residuals' ``(1 - level) / 2`` and
   ``(1 + level) / 2`` quantiles (empirical, not a finite-sample guarantee) widen an
   estimated request's ratios: speedup in ``[s e^lo, s e^hi]``, energy ratio up to
   ``e e^hi``. With fewer than :data:`MIN_RESIDUALS` residuals for the basis, the
   mode's residuals over every basis; with fewer still, no interval (the plain rule).
4. ``p_faster``: the share of the mode's residuals under which the request would be
   faster than the reference, the estimate's analogue of a measured label's
   bootstrap confidence.

The oracle then holds an estimated request's safety to these intervals as it holds
a measured one's to its trials (:func:`modeswitch.oracle.noise_aware.choose`): the energy
limit is met only by the upper end. Among the modes that clear it, the fastest by
the point estimate is the label, with ``p_faster`` as its confidence.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from modeswitch.oracle.cells import OracleError, request_rows, summarise
from modeswitch.oracle.costmodel import CostModel, grouped_folds
from modeswitch.oracle.estimate import estimate

#: residuals a (mode, basis) needs before its own quantiles are used
MIN_RESIDUALS = 8
COLUMNS = ["unit", "family", "mode", "basis", "r_speedup", "r_energy"]


def _ratios(metrics: pd.DataFrame, ref: str) -> pd.DataFrame:
    """Per mode of one unit: speedup over ``ref`` and energy ratio to it."""
    r = metrics.loc[ref]
    return pd.DataFrame({
        "speedup": r["latency_ms"] / metrics["latency_ms"],
        "energy_ratio": metrics["energy_per_token_j"] / r["energy_per_token_j"],
    })


def residuals(profile: pd.DataFrame, costmodel: CostModel | None = None, k: int = 5,
              seed: int = 0) -> pd.DataFrame:
    """One row per held-out (measured request, mode other than its reference): the
    latency basis its estimate had and the log residuals of speedup and energy ratio.
    Empty where the profile has fewer than two measured requests (a published table's
    aggregates, say): nothing to cross-validate on."""
    rows = request_rows(profile)
    if rows.empty or rows["request_id"].nunique() < 2:
        return pd.DataFrame(columns=COLUMNS)
    out = []
    for train_ids, test_ids in grouped_folds(rows, k, seed):
        train = rows[rows["request_id"].astype(str).isin(train_ids)]
        test = rows[rows["request_id"].astype(str).isin(test_ids)]
        actual = summarise(test)
        shapes = actual.units.reset_index().rename(columns={"unit": "id"})
        fold_cm = None
        if costmodel is not None:
            fold_cm = CostModel.fit(train, seed=seed)
            fold_cm.validation = costmodel.validation  # the full model's choice of estimator
        try:
            est, _ = estimate(summarise(train), shapes, costmodel=fold_cm)
        except OracleError:
            continue  # a fold without cells for a condition: its requests get no residual
        for unit, info in actual.units.iterrows():
            ref = info["reference_mode"]
            got, guess = actual.metrics.loc[unit], est.loc[unit]
            if ref not in got.index or ref not in guess.index:
                continue
            m, e = _ratios(got, ref), _ratios(guess, ref)
            for mode in m.index.intersection(e.index).drop(ref, errors="ignore"):
                out.append({
                    "unit": unit, "family": info["family"], "mode": mode,
                    "basis": guess.loc[mode, "latency_basis"],
                    "r_speedup": np.log(m.loc[mode, "speedup"] / e.loc[mode, "speedup"]),
                    "r_energy": np.log(m.loc[mode, "energy_ratio"] / e.loc[mode, "energy_ratio"]),
                })
    res = pd.DataFrame(out, columns=COLUMNS)
    return res[np.isfinite(res["r_speedup"]) & np.isfinite(res["r_energy"])].reset_index(drop=True)


def _pool(res: pd.DataFrame, mode: str, basis: str) -> pd.DataFrame:
    own = res[(res["mode"] == mode) & (res["basis"] == basis)]
    if len(own) >= MIN_RESIDUALS:
        return own
    anyb = res[res["mode"] == mode]
    return anyb if len(anyb) >= MIN_RESIDUALS else anyb.iloc[:0]


def attach(cand: pd.DataFrame, res: pd.DataFrame, estimated: set, level: float) -> None:
    """Give the estimated units' candidates (``cand`` rows of units in ``estimated``,
    other than their reference) ``speedup_low``/``speedup_high``,
    ``energy_ratio_high`` and ``p_faster`` from the residuals; every row gets
    ``interval_basis`` ("trials", "estimate error", or "" for none). Rows that
    already have an interval from trials keep it."""
    if "speedup_low" not in cand:
        for col in ("speedup_low", "speedup_high", "energy_ratio_high"):
            cand[col] = np.nan
    cand["p_faster"] = np.nan
    cand["interval_basis"] = np.where(cand["speedup_low"].notna(), "trials", "")
    if res is None or res.empty or not estimated:
        return
    basis = cand["latency_basis"] if "latency_basis" in cand else pd.Series("interpolation", index=cand.index)
    lo_q, hi_q = (1 - level) / 2, (1 + level) / 2
    todo = cand["unit"].isin(estimated) & ~cand["is_reference"] & cand["speedup_low"].isna()
    for (mode, b), idx in cand[todo].groupby([cand["mode"], basis]).groups.items():
        pool = _pool(res, mode, b)
        if pool.empty:
            continue
        rs, re = pool["r_speedup"].to_numpy(float), pool["r_energy"].to_numpy(float)
        s = cand.loc[idx, "speedup"].to_numpy(float)
        cand.loc[idx, "speedup_low"] = s * np.exp(np.quantile(rs, lo_q))
        cand.loc[idx, "speedup_high"] = s * np.exp(np.quantile(rs, hi_q))
        cand.loc[idx, "energy_ratio_high"] = (cand.loc[idx, "energy_ratio"].to_numpy(float)
                                              * np.exp(np.quantile(re, hi_q)))
        cand.loc[idx, "p_faster"] = (np.log(s)[:, None] + rs[None, :] > 0).mean(axis=1)
        cand.loc[idx, "interval_basis"] = "estimate error"


def summary(res: pd.DataFrame, level: float) -> pd.DataFrame:
    """Per mode: residuals, and the factors an estimated request's ratios are widened
    by (speedup x low .. x high, energy ratio x high): for the label table's attrs."""
    if res is None or res.empty:
        return pd.DataFrame(columns=["mode", "n", "speedup_low_factor", "speedup_high_factor",
                                     "energy_high_factor"])
    lo_q, hi_q = (1 - level) / 2, (1 + level) / 2
    g = res.groupby("mode")
    return pd.DataFrame({
        "n": g.size(),
        "speedup_low_factor": np.exp(g["r_speedup"].quantile(lo_q)),
        "speedup_high_factor": np.exp(g["r_speedup"].quantile(hi_q)),
        "energy_high_factor": np.exp(g["r_energy"].quantile(hi_q)),
    }).reset_index()

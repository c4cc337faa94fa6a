"""The oracle's noise rule: a mode replaces a safer one only when its gain is
beyond measurement noise, and a limit is met only when the interval meets it.

Why: one unit's trials differ by several per cent on a small machine, so a mode
a few per cent faster in the median of three trials is not faster, and a mode at 0.99x the reference's
energy on medians may be at 1.02x on the next run. Labels chosen on such noise
teach a router to flip between modes for nothing, and call a mode safe on one
lucky trial.

For a measured unit with two or more clean trials per mode (paired by trial
index: trial ``t`` of every mode ran in the same pass over the units):

* **Limits.** The energy check uses the upper end of the paired energy-ratio
  interval (:func:`modeswitch.oracle.uncertainty.paired_ratio`): a mode within noise of the
  limit is not safe.
* **Choice.** Take the fastest safe mode by median latency; every safe mode whose
  latency is not beyond noise slower than it (the paired ratio interval reaches 1)
  ties with it; among the tied, the safest wins: the reference first, then
  lossless modes (their greedy output is the reference's), then lossy ones, then
  the faster median, then the name.
* **Margin and confidence.** Each label carries the interval of its speedup over
  the reference (``speedup_low``/``speedup_high``) and a ``confidence``: the share
  of bootstrap resamples of the paired trials in which the decision holds (the
  label faster than the reference; for a reference label, the fastest safe
  alternative not faster than the reference).

A request the profile did not measure has no trials; where the estimator's
cross-validated error is known (:mod:`modeswitch.oracle.estimate_error`) its candidates carry
intervals from it instead (``interval_basis`` = "estimate error") and the same rule
applies to their safety: the energy limit is met by the interval's upper end. The
choice among the safe is the point estimate's (:func:`_choose_estimated` says why),
and ``confidence`` is the share of residuals under which it is faster than the
reference. Units with neither (published aggregates, a profile too small to
cross-validate) keep the plain rule; their ``confidence`` is missing.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from modeswitch.engine.modes import get_mode
from modeswitch.oracle.uncertainty import DEFAULT_BOOT, paired_ratio, resamples


def safety_rank(mode: str, reference: str) -> int:
    """0 the reference, 1 a lossless mode, 2 a lossy one (or unknown)."""
    if mode == reference:
        return 0
    try:
        return 1 if get_mode(mode).lossless else 2
    except KeyError:
        return 2


def _series(trials: pd.DataFrame, unit, mode, metric) -> pd.Series:
    try:
        return trials.loc[(unit, mode)][metric]
    except KeyError:
        return pd.Series(dtype=float)


def _pair(trials, unit, a, b, metric="latency_ms"):
    """Trial-aligned values of modes ``a`` and ``b`` (common trial indices only)."""
    x, y = _series(trials, unit, a, metric), _series(trials, unit, b, metric)
    common = x.index.intersection(y.index)
    return x.loc[common].to_numpy(float), y.loc[common].to_numpy(float)


def _p_below_one(num, den, seed: int, n_boot: int = 1000) -> float:
    """Share of paired-bootstrap resamples whose median ratio num/den is below 1."""
    ok = np.isfinite(num) & np.isfinite(den) & (den > 0)
    meds = resamples(num[ok] / den[ok], "median", n_boot, seed)
    return float(np.mean(meds < 1)) if len(meds) else np.nan


def add_intervals(cand: pd.DataFrame, trials: pd.DataFrame, level: float, seed: int = 0) -> None:
    """Per candidate: ``n_paired`` trials, the speedup interval vs the reference and
    the upper end of its energy-ratio interval (NaN where fewer than two pairs)."""
    t = trials.set_index(["unit", "mode", "trial"]).sort_index()
    lo, hi, e_hi, n = [], [], [], []
    for row in cand.itertuples(index=False):
        ref_l, m_l = _pair(t, row.unit, row.reference_mode, row.mode)
        if len(m_l) >= 2:
            ci = paired_ratio(ref_l, m_l, DEFAULT_BOOT, level, seed)
            lo.append(ci.low)
            hi.append(ci.high)
        else:
            lo.append(np.nan)
            hi.append(np.nan)
        n.append(len(m_l))
        m_e, ref_e = _pair(t, row.unit, row.mode, row.reference_mode, "energy_per_token_j")
        e_hi.append(paired_ratio(m_e, ref_e, DEFAULT_BOOT, level, seed).high if len(m_e) >= 2 else np.nan)
    cand["n_paired"] = n
    cand["speedup_low"] = lo
    cand["speedup_high"] = hi
    cand["energy_ratio_high"] = e_hi


def choose(cand: pd.DataFrame, chosen: pd.Series, trials: pd.DataFrame, level: float,
           seed: int = 0) -> tuple[pd.Series, pd.DataFrame]:
    """Apply the noise rule to the plain choice (unit -> fastest safe mode by median).

    Returns the new choice and, per unit, ``noise_rule`` (what the rule did),
    ``confidence`` and ``tied`` (the modes within noise of the fastest).
    """
    t = trials.set_index(["unit", "mode", "trial"]).sort_index()
    out, info = {}, []
    estimated = set()
    if "interval_basis" in cand:
        estimated = set(cand.loc[cand["interval_basis"] == "estimate error", "unit"])
    for unit, g in cand[cand["safe"]].groupby("unit", sort=False):
        best = chosen.get(unit)
        ref = g["reference_mode"].iloc[0]
        if best is not None and g["n_paired"].max() < 2 and unit in estimated:
            out[unit], rec = _choose_estimated(g, best, ref)
            info.append({"unit": unit, **rec})
            continue
        if best is None or g["n_paired"].max() < 2:
            out[unit] = best
            info.append({"unit": unit, "noise_rule": "no trials: median rule", "confidence": np.nan,
                         "tied": ""})
            continue
        tied = [best]
        for m in g["mode"]:
            if m == best:
                continue
            a, b = _pair(t, unit, m, best)
            # not beyond noise slower than the fastest (too few pairs: the median decides)
            if len(a) >= 2 and paired_ratio(a, b, DEFAULT_BOOT, level, seed).low <= 1.0:
                tied.append(m)
        lat = g.set_index("mode")["latency_ms"]
        label = min(tied, key=lambda m: (safety_rank(m, ref), lat[m], m))
        out[unit] = label
        if label != ref:
            a, b = _pair(t, unit, label, ref)
            conf = _p_below_one(a, b, seed)
        else:
            others = [m for m in g["mode"] if m != ref]
            if others:
                alt = min(others, key=lambda m: (lat[m], m))
                a, b = _pair(t, unit, alt, ref)
                p = _p_below_one(a, b, seed)
                conf = 1 - p if p == p else np.nan
            else:
                conf = 1.0
        rule = ("fastest, beyond noise" if label == best and len(tied) == 1 else
                f"within noise of {best}: the safest of {len(tied)} tied" if label != best else
                f"fastest and safest of {len(tied)} tied")
        info.append({"unit": unit, "noise_rule": rule, "confidence": conf, "tied": ",".join(sorted(tied))})
    return pd.Series(out, name="mode"), pd.DataFrame(info).set_index("unit")


def _choose_estimated(g: pd.DataFrame, best: str, ref: str) -> tuple[str, dict]:
    """An estimated unit keeps the fastest safe mode by its point estimates: its safety
    already cleared the estimate's error (the energy limit met by the upper end), and
    on a CPU energy is CPU time, so a mode that clears it is beyond error cheaper and
    so faster. Holding the speed to an interval too would only hand an uncertain gain
    back to the reference; the label records how sure it is instead: ``confidence``
    is the share of residuals under which the label is faster than the reference
    (for a reference label, under which the fastest alternative is not)."""
    x = g.set_index("mode")
    lat = x["latency_ms"]
    if best != ref:
        conf = float(x.loc[best, "p_faster"])
    else:
        others = [m for m in x.index if m != ref]
        alt = min(others, key=lambda m: (lat[m], m)) if others else None
        conf = 1 - float(x.loc[alt, "p_faster"]) if alt is not None else 1.0
    return best, {"noise_rule": "estimate: fastest safe by estimate, energy within its error",
                  "confidence": conf, "tied": ""}

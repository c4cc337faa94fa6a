"""95 % bootstrap intervals for family-weighted aggregates of per-request scores.

The headline figures weigh every workload family equally (the mean of family
values), so an interval must too: each resample draws requests with replacement
*within* each family, recomputes every family's value and averages them. Used by
the offline and the live scores alike.

Every figure is a ratio of two sums over a family's requests, given as the two
per-request columns (:data:`Parts`): a mean is ``sum(x) / count`` (:func:`mean_parts`),
a speedup ``sum(reference latency) / sum(latency)`` (:func:`ratio_parts`). So one
definition gives the point estimate (:func:`family_weighted`) and the resamples
(:func:`family_bootstrap`), and a resample is two sums over drawn row indices, done
for a block of resamples at once in numpy. Why: one pandas frame per resample is
tens of times slower for the same intervals (``bench/score_intervals.py`` times both),
and a study's score steps draw thousands of resamples per router.

NaN is skipped as pandas' ``mean()`` and ``quantile()`` skip it; an infinite value
(an energy ratio over a reference that read 0 J) is kept, as there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np
import pandas as pd

#: figure name -> (numerator, denominator) per request; the figure is their sums' ratio
Parts = dict[str, tuple[np.ndarray, np.ndarray]]

#: drawn row indices held at once, over all families (a few MB): resamples go in blocks
_CHUNK = 1 << 19


def mean_parts(values) -> tuple[np.ndarray, np.ndarray]:
    """The mean of ``values`` (booleans as 0/1), NaN left out."""
    x = np.asarray(values, dtype=float)
    ok = ~np.isnan(x)
    return np.where(ok, x, 0.0), ok.astype(float)


def ratio_parts(num, den) -> tuple[np.ndarray, np.ndarray]:
    """``sum(num) / sum(den)`` over the rows where neither is NaN (a missing number never
    drops out of one side only)."""
    n, d = np.asarray(num, dtype=float), np.asarray(den, dtype=float)
    ok = ~np.isnan(n) & ~np.isnan(d)
    return np.where(ok, n, 0.0), np.where(ok, d, 0.0)


def value(part: tuple[np.ndarray, np.ndarray]) -> float:
    """The figure of one family's rows: NaN when the denominator sums to 0 or less."""
    num, den = part
    d = float(den.sum())
    return float(num.sum()) / d if d > 0 else float("nan")


def _nanmean(a: np.ndarray, axis: int) -> np.ndarray:
    """Mean along ``axis`` with NaN left out (NaN where nothing is left, no warning)."""
    ok = ~np.isnan(a)
    n = ok.sum(axis=axis)
    s = np.where(ok, a, 0.0).sum(axis=axis)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n > 0, s / np.maximum(n, 1), np.nan)


def family_weighted(per_request: pd.DataFrame, parts: Callable[[pd.DataFrame], Parts]) -> dict:
    """The mean over families of each figure of ``parts(family rows)`` (a family whose
    figure is NaN is left out of that figure's mean)."""
    fams = [parts(g) for _, g in per_request.groupby("family", sort=True)]
    if not fams:
        return {}
    return {name: float(_nanmean(np.array([value(f[name]) for f in fams]), axis=0)) for name in fams[0]}


def family_bootstrap(per_request: pd.DataFrame, parts: Callable[[pd.DataFrame], Parts],
                     names: Iterable[str], n_boot: int = 1000, seed: int = 0,
                     level: float = 0.95) -> dict:
    """``{name}_low`` / ``{name}_high`` for each figure in ``names``: percentile interval of
    the family-weighted figure over ``n_boot`` resamples, each drawing every family's rows
    with replacement (per resample, family by family in sorted order, as many rows as the
    family has: the draws of the per-resample pandas bootstrap this replaced)."""
    rng = np.random.default_rng(seed)
    groups = [(len(g), parts(g)) for _, g in per_request.groupby("family", sort=True)]
    names = list(names)
    per_family = {k: np.full((len(groups), n_boot), np.nan) for k in names}
    step = max(1, _CHUNK // max(1, sum(n for n, _ in groups)))  # resamples per block
    for b in range(0, n_boot, step):
        block = [[rng.integers(0, n, n) for n, _ in groups] for _ in range(min(step, n_boot - b))]
        for i, (_, p) in enumerate(groups):
            idx = np.stack([d[i] for d in block])  # (resamples, rows of the family)
            for k in names:
                num, den = p[k]
                s_num, s_den = num[idx].sum(axis=1), den[idx].sum(axis=1)
                ok = s_den > 0
                per_family[k][i, b:b + len(block)] = np.where(ok, s_num / np.where(ok, s_den, 1.0), np.nan)
    lo, hi = (1 - level) / 2, (1 + level) / 2
    out = {}
    for k in names:
        boots = _nanmean(per_family[k], axis=0)
        boots = boots[~np.isnan(boots)]
        if len(boots):
            out[f"{k}_low"], out[f"{k}_high"] = (float(q) for q in np.quantile(boots, [lo, hi]))
        else:
            out[f"{k}_low"] = out[f"{k}_high"] = float("nan")
    return out


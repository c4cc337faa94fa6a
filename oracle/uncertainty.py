"""Bootstrap confidence intervals for the figures routers are judged by.

Why: on a noisy machine a mode that looks 3 % faster on one trial is not faster;
a live speedup of 1.4x from six requests is not 1.4x. Every comparison the oracle
makes between modes and every aggregate a report shows comes with a percentile
bootstrap interval (Efron & Tibshirani, ch. 13): resample the observations with
replacement ``n_boot`` times, recompute the statistic, take the
``(1 - level) / 2`` and ``(1 + level) / 2`` quantiles. Paired data (the same
trial index of two modes, interleaved in time; the same request under two
routers) is resampled jointly, so what the machine did to both cancels.

Deterministic for a given ``seed``; vectorised, so thousands of resamples of a few
hundred values cost milliseconds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

DEFAULT_BOOT = 2000
DEFAULT_LEVEL = 0.95


@dataclass(frozen=True)
class Interval:
    """A point estimate with its bootstrap interval (NaN where there is no data)."""

    estimate: float
    low: float
    high: float
    n: int
    level: float = DEFAULT_LEVEL

    def excludes(self, value: float) -> bool:
        """The interval lies entirely on one side of ``value``."""
        return bool(self.low > value or self.high < value)

    def __str__(self) -> str:
        return f"{self.estimate:.3g} [{self.low:.3g}, {self.high:.3g}]"


def _stat(name):
    if name == "mean":
        return lambda a, axis: np.nanmean(a, axis=axis)
    if name == "median":
        return lambda a, axis: np.nanmedian(a, axis=axis)
    raise ValueError(f"statistic {name!r}: choose mean or median")


def resamples(values, statistic: str = "mean", n_boot: int = DEFAULT_BOOT,
              seed: int = 0) -> np.ndarray:
    """``statistic`` of ``n_boot`` resamples (with replacement) of the finite ``values``."""
    x = np.asarray(values, float)
    x = x[np.isfinite(x)]
    if len(x) == 0:
        return np.array([])
    rng = np.random.default_rng(seed)
    return _stat(statistic)(x[rng.integers(0, len(x), size=(n_boot, len(x)))], axis=1)


def bootstrap(values, statistic: str = "mean", n_boot: int = DEFAULT_BOOT,
              level: float = DEFAULT_LEVEL, seed: int = 0) -> Interval:
    """Percentile bootstrap interval of ``statistic`` of ``values`` (NaNs dropped)."""
    x = np.asarray(values, float)
    x = x[np.isfinite(x)]
    if len(x) == 0:
        return Interval(np.nan, np.nan, np.nan, 0, level)
    est = float(_stat(statistic)(x, axis=None))
    if len(x) == 1:
        return Interval(est, est, est, 1, level)
    boots = resamples(x, statistic, n_boot, seed)
    lo, hi = np.quantile(boots, [(1 - level) / 2, (1 + level) / 2])
    return Interval(est, float(lo), float(hi), len(x), level)


def ratio_of_sums(num, den, n_boot: int = DEFAULT_BOOT, level: float = DEFAULT_LEVEL,
                  seed: int = 0) -> Interval:
    """sum(num) / sum(den) over paired observations (rows with both finite), with a
    paired bootstrap interval: the study's mean-latency speedup, reference latency
    over the pick's, with its uncertainty."""
    a, b = np.asarray(num, float), np.asarray(den, float)
    ok = np.isfinite(a) & np.isfinite(b)
    a, b = a[ok], b[ok]
    if len(a) == 0 or b.sum() <= 0:
        return Interval(np.nan, np.nan, np.nan, int(len(a)), level)
    est = float(a.sum() / b.sum())
    if len(a) == 1:
        return Interval(est, est, est, 1, level)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(a), size=(n_boot, len(a)))
    boots = a[idx].sum(1) / np.maximum(b[idx].sum(1), 1e-300)
    lo, hi = np.quantile(boots, [(1 - level) / 2, (1 + level) / 2])
    return Interval(est, float(lo), float(hi), len(a), level)


def paired_ratio(num, den, n_boot: int = DEFAULT_BOOT, level: float = DEFAULT_LEVEL,
                 seed: int = 0) -> Interval:
    """Median of the per-pair ratios ``num[i] / den[i]`` (trial i of two modes), with a
    paired bootstrap interval. With three trials the interval spans their ratios:
    a mode is faster beyond noise only when every trial says so."""
    a, b = np.asarray(num, float), np.asarray(den, float)
    ok = np.isfinite(a) & np.isfinite(b) & (b > 0)
    return bootstrap(a[ok] / b[ok], "median", n_boot, level, seed)

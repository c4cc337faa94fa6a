"""Safety thresholds with a finite-sample guarantee (Learn then Test).

Why: a threshold on a router's safety score tuned on one traffic mix says nothing
about the violation rate on the next. Here the threshold is *certified* on held-out
calibration requests: with probability at least ``1 - delta`` over the draw of the
calibration set, the violation rate on new requests from the same distribution is
at most ``alpha``.

Method: Learn then Test (Angelopoulos, Bates, Candès, Jordan, Lei, "Learn then
Test: Calibrating Predictive Algorithms to Achieve Risk Control", 2021,
arXiv:2110.01052), with fixed-sequence testing. The candidate thresholds, fixed
before the calibration rows are looked at (from the fitting rows' scores), are
ordered from the strictest (the cost routers: only the reference mode, which
violates nothing by definition; the guarded classifiers: every pick falls back)
to the loosest; for each, the null hypothesis "its violation rate
exceeds alpha" is tested with the exact binomial tail p-value
``P(Binomial(n, alpha) <= k)`` (k violations among n calibration requests); the
sequence is walked while the null is rejected at level ``delta``, and the last
threshold rejected is returned. Fixed-sequence testing controls the family-wise
error at ``delta`` without assuming the violation rate is monotone in the
threshold (a stricter threshold can swap one unsafe mode for another, so
conformal risk control's monotonicity does not hold for argmin routers).

What it costs: certifying a small ``alpha`` needs many calibration requests. With
no violations at all, ``(1 - alpha)^n <= delta`` needs ``n >= log(delta) /
log(1 - alpha)``: 230 requests for alpha = 0.01, delta = 0.1. With fewer, no
threshold is certified and the router answers the reference mode: the guarantee
holds, the speedup is gone. :func:`min_calibration` says how many are needed.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

#: the default target violation rate and confidence (the issue's defaults)
ALPHA = 0.01
DELTA = 0.1


def binomial_p_value(k: int, n: int, alpha: float) -> float:
    """P(Binomial(n, alpha) <= k): small when k violations in n are unlikely under a
    violation rate of alpha or more (the null)."""
    from scipy.stats import binom  # lazy: scipy is heavy

    return float(binom.cdf(k, n, alpha)) if n > 0 else 1.0


def min_calibration(alpha: float = ALPHA, delta: float = DELTA) -> int:
    """Calibration requests needed to certify anything (zero violations observed)."""
    return math.ceil(math.log(delta) / math.log(1 - alpha))


@dataclass(frozen=True)
class Calibration:
    """What a certified threshold rests on (kept on the router as ``calibration_``)."""

    alpha: float
    delta: float
    n: int
    #: the certified threshold (None: none certified, the router answers the reference)
    threshold: float | None
    #: violations among the n calibration requests at that threshold
    violations: int
    #: the empirical violation rate there, and its (1 - delta) upper confidence bound
    rate: float
    upper_bound: float
    p_value: float
    tested: int

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def slack(self) -> float:
        """How far the stated bound may sit above the target: the guarantee is
        ``rate_new <= alpha`` with probability 1 - delta; the calibration's own
        upper bound ``upper_bound`` is what it saw."""
        return max(0.0, self.upper_bound - self.alpha)


def sampling_slack(alpha: float, n: int, delta: float = DELTA) -> float:
    """How far above ``alpha`` the violation rate measured on ``n`` new requests may lie
    by chance alone, for a router whose true rate is ``alpha``: the (1 - delta)
    quantile of Binomial(n, alpha), as a rate, minus alpha. A certified router whose
    held-out rate exceeds ``alpha + slack`` broke its certificate beyond test noise."""
    from scipy.stats import binom  # lazy: scipy is heavy

    if n <= 0:
        return math.inf
    return float(binom.ppf(1 - delta, n, alpha)) / n - alpha


def upper_bound(k: int, n: int, delta: float) -> float:
    """Clopper-Pearson one-sided (1 - delta) upper bound of a rate from k of n."""
    from scipy.stats import beta  # lazy: scipy is heavy

    if n == 0:
        return 1.0
    return 1.0 if k >= n else float(beta.ppf(1 - delta, k + 1, n - k))


def learn_then_test(violations_at, thresholds, n: int, alpha: float = ALPHA,
                    delta: float = DELTA) -> Calibration:
    """The loosest threshold certified by fixed-sequence testing.

    ``thresholds`` are ordered strictest first; ``violations_at(t)`` returns the
    number of violating calibration requests (of ``n``) at threshold ``t``.
    """
    if not 0 < alpha < 1:
        raise ValueError(f"target violation rate {alpha}: must lie in (0, 1)")
    best, best_k, best_p, tested = None, 0, 1.0, 0
    for t in thresholds:
        k = int(violations_at(t))
        p = binomial_p_value(k, n, alpha)
        tested += 1
        if not p <= delta:  # NaN (a bad alpha) stops too: nothing is certified by accident
            break
        best, best_k, best_p = t, k, p
    return Calibration(alpha, delta, n, None if best is None else float(best), best_k,
                       best_k / n if n else math.nan, upper_bound(best_k, n, delta), best_p, tested)


@dataclass(frozen=True)
class GroupCalibration(Calibration):
    """A threshold certified in every group at once (kept as ``calibration_``): the
    pooled figures of :class:`Calibration`, and per group (a family, or a cluster of
    small ones pooled) its calibration rows, violations, rate and upper bound at the
    certified threshold: ``{"members": [...], "n", "violations", "rate",
    "upper_bound", "p_value"}``."""

    groups: dict = field(default_factory=dict)


def group_clusters(groups: np.ndarray, alpha: float, delta: float = DELTA) -> dict[str, list]:
    """Calibration groups as clusters that can each be certified: a group with at least
    :func:`min_calibration` rows is its own cluster; the smaller ones are pooled into one
    (clustered conformal prediction's remedy for small groups, Ding, Angelopoulos, Bates,
    Jordan, Tibshirani, arXiv:2306.09335); if that pool is still too small, it joins the
    smallest cluster that is large enough (or everything is one cluster)."""
    need = min_calibration(alpha, delta)
    names, counts = np.unique(np.asarray(groups, dtype=str), return_counts=True)
    big = {str(g): [str(g)] for g, c in zip(names, counts) if c >= need}
    small = [str(g) for g, c in zip(names, counts) if c < need]
    if small:
        pooled = sum(int(c) for g, c in zip(names, counts) if str(g) in small)
        if pooled >= need:
            big["+".join(small)] = small
        elif big:
            size = {k: sum(int(c) for g, c in zip(names, counts) if str(g) in v) for k, v in big.items()}
            host = min(size, key=size.get)
            members = big.pop(host) + small
            big["+".join(members)] = members
        else:
            big = {"+".join(small): small}
    return big


def learn_then_test_groups(violations_at, thresholds, groups: np.ndarray, alpha: float = ALPHA,
                           delta: float = DELTA) -> GroupCalibration:
    """The loosest threshold at which *every* cluster's violation rate is certified at
    most ``alpha`` (:func:`group_clusters`), by fixed-sequence testing.

    ``violations_at(t)``: a boolean per calibration row (does the pick at ``t`` violate);
    ``groups``: each row's group. Each threshold's null is the union over clusters of
    "this cluster's rate exceeds alpha"; it is rejected when every cluster's binomial test
    rejects at ``delta`` (an intersection-union test: level ``delta`` with no correction),
    so with probability ``1 - delta`` each cluster's rate is at most ``alpha``
    (Mondrian, group-conditional risk control) instead of only the pooled rate."""
    if not 0 < alpha < 1:
        raise ValueError(f"target violation rate {alpha}: must lie in (0, 1)")
    groups = np.asarray(groups, dtype=str)
    clusters = group_clusters(groups, alpha, delta)
    member = {g: c for c, gs in clusters.items() for g in gs}
    cluster_of = np.array([member[g] for g in groups])
    best, best_v, tested = None, None, 0
    for t in thresholds:
        v = np.asarray(violations_at(t), dtype=bool)
        tested += 1
        ps = {c: binomial_p_value(int(v[cluster_of == c].sum()), int((cluster_of == c).sum()), alpha)
              for c in clusters}
        if not all(p <= delta for p in ps.values()):
            break
        best, best_v = t, v
    n = len(groups)
    certified = best_v is not None
    if not certified:  # nothing certified: the reference only, no violation, no evidence
        best_v = np.zeros(n, dtype=bool)
    per = {}
    for c, gs in clusters.items():
        rows = cluster_of == c
        k, m = int(best_v[rows].sum()), int(rows.sum())
        per[c] = {"members": gs, "n": m, "violations": k, "rate": k / m if m else math.nan,
                  "upper_bound": upper_bound(k, m, delta),
                  "p_value": binomial_p_value(k, m, alpha) if certified else 1.0}
    k = int(best_v.sum())
    return GroupCalibration(alpha, delta, n, None if best is None else float(best), k, k / n if n else math.nan,
                            upper_bound(k, n, delta), max((g["p_value"] for g in per.values()), default=1.0),
                            tested, per)


def candidate_grid(scores: np.ndarray, n: int = 200) -> np.ndarray:
    """Thresholds to test, from scores *not* of the calibration rows (Learn then Test
    needs the grid fixed in advance): midpoints between up to ``n`` quantiles, so a
    threshold never sits exactly on a score (where rounding could decide)."""
    s = np.unique(np.asarray(scores, float)[np.isfinite(scores)])
    if len(s) > n:
        s = np.unique(np.quantile(s, np.linspace(0, 1, n)))
    if len(s) < 2:
        return s
    return (s[:-1] + s[1:]) / 2


def calibration_split(n: int, share: float, seed: int, groups=None, alpha: float | None = None,
                      delta: float = DELTA) -> tuple[np.ndarray, np.ndarray]:
    """(fit rows, calibration rows): a random ``share`` held out for calibration
    (stratified by ``groups`` when given, so every family is represented). With a
    target ``alpha`` the share is raised to what certifying it needs at all
    (:func:`min_calibration`), at most half the rows."""
    if alpha:
        share = min(0.5, max(share, min_calibration(alpha, delta) / max(n, 1)))
    rng = np.random.default_rng(seed)
    idx = np.arange(n)
    k = min(n, math.ceil(n * share - 1e-9))  # at least the share asked for, never fewer
    if groups is None:
        perm = rng.permutation(idx)
        return np.sort(perm[k:]), np.sort(perm[:k])
    groups = np.asarray(groups)
    # every group its share (rounded down), then the rows still missing from the
    # groups' remainders at random, so the total is exactly k
    cal, rest = [], []
    for g in np.unique(groups):
        rows = rng.permutation(idx[groups == g])
        take = int(len(rows) * share)
        cal.extend(rows[:take])
        rest.extend(rows[take:])
    cal.extend(rng.permutation(np.array(rest, dtype=int))[: max(0, k - len(cal))])
    cal = np.sort(np.array(cal, dtype=int))
    return np.setdiff1d(idx, cal), cal

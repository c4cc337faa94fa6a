"""The bootstrap intervals on synthetic data whose intervals are known."""

from __future__ import annotations

import numpy as np
import pytest

from modeswitch.oracle.uncertainty import bootstrap, paired_ratio, ratio_of_sums


def test_mean_interval_matches_the_normal_theory_and_covers_at_its_level():
    rng = np.random.default_rng(0)
    x = rng.normal(10.0, 2.0, 400)
    ci = bootstrap(x, "mean", n_boot=4000, seed=1)
    half = 1.96 * 2.0 / np.sqrt(400)  # the known 95 % half-width
    assert ci.estimate == pytest.approx(x.mean())
    assert (ci.high - ci.low) / 2 == pytest.approx(half, rel=0.12)
    # coverage over many samples of the same population is close to 95 %
    hits = 0
    for s in range(200):
        y = rng.normal(10.0, 2.0, 60)
        c = bootstrap(y, "mean", n_boot=1000, seed=s)
        hits += c.low <= 10.0 <= c.high
    assert 0.88 <= hits / 200 <= 0.99


def test_ratio_of_sums_is_paired_and_its_interval_shrinks_with_n():
    rng = np.random.default_rng(3)
    ref = rng.uniform(100, 1000, 300)
    pick = ref / 2 * rng.normal(1, 0.05, 300)  # a true 2x speedup, 5 % noise
    ci = ratio_of_sums(ref, pick, seed=0)
    assert ci.low < 2.0 < ci.high and ci.excludes(1.0)
    small = ratio_of_sums(ref[:20], pick[:20], seed=0)
    assert (small.high - small.low) > (ci.high - ci.low)
    # a missing value drops the whole pair, never one side only
    pick2 = pick.copy()
    pick2[0] = np.nan
    assert ratio_of_sums(ref, pick2).n == 299
    assert ratio_of_sums(ref, pick2).estimate == pytest.approx(ref[1:].sum() / pick[1:].sum())


def test_paired_ratio_excludes_one_only_when_every_trial_agrees():
    assert paired_ratio([90, 91, 89], [100, 100, 100]).excludes(1.0)
    mixed = paired_ratio([90, 105, 89], [100, 100, 100])
    assert not mixed.excludes(1.0) and mixed.estimate == pytest.approx(0.90)
    assert np.isnan(bootstrap([]).estimate) and bootstrap([5.0]).low == 5.0

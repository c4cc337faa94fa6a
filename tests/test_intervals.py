"""The vectorised family bootstrap gives the intervals the per-resample pandas one gave
(same draws, same figures), for the live and the offline figures, in chunks or not."""

import numpy as np
import pandas as pd
import pytest
from helpers import pandas_family_bootstrap, pandas_live_figures

from modeswitch.routers.scoring import intervals
from modeswitch.routers.scoring.intervals import family_bootstrap, family_weighted
from modeswitch.routers.scoring.live import INTERVAL_FIGURES as LIVE_FIGURES
from modeswitch.routers.scoring.live import _family_parts
from modeswitch.routers.scoring.offline import INTERVAL_FIGURES as OFFLINE_FIGURES
from modeswitch.routers.scoring.offline import _aggregate, _interval_parts

# family sizes: one of a single request, one whose energy was never measured
SIZES = {"a": 5, "b": 1, "c": 40, "d": 7, "e": 3}


def per_request(seed=0, missing=True) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for fam, n in SIZES.items():
        for i in range(n):
            ref = float(rng.uniform(50, 150))
            v = rng.random(4) < [0.2, 0.1, 0.3, 0.05]
            rows.append({
                "family": fam, "request_id": f"{fam}{i}",
                "reference_latency_ms": ref, "effective_latency_ms": ref / rng.uniform(0.8, 2.5),
                "oracle_latency_ms": ref / 2.6,
                "energy_ratio": np.nan if fam == "e" else float(rng.uniform(0.3, 1.1)),
                "rouge_delta": -float(rng.uniform(0, 0.4)),
                "violates_quality": v[0], "violates_energy": v[1], "violates_any": v[0] | v[1] | v[2],
                "violates_any_beyond_noise": v[0] | v[3], "diverges": v[2],
                # the rest of an offline score's row (routers.scoring.offline.score_requests)
                "oracle_energy_ratio": 0.5, "memory_ratio": 0.8, "accuracy_delta_pp": 0.0,
                "charged": False, "oracle_match": v[3], "regret": 0.1, "fallback": False,
                "overhead_us": 1.0, "violates_memory": False, "violates_unmeasured": v[2]})
    df = pd.DataFrame(rows)
    if missing:  # offline rows the table has no latency for
        df.loc[[3, 20, 21], "oracle_latency_ms"] = np.nan
        df.loc[[9], "effective_latency_ms"] = np.nan
    return df


def offline_figures_as_before(g: pd.DataFrame) -> dict:
    both = g[np.isfinite(g["reference_latency_ms"]) & np.isfinite(g["effective_latency_ms"])
             & np.isfinite(g["oracle_latency_ms"])]
    eff = both["effective_latency_ms"].sum()
    return {"speedup": both["reference_latency_ms"].sum() / eff if eff > 0 else np.nan,
            "energy_ratio": g["energy_ratio"].mean(), "violation_rate_any": float(g["violates_any"].mean())}


def assert_same(got: dict, want: dict):
    assert got.keys() == want.keys()
    for k in want:
        assert got[k] == pytest.approx(want[k], rel=1e-9, nan_ok=True), k


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_live_intervals_equal_the_pandas_bootstrap(seed):
    per = per_request(seed, missing=False)  # live latencies are always measured
    got = family_bootstrap(per, _family_parts, LIVE_FIGURES, n_boot=300, seed=seed)
    want = pandas_family_bootstrap(per, pandas_live_figures, LIVE_FIGURES, n_boot=300, seed=seed)
    assert_same(got, want)
    assert got["speedup_low"] < got["speedup_high"]
    assert_same(family_weighted(per, _family_parts),
                pd.DataFrame([pandas_live_figures(g) for _, g in per.groupby("family")]).mean().to_dict())


@pytest.mark.parametrize("seed", [0, 1])
def test_offline_intervals_equal_the_pandas_bootstrap(seed):
    per = per_request(seed)
    got = family_bootstrap(per, _interval_parts, OFFLINE_FIGURES, n_boot=300, seed=seed)
    want = pandas_family_bootstrap(per, offline_figures_as_before, OFFLINE_FIGURES, n_boot=300, seed=seed)
    assert_same(got, want)
    # the family "e" energy was never measured: left out of the mean, as pandas does
    assert np.isfinite(got["energy_ratio_low"])
    # and the point estimate reads the same parts
    for fam, g in per.groupby("family"):
        a, want = _aggregate(g), offline_figures_as_before(g)
        for k in OFFLINE_FIGURES:
            assert a[k] == pytest.approx(want[k], rel=1e-12, nan_ok=True), (fam, k)


@pytest.mark.parametrize("chunk", [7, 200])  # one resample a block; blocks of 3, the last of 2
def test_resamples_in_blocks_give_the_same_interval(monkeypatch, chunk):
    per = per_request(3)
    whole = family_bootstrap(per, _family_parts, LIVE_FIGURES, n_boot=200, seed=3)
    monkeypatch.setattr(intervals, "_CHUNK", chunk)
    assert family_bootstrap(per, _family_parts, LIVE_FIGURES, n_boot=200, seed=3) == whole


def test_an_infinite_ratio_is_kept_as_pandas_kept_it():
    """An energy ratio over a reference that read 0 J is inf: pandas' mean and quantile
    skip NaN only, so the inf stays in the figure (not the request left out) and the
    interval is what pandas gave (numpy's interpolation between two infs: NaN)."""
    per = per_request(4, missing=False)
    per.loc[per["family"] == "c", "energy_ratio"] = np.inf
    got = family_bootstrap(per, _family_parts, LIVE_FIGURES, n_boot=100, seed=4)
    want = pandas_family_bootstrap(per, pandas_live_figures, LIVE_FIGURES, n_boot=100, seed=4)
    assert_same(got, want)
    assert family_weighted(per, _family_parts)["energy_ratio"] == np.inf
    assert np.isfinite(got["speedup_low"])


def test_a_figure_without_any_denominator_is_nan():
    per = per_request(0)
    per["energy_ratio"] = np.nan
    got = family_bootstrap(per, _family_parts, ["energy_ratio", "speedup"], n_boot=50)
    assert np.isnan(got["energy_ratio_low"]) and np.isnan(got["energy_ratio_high"])
    assert np.isfinite(got["speedup_low"])
    assert np.isnan(family_weighted(per, _family_parts)["energy_ratio"])


def test_the_exact_bound_of_a_rare_rate_matches_its_closed_forms():
    """Clopper-Pearson, one-sided, as the oracle's live target reads it
    (routers.risk_control): with no failure in n the 95 % bound is 1 - 0.05 ** (1 / n);
    with every trial failing it is 1; 59 clean trials are the fewest under 5 %."""
    from modeswitch.routers.risk_control import min_calibration, upper_bound

    for n in (1, 6, 21, 59):
        assert upper_bound(0, n, 0.05) == pytest.approx(1 - 0.05 ** (1 / n))
    assert upper_bound(6, 6, 0.05) == 1.0
    assert upper_bound(1, 6, 0.05) > upper_bound(0, 6, 0.05) > 1 / 6
    n = min_calibration(0.05, 0.05)
    assert n == 59 and upper_bound(0, n, 0.05) <= 0.05 < upper_bound(0, n - 1, 0.05)
    assert min_calibration(0.01, 0.05) == 299
    assert upper_bound(0, 0, 0.05) == 1.0  # nothing measured: nothing bounded

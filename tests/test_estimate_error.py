"""An estimated request's label is held to the estimator's cross-validated error
(oracle.estimate_error), and the cost model is fitted by the groups it models."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from modeswitch.oracle import Constraints, label_requests
from modeswitch.oracle.costmodel import enough_requests
from modeswitch.oracle.estimate_error import residuals, summary
from tests.helpers import profile, request_shapes, row

REF = "fp16_baseline"


def _measured(n=12, seed=0, parity_spread=0.12, family="short_prompt_short_output", **shape):
    """``n`` measured requests, two trials each: prefix caching (lossless) at parity with
    the reference up to +-``parity_spread`` per request (what its gain depends on is not
    in the shape), int8 (lossy, quality passing) at half its cost. Energy follows latency."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        p, o = float(rng.integers(64, 1024)), float(rng.integers(8, 128))
        base = 0.4 * p + 20 * o
        pc = 1 + rng.uniform(-parity_spread, parity_spread)
        kw = dict(prompt_tokens=p, expected_output_tokens=o, family=family, request_id=f"m{seed}-{i}",
                  **shape)
        for t in range(2):
            f = 1 + 0.01 * (t - 0.5)
            rows += [row(f"m{seed}-{i}", REF, base * f, energy=base * f / 1e3, trial=t, **kw),
                     row(f"m{seed}-{i}", "prefix_caching", base * pc * f, energy=base * pc * f / 1e3,
                         trial=t, **kw),
                     row(f"m{seed}-{i}", "int8_quant", 0.5 * base * f, energy=0.5 * base * f / 1e3,
                         trial=t, rouge_l_vs_baseline=0.95, **kw)]
    return profile(rows)


def _drawn(n=8, seed=5, family="short_prompt_short_output"):
    return request_shapes(n, seed, family, prompt=(100, 900), output=(16, 100), prefix="draw")


def _without_int8(prof: pd.DataFrame) -> pd.DataFrame:
    return prof[prof["mode"] != "int8_quant"].reset_index(drop=True)


def test_residuals_hold_out_each_measured_request_once():
    res = residuals(_measured())
    assert set(res["mode"]) == {"prefix_caching", "int8_quant"}
    assert res.groupby("mode")["unit"].nunique().eq(12).all()  # every request held out once
    assert (res["basis"] == "interpolation").all()
    # int8's ratio is exact (0.5 everywhere): nothing to miss; prefix caching's varies
    int8 = res[res["mode"] == "int8_quant"]
    assert np.abs(int8["r_speedup"]).max() < 1e-9 and np.abs(int8["r_energy"]).max() < 1e-9
    pc = res[res["mode"] == "prefix_caching"]
    assert np.abs(pc["r_energy"]).max() > 0.05
    table = summary(res, 0.95).set_index("mode")
    assert table.loc["prefix_caching", "energy_high_factor"] > 1.05
    assert table.loc["int8_quant", "energy_high_factor"] == pytest.approx(1.0)


def test_a_lossless_mode_near_parity_is_not_an_estimated_requests_label():
    prof = _without_int8(_measured())
    q = _drawn()
    labels, cand, _ = label_requests(prof, q)
    est = cand[cand["mode"] == "prefix_caching"].set_index("unit")
    assert (est["interval_basis"] == "estimate error").all()
    assert (est["energy_ratio_high"] > est["energy_ratio"]).all()
    # every estimate near parity: within the error of the energy limit, so not safe
    near = est["energy_ratio"].between(0.88, 1.0)
    assert near.any()
    assert (labels.loc[near[near].index, "label"] == REF).all()
    assert est.loc[near[near].index, "reason"].str.contains("within the estimate's error").all()
    assert labels["noise_rule"].str.startswith("estimate:").all()
    assert labels["confidence"].between(0, 1).all()
    # the plain rule (noise_aware off) takes the median: prefix caching where it is below 1
    plain, _, _ = label_requests(prof, q, constraints=Constraints(noise_aware=False))
    assert (plain.loc[near[near].index, "label"] == "prefix_caching").all()


def test_a_gain_beyond_the_estimates_error_stays_the_label():
    labels, cand, _ = label_requests(_measured(), _drawn())
    assert (labels["label"] == "int8_quant").all()
    assert (labels["confidence"] == 1.0).all()  # every residual leaves it faster
    assert labels.attrs["estimate_error"]  # per mode, the widening factors


def test_a_measured_request_keeps_its_trials_interval():
    prof = _measured()
    q = _drawn()
    measured = prof.drop_duplicates("request_id").rename(columns={"request_id": "id"})
    reqs = pd.concat([q, measured[q.columns]], ignore_index=True)
    _, cand, _ = label_requests(prof, reqs)
    own = cand[cand["unit"].str.startswith("m") & (cand["mode"] != REF)]
    assert (own["interval_basis"] == "trials").all()
    drawn = cand[cand["unit"].str.startswith("draw") & (cand["mode"] != REF)]
    assert (drawn["interval_basis"] == "estimate error").all()


def test_the_cost_model_is_fitted_by_condition_not_by_family():
    # three requests in each of two families, all under one condition (shared prefix):
    # six in the group the model fits, though no family has six
    prof = pd.concat([
        _measured(3, seed=1, family="long_prompt_short_output", shared_prefix_tokens=32.0),
        _measured(3, seed=2, family="short_prompt_short_output", shared_prefix_tokens=32.0)],
        ignore_index=True)
    assert enough_requests(prof, min_requests=6) is None
    why = enough_requests(_measured(5), min_requests=6)
    assert why == "at most 5 requests per (mode, condition); the model needs 6"

import math

import pandas as pd
import pytest

from modeswitch.oracle import Constraints, OracleError, label_requests
from tests.helpers import profile, row

REF = "fp16_baseline"


def grid_profile():
    """2x2 plain grid (128/1024 prompt x 32/128 output) plus one shared-prefix cell."""
    rows = []
    for p in (128, 1024):
        for o in (32, 128):
            unit = f"p{p}_o{o}"
            lat = 0.5 * p + 20 * o  # reference latency
            fam = "short_prompt_short_output"
            rows.append(row(unit, REF, lat, prompt_tokens=p, expected_output_tokens=o, family=fam))
            # int8: 0.6x; gptq: 0.5x but too much energy on long outputs
            rows.append(row(unit, "int8_quant", 0.6 * lat, prompt_tokens=p, expected_output_tokens=o, family=fam))
            rows.append(row(unit, "gptq_4bit", 0.5 * lat, energy=0.9 if o == 32 else 1.5,
                            prompt_tokens=p, expected_output_tokens=o, family=fam))
    for mode, lat in ((REF, 1000), ("prefix_caching", 300)):
        rows.append(row("chat", mode, lat, prompt_tokens=1088, expected_output_tokens=64,
                        shared_prefix_tokens=1024, family="shared_prefix_chat"))
    return profile(rows)


def reqs(*items):
    base = {"shared_prefix_tokens": 0, "concurrent_requests": 1, "memory_pressure": 0.0,
            "family": None, "workload": None, "benchmark_suite": None}
    return pd.DataFrame([{**base, **it} for it in items])


def test_request_on_a_cell_takes_that_cells_values_but_is_measured_only_as_its_own():
    """A request of a measured cell's lengths takes its numbers; it is ``measured`` only
    when it is the cell's own request (another one ran other text)."""
    labels, cand, _ = label_requests(grid_profile(), reqs(
        {"id": "a", "prompt_tokens": 128, "expected_output_tokens": 32}))
    assert labels.loc["a", "label_source"] == "estimated"
    assert "cell " in labels.loc["a", "estimate_basis"]
    own, _, _ = label_requests(grid_profile(), reqs(
        {"id": "p128_o32", "prompt_tokens": 128, "expected_output_tokens": 32, "family": "short_prompt_short_output"}))
    assert own.loc["p128_o32", "label_source"] == "measured"
    assert labels.loc["a", "label"] == "gptq_4bit"
    c = cand.set_index(["unit", "mode"])
    assert c.loc[("a", REF), "latency_ms"] == pytest.approx(0.5 * 128 + 20 * 32)


def test_inside_the_grid_is_interpolated_in_log_space():
    labels, cand, _ = label_requests(grid_profile(), reqs(
        {"id": "mid", "prompt_tokens": 362, "expected_output_tokens": 64}))
    assert labels.loc["mid", "label_source"] == "estimated"
    assert "interpolated" in labels.loc["mid", "estimate_basis"]
    c = cand.set_index(["unit", "mode"])
    lat = c.loc[("mid", REF), "latency_ms"]
    corners = [0.5 * p + 20 * o for p in (128, 1024) for o in (32, 128)]
    assert min(corners) < lat < max(corners)
    # ratios between modes survive interpolation in log space exactly
    assert c.loc[("mid", "int8_quant"), "latency_ms"] / lat == pytest.approx(0.6)
    # gptq's energy is interpolated between 0.9 and 1.5 -> rejected on energy here
    assert 0.9 < c.loc[("mid", "gptq_4bit"), "energy_per_token_j"] < 1.5
    assert labels.loc["mid", "label"] == "int8_quant"


def test_outside_the_range_uses_the_nearest_cell():
    labels, cand, _ = label_requests(grid_profile(), reqs(
        {"id": "big", "prompt_tokens": 4000, "expected_output_tokens": 300}))
    assert "nearest cell p1024_o128" in labels.loc["big", "estimate_basis"]
    c = cand.set_index(["unit", "mode"])
    assert c.loc[("big", REF), "latency_ms"] == pytest.approx(0.5 * 1024 + 20 * 128)


def test_condition_pools_and_fallback():
    labels, _, _ = label_requests(grid_profile(), reqs(
        {"id": "s", "prompt_tokens": 1200, "expected_output_tokens": 60, "shared_prefix_tokens": 1100},
        {"id": "m", "prompt_tokens": 2000, "expected_output_tokens": 128, "memory_pressure": 0.5},
        {"id": "g", "prompt_tokens": 200, "expected_output_tokens": 16, "benchmark_suite": "gsm8k"},
    ))
    assert labels.loc["s", "label"] == "prefix_caching"
    assert "shared_prefix cells" in labels.loc["s", "estimate_basis"]
    assert "no memory_pressure cells measured" in labels.loc["m", "estimate_basis"]
    assert "no gsm8k cells measured" in labels.loc["g", "estimate_basis"]
    assert set(labels["label_source"]) == {"estimated"}


def test_estimated_requests_still_refuse_missing_metrics():
    prof = grid_profile().copy()
    prof.loc[prof["mode"] == "int8_quant", "energy_per_token_j"] = math.nan
    with pytest.raises(OracleError, match="energy_per_token_j"):
        label_requests(prof, reqs({"id": "a", "prompt_tokens": 300, "expected_output_tokens": 50}))
    labels, _, _ = label_requests(prof, reqs({"id": "a", "prompt_tokens": 300, "expected_output_tokens": 50}),
                                  Constraints(on_incomplete="skip"))
    assert labels.loc["a", "label"] in {"fp16_baseline", "gptq_4bit"}

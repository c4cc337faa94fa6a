"""The self-consistency floor: lossless modes' divergence from the reference's own output
is measured and reported, lossy modes are left out (oracle/quality_floor.py)."""

import pytest

from modeswitch.oracle.quality_floor import self_consistency_floor
from tests.helpers import profile, row


def test_the_floor_counts_lossless_divergence_per_mode_and_family():
    rows = []
    for i, (cb, chunk, int8) in enumerate([(1.0, 1.0, 0.4), (0.6, 1.0, 0.9), (1.0, 0.8, 0.2), (0.9, 1.0, 1.0)]):
        u = f"u{i}"
        rows += [row(u, "fp16_baseline", 100, request_id=u),
                 row(u, "continuous_batching", 90, request_id=u, rouge_l_vs_baseline=cb),
                 row(u, "chunked_prefill", 95, request_id=u, rouge_l_vs_baseline=chunk),
                 row(u, "int8_quant", 50, request_id=u, rouge_l_vs_baseline=int8),
                 # a later trial's divergence is not the first clean trial's
                 row(u, "chunked_prefill", 95, trial=1, request_id=u, rouge_l_vs_baseline=0.1)]
    floor = self_consistency_floor(profile(rows)).set_index("mode")
    assert set(floor.index) == {"continuous_batching", "chunked_prefill"}  # int8 is lossy: not a floor
    cb = floor.loc["continuous_batching"]
    assert cb["requests"] == 4 and cb["diverged_share"] == pytest.approx(0.5)
    assert cb["rouge_l_mean"] == pytest.approx((1 + 0.6 + 1 + 0.9) / 4) and cb["rouge_l_min"] == pytest.approx(0.6)
    assert floor.loc["chunked_prefill", "diverged_share"] == pytest.approx(0.25)


def test_no_lossless_rows_give_an_empty_floor():
    rows = [row("u", "fp16_baseline", 100, request_id="u"), row("u", "int8_quant", 50, request_id="u")]
    assert self_consistency_floor(profile(rows)).empty

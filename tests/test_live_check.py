"""The live check of the table's latency: measured requests first, their error apart."""

import numpy as np
import pandas as pd
import pytest

from modeswitch.dataset.requests import Request
from modeswitch.routers.scoring.live import estimate_error_by_source, stratified


def test_the_stream_takes_the_measured_requests_of_each_family_first():
    reqs = [Request(id=f"{f}{i}", prompt_tokens=8, expected_output_tokens=2, family=f)
            for f in "ab" for i in range(5)]
    measured = {"a3", "b1", "b4"}
    stream = stratified(reqs, 4, seed=1, prefer=measured)
    assert {r.family for r in stream} == {"a", "b"}
    assert {r.id for r in stream} >= {"a3", "b1", "b4"}
    assert len(stratified(reqs, 4, seed=1)) == 4


def test_the_error_is_split_by_where_the_tables_latency_came_from():
    est = pd.DataFrame({"label_source": ["measured", "measured", "estimated", "estimated"],
                        "signed_pct_error": [10.0, -20.0, 50.0, np.nan]})
    est["abs_pct_error"] = est["signed_pct_error"].abs()
    got = estimate_error_by_source(est)
    assert got["estimate_mape_pct_measured"] == pytest.approx(15.0)
    assert got["estimate_median_signed_pct_measured"] == pytest.approx(-5.0)
    assert got["estimate_pairs_measured"] == 2
    assert got["estimate_mape_pct_estimated"] == pytest.approx(50.0)
    assert got["estimate_pairs_estimated"] == 1

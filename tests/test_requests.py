import json

import pytest

from modeswitch.dataset.errors import InputFileError
from modeswitch.dataset.features import (
    FEATURE_SET_A,
    FEATURE_SET_B,
    features_frame,
    request_features,
)
from modeswitch.dataset.requests import Request, read_requests, serving_request
from modeswitch.dataset.workloads import get_workload, list_workloads


def write_jsonl(path, rows):
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_read_requests_validates_and_keeps_optional_fields_missing(tmp_path):
    p = write_jsonl(tmp_path / "r.jsonl", [
        {"id": "a", "prompt_tokens": 100, "expected_output_tokens": 32},
        {"id": "b", "prompt_tokens": 900, "expected_output_tokens": 8, "shared_prefix_tokens": 800,
         "benchmark_suite": "gsm8k", "prompt": "2+2?"},
    ])
    reqs = read_requests(p)
    assert reqs[0].family is None and reqs[0].concurrent_requests == 1
    assert reqs[1].shared_prefix_tokens == 800 and reqs[1].prompt == "2+2?"


@pytest.mark.parametrize("bad,field", [
    ({"prompt_tokens": -1}, "prompt_tokens"),
    ({"expected_output_tokens": 0}, "expected_output_tokens"),
    ({"memory_pressure": 1.5}, "memory_pressure"),
    ({"concurrent_requests": "many"}, "concurrent_requests"),
    ({"shared_prefix_tokens": 500}, "shared_prefix_tokens"),
])
def test_bad_request_names_file_row_and_field(tmp_path, bad, field):
    good = {"id": "a", "prompt_tokens": 100, "expected_output_tokens": 32}
    p = write_jsonl(tmp_path / "r.jsonl", [good, {**good, "id": "b", **bad}])
    with pytest.raises(InputFileError) as exc:
        read_requests(p)
    assert (exc.value.row, exc.value.field) == (1, field)
    assert str(p) in str(exc.value)


def test_missing_required_field_and_duplicate_ids(tmp_path):
    p = write_jsonl(tmp_path / "r.jsonl", [{"id": "a", "prompt_tokens": 5}])
    with pytest.raises(InputFileError) as exc:
        read_requests(p)
    assert exc.value.field == "expected_output_tokens"
    p = write_jsonl(tmp_path / "d.jsonl", [{"id": "a", "prompt_tokens": 5, "expected_output_tokens": 1}] * 2)
    with pytest.raises(InputFileError, match="duplicate"):
        read_requests(p)


def test_features_are_pure_and_ordered():
    r = Request(id="x", prompt_tokens=128, expected_output_tokens=32, memory_pressure=0.25,
                family="short_prompt_short_output")
    a = request_features(r, "A")
    assert len(a) == len(FEATURE_SET_A)
    assert a[0] == 128 and a[1] == 32 and a[2] == pytest.approx(0.25) and a[-1] == 0.25
    assert request_features(r, "A") == a
    b = request_features(r, "B")
    assert b[: len(a)] == a and b[-2:] == ("short_prompt_short_output", "none")
    df = features_frame([r], "B")
    assert list(df.columns[: len(FEATURE_SET_B)]) == list(FEATURE_SET_B)
    with pytest.raises(ValueError):
        request_features(r, "C")


def test_workloads_vary_inside_a_family_and_are_seeded():
    spec = get_workload("long_prompt_short_output")
    reqs = spec.sample(50, seed=3)
    assert len({r.prompt_tokens for r in reqs}) > 10
    assert len({r.expected_output_tokens for r in reqs}) > 5
    assert [r.prompt_tokens for r in spec.sample(50, seed=3)] == [r.prompt_tokens for r in reqs]
    shared = get_workload("shared_prefix_chat").sample(20, seed=1)
    assert all(r.prompt_tokens > r.shared_prefix_tokens == 1024 for r in shared)
    assert {w.name for w in list_workloads()} >= {
        "short_prompt_short_output", "short_prompt_long_output", "long_prompt_short_output",
        "long_prompt_long_output", "shared_prefix_chat", "memory_pressure_long_context",
        "batch_pressure"}


def test_a_stratified_draw_spans_the_spread_routers_see():
    """Profiles measure a stratified draw: ten requests cover the central 95 % of what
    thousands of random draws of the family give, in prompt and in output length."""
    import numpy as np

    from modeswitch.dataset.workloads import get_workload

    w = get_workload("long_prompt_long_output")
    prof = w.sample(10, seed=0, stratified=True)
    seen = w.sample(4000, seed=1)
    for attr in ("prompt_tokens", "expected_output_tokens"):
        p = [getattr(r, attr) for r in prof]
        lo, hi = np.percentile([getattr(r, attr) for r in seen], [2.5, 97.5])
        assert min(p) <= lo * 1.02 and max(p) >= hi * 0.98
        assert len(set(p)) == 10  # evenly spread, no two alike
    # a random draw of ten does not promise that; the stratified one is reproducible
    assert [r.prompt_tokens for r in w.sample(10, seed=0, stratified=True)] == [r.prompt_tokens for r in prof]


def test_the_serving_constructor_builds_the_same_frozen_request():
    """The server's cheap constructor: equal to ``Request(...)`` field for field (the
    defaults it leaves out included), hashable alike, frozen, and it survives pickling
    and ``asdict`` (the features and the engines read it like any other request)."""
    import dataclasses
    import pickle

    fast = serving_request("cmpl-1", 30, 32, 16, 4, 0.25)
    slow = Request(id="cmpl-1", prompt_tokens=30, expected_output_tokens=32, shared_prefix_tokens=16,
                   concurrent_requests=4, memory_pressure=0.25)
    assert fast == slow and hash(fast) == hash(slow) and repr(fast) == repr(slow)
    assert fast.to_dict() == slow.to_dict() and fast.family is None and fast.prompt_token_ids is None
    assert pickle.loads(pickle.dumps(fast)) == slow
    assert request_features(fast, "B") == request_features(slow, "B")
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.prompt_tokens = 31
    assert dataclasses.replace(fast, family="chat") == dataclasses.replace(slow, family="chat")

"""Per-request conditions drawn across families (dataset.workloads.conditions)."""

import collections
import dataclasses

import pytest

from modeswitch.dataset.requests import Request
from modeswitch.dataset.workloads import get_workload
from modeswitch.dataset.workloads.conditions import (
    ConditionDraw,
    arrival_group,
    draw_units,
    primer,
    scaled,
)
from modeswitch.dataset.workloads.spec import condition_of


def test_a_family_keeps_its_defining_condition_and_draws_the_others():
    draw = ConditionDraw()
    batch = draw_units(get_workload("batch_pressure"), 60, draw, seed=1)
    assert all(u.request.concurrent_requests > 1 for u in batch)
    assert all(len(u.group) == u.request.concurrent_requests for u in batch)
    plain = draw_units(get_workload("short_prompt_short_output"), 200, draw, seed=2)
    conc = collections.Counter(u.request.concurrent_requests for u in plain)
    assert set(conc) == {1, 2, 4, 8, 16}  # every level is drawn in a plain family
    assert conc[1] > conc[16]  # and with the weights' order
    with_prefix = [u for u in plain if u.request.shared_prefix_tokens]
    assert 0.15 < len(with_prefix) / len(plain) < 0.45  # shared_prefix_rate 0.3
    for u in with_prefix:  # 25-75 % of the prompt, and every companion shares it
        r = u.request
        assert 0.2 <= r.shared_prefix_tokens / r.prompt_tokens <= 0.8
        assert all(c.shared_prefix_tokens == r.shared_prefix_tokens < c.prompt_tokens for c in u.companions)
    assert {u.request.memory_pressure for u in plain} == {0.0, 0.25, 0.5}
    mem = draw_units(get_workload("memory_pressure_long_context"), 30, draw, seed=3)
    assert all(u.request.memory_pressure > 0 for u in mem)
    chat = draw_units(get_workload("shared_prefix_chat"), 20, draw, seed=4)
    assert all(u.request.shared_prefix_tokens == 1024 for u in chat)


def test_conditions_vary_inside_a_family_so_its_condition_is_no_longer_its_name():
    units = draw_units(get_workload("long_prompt_short_output"), 100, ConditionDraw(), seed=0)
    conds = {condition_of(u.request.shared_prefix_tokens, u.request.memory_pressure,
                          u.request.concurrent_requests) for u in units}
    assert conds == {"plain", "shared_prefix", "memory_pressure", "batch_pressure"}


def test_draws_are_reproducible_and_ids_unique():
    a = draw_units(get_workload("batch_pressure"), 10, ConditionDraw(), seed=5)
    b = draw_units(get_workload("batch_pressure"), 10, ConditionDraw(), seed=5)
    assert [u.request for u in a] == [u.request for u in b]
    ids = [r.id for u in a for r in u.group]
    assert len(ids) == len(set(ids))


def test_scaled_shrinks_every_length():
    w = scaled(get_workload("shared_prefix_chat"), 0.25)
    assert (w.prompt_tokens, w.expected_output_tokens, w.shared_prefix_tokens) == (272, 16, 256)
    assert scaled(w, 1) is w
    with pytest.raises(ValueError, match="length scale"):
        scaled(w, 0)


@pytest.mark.parametrize("bad, msg", [
    ({"concurrency": [1, 2], "concurrency_weights": [1.0]}, "1 weights for 2"),
    ({"concurrency": [0, 2], "concurrency_weights": [1, 1]}, ">= 1"),
    ({"shared_prefix_fraction": [0.5, 1.2]}, "0 < low <= high < 1"),
    ({"memory_pressure": [1.5]}, r"\[0, 1\)"),
    ({"concurency": [1]}, "unknown key"),
])
def test_a_bad_draw_says_which_key(bad, msg):
    with pytest.raises(ValueError, match=msg):
        ConditionDraw.from_dict(bad)


def test_profile_units_under_drawn_conditions_are_groups_with_primers():
    from modeswitch.engine.profiler import ProfileSpec, build_units

    spec = ProfileSpec(model="m", workloads=["short_prompt_long_output", "batch_pressure"], requests=12,
                       conditions=ConditionDraw().to_dict(), length_scale=0.5)
    units = build_units(spec)
    assert len(units) == 24
    for u in units:
        assert len(u.requests) == u.requests[0].concurrent_requests
        if u.requests[0].shared_prefix_tokens:
            p = u.prime[0]
            assert p.shared_prefix_tokens == u.requests[0].shared_prefix_tokens and p.family == u.family
        else:
            assert not u.prime
        # the recipes live scoring replays from the row's lead request
        assert u.requests == arrival_group(u.requests[0])
        assert u.prime == ([primer(u.requests[0])] if u.requests[0].shared_prefix_tokens else [])
    import statistics

    assert 48 < statistics.median(r.prompt_tokens for u in units for r in u.requests) < 80  # 128 x 0.5
    # settings added later leave older journals' identity alone
    assert ProfileSpec(model="m").identity() == ProfileSpec(model="m", length_scale=1.0).identity()
    assert spec.identity() != ProfileSpec(model="m", workloads=spec.workloads, requests=12).identity()


def test_an_arrival_group_and_primer_follow_from_the_lead_request_alone():
    """Live scoring rebuilds a profiled group from the table's row (the lead request):
    companions take its shape and their own ids (own text); the primer its prefix."""
    lead = Request(id="f-0-00001", prompt_tokens=90, expected_output_tokens=12, family="f",
                   concurrent_requests=3, shared_prefix_tokens=40, memory_pressure=0.25)
    group = arrival_group(lead)
    assert group[0] is lead and [r.id for r in group[1:]] == ["f-0-00001~1", "f-0-00001~2"]
    assert {(r.prompt_tokens, r.expected_output_tokens, r.shared_prefix_tokens, r.memory_pressure,
             r.concurrent_requests) for r in group} == {(90, 12, 40, 0.25, 3)}
    p = primer(lead)
    assert (p.id, p.prompt_tokens, p.expected_output_tokens, p.shared_prefix_tokens, p.concurrent_requests) \
        == ("f-0-00001-prime", 48, 1, 40, 1)
    alone = dataclasses.replace(lead, concurrent_requests=1, shared_prefix_tokens=0)
    assert arrival_group(alone) == [alone] and primer(alone) is None

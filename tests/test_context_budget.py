"""Engines of a profile or a live check are sized for the requests they measure."""

from modeswitch.dataset.requests import Request
from modeswitch.engine.backends.base import EngineSettings, context_for


def test_the_budget_covers_the_longest_request_with_room_in_whole_pages():
    reqs = [Request(id="a", prompt_tokens=100, expected_output_tokens=8),
            Request(id="b", prompt_tokens=512, expected_output_tokens=32)]
    got = context_for(reqs)
    assert got % 256 == 0 and got >= (512 + 32) * 1.5
    assert context_for([]) == 256


def test_a_continuous_batching_cache_is_sized_by_the_budget(tiny_models):
    from modeswitch.engine.backends.registry import get_backend

    be = get_backend("transformers")
    sizes = {}
    for ctx in (None, 512):
        s = EngineSettings(str(tiny_models.target), device="cpu", threads=1, max_context=ctx)
        eng = be.engine("continuous_batching", s).load()
        try:
            sizes[ctx] = eng.cache_mb
            out = eng.run([(Request(id="r", prompt_tokens=16, expected_output_tokens=4), list(range(5, 21)))])
            assert out[0].output_tokens == 4
        finally:
            eng.close()
    assert sizes[512] < sizes[None] / 2  # the tiny model caps contexts at 2,048 tokens

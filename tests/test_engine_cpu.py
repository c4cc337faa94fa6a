"""The transformers backend really runs each mode (tiny trained model, CPU)."""

import pytest
import torch

from modeswitch.dataset.requests import Request
from modeswitch.dataset.workloads import get_workload
from modeswitch.engine.backends.transformers_backend import TransformersEngine, capabilities
from modeswitch.engine.modes import list_modes
from modeswitch.engine.prompts import PromptBuilder


class ForwardSpy:
    """Wraps model.forward to record how many tokens each call processed."""

    def __init__(self, model):
        self.calls = []
        self.cache_types = set()
        self._orig = model.forward

        def fwd(*args, **kwargs):
            ids = kwargs.get("input_ids", args[0] if args else None)
            if ids is not None:
                self.calls.append(ids.shape[-1])
            pkv = kwargs.get("cache", kwargs.get("past_key_values"))
            if pkv is not None:
                self.cache_types.add(type(pkv).__name__)
            return self._orig(*args, **kwargs)

        model.forward = fwd


@pytest.fixture(scope="module")
def reqs(tiny_models):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_models.target)
    b = PromptBuilder(tok)
    rs = [Request(id="a", prompt_tokens=300, expected_output_tokens=24),
          Request(id="b", prompt_tokens=90, expected_output_tokens=16)]
    rs += get_workload("shared_prefix_chat").sample(2, seed=3)
    return [b.prepare(r) for r in rs]


def engine(tiny_models, mode):
    return TransformersEngine(mode, tiny_models.target, tiny_models.draft).load()


@pytest.fixture(scope="module")
def reference_outputs(tiny_models, reqs):
    e = engine(tiny_models, "fp16_baseline")
    out = [e.run([rq])[0] for rq in reqs]
    e.close()
    return out


def test_the_model_was_trained(tiny_models):
    card = tiny_models.card
    assert card["target"]["final_train_loss"] < 5.5  # uniform over 512 tokens would be 6.24
    assert card["target_median_top1_top2_logit_gap"] > 0.2
    assert 0 < card["draft_acceptance_rate"] <= 1


CPU_MODES = {
    "fp16_baseline", "int8_quant", "gptq_4bit", "speculative_decoding", "ngram_speculative_decoding",
    "kv_cache_compression", "prefix_caching", "chunked_prefill", "continuous_batching",
    "gptq_plus_prefix_caching", "int8_plus_prefix_caching", "int8_plus_continuous_batching",
    "gptq_plus_chunked_prefill", "int8_plus_chunked_prefill", "quantized_draft_speculative", "int8_weight_only",
}


def test_capabilities_cover_the_registry_and_explain_gaps():
    caps = capabilities("cpu")
    assert set(caps.supported_modes()) == CPU_MODES
    # every other registered mode is declared unsupported, each with its own reason
    assert set(caps.unsupported()) == {m.name for m in list_modes()} - CPU_MODES
    assert len(set(caps.unsupported().values())) == len(caps.unsupported())
    assert "gptq_4bit" in caps.support("awq_4bit").reason  # says what routers use instead
    # weight quantization on CUDA needs pre-quantized checkpoints: not offered there
    cuda = capabilities("cuda")
    assert not cuda.support("int8_quant").supported and "vLLM" in cuda.support("int8_quant").reason
    assert set(cuda.supported_modes()) < CPU_MODES


def test_unsupported_mode_refuses_to_load(tiny_models):
    with pytest.raises(NotImplementedError, match="awq_4bit"):
        TransformersEngine("awq_4bit", tiny_models.target).load()


@pytest.mark.parametrize("mode", ["prefix_caching", "chunked_prefill", "ngram_speculative_decoding",
                                  "speculative_decoding"])
def test_lossless_modes_reproduce_the_reference(tiny_models, reqs, reference_outputs, mode):
    e = engine(tiny_models, mode)
    got = [e.run([rq])[0] for rq in reqs]
    e.close()
    for g, ref in zip(got, reference_outputs):
        assert g.output_ids == ref.output_ids, (mode, g.request_id)
        assert g.output_tokens == ref.output_tokens


def test_continuous_batching_serves_a_group_with_reference_outputs(tiny_models, reqs, reference_outputs):
    e = engine(tiny_models, "continuous_batching")
    got = e.run(reqs)
    e.close()
    assert [g.request_id for g in got] == [r.id for r, _ in reqs]
    for g, ref in zip(got, reference_outputs):
        assert g.output_ids == ref.output_ids
        assert len(g.token_times_ms) == g.output_tokens and g.ttft_ms > 0


def test_continuous_batching_shares_its_batch_across_concurrent_calls(tiny_models, reqs, reference_outputs):
    """Concurrent ``run`` calls (as concurrent HTTP requests make them) join one running
    batch, each gets its own request's output, and a streaming call gets its tokens in
    pieces as the batch steps."""
    from concurrent.futures import ThreadPoolExecutor

    e = engine(tiny_models, "continuous_batching")
    assert e.concurrent_runs
    with ThreadPoolExecutor(len(reqs)) as pool:
        got = list(pool.map(lambda rq: e.run([rq])[0], reqs))
    pieces = []
    streamed = e.run([reqs[0]], on_token=lambda rid, ids: pieces.append((rid, list(ids))))[0]
    e.close()
    for g, ref in zip(got, reference_outputs):
        assert g.output_ids == ref.output_ids
    assert e.info["max_requests_in_batch"] >= 2
    assert [t for _, ids in pieces for t in ids] == streamed.output_ids == reference_outputs[0].output_ids
    assert len(pieces) >= 2 and {rid for rid, _ in pieces} == {reqs[0][0].id}
    assert not TransformersEngine("fp16_baseline", tiny_models.target).concurrent_runs


def test_the_paged_cache_is_checked_against_the_machines_free_memory_not_a_small_numa_node(
        tiny_models, reqs, reference_outputs, monkeypatch):
    """A sandbox that reports one NUMA node smaller than the process already holds (here
    faked: 1 MB, so transformers' own reading leaves nothing) still gets its cache: the
    footprint is checked against what the kernel says is free."""
    import psutil
    from transformers.generation.continuous_batching import cache

    from modeswitch.engine.backends import transformers_backend

    rss = psutil.Process().memory_info().rss
    monkeypatch.setattr(cache, "get_device_and_memory_breakdown",
                        lambda: (torch.device("cpu"), 2**20, rss, rss))
    transformers_backend.machine_memory_for_paged_cache()
    _, total, reserved, _ = cache.get_device_and_memory_breakdown()
    assert total - reserved >= 0.5 * psutil.virtual_memory().available
    e = engine(tiny_models, "continuous_batching")
    got = e.run(reqs[:1])
    e.close()
    assert got[0].output_ids == reference_outputs[0].output_ids


def test_int8_replaces_linear_layers_and_changes_numerics(tiny_models, reqs):
    from torch.ao.nn.quantized.dynamic import Linear as DynLinear

    e = engine(tiny_models, "int8_quant")
    n_layers = e.model.config.num_hidden_layers
    assert e.info["int8_linears"] == 7 * n_layers
    assert sum(isinstance(m, DynLinear) for m in e.model.modules()) == 7 * n_layers
    ref = TransformersEngine("fp16_baseline", tiny_models.target).load()
    ids = torch.tensor([reqs[0][1]])
    with torch.inference_mode():
        a, b = ref.model(ids).logits, e.model(ids).logits
    assert not torch.equal(a, b)
    # same model underneath: the top token agrees almost everywhere
    assert (a.argmax(-1) == b.argmax(-1)).float().mean() > 0.8
    assert e.weights_bytes() < ref.weights_bytes()
    # the packed int8 weights are counted: about a quarter of the fp32 linear weights
    n_lin = sum(p.numel() for n, p in ref.model.named_parameters() if "layers" in n and p.dim() == 2)
    assert ref.weights_bytes() - e.weights_bytes() == pytest.approx(3 * n_lin, rel=0.02)


def test_int4_packs_weights_and_stays_close(tiny_models, reqs):
    from modeswitch.engine.backends.quantize import Int4WeightOnlyLinear

    e = engine(tiny_models, "gptq_4bit")
    ref = TransformersEngine("fp16_baseline", tiny_models.target).load()
    assert sum(isinstance(m, Int4WeightOnlyLinear) for m in e.model.modules()) == e.info["int4_linears"] > 0
    ids = torch.tensor([reqs[0][1]])
    with torch.inference_mode():
        a, b = ref.model(ids).logits, e.model(ids).logits
    assert (a.argmax(-1) == b.argmax(-1)).float().mean() > 0.6
    assert e.weights_bytes() < ref.weights_bytes()


def test_prefix_caching_skips_the_prefix_on_the_second_request(tiny_models, reqs):
    e = engine(tiny_models, "prefix_caching")
    spy = ForwardSpy(e.model)
    first, second = reqs[2], reqs[3]
    p = first[0].shared_prefix_tokens
    assert first[1][:p] == second[1][:p] and p == 1024
    e.run([first])
    spy.calls.clear()
    e.run([second])
    # the second request's prefill covers only its own suffix
    assert spy.calls[0] == len(second[1]) - p
    assert e.info["prefix_hits"] == 1 and e.info["prefix_tokens_reused"] == p


def test_a_short_cached_prefix_is_extended_to_the_requests_own_and_kept(tiny_models, reqs):
    """A request with a short shared prefix (a few opening tokens) cached first must not
    stand in for a longer one that shares its opening: the longer prefix is computed on
    top of it and kept, so the next request with it skips the whole prefix (the study's
    profile ran every shared-prefix unit after such a short entry and never hit)."""
    import dataclasses

    e = engine(tiny_models, "prefix_caching")
    first, second = reqs[2], reqs[3]
    p = first[0].shared_prefix_tokens
    short = (dataclasses.replace(first[0], id="short", shared_prefix_tokens=4), first[1][:4] + [7, 8, 9])
    e.run([short])
    e.run([first])  # hits the 4-token entry; extends it to p and keeps that
    spy = ForwardSpy(e.model)
    e.run([second])
    assert spy.calls[0] == len(second[1]) - p
    assert e.info["prefix_hits"] == 2 and e.info["prefix_tokens_reused"] == 4 + p


def test_a_unit_starts_from_an_empty_prefix_cache_warmed_by_its_primer(tiny_models, reqs):
    """start_unit: what an earlier request left in the cache is gone, the unit's own
    primer is there, so a unit's latency does not depend on what ran before it."""
    from modeswitch.engine.backends.base import start_unit

    e = engine(tiny_models, "prefix_caching")
    first, second = reqs[2], reqs[3]
    p = first[0].shared_prefix_tokens
    e.run([first])
    start_unit(e, [], ignore_eos=True)  # no primer: the earlier prefix is forgotten
    spy = ForwardSpy(e.model)
    e.run([second])
    assert spy.calls[0] > len(second[1]) - p  # the prefix was computed again
    start_unit(e, [first], ignore_eos=True)  # the primer's prefix is warm
    spy.calls.clear()
    e.run([second])
    assert spy.calls[0] == len(second[1]) - p
    start_unit(engine(tiny_models, "fp16_baseline"), [], ignore_eos=True)  # no cache: nothing to do


def test_speculative_decoding_accepts_draft_tokens(tiny_models, reqs, reference_outputs):
    from modeswitch.engine.modes import get_mode

    # the target as its own draft agrees with itself: every proposal is accepted, so the
    # target runs about once per k+1 tokens instead of once per token
    mode = get_mode("speculative_decoding").with_overrides(
        {"speculative.draft_model": str(tiny_models.target)})
    e = TransformersEngine(mode, tiny_models.target).load()
    spy = ForwardSpy(e.model)
    g = e.run([reqs[0]])[0]
    k = mode.speculative.num_speculative_tokens
    assert len(spy.calls) <= -(-g.output_tokens // (k + 1)) + 1
    assert max(spy.calls[1:]) == k + 1  # each verification step checks k draft tokens + 1
    assert g.output_ids == reference_outputs[0].output_ids


def test_kv_cache_compression_uses_a_quantized_cache(tiny_models, reqs):
    e = engine(tiny_models, "kv_cache_compression")
    spy = ForwardSpy(e.model)
    e.run([reqs[1]])
    assert spy.cache_types == {"QuantizedCache"}


def test_chunked_prefill_never_prefills_more_than_a_chunk(tiny_models, reqs):
    e = engine(tiny_models, "chunked_prefill")
    e.mode = e.mode.with_overrides({"max_num_batched_tokens": 64})
    spy = ForwardSpy(e.model)
    e.run([reqs[0]])
    assert max(spy.calls) <= 64
    assert e.info["prefill_chunks"] == -(-(len(reqs[0][1]) - 1) // 64)


def test_quantized_self_speculation_drafts_with_an_int8_copy_and_keeps_the_reference_output(
        tiny_models, reqs, reference_outputs):
    from modeswitch.engine.backends.quantize import Int8WeightOnlyLinear

    e = engine(tiny_models, "quantized_draft_speculative")
    try:
        assert any(isinstance(m, Int8WeightOnlyLinear) for m in e.draft.modules())
        assert not any(isinstance(m, Int8WeightOnlyLinear) for m in e.model.modules())
        assert e.draft.model.embed_tokens.weight.data_ptr() != e.model.model.embed_tokens.weight.data_ptr()
        for rq, ref in zip(reqs, reference_outputs):
            assert e.run([rq])[0].output_ids == ref.output_ids
    finally:
        e.close()


def test_weight_only_int8_replaces_the_linears_with_int8_weights(tiny_models, reqs):
    from modeswitch.engine.backends.quantize import Int8WeightOnlyLinear

    e = engine(tiny_models, "int8_weight_only")
    try:
        lins = [m for m in e.model.modules() if isinstance(m, Int8WeightOnlyLinear)]
        assert lins and all(m.weight_int8.dtype == torch.int8 for m in lins)
        gen = e.run([reqs[0]])[0]
        assert gen.output_tokens == reqs[0][0].expected_output_tokens
    finally:
        e.close()

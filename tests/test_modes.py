import dataclasses

import pytest
from pydantic import ValidationError

from modeswitch.engine.backends import BackendCapabilities, ModeSupport
from modeswitch.engine.modes import (
    UnknownModeError,
    get_mode,
    list_modes,
    mode_names,
    reference_mode,
    resolve_mode,
)

STUDY = ["fp16_baseline", "int8_quant", "gptq_4bit", "awq_4bit", "speculative_decoding",
         "kv_cache_compression", "prefix_caching", "chunked_prefill", "continuous_batching",
         "cuda_graphs", "gptq_plus_prefix_caching", "int8_plus_continuous_batching",
         "awq_plus_chunked_prefill"]


def test_study_modes_are_registered_with_one_reference():
    assert set(STUDY) <= set(mode_names())
    assert reference_mode().name == "fp16_baseline"
    assert len({m.name for m in list_modes()}) == len(list_modes())


def test_modes_are_frozen_and_typed():
    m = get_mode("gptq_plus_prefix_caching")
    assert m.quantization == "gptq_4bit" and m.prefix_caching and m.is_hybrid
    assert get_mode("speculative_decoding").speculative.method == "draft_model"
    assert get_mode("kv_cache_compression").kv_cache_dtype == "fp8"
    assert get_mode("fp16_baseline").lossless and not get_mode("int8_quant").lossless
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.prefix_caching = False


def test_overrides_are_parsed_by_field_type():
    m = get_mode("speculative_decoding").with_overrides(
        ["speculative.num_speculative_tokens=3", "prefix_caching=true", "max_num_seqs=8"])
    assert m.speculative.num_speculative_tokens == 3 and m.prefix_caching is True
    assert m.max_num_seqs == 8
    with pytest.raises(ValidationError, match="kv_cache_dtype"):
        get_mode("fp16_baseline").with_overrides({"kv_cache_dtype": "fp3"})
    with pytest.raises(ValueError, match="no setting"):
        get_mode("fp16_baseline").with_overrides(["warp_speed=1"])
    assert get_mode("fp16_baseline").from_dict(get_mode("fp16_baseline").to_dict()) == get_mode("fp16_baseline")


def test_unknown_mode_is_a_clear_error():
    with pytest.raises(UnknownModeError, match="unknown mode 'turbo'"):
        get_mode("turbo")


def test_substitutes_are_registered_modes():
    names = set(mode_names())
    for m in list_modes():
        assert set(m.substitutes) <= names, m.name
        assert "fp16_baseline" not in m.substitutes


def test_resolve_walks_substitutes_and_never_falls_back_silently():
    assert resolve_mode("gptq_plus_prefix_caching", ["fp16_baseline", "gptq_4bit"]) == "gptq_4bit"
    assert resolve_mode("int8_plus_continuous_batching", ["continuous_batching"]) == "continuous_batching"
    with pytest.raises(LookupError, match="cuda_graphs"):
        resolve_mode("cuda_graphs", ["fp16_baseline"])


def test_backend_capabilities_need_how_or_why():
    caps = BackendCapabilities(
        "toy", "fp16_baseline", "float32",
        {"fp16_baseline": ModeSupport("fp16_baseline", True, how="fp32 weights"),
         "cuda_graphs": ModeSupport("cuda_graphs", False, reason="no GPU")},
    )
    assert caps.supported_modes() == ["fp16_baseline"]
    assert caps.unsupported()["cuda_graphs"] == "no GPU"
    assert "does not implement" in caps.unsupported()["int8_quant"]
    with pytest.raises(ValueError):
        ModeSupport("int8_quant", False)
    with pytest.raises(ValueError):
        BackendCapabilities("toy", "fp16_baseline", "float32", {})

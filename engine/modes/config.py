"""The typed settings of an inference mode: one frozen dataclass, as vLLM's EngineArgs.

Python code, the CLI and mode files all go through :class:`ModeConfig`, so a mode's
settings have a single source. ``ModeConfig.from_dict`` validates untyped input
(TOML, CLI ``key=value`` overrides) with pydantic, so "true", "3" and "fp8" arrive
as the field's type or fail with the field named.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Annotated, Literal

from pydantic import Field, TypeAdapter

from modeswitch.dataset.errors import InputError

Quantization = Literal["none", "int8", "int8_weight_only", "gptq_4bit", "awq_4bit"]
KVCacheDtype = Literal["auto", "fp8", "int8", "int4"]
Batching = Literal["none", "continuous"]
Phase = Literal["prefill", "decode", "both", "memory", "throughput"]
#: the keys of a run's weights per format (``EngineSettings.checkpoints``): the quantized
#: modes' weights (a vLLM pre-quantized checkpoint, a llama.cpp GGUF type or file) and, on
#: llama.cpp, the reference's (F16 instead of F32, say)
CHECKPOINT_KEYS = ("int8", "gptq_4bit", "awq_4bit", "reference")


@dataclass(frozen=True)
class SpeculativeConfig:
    """Speculative decoding: a draft model, n-gram (prompt-lookup) proposals, or a
    quantised copy of the model itself (``quantized_self``, QSpec arXiv 2410.11305).

    ``num_speculative_tokens`` is k, the tokens proposed per verification step;
    ``draft_model`` is a model id or local path (None: the backend's default draft,
    the project's own small draft model on the transformers backend);
    ``draft_quantization`` is how ``quantized_self`` stores its copy's weights. Every
    method is lossless under greedy decoding: the model verifies each drafted token.
    """

    method: Literal["draft_model", "ngram", "quantized_self"]
    num_speculative_tokens: Annotated[int, Field(ge=1, le=64)] = 5
    draft_model: str | None = None
    prompt_lookup_max: Annotated[int, Field(ge=1)] = 4
    prompt_lookup_min: Annotated[int, Field(ge=1)] = 1
    draft_quantization: Literal["int8", "int8_weight_only", "gptq_4bit"] = "int8_weight_only"


@dataclass(frozen=True)
class ModeConfig:
    """Everything that defines one serving mode of one model.

    ``graph_capture`` None means "the backend's common setting": the reference and
    every mode that is not about graphs run with the same setting, so a mode's
    measured effect is its own (the study compared an eager-mode FP16 baseline
    with graph-captured modes). ``substitutes`` lists, nearest first, the modes a
    backend that lacks this one should run instead; the chain never ends at the
    reference implicitly. ``max_num_batched_tokens`` is the prefill chunk size of
    chunked-prefill modes (vLLM's name for it).
    """

    name: str
    description: str
    quantization: Quantization = "none"
    speculative: SpeculativeConfig | None = None
    prefix_caching: bool = False
    chunked_prefill: bool = False
    batching: Batching = "none"
    max_num_seqs: Annotated[int, Field(ge=1)] | None = None
    max_num_batched_tokens: Annotated[int, Field(ge=16)] | None = None
    graph_capture: bool | None = None
    kv_cache_dtype: KVCacheDtype = "auto"
    primary_phase: Phase = "both"
    is_reference: bool = False
    substitutes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def is_hybrid(self) -> bool:
        """True when the mode combines two or more optimisations."""
        parts = [
            self.quantization != "none",
            self.speculative is not None,
            self.prefix_caching,
            self.chunked_prefill,
            self.batching != "none",
            self.kv_cache_dtype != "auto",
            bool(self.graph_capture),
        ]
        return sum(parts) >= 2

    @property
    def lossless(self) -> bool:
        """True when the mode should give the reference's greedy output exactly."""
        return self.quantization == "none" and self.kv_cache_dtype == "auto"

    def missing_draft(self, draft_path) -> str | None:
        """Why this mode cannot run without a draft model (``None`` when it can): the one
        check the profiler, the server and every backend's capabilities use."""
        s = self.speculative
        if s is not None and s.method == "draft_model" and not s.draft_model and not draft_path:
            return "no draft model given (--draft-model PATH)"
        return None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> ModeConfig:
        return _ADAPTER.validate_python(data)

    def with_overrides(self, overrides: dict | list[str]) -> ModeConfig:
        """A copy with fields changed, from a dict or ``["a=1", "speculative.k=3"]``."""
        if isinstance(overrides, (list, tuple)):
            parsed = {}
            for item in overrides:
                if "=" not in item:
                    raise InputError(f"override {item!r} is not key=value")
                k, v = item.split("=", 1)
                parsed[k.strip()] = v.strip()
            overrides = parsed
        data = self.to_dict()
        for key, value in overrides.items():
            head, _, rest = key.partition(".")
            if head not in data:
                raise InputError(f"mode {self.name}: no setting named {head!r}")
            if rest:
                sub = dict(data[head] or {})
                sub[rest] = value
                data[head] = sub
            else:
                data[head] = None if value in ("none", "None", "") and head == "speculative" else value
        return ModeConfig.from_dict(data)


_ADAPTER = TypeAdapter(ModeConfig)

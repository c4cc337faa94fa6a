"""Weights per format (``EngineSettings.checkpoints``: vLLM's pre-quantized checkpoints,
llama.cpp's GGUF types) reach every engine a study, a live check or a server builds, as
they reach the profiler's."""

from __future__ import annotations

import pytest

from modeswitch.dataset.errors import InputFileError
from modeswitch.dataset.requests import Request
from modeswitch.engine.modes.config import CHECKPOINT_KEYS
from modeswitch.engine.serving import ServerConfig
from modeswitch.routers.scoring import live
from modeswitch.routers.scoring.run import ScoreConfig, live_checkpoints
from modeswitch.study import StudyConfig
from modeswitch.study.steps.profile import profile_spec


def test_a_study_hands_its_checkpoints_to_the_profile_and_its_identity_keeps_none(tmp_path):
    plain = tmp_path / "plain.toml"
    plain.write_text('[model]\nbackend = "vllm"\n')
    given = tmp_path / "given.toml"
    given.write_text('[model]\nbackend = "vllm"\ncheckpoints = {int8 = "/ckpt/w8a8", gptq_4bit = "/ckpt/gptq"}\n')
    a, b = StudyConfig.from_toml(plain), StudyConfig.from_toml(given)
    assert a.checkpoints == {} and a.identity() == a.replace(checkpoints={}).identity()
    assert "checkpoints" not in a.to_dict() or a.to_dict()["checkpoints"] == {}
    assert b.identity() != a.identity()  # other weights: another study
    spec = profile_spec(b, "/models/target", None)
    assert spec.checkpoints == {"int8": "/ckpt/w8a8", "gptq_4bit": "/ckpt/gptq"}


def test_an_unknown_checkpoint_key_names_the_file_and_field(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[model]\ncheckpoints = {fp4 = "/ckpt"}\n')
    with pytest.raises(InputFileError) as err:
        StudyConfig.from_toml(bad)
    msg = str(err.value)
    assert str(bad) in msg and "model.checkpoints" in msg and "fp4" in msg
    assert all(k in msg for k in CHECKPOINT_KEYS) and "\n" not in msg


def test_the_live_check_loads_the_profiles_checkpoints_unless_told_otherwise():
    plan = {"model": "/m", "checkpoints": {"int8": "/ckpt/w8a8"}}
    assert live_checkpoints(ScoreConfig(profile_plan=plan)) == {"int8": "/ckpt/w8a8"}
    assert live_checkpoints(ScoreConfig(profile_plan=plan, checkpoints={"int8": "/other"})) == {"int8": "/other"}
    assert live_checkpoints(ScoreConfig()) == {}


class Planned(Exception):
    pass


def test_the_live_engines_are_built_with_the_checkpoints(monkeypatch):
    seen = {}

    class Backend:
        def plan(self, settings, modes):
            seen["settings"], seen["modes"] = settings, modes
            raise Planned

    monkeypatch.setattr(live.registry, "get_backend", lambda name: Backend())
    stream = [Request(id="a", prompt_tokens=20, expected_output_tokens=4, family="short_prompt_short_output")]
    with pytest.raises(Planned):
        live.run_live(stream, {"r": ["int8_quant"]}, "/models/target", backend="vllm",
                      checkpoints={"int8": "/ckpt/w8a8"})
    assert seen["settings"].checkpoints == {"int8": "/ckpt/w8a8"}
    assert seen["modes"] == ["fp16_baseline", "int8_quant"]


def test_the_server_builds_its_engines_with_the_checkpoints():
    cfg = ServerConfig(model_path="/models/target", backend="vllm", checkpoints={"awq_4bit": "/ckpt/awq"})
    assert cfg.engine_settings().checkpoints == {"awq_4bit": "/ckpt/awq"}
    assert ServerConfig(model_path="/m").engine_settings().checkpoints == {}

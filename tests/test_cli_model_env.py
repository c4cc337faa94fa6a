"""``$MODESWITCH_MODEL`` is the default of every command that takes ``--model``: each one
given no ``--model`` runs (or refuses) the model the environment names.

The model here is an empty checkpoint folder (a ``config.json``); each command's consumer
is replaced, as in ``test_cli_options``, so nothing is loaded or run."""

from __future__ import annotations

import pytest

from modeswitch.cli import app
from tests.test_cli_options import _built, _capture, runner


@pytest.fixture
def env_model(tmp_path, monkeypatch):
    from modeswitch.engine.models.resolve import MODEL_ENV

    folder = tmp_path / "env-model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    monkeypatch.setenv(MODEL_ENV, str(folder))
    return folder


def test_serve_runs_the_environments_model(monkeypatch, env_model):
    _capture(monkeypatch, "modeswitch.cli.serve.supported_modes")
    assert _built(["serve", "--router", "rule"]).model_path == str(env_model)


def test_profile_runs_the_environments_model(monkeypatch, env_model, tmp_path):
    _capture(monkeypatch, "modeswitch.engine.profiler.Profiler")
    assert _built(["profile", "-o", str(tmp_path / "p.parquet")]).model == str(env_model)


def test_sweep_runs_the_environments_model(monkeypatch, env_model, tmp_path):
    _capture(monkeypatch, "modeswitch.cli.sweep.run_sweep")
    assert _built(["quality-sweep", "-o", str(tmp_path / "s.parquet")]).model == str(env_model)


def test_score_live_runs_the_environments_model(monkeypatch, env_model, tmp_path):
    """The command keeps no --model (None); the live step resolves it, from the environment."""
    import pandas as pd

    from modeswitch.engine.models.resolve import resolve_models

    table = tmp_path / "train.parquet"
    df = pd.DataFrame({"x": [1]})
    df.attrs["modeswitch"] = "{}"  # a training table's metadata (the config is captured before it is read)
    df.to_parquet(table)
    _capture(monkeypatch, "modeswitch.cli.score.score_routers")
    cfg = _built(["score", "--data", str(table), "-o", str(tmp_path / "r"), "--live"])
    assert cfg.model is None
    assert resolve_models(cfg.model, cfg.draft_model, None, None, lambda *a: None)[0] == env_model


def test_model_build_takes_the_environments_model(env_model):
    """A checkpoint folder needs no build: the refusal names the environment's model."""
    res = runner.invoke(app, ["model", "build"])
    assert res.exit_code != 0 and str(env_model) in res.output, res.output


def test_model_quantize_takes_the_environments_model(monkeypatch, env_model):
    """Given no --model, the checkpoints are made from the environment's folder."""
    import modeswitch.engine.models.compressed as compressed

    folders = []

    def build(folder, key, *args, **kwargs):
        folders.append(folder)
        raise SystemExit(3)

    monkeypatch.setattr(compressed, "build_compressed", build)
    res = runner.invoke(app, ["model", "quantize", "--checkpoint", "int8"])
    assert res.exit_code == 3 and folders == [env_model], res.output


def test_every_command_with_model_is_covered():
    """A command that grows a --model option is added above."""
    from modeswitch.cli.lazy import COMMANDS, load_command

    found = set()

    def walk(cmd, name):
        for sub_name, sub in getattr(cmd, "commands", {}).items():
            walk(sub, f"{name} {sub_name}")
        if any("--model" in getattr(p, "opts", ()) for p in cmd.params):
            found.add(name)

    for name in COMMANDS:
        walk(load_command(name), name)
    assert found == {"serve", "profile", "quality-sweep", "score", "model build",
                     "model quantize"}, found

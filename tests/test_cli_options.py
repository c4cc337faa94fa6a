"""The CLI stays in step with the config dataclasses behind its commands.

As in vLLM's EngineArgs, each config field a user may set is an option of the
command, with the field's own default; the options are declared by hand (so
``modeswitch --help`` imports nothing heavy), and these tests hold them to the
dataclasses: every field has an option or a stated reason not to, every option's
default is the field's, and a command run with no options builds exactly the
dataclass's defaults. A field added to a dataclass fails here until the command
exposes it or EXCLUDED says why not.
"""

from __future__ import annotations

import dataclasses
import importlib
import typing
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from modeswitch.cli import app
from modeswitch.cli.common import (
    Certificate,
    Fallback,
    FeatureSet,
    Incomplete,
    LofoTuning,
    Split,
    TuningObjective,
    config_defaults,
)
from modeswitch.cli.lazy import load_command

runner = CliRunner()
TARGET = Path("/models/target")


@dataclass
class Backed:
    """A command built on a config dataclass."""

    config: str  # "module:Class"
    #: field -> option, where the option is not --field-name
    renamed: dict[str, str] = field(default_factory=dict)
    #: fields the command computes from its options (no default to compare)
    resolved: dict[str, str] = field(default_factory=dict)
    #: options left at None so the dataclass decides; their help shows its default
    none_means_default: dict[str, str] = field(default_factory=dict)

    def cls(self):
        module, _, name = self.config.partition(":")
        return getattr(importlib.import_module(module), name)


BACKED = {
    "serve": Backed("modeswitch.engine.serving:ServerConfig",
                    renamed={"checkpoints": "--checkpoint"},
                    resolved={"model_path": "--model", "draft_path": "--draft-model"}),
    "train": Backed("modeswitch.routers.training.trainer:TrainConfig",
                    none_means_default={"routers": "--routers"}),
    "score": Backed("modeswitch.routers.scoring.run:ScoreConfig",
                    renamed={"run_ids": "--run", "compiled": "--compile", "checkpoints": "--checkpoint"},
                    none_means_default={"live_requests": "--live-requests"}),
    "profile": Backed("modeswitch.engine.profiler:ProfileSpec",
                      renamed={"checkpoints": "--checkpoint"},
                      resolved={"model": "--model", "draft_model": "--draft-model"},
                      none_means_default={"workloads": "--workloads", "requests": "--requests",
                                          "trials": "--trials"}),
}

#: (command, field) -> why the command does not expose it
EXCLUDED = {
    ("serve", "reference"): "the fallback for failed routing decisions is the registry's "
                            "reference mode, the one every label and cost is relative to; "
                            "not a serving choice",
    ("score", "name"): "the report's name is its folder's name (--output)",
    ("profile", "max_concurrency"): "the study's beside step sets it, to measure another study's "
                                    "requests only at the arrival groups this study draws; a "
                                    "profile of its own draws its groups from its conditions",
}


def _command(name: str):
    return load_command(name)


def _options(name: str) -> dict[str, object]:
    """option string (--x) -> click parameter, for one command."""
    return {opt: p for p in _command(name).params for opt in p.opts}


def _option_of(cmd: str, spec: Backed, fname: str) -> str:
    return {**spec.renamed, **spec.resolved, **spec.none_means_default}.get(
        fname, "--" + fname.replace("_", "-"))


@pytest.mark.parametrize("cmd", sorted(BACKED))
def test_every_field_has_an_option_or_a_reason(cmd):
    spec, options = BACKED[cmd], _options(cmd)
    fields = {f.name for f in dataclasses.fields(spec.cls())}
    excluded = {f for c, f in EXCLUDED if c == cmd}
    assert excluded <= fields, f"EXCLUDED names fields {cmd}'s config lacks: {excluded - fields}"
    missing = {f: _option_of(cmd, spec, f) for f in fields - excluded
               if _option_of(cmd, spec, f) not in options}
    assert not missing, f"{cmd}: config fields without an option: {missing}"
    stale = {f for f in excluded if "--" + f.replace("_", "-") in options}
    assert not stale, f"{cmd}: fields listed as not exposed have an option: {stale}"


@pytest.mark.parametrize("cmd", sorted(BACKED))
def test_option_defaults_are_the_dataclass_defaults(cmd):
    spec, options = BACKED[cmd], _options(cmd)
    excluded = {f for c, f in EXCLUDED if c == cmd}
    for fname, default in config_defaults(spec.config).items():
        if fname in excluded or fname in spec.resolved:
            continue
        cli = options[_option_of(cmd, spec, fname)].default
        if fname in spec.none_means_default:
            assert cli is None, f"{cmd} {fname}: None lets the config decide"
            continue
        if isinstance(cli, Path):
            cli = str(cli)
        if cli is None and default in ([], {}):  # a repeatable option given no times
            continue
        assert cli == default, f"{cmd} --{fname}: option default {cli!r}, config default {default!r}"


@pytest.mark.parametrize("cmd", [c for c in sorted(BACKED) if BACKED[c].none_means_default])
def test_help_shows_the_defaults_the_config_decides(cmd):
    spec = BACKED[cmd]
    defaults = config_defaults(spec.config)
    res = runner.invoke(app, [cmd, "--help"], env={"COLUMNS": "1000", "TERMINAL_WIDTH": "1000"})
    text = " ".join(res.output.split())
    for fname in spec.none_means_default:
        value = defaults[fname]
        shown = ", ".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
        assert f"[{shown}" in text or f": {shown}]" in text, f"{cmd} --{fname}: help lacks {shown!r}"


# ---------------------------------------------- run with no options at all
class Captured(Exception):
    """Raised by a stand-in for the command's consumer, carrying the config it got."""

    def __init__(self, config):
        super().__init__("captured")
        self.config = config


def _capture(monkeypatch, target: str):
    import modeswitch.engine.distributed  # noqa: F401 - subclasses the Profiler: imported before it is replaced

    module, _, name = target.rpartition(".")

    def consumer(*args, **kwargs):
        raise Captured(next(a for a in (*args, *kwargs.values()) if dataclasses.is_dataclass(a)))

    monkeypatch.setattr(importlib.import_module(module), name, consumer)


def _built(args) -> object:
    res = runner.invoke(app, args)
    assert isinstance(res.exception, Captured), res.output
    return res.exception.config


@pytest.fixture
def fake_models(monkeypatch):
    import modeswitch.engine.models.resolve

    monkeypatch.setattr(modeswitch.engine.models.resolve, "resolve_models", lambda *a, **k: (TARGET, None, None))


@pytest.fixture
def table(tmp_path):
    path = tmp_path / "train.parquet"
    df = pd.DataFrame({"x": [1]})
    df.attrs["modeswitch"] = "{}"  # a training table's metadata (the config is captured before it is read)
    df.to_parquet(path)
    return path


def test_serve_with_no_options_builds_the_default_server_config(monkeypatch, fake_models):
    from modeswitch.engine.serving import ServerConfig

    _capture(monkeypatch, "modeswitch.cli.serve.supported_modes")
    # --router rule: a stored router is loaded (and vetted) before the config is used
    assert _built(["serve", "--router", "rule"]) == ServerConfig(model_path=str(TARGET))


def test_serve_passes_max_tokens_limit_on(monkeypatch, fake_models):
    _capture(monkeypatch, "modeswitch.cli.serve.supported_modes")
    assert _built(["serve", "--router", "rule", "--max-tokens-limit", "64"]).max_tokens_limit == 64


def test_profile_with_no_options_builds_the_default_spec(monkeypatch, fake_models, tmp_path):
    from modeswitch.engine.profiler import ProfileSpec

    _capture(monkeypatch, "modeswitch.engine.profiler.Profiler")
    out = ["-o", str(tmp_path / "p.parquet")]
    assert _built(["profile", *out]) == ProfileSpec(model=str(TARGET))
    assert _built(["profile", *out, "--quick"]).requests == 1
    assert _built(["profile", *out, "--quick", "--requests", "2"]).requests == 2


def test_profile_ray_takes_an_optional_address(monkeypatch, fake_models, tmp_path):
    """``--ray`` alone starts a local Ray (or joins $RAY_ADDRESS: Ray reads it); with
    ``--ray-address`` it joins that cluster; the spec (and so the journal's identity) is
    the serial run's either way."""
    import modeswitch.engine.distributed
    from modeswitch.engine.profiler import ProfileSpec

    got = {}

    def consumer(spec, *a, **kw):
        got.update(kw, spec=spec)
        raise Captured(spec)

    monkeypatch.setattr(modeswitch.engine.distributed, "RayProfiler", consumer)
    out = ["-o", str(tmp_path / "p.parquet")]
    assert _built(["profile", *out, "--ray"]) == ProfileSpec(model=str(TARGET))
    assert got["address"] is None and got["workers"] is None
    _built(["profile", *out, "--ray", "--ray-address", "ray://head:10001", "--ray-workers", "4",
            "--ray-cpus-per-worker", "2"])
    assert (got["address"], got["workers"], got["cpus_per_worker"]) == ("ray://head:10001", 4, 2)
    res = runner.invoke(app, ["profile", *out, "--ray-workers", "2"])
    assert res.exit_code == 2 and "--ray" in res.output


def test_train_with_no_options_builds_the_default_config(monkeypatch, table):
    from modeswitch.routers.training.trainer import TrainConfig

    _capture(monkeypatch, "modeswitch.cli.train.train")
    assert _built(["train", "--data", str(table)]) == TrainConfig()
    assert _built(["train", "--data", str(table), "--routers", "dt,lr"]).routers == ["dt", "lr"]


def test_score_with_no_options_builds_the_default_config(monkeypatch, table, tmp_path):
    from modeswitch.routers.scoring.run import ScoreConfig

    _capture(monkeypatch, "modeswitch.cli.score.score_routers")
    cfg = _built(["score", "--data", str(table), "-o", str(tmp_path / "report")])
    assert cfg == ScoreConfig(name="report")


#: per command, invocations that between them set every exposed field to a non-default
#: value (profile: vLLM cannot --interleave, so that one comes on its own)
SET_ALL = {
    "serve": [["serve", "--router", "rule", "--backend", "vllm", "--device", "cuda", "--api-key", "k",
               "--served-name", "n", "--max-tokens-limit", "64", "--route-budget-us", "1.5",
               "--memory-budget-mb", "2.5", "--one-at-a-time", "--max-body-bytes", "1000",
               "--max-in-flight", "3", "--context-tokens", "512", "--header-timeout-s", "2.5",
               "--body-timeout-s", "3.5", "--max-connections-per-peer", "7", "--max-receiving-bodies", "9",
               "--raw-completions", "--admin-key", "a", "--feedback-window-s", "5", "--checkpoint", "int8=/ckpt"]],
    "profile": [["profile", "--backend", "vllm", "--device", "cuda", "--modes", "fp16_baseline",
                 "--workloads", "batch_pressure", "--requests", "2", "--trials", "2", "--max-remeasure", "1", "--seed", "1",
                 "--benchmarks", "b.jsonl", "--benchmark-requests", "3", "--batch-size", "4",
                 "--watts-per-core", "5", "--threads", "2", "--checkpoint", "int8=/ckpt"],
                ["profile", "--interleave", "--length-scale", "0.5",
                 "--conditions", str(Path(__file__).resolve().parents[1] / "study.toml")]],
    "train": [["train", "--routers", "dt", "--feature-set", "B", "--split", "lofo",
               "--test-size", "0.5", "--trials", "2", "--seed", "1", "--unsafe-penalty", "2",
               "--safety-threshold", "0.5", "--fallback", "reference", "--labels", "measured", "--storage",
               "sqlite:///x.db", "--target-violation-rate", "0.05", "--mlruns", "m2", "--preset", "modeswitch-paper",
               "--workers", "3", "--tracking-uri", "http://127.0.0.1:5999", "--certificate", "per-family",
               "--no-decision-cost", "--router-params", "dt.max_depth=3", "--tuning-objective", "capture",
               "--lofo-tuning", "pooled"]],
    "score": [["score", "--run", "r1", "--no-compile", "--decisions", "5",
               "--pipeline-decisions", "6", "--live", "--live-requests", "3", "--live-per-family", "4", "--live-trials", "2",
               "--live-threads", "2", "--live-max-remeasure", "1", "--model", "/m",
               "--draft-model", "/d", "--device", "cuda", "--backend", "vllm", "--mlruns", "m2",
               "--seed", "1", "--labels", "measured", "--tracking-uri", "http://127.0.0.1:5999", "--no-frontier",
               "--no-adaptive", "--checkpoint", "gptq_4bit=/ckpt"]],
}
#: what each command hands its config to, patched where the command module looks it up
CONSUMER = {"serve": "modeswitch.cli.serve.supported_modes", "profile": "modeswitch.engine.profiler.Profiler",
            "train": "modeswitch.cli.train.train", "score": "modeswitch.cli.score.score_routers"}


@pytest.mark.parametrize("cmd", sorted(BACKED))
def test_every_option_reaches_the_config(cmd, monkeypatch, fake_models, table, tmp_path):
    spec = BACKED[cmd]
    _capture(monkeypatch, CONSUMER[cmd])
    journal = tmp_path / "p.parquet.journal.jsonl"  # a profiler's journal: its first line holds the plan
    journal.write_text('{"identity": "x", "run_id": "y", "spec": {"model": "m"}}\n')
    extra = {"profile": ["-o", str(tmp_path / "p.parquet")], "train": ["--data", str(table)],
             "score": ["--data", str(table), "-o", str(tmp_path / "r"), "--profile-plan", str(journal)]
             }.get(cmd, [])
    built = [_built([*args, *extra]) for args in SET_ALL[cmd]]
    skip = set(spec.resolved) | {f for c, f in EXCLUDED if c == cmd}
    unset = {f for f, d in config_defaults(spec.config).items()
             if f not in skip and all(getattr(cfg, f) == d for cfg in built)}
    assert not unset, f"{cmd}: options that never reach the config: {unset}"


# ------------------------------------------------- choices and their source
def test_choices_match_the_code_that_consumes_them():
    from modeswitch.dataset.features import FEATURE_SETS
    from modeswitch.oracle.constraints import Constraints
    from modeswitch.routers.training.splits import SPLITS

    assert typing.get_args(Split) == SPLITS
    assert sorted(typing.get_args(FeatureSet)) == sorted(FEATURE_SETS)
    hints = typing.get_type_hints(Constraints, include_extras=True)
    assert typing.get_args(Incomplete) == typing.get_args(hints["on_incomplete"])
    # the learned routers' fallback: "rule" or "reference" (routers.families.base)
    assert typing.get_args(Fallback) == ("rule", "reference")
    from modeswitch.routers.certificates import CERTIFICATES

    assert typing.get_args(Certificate) == tuple(CERTIFICATES)
    from modeswitch.routers.training.costs import OBJECTIVES

    assert typing.get_args(TuningObjective) == OBJECTIVES
    from modeswitch.routers.training.splits import LOFO_TUNING

    assert typing.get_args(LofoTuning) == LOFO_TUNING


@pytest.mark.parametrize("cmd", ["serve", "profile", "score"])
def test_backend_choices_are_the_registered_backends(cmd):
    from modeswitch.engine.backends.registry import backend_names

    out = runner.invoke(app, [cmd, "--help"], env={"COLUMNS": "250"}).output
    assert "<" + "|".join(backend_names()) + ">" in out


@pytest.mark.parametrize("option, value", [("--memory-budget-mb", "-5"), ("--max-tokens-limit", "0"),
                                           ("--route-budget-us", "-1"), ("--route-budget-us", "inf"),
                                           ("--header-timeout-s", "0"), ("--max-connections-per-peer", "0")])
def test_serve_refuses_a_limit_out_of_range_before_any_work(monkeypatch, option, value):
    import modeswitch.engine.models.resolve

    def no_model(*a, **k):
        raise AssertionError("the model was resolved before the options were checked")

    monkeypatch.setattr(modeswitch.engine.models.resolve, "resolve_models", no_model)
    res = runner.invoke(app, ["serve", "--router", "rule", option, value])
    assert res.exit_code == 2 and option in res.output and "positive" in res.output, res.output
    assert len(res.output.strip().splitlines()) == 1

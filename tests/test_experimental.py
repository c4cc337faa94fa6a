"""The experimental boundary (modeswitch.experimental): the core loads no research module,
each command's help shows its core options before an "Advanced" panel, and using a
research add-on (a class, a function, an advanced option) warns once."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings

import pytest
from sklearn.base import clone
from typer.testing import CliRunner

from modeswitch.cli import app
from modeswitch.experimental import RESEARCH_MODULES, ExperimentalWarning, _warn
from modeswitch.experimental import experimental_func as mark_experimental

runner = CliRunner()
WIDE = {"COLUMNS": "250", "TERMINAL_WIDTH": "250"}


def _loaded_after(statement: str) -> set[str]:
    code = f"import json, sys\n{statement}\nprint(json.dumps(sorted(sys.modules)))"
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True,
                          timeout=300, check=True)
    return set(json.loads(proc.stdout.strip().splitlines()[-1]))


def _behind_the_boundary(loaded: set[str]) -> list[str]:
    return sorted(m for m in loaded if m.startswith("modeswitch.experimental") or m in RESEARCH_MODULES)


@pytest.fixture
def fresh():
    """Every feature unwarned, every warning recorded."""
    _warn._warned.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield caught
    _warn._warned.clear()


def _experimental(caught) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, ExperimentalWarning)]


def test_the_api_imports_nothing_behind_the_boundary():
    assert _behind_the_boundary(_loaded_after("import modeswitch.routers.api")) == []


def test_the_boundary_names_its_research_lazily():
    loaded = _loaded_after("import modeswitch.experimental")
    assert not [m for m in RESEARCH_MODULES if m in loaded]
    assert "modeswitch.routers.adaptive" in _loaded_after(
        "from modeswitch.experimental import AdaptiveThresholdRouter")


def test_every_research_module_is_marked():
    """Each module behind the boundary marks its add-ons with the boundary's decorators
    (so using one warns), and every name the package offers resolves."""
    import importlib

    import modeswitch.experimental as exp

    for name in RESEARCH_MODULES:
        module = importlib.import_module(name)
        marked = [v for v in vars(module).values()
                  if getattr(v, "__module__", None) == name
                  and hasattr(v.__init__ if isinstance(v, type) else v, "__wrapped__")]
        assert marked, f"{name}: nothing marked @experimental_class / @experimental_func"
    for name in exp._LAZY:
        assert getattr(exp, name) is not None


def test_train_help_shows_core_options_before_the_advanced_panel():
    out = runner.invoke(app, ["train", "--help"], env=WIDE).output
    advanced = out.index("─ Advanced ")
    for core in ("--data", "--routers", "--feature-set", "--split", "--trials", "--target-violation-rate"):
        assert out.index(core) < advanced, core
    for research in ("--certificate", "--tuning-objective", "--lofo-tuning"):
        assert out.index(research) > advanced, research


@pytest.mark.parametrize("cmd, research", [(["score"], "--frontier"), (["label"], "--quality-scope"),
                                           (["dataset", "build"], "--quality-risk"), (["serve"], "--admin-key")])
def test_research_options_sit_in_the_advanced_panel(cmd, research):
    out = runner.invoke(app, [*cmd, "--help"], env=WIDE).output
    assert out.index("─ Advanced ") < out.index(research)


def test_an_experimental_class_warns_once(fresh):
    from modeswitch.experimental import AdaptiveThresholdRouter

    router = AdaptiveThresholdRouter(None, step_size=0.2)
    AdaptiveThresholdRouter(None)
    clone(router)  # scikit-learn still reads the parameters through the wrapped __init__
    assert router.get_params()["step_size"] == 0.2
    assert len(_experimental(fresh)) == 1
    assert _experimental(fresh)[0].startswith(
        "experimental add-on modeswitch.routers.adaptive.AdaptiveThresholdRouter ")


def test_an_experimental_function_warns_once_but_not_when_run_by_default(fresh):
    @mark_experimental
    def add_on(x):
        return x + 1

    with _warn.run_by_default():
        assert add_on(1) == 2
    assert _experimental(fresh) == []
    assert add_on(1) == add_on(2) - 1
    assert len(_experimental(fresh)) == 1


def test_a_research_training_option_warns_once(fresh):
    from modeswitch.routers.training.trainer import TrainConfig

    TrainConfig()
    assert _experimental(fresh) == []
    TrainConfig(certificate="per-family")
    TrainConfig(certificate="per-family")
    assert _experimental(fresh) == ["experimental add-on --certificate per-family (modeswitch.experimental): "
                                    "its interface and results may change without notice"]


def test_an_advanced_option_on_the_command_line_warns_once(fresh, tmp_path):
    missing = str(tmp_path / "missing.parquet")
    runner.invoke(app, ["train", "--data", missing, "--trials", "3"])
    assert _experimental(fresh) == []
    res = runner.invoke(app, ["train", "--data", missing, "--lofo-tuning", "pooled"])
    runner.invoke(app, ["train", "--data", missing, "--lofo-tuning", "pooled"])
    assert res.exit_code == 2  # the missing table still stops it, after the warning
    assert [m.split()[2] for m in _experimental(fresh)] == ["--lofo-tuning"]

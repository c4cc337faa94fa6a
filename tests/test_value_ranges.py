"""Options and TOML values out of range are refused before any work, in one line naming
the value: not finite, not positive, or more than this machine can count or hold."""

from __future__ import annotations

from pathlib import Path

import pytest
from modeswitch.dataset.errors import InputError, InputFileError
from typer.testing import CliRunner

from modeswitch.cli import app

REPO = Path(__file__).resolve().parents[1]
runner = CliRunner()


def _study(tmp_path, key: str, value: str) -> Path:
    text = (REPO / "study.toml").read_text()
    lines = [f"{key} = {value}" if line.split("=")[0].strip() == key else line for line in text.splitlines()]
    assert lines != text.splitlines(), f"study.toml has no {key}"
    path = tmp_path / "study.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("key, value, says", [
    ("requests_per_family", "1e20", "requests_per_family"),
    ("requests_per_family", "100000000000000000000", "larger than this machine can count"),
    ("requests_per_family", "1000000000000", "GiB to draw"),
    ("length_scale", "inf", "must be a finite number"),
    ("length_scale", "nan", "must be a finite number"),
    ("test_size", "1.5", "must be below 1"),
])
def test_study_toml_values_out_of_range_are_refused_naming_them(tmp_path, key, value, says):
    from modeswitch.study.config import StudyConfig

    path = _study(tmp_path, key, value)
    with pytest.raises(InputFileError, match=says) as exc:
        StudyConfig.from_toml(path)
    assert str(path) in str(exc.value)


def test_study_run_refuses_them_in_one_line_before_any_step(tmp_path):
    path = _study(tmp_path, "length_scale", "inf")
    res = runner.invoke(app, ["study", "run", "--config", str(path), "-o", str(tmp_path / "out")])
    assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1, res.output
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("kw, says", [({"length_scale": float("inf")}, "length_scale"),
                                      ({"requests": 0}, "requests"), ({"trials": 10**20}, "can count"),
                                      ({"watts_per_core": float("nan")}, "watts_per_core")])
def test_a_profile_spec_out_of_range_is_refused(kw, says):
    from modeswitch.engine.profiler import ProfileSpec

    with pytest.raises(InputError, match=says):
        ProfileSpec(model="m", **kw)


def test_profile_checks_its_values_before_resolving_the_model(monkeypatch, tmp_path):
    import modeswitch.engine.models.resolve

    def no_model(*a, **k):
        raise AssertionError("the model was resolved before the options were checked")

    monkeypatch.setattr(modeswitch.engine.models.resolve, "resolve_models", no_model)
    res = runner.invoke(app, ["profile", "--length-scale", "inf", "-o", str(tmp_path / "p.parquet")])
    assert res.exit_code == 2 and "length_scale = inf" in res.output, res.output

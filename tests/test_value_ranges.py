"""Options and TOML values out of range are refused before any work, in one line naming
the value: not finite, not positive, or more than this machine can count or hold."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from modeswitch.cli import app
from modeswitch.dataset.errors import InputError, InputFileError

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


@pytest.mark.parametrize("column, value, says", [
    ("prompt_tokens", 1e300, "1e+300 is out of range: the routers read numbers as 32-bit floats"),
    ("log_prompt_tokens", float("inf"), "inf is not a finite number"),
    ("latency_ms__int8_quant", float("-inf"), "-inf is not a finite number"),
    ("energy_ratio__gptq_4bit", float("inf"), "inf is not a finite number"),
    ("memory_pressure", 1.5, "1.5 is out of range: must be from 0 to below 1"),
    ("concurrent_requests", 0, "0 is out of range: must be at least 1"),
    ("expected_output_tokens", float("nan"), "missing; every row needs its request's expected_output_tokens"),
    ("latency_ms__fp16_baseline", 0.0, "a latency must be > 0"),
])
def test_a_bad_number_in_a_training_table_is_one_error_naming_file_row_and_column(tmp_path, column, value, says):
    """As ``train`` and ``score`` read the table, before any estimator sees it."""
    from modeswitch.oracle.external_table import read_training_table
    from tests.helpers import synthetic_table

    table = synthetic_table(("short_prompt_short_output", "batch_pressure"), 10)
    table[column] = table[column].astype(float)
    table.loc[4, column] = value
    table.loc[7, "prompt_tokens"] = float("inf")  # a second bad value, in a later row
    path = tmp_path / "table.parquet"
    table.to_parquet(path)
    with pytest.raises(InputFileError, match=re.escape(says)) as exc:
        read_training_table(path)
    assert (exc.value.path, exc.value.row, exc.value.field) == (str(path), 4, column)
    assert "and 1 more bad values" in str(exc.value)

    res = runner.invoke(app, ["train", "--data", str(path), "--routers", "lr", "--trials", "1",
                              "--mlruns", str(tmp_path / "mlruns")])
    said = "".join(res.output.split())  # the one line, as the terminal's width wrapped it
    assert res.exit_code == 2 and isinstance(res.exception, SystemExit), res.output
    assert f"file{path},row4,field'{column}'" in said and "".join(says.split()) in said


def test_a_cost_table_s_huge_prompt_is_refused_as_it_is_read(tmp_path):
    """A cost table (your own per-mode costs) passes its own checks with a finite
    1e300; the table built from it is checked all the same."""
    import pandas as pd

    from modeswitch.oracle.external_table import read_training_table

    costs = pd.DataFrame({"request_id": ["a", "b", "c"], "prompt_tokens": [100.0, 1e300, 50.0],
                          "expected_output_tokens": 32, "latency_ms__fp16_baseline": 100.0,
                          "latency_ms__int8_quant": 60.0})
    path = tmp_path / "costs.csv"
    costs.to_csv(path, index=False)
    with pytest.raises(InputFileError, match="1e\\+300 is out of range") as exc:
        read_training_table(path)
    assert (exc.value.row, exc.value.field) == (1, "prompt_tokens")

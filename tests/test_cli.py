import json

import pandas as pd
from typer.testing import CliRunner

from modeswitch.cli import app
from tests.helpers import row

runner = CliRunner()


def test_help_lists_the_commands():
    out = runner.invoke(app, ["--help"])
    assert out.exit_code == 0
    for cmd in ("import-profiles", "label", "modes", "route", "validate", "requests"):
        assert cmd in out.output


def test_import_and_label_with_explain(tmp_path, a100_dir):
    out_profile = tmp_path / "a100.parquet"
    res = runner.invoke(app, ["import-profiles", str(a100_dir / "profiles_a100_curated_sweep_trials.csv"),
                              "-o", str(out_profile)])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["label", "--profiles", str(out_profile), "--explain",
                              "-o", str(tmp_path / "labels.parquet")])
    assert res.exit_code == 0, res.output
    assert "rejected: energy/token" in res.output
    labels = pd.read_parquet(tmp_path / "labels.parquet")
    assert len(labels) == 7
    assert (tmp_path / "labels.candidates.parquet").exists()
    # a second run does not overwrite
    res = runner.invoke(app, ["import-profiles", str(a100_dir / "profiles_a100_curated_sweep_trials.csv"),
                              "-o", str(out_profile)])
    assert res.exit_code == 2 and "already exists" in res.output


def test_bad_profile_gives_one_clear_error(tmp_path):
    df = pd.DataFrame([row("w", "fp16_baseline", 10.0), row("w", "int8_quant", -5.0)])
    p = tmp_path / "bad.csv"
    df.to_csv(p, index=False)
    res = runner.invoke(app, ["validate", str(p)])
    assert res.exit_code == 2
    assert "row 1" in res.output and "latency_ms" in res.output and "bad.csv" in res.output


def test_label_thresholds_from_flags_and_toml(tmp_path):
    df = pd.DataFrame([row("w", "fp16_baseline", 10.0), row("w", "int8_quant", 5.0, energy=1.1)])
    p = tmp_path / "p.csv"
    df.to_csv(p, index=False)
    res = runner.invoke(app, ["label", "-p", str(p), "-o", str(tmp_path / "a.parquet")])
    assert res.exit_code == 0, res.output
    assert pd.read_parquet(tmp_path / "a.parquet")["label"].item() == "fp16_baseline"
    res = runner.invoke(app, ["label", "-p", str(p), "--max-energy-ratio", "1.2", "-o", str(tmp_path / "b.parquet")])
    assert pd.read_parquet(tmp_path / "b.parquet")["label"].item() == "int8_quant"
    toml = tmp_path / "c.toml"
    toml.write_text("[constraints]\nmax_energy_ratio = 1.15\n")
    res = runner.invoke(app, ["label", "-p", str(p), "--config", str(toml), "-o", str(tmp_path / "c.parquet")])
    assert pd.read_parquet(tmp_path / "c.parquet")["label"].item() == "int8_quant"


def test_requests_route_and_label_by_estimation(tmp_path):
    prof = pd.DataFrame([
        row(f"p{p}_o{o}", m, lat * (0.5 if m == "int8_quant" else 1), prompt_tokens=p, expected_output_tokens=o)
        for p in (128, 1024) for o in (32, 128) for m, lat in (("fp16_baseline", p + 10 * o), ("int8_quant", p + 10 * o))
    ])
    pp = tmp_path / "p.csv"
    prof.to_csv(pp, index=False)
    rq = tmp_path / "r.jsonl"
    res = runner.invoke(app, ["requests", "-o", str(rq), "-n", "3", "--workloads",
                              "short_prompt_short_output,long_prompt_long_output"])
    assert res.exit_code == 0, res.output
    assert len(rq.read_text().splitlines()) == 6
    res = runner.invoke(app, ["route", "--requests", str(rq), "--explain"])
    assert res.exit_code == 0 and "rule 4" in res.output
    res = runner.invoke(app, ["label", "-p", str(pp), "--requests", str(rq), "-o", str(tmp_path / "l.parquet")])
    assert res.exit_code == 0, res.output
    labels = pd.read_parquet(tmp_path / "l.parquet")
    assert set(labels["label"]) == {"int8_quant"} and len(labels) == 6


def test_modes_show_with_override():
    res = runner.invoke(app, ["modes", "--show", "speculative_decoding", "--set",
                              "speculative.num_speculative_tokens=2"])
    assert res.exit_code == 0
    assert json.loads(res.output)["speculative"]["num_speculative_tokens"] == 2
    res = runner.invoke(app, ["modes", "--show", "nope"])
    assert res.exit_code == 2 and "unknown mode" in res.output

import importlib
import json
from pathlib import Path

import pandas as pd
from typer.core import TyperGroup
from typer.main import get_command
from typer.testing import CliRunner

import modeswitch.cli as cli
from modeswitch.cli import app
from modeswitch.cli.lazy import COMMANDS, load_command
from tests.helpers import row

runner = CliRunner()


def test_help_lists_the_commands():
    out = runner.invoke(app, ["--help"])
    assert out.exit_code == 0
    for cmd in ("import-profiles", "label", "modes", "route", "validate", "requests"):
        assert cmd in out.output


def test_every_command_in_the_table_loads_with_the_help_the_table_gives():
    # `modeswitch --help` reads the table only; the table must match the modules
    for name, (module, line) in COMMANDS.items():
        command = load_command(name)
        first = " ".join((command.help or "").split("\n\n")[0].split())
        assert first == line, f"{name} ({module}): the table says {line!r}, the command {first!r}"


def test_every_command_a_module_registers_is_in_the_table():
    folder = Path(cli.__file__).parent
    modules = {p.stem for p in folder.glob("*.py")} - {"__init__", "__main__", "common", "lazy", "oracle_options"}
    assert modules == {m for m, _ in COMMANDS.values()}, "a command module the table does not list (or the reverse)"
    for module in modules:
        built = get_command(importlib.import_module(f"modeswitch.cli.{module}").app)
        names = list(built.commands) if isinstance(built, TyperGroup) else [built.name]
        assert names and all(COMMANDS.get(n, ("?",))[0] == module for n in names), (module, names)


def test_an_unknown_command_is_a_usage_error_with_the_commands_listed():
    res = runner.invoke(app, ["labl"])
    assert res.exit_code == 2 and "No such command" in res.output
    res = runner.invoke(app, ["--help"])
    assert all(name in res.output for name in COMMANDS)


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
    # each family's divergence rates beside the rule's verdict on its mean
    families = pd.read_csv(tmp_path / "labels.families.csv")
    assert {"quality_group", "mode", "units", "divergence_rate", "rouge_l_mean", "passes_rule"} <= set(families)
    assert "fp16_baseline" not in set(families["mode"]) and families["divergence_rate"].between(0, 1).all()
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


# ------------------------------------------------------------- error policy
def test_debug_shows_the_traceback_of_an_input_error():
    from modeswitch.dataset.registry import UnknownNameError

    res = runner.invoke(app, ["--debug", "modes", "--show", "nope"])
    assert isinstance(res.exception, UnknownNameError) and res.exit_code == 1
    assert "error:" not in res.output
    res = runner.invoke(app, ["modes", "--show", "nope"], env={"MODESWITCH_DEBUG": "1"})
    assert isinstance(res.exception, UnknownNameError)
    res = runner.invoke(app, ["modes", "--show", "nope"], env={"MODESWITCH_DEBUG": "0"})
    assert res.exit_code == 2 and "unknown mode" in res.output


def test_debug_prints_a_python_traceback_in_a_real_process():
    import os
    import subprocess
    import sys

    env = {**os.environ, "MODESWITCH_DEBUG": ""}
    proc = subprocess.run([sys.executable, "-m", "modeswitch", "--debug", "modes", "--show", "nope"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 1
    assert "Traceback (most recent call last)" in proc.stderr and "UnknownNameError" in proc.stderr


def test_an_unexpected_exception_is_not_an_input_error(monkeypatch):
    from modeswitch.cli import registries  # the module the `workloads` command lives in

    for exc in (RuntimeError("boom"), ValueError("a bug, not the user's input"),
                KeyError("a bug too")):
        def broken(exc=exc):
            raise exc

        monkeypatch.setattr(registries, "list_workloads", broken)
        res = runner.invoke(app, ["workloads"])
        assert res.exception is exc and res.exit_code == 1
        assert "error:" not in res.output


def test_bad_option_values_are_one_line_input_errors(tmp_path):
    res = runner.invoke(app, ["export"])
    assert res.exit_code == 2 and "give exactly one of --run RUN_ID or --best METRIC" in res.output
    res = runner.invoke(app, ["export", "--run", "r", "--best", "speedup"])
    assert res.exit_code == 2 and "exactly one" in res.output
    res = runner.invoke(app, ["label", "-p", "unused.csv", "--max-energy-ratio", "-1"])
    assert res.exit_code == 2 and "--max-energy-ratio" in res.output and "Traceback" not in res.output
    res = runner.invoke(app, ["modes", "--show", "speculative_decoding", "--set", "nope"])
    assert res.exit_code == 2 and "not key=value" in res.output
    res = runner.invoke(app, ["modes", "--show", "speculative_decoding", "--set",
                              "speculative.num_speculative_tokens=many"])
    assert res.exit_code == 2 and "--set speculative.num_speculative_tokens" in res.output
    res = runner.invoke(app, ["serve", "--backend", "nope"])
    assert res.exit_code == 2 and "transformers" in res.output and "vllm" in res.output
    res = runner.invoke(app, ["train", "--data", "t.parquet", "--split", "nope"])
    assert res.exit_code == 2 and "lofo" in res.output


def test_an_unreadable_file_is_one_line_naming_it(tmp_path):
    bad = tmp_path / "table.parquet"
    bad.write_text("not parquet")
    res = runner.invoke(app, ["train", "--data", str(bad)])
    assert res.exit_code == 2 and "table.parquet" in res.output and "cannot be read" in res.output
    toml = tmp_path / "c.toml"
    toml.write_text("max_energy_ratio = \n")
    res = runner.invoke(app, ["label", "-p", "unused.csv", "--config", str(toml)])
    assert res.exit_code == 2 and "c.toml" in res.output


# ---------------------------------------------------------------- help text
def _help(*cmd):
    res = runner.invoke(app, [*cmd, "--help"], env={"COLUMNS": "250", "TERMINAL_WIDTH": "250"})
    assert res.exit_code == 0, res.output
    return res.output


def test_serve_help_lists_max_tokens_limit_and_the_backends():
    out = _help("serve")
    assert "--max-tokens-limit" in out and "1024" in out
    from modeswitch.engine.backends.registry import backend_names

    listed = next(w for w in out.split() if w.startswith("<") and "vllm" in w).strip("<>").split("|")
    assert sorted(listed) == sorted(backend_names()) and {"transformers", "llamacpp", "vllm"} <= set(listed)


def test_profile_help_lists_the_backends_and_the_real_defaults():
    out = _help("profile")
    assert "transformers" in out and "vllm" in out
    assert "[3; quick: 1]" in out


def test_root_help_lists_debug_and_commands_in_pipeline_order():
    out = _help()
    assert "--debug" in out and "MODESWITCH_DEBUG" in out
    listed = [line.strip("│ ").split()[0] for line in out.split("Commands")[1].splitlines()
              if line.startswith("│")]
    pipeline = ["modes", "requests", "profile", "label", "dataset", "train", "score", "export", "serve"]
    assert [c for c in listed if c in pipeline] == pipeline


def test_bad_router_uris_runs_and_ports_are_one_line_errors(tmp_path, tiny_models):
    """Each used to print a Python traceback (MLflow's own exceptions, a bind() overflow)."""
    store = ["--mlruns", str(tmp_path / "m")]
    model = ["--model", str(tiny_models.target)]
    for uri, says in [("models:/nope@champion", "Registered Model with name=nope not found"),
                      ("models:/nope/3", "not found"), ("runs:/deadbeef/model", "Run with id=deadbeef not found"),
                      ("models:/", "not a model URI this can load"),
                      ("garbage::uri", "not a model URI this can load")]:
        res = runner.invoke(app, ["serve", "--router", uri, *model, *store])
        assert res.exit_code == 2 and says in res.output and "Traceback" not in res.output, (uri, res.output)
    res = runner.invoke(app, ["serve", "--port", "70000", "--router", "mode:fp16_baseline", *model])
    assert res.exit_code == 2 and "65535" in res.output and "Traceback" not in res.output
    res = runner.invoke(app, ["export", "--run", "deadbeef", *store])
    assert res.exit_code == 2 and "--run deadbeef: no such training run" in res.output


def test_validate_refuses_what_label_could_not_use(tmp_path):
    df = pd.DataFrame([row("w", "fp16_baseline", 10.0), row("w", "int8_quant", 5.0, trial=1)])
    df.drop(columns=["latency_ms"]).to_parquet(tmp_path / "nolat.parquet")
    res = runner.invoke(app, ["validate", str(tmp_path / "nolat.parquet")])
    assert res.exit_code == 2 and "latency_ms" in res.output and "required column is missing" in res.output
    pd.concat([df, df]).to_parquet(tmp_path / "twice.parquet")
    res = runner.invoke(app, ["validate", str(tmp_path / "twice.parquet")])
    assert res.exit_code == 2 and "repeats row 0" in res.output


def test_serve_reads_its_api_key_from_a_file_and_refuses_two_sources(tmp_path, tiny_models):
    key = tmp_path / "key"
    key.write_text("")
    res = runner.invoke(app, ["serve", "--api-key-file", str(key), "--model", str(tiny_models.target)])
    assert res.exit_code == 2 and "holds no key" in res.output
    res = runner.invoke(app, ["serve", "--api-key", "a", "--api-key-file", str(key),
                              "--model", str(tiny_models.target)])
    assert res.exit_code == 2 and "not both" in res.output

"""The pipeline's steps through the CLI, as a user types them: dataset build -> train ->
score -> export, then ``serve --router mode:NAME`` as a real process on loopback."""

import os
import subprocess
import sys
import time

import pytest
from typer.testing import CliRunner

from modeswitch.cli import app
from tests.helpers import free_port, http, synthetic_profile


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory):
    """A training table built, routers trained, scored and exported, all through the CLI."""
    from modeswitch.dataset.io import write_parquet

    tmp = tmp_path_factory.mktemp("cli")
    prof = tmp / "profile.parquet"
    write_parquet(synthetic_profile(), prof)
    runner = CliRunner()
    mlruns = str(tmp / "mlruns")
    steps = {}

    def invoke(name, args):
        res = runner.invoke(app, args)
        steps[name] = res
        assert res.exit_code == 0, f"{name}: {res.output}"
        return res

    invoke("dataset build", ["dataset", "build", "-p", str(prof), "--requests", "160",
                             "--workloads", "short_prompt_short_output,long_prompt_long_output,"
                             "shared_prefix_chat,batch_pressure", "-o", str(tmp / "train.parquet")])
    invoke("train", ["train", "--data", str(tmp / "train.parquet"), "--routers", "dt,lr",
                     "--trials", "2", "--split", "random", "--mlruns", mlruns])
    invoke("score", ["score", "--data", str(tmp / "train.parquet"), "--mlruns", mlruns,
                     "--decisions", "300", "-o", str(tmp / "report")])
    invoke("export", ["export", "--best", "oracle_match", "--mlruns", mlruns])
    return tmp, steps


def test_dataset_build_writes_a_labelled_table(cli_run):
    import pandas as pd

    tmp, steps = cli_run
    table = pd.read_parquet(tmp / "train.parquet")
    assert len(table) == 160 and table["label"].notna().all()
    assert "wrote 160 requests" in steps["dataset build"].output


def test_train_reports_every_family_and_its_runs(cli_run):
    _, steps = cli_run
    out = steps["train"].output
    assert "dt=" in out and "lr=" in out and "best trial per router family" in out


def test_score_writes_the_report_with_the_rule_baseline(cli_run):
    tmp, steps = cli_run
    assert (tmp / "report" / "README.md").exists() and (tmp / "report" / "headline.csv").exists()
    out = steps["score"].output
    assert "rule" in out and "dt" in out and "lr" in out


def _client(tmp):
    import mlflow

    from modeswitch.routers.training.tracking import tracking_uri

    return mlflow.MlflowClient(tracking_uri(tmp / "mlruns"))


def test_scoring_logs_one_child_run_per_router_with_the_same_metric_keys(cli_run):
    """The MLflow UI compares routers by selecting runs: each router is a child of the
    scoring run, every child with the same metric names and its family as a tag."""
    tmp, _ = cli_run
    client = _client(tmp)
    exp = client.get_experiment_by_name("modeswitch-score")
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert len(parents) == 1
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id]
    by_router = {r.data.tags["router"]: r for r in children}
    assert set(by_router) == {"reference", "rule", "oracle", "dt", "lr"}
    keys = {frozenset(r.data.metrics) for r in children}
    assert len(keys) == 1
    assert {"speedup", "energy_ratio", "violation_rate_quality", "overhead_p50_us"} <= next(iter(keys))
    assert by_router["dt"].data.tags["router_family"] == "dt"
    assert by_router["dt"].data.tags["training_run_id"] == parents[0].data.tags["router_run.dt"]
    assert not parents[0].data.metrics  # no prefixed copies: one chart per figure, a bar per router
    import pandas as pd

    head = pd.read_csv(tmp / "report" / "headline.csv", index_col=0)
    assert by_router["rule"].data.metrics["speedup"] == pytest.approx(head.loc["rule", "speedup"])


def test_training_and_scoring_runs_show_their_dataset(cli_run):
    import pandas as pd

    from modeswitch.oracle.training_table import frame_hash, table_meta

    tmp, _ = cli_run
    client = _client(tmp)
    table = pd.read_parquet(tmp / "train.parquet")
    exp = client.get_experiment_by_name(f"modeswitch-train-{frame_hash(table)}")
    assert exp is not None and exp.tags["mlflow.experimentKind"] == "custom_model_development"
    train_exp = exp.experiment_id
    parents = [r for r in client.search_runs([train_exp]) if "mlflow.parentRunId" not in r.data.tags]
    assert {r.data.tags["router_family"] for r in parents} == {"dt", "lr"}
    for r in parents + client.search_runs([client.get_experiment_by_name("modeswitch-score").experiment_id]):
        inputs = r.inputs.dataset_inputs
        assert len(inputs) == 1, r.info.run_name
        ds, tags = inputs[0].dataset, {t.key: t.value for t in inputs[0].tags}
        assert ds.name == "training-table" and ds.digest == frame_hash(table)
        assert str(tmp / "train.parquet") in ds.source
        assert tags["profile_hash"] == table_meta(table)["profile_hash"]
        assert tags["profile_source"].endswith("profile.parquet")


def test_export_registers_the_champion(cli_run):
    _, steps = cli_run
    assert "registered modeswitch-router version 1 as models:/modeswitch-router@champion" in \
        steps["export"].output


def test_serve_with_a_fixed_mode_answers_on_loopback(tiny_models, tmp_path):
    port = free_port()
    env = {**os.environ, "MODESWITCH_CACHE": str(tmp_path / "cache")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "modeswitch", "serve", "--router", "mode:int8_quant",
         "--model", str(tiny_models.target), "--port", str(port), "--mlruns", str(tmp_path / "m")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True)
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                status, _, _ = http("GET", f"http://127.0.0.1:{port}/health")
                if status == 200:
                    break
            except OSError:
                pass
            assert proc.poll() is None, proc.stdout.read()
            time.sleep(0.5)
        status, headers, text = http("POST", f"http://127.0.0.1:{port}/v1/completions",
                                     {"prompt": "def main():", "max_tokens": 4})
        assert status == 200, text
        assert headers["x-modeswitch-mode"] == "int8_quant"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_serve_with_an_unknown_fixed_mode_is_one_clear_error(tiny_models):
    res = CliRunner().invoke(app, ["serve", "--router", "mode:turbo", "--model", str(tiny_models.target)])
    assert res.exit_code == 2
    assert "mode:turbo" in res.output and "int8_quant" in res.output

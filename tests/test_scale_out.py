"""Tuning and tracking on shared servers: two ``train`` processes on one Optuna study in
PostgreSQL, their MLflow runs in an ``mlflow server`` backed by the same PostgreSQL
instance; a crashed trial marked FAIL by its heartbeat; the exported champion served
by ``mlflow models serve`` with ``load_router``'s decisions.

PostgreSQL comes from Debian's package (``.ci/run`` installs it); each module run
starts a private cluster on a free loopback port (tests.helpers.PostgresCluster)."""

import json
import os
import subprocess
import sys
import time
import urllib.request

import pandas as pd
import pytest
from typer.testing import CliRunner

from modeswitch.cli import app
from tests.helpers import PostgresCluster, free_port, postgres_bin, synthetic_profile

MODESWITCH = [sys.executable, "-m", "modeswitch"]


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    from modeswitch.dataset.io import write_parquet

    tmp = tmp_path_factory.mktemp("scale")
    write_parquet(synthetic_profile(), tmp / "profile.parquet")
    res = CliRunner().invoke(app, ["dataset", "build", "-p", str(tmp / "profile.parquet"), "--requests", "160",
                                   "--workloads", "short_prompt_short_output,long_prompt_long_output,"
                                   "shared_prefix_chat,batch_pressure", "-o", str(tmp / "train.parquet")])
    assert res.exit_code == 0, res.output
    return tmp / "train.parquet"


@pytest.fixture(scope="module")
def postgres():
    pytest.importorskip("psycopg", reason="psycopg is the `distributed` extra (make test installs it)")
    if postgres_bin() is None:
        pytest.skip("PostgreSQL's server programs are not installed (Debian: apt-get install postgresql; "
                    ".ci/run does)")
    cluster = PostgresCluster().start()
    yield cluster
    cluster.stop()


def _wait_http(url, proc, timeout=120):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            raise AssertionError(f"{url}: the server exited ({proc.returncode}): {proc.stdout.read()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise AssertionError(f"{url} did not answer in {timeout} s")


def _stop(proc):
    proc.terminate()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.fixture(scope="module")
def mlflow_server(postgres, tmp_path_factory):
    """``mlflow server`` with a PostgreSQL backend store and proxied artifacts."""
    port = free_port()
    artifacts = tmp_path_factory.mktemp("artifacts")
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", postgres.url("mlflow"),
         "--artifacts-destination", str(artifacts), "--serve-artifacts", "--host", "127.0.0.1",
         "--port", str(port), "--workers", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_http(url + "/health", proc)
        yield url
    finally:
        _stop(proc)


@pytest.mark.slow
def test_two_train_processes_tune_one_study_in_postgres_and_track_in_an_mlflow_server(
        postgres, mlflow_server, table, tmp_path):
    import mlflow
    import mlflow.sklearn
    import optuna

    storage = postgres.url("optuna")
    trials = 12
    args = ["train", "--data", str(table), "--routers", "rf", "--trials", str(trials), "--split", "random",
            "--storage", storage, "--tracking-uri", mlflow_server]
    env = {**os.environ, "MLFLOW_TRACKING_URI": ""}  # only --tracking-uri names the store
    t0 = time.time()
    procs = [subprocess.Popen([*MODESWITCH, *args, "--mlruns", str(tmp_path / f"m{i}"), *extra], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i, extra in enumerate([["--workers", "2"], []])]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out[-3000:]
    wall = time.time() - t0

    summaries = optuna.get_all_study_summaries(storage)
    assert len(summaries) == 1  # one study, whoever ran it
    study = optuna.load_study(study_name=summaries[0].study_name, storage=storage)
    done = [t for t in study.trials if t.state.is_finished()]
    numbers = [t.number for t in study.trials]
    assert len(numbers) == len(set(numbers)) == len(done)  # no trial twice, none left RUNNING
    # stopped together at the budget; trials already running when it was reached still finish
    assert trials <= len(done) <= trials + 2
    workers = {t.user_attrs.get("worker") for t in done}
    assert len(workers) >= 2, workers  # the processes tuned together

    client = mlflow.MlflowClient(tracking_uri=mlflow_server)
    exp = next(e for e in client.search_experiments() if e.name.startswith("modeswitch-train-"))
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) == 2 and all(r.info.status == "FINISHED" for r in parents)
    # every trial logged once, under the training run of the process that ran it
    assert sorted(int(r.info.run_name) for r in children) == sorted(numbers)
    assert {r.data.tags["mlflow.parentRunId"] for r in children} <= {r.info.run_id for r in parents}
    # the models went through the server (proxied artifacts), not to a local folder, and load back
    before, env_before = mlflow.get_tracking_uri(), os.environ.get("MLFLOW_TRACKING_URI")
    mlflow.set_tracking_uri(mlflow_server)  # (it also sets $MLFLOW_TRACKING_URI: restored below)
    try:
        for r in parents:
            assert r.info.artifact_uri.startswith("mlflow-artifacts:/")
            model = client.get_logged_model(r.data.tags["model_uri"].split("/")[-1])
            assert model.artifact_location.startswith("mlflow-artifacts:/")
            est = mlflow.sklearn.load_model(r.data.tags["model_uri"])
            assert len(est.predict(pd.read_parquet(table).head(5))) == 5
    finally:
        mlflow.set_tracking_uri(before)
        if env_before is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        else:
            os.environ["MLFLOW_TRACKING_URI"] = env_before
    # and the runs are rows of the PostgreSQL backend store
    import psycopg

    with psycopg.connect(postgres.url("mlflow")) as conn:
        n = conn.execute("SELECT count(*) FROM runs WHERE experiment_id = %s", (int(exp.experiment_id),)).fetchone()[0]
    assert n == len(runs)
    print(f"two train processes (3 workers), {len(done)} trials, {len(workers)} workers: {wall:.1f} s")


def test_a_crashed_workers_trial_is_marked_failed_by_its_heartbeat(postgres, monkeypatch):
    import optuna
    from optuna.trial import TrialState

    from modeswitch.routers.training import parallel

    monkeypatch.setattr(parallel, "HEARTBEAT_INTERVAL_S", 1)
    monkeypatch.setattr(parallel, "GRACE_PERIOD_S", 2)
    storage = parallel.optuna_storage(postgres.url("heartbeat"))
    study = optuna.create_study(study_name="crash", storage=storage)
    # a worker took a trial, sent its heartbeat and died (no more heartbeats)
    trial = study.ask()
    storage.record_heartbeat(trial._trial_id)
    time.sleep(3)
    # the next worker to start optimising marks it failed before its own trials
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=1)
    states = {t.number: t.state for t in study.trials}
    assert states[trial.number] == TrialState.FAIL
    assert list(states.values()).count(TrialState.COMPLETE) == 1


@pytest.mark.slow
def test_mlflow_models_serve_answers_with_load_routers_decisions(table, tmp_path):
    """The exported champion behind ``mlflow models serve`` (loopback): the same modes as
    ``load_router`` on 50 requests of raw fields."""
    from modeswitch.dataset.workloads import get_workload
    from modeswitch.routers.export import INPUT_COLUMNS, load_router

    mlruns = tmp_path / "mlruns"
    runner = CliRunner()
    for args in (["train", "--data", str(table), "--routers", "dt", "--trials", "2", "--split", "random"],
                 ["score", "--data", str(table), "--decisions", "200", "-o", str(tmp_path / "report")],
                 ["export", "--best", "oracle_match"]):
        res = runner.invoke(app, [*args, "--mlruns", str(mlruns)])
        assert res.exit_code == 0, res.output
    reqs = []
    for i, fam in enumerate(["short_prompt_short_output", "long_prompt_long_output", "shared_prefix_chat",
                             "batch_pressure", "memory_pressure_long_context"]):
        reqs += get_workload(fam).sample(10, seed=i)
    frame = pd.DataFrame([{c: getattr(r, c) for c in INPUT_COLUMNS} for r in reqs])
    frame[["family", "benchmark_suite"]] = frame[["family", "benchmark_suite"]].fillna("none")
    for c in INPUT_COLUMNS[:5]:
        frame[c] = frame[c].astype(float)
    uri = "models:/modeswitch-router@champion"
    expected = load_router(uri, str(mlruns)).predict(None, frame)

    port = free_port()
    # as in an activated venv: MLflow execs `uvicorn` from PATH
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{mlruns.resolve() / 'mlflow.db'}",
           "PATH": f"{os.path.dirname(sys.executable)}:{os.environ.get('PATH', '')}"}
    proc = subprocess.Popen([sys.executable, "-m", "mlflow", "models", "serve", "-m", uri, "--env-manager",
                             "local", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        _wait_http(f"http://127.0.0.1:{port}/ping", proc)
        body = json.dumps({"dataframe_split": frame.to_dict(orient="split", index=False)}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/invocations", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            got = json.loads(r.read())["predictions"]
    finally:
        _stop(proc)
    assert len(got) == len(expected) == 50
    assert got == list(expected)
    assert len(set(got)) >= 2  # the requests differ enough to get different modes


def test_tuning_turns_heartbeats_on_only_for_a_shared_study(table, tmp_path, monkeypatch):
    """An explicit storage (other processes may join) gets heartbeats; the default
    one-process SQLite study does not (each heartbeat is a database write)."""
    from modeswitch.routers.training import parallel
    from modeswitch.routers.training.trainer import TrainConfig, train

    seen = []
    real = parallel.optuna_storage

    def spy(url, shared=True):
        seen.append(shared)
        return real(url, shared)

    monkeypatch.setattr(parallel, "optuna_storage", spy)
    data = pd.read_parquet(table)
    for storage in (f"sqlite:///{tmp_path / 'shared.db'}", None):
        train(data, TrainConfig(routers=["dt"], trials=2, split="random", mlruns=str(tmp_path / "m"),
                                storage=storage))
    assert seen == [True, False]
    import optuna

    study = optuna.load_study(study_name=optuna.get_all_study_summaries(f"sqlite:///{tmp_path / 'shared.db'}")[0]
                              .study_name, storage=f"sqlite:///{tmp_path / 'shared.db'}")
    assert all("worker" in t.user_attrs for t in study.trials)  # which process ran each trial


def test_local_workers_share_the_cores_out(table, tmp_path, monkeypatch):
    """With ``--workers N`` each process's BLAS and OpenMP pools keep to its share of the
    cores (parallel.threads_per_worker), instead of every process starting pools as wide
    as the machine; one process is left as it is."""
    import numpy as np
    from threadpoolctl import threadpool_info

    from modeswitch.routers.training import parallel, trainer
    from modeswitch.routers.training.table import TrainingTable

    cores = len(os.sched_getaffinity(0))
    assert parallel.threads_per_worker(1) == cores
    assert parallel.threads_per_worker(cores * 4) == 1
    seen = []

    def served(est, valid):  # runs inside each trial, in this process
        seen.append(max((p["num_threads"] for p in threadpool_info()), default=0))
        return est.predict(valid), 0.0

    monkeypatch.setattr(trainer, "served_decision", served)
    monkeypatch.setattr(parallel, "tune_in_workers", lambda *a, **k: [])  # this process alone
    data = TrainingTable.read(table)
    cfg = trainer.TrainConfig(routers=["dt"], trials=2, split="random", mlruns=str(tmp_path / "m"), workers=2)
    trainer.tune("dt", cfg, data, np.arange(len(data.frame)), "shared-out")
    assert seen and max(seen) <= parallel.threads_per_worker(2)

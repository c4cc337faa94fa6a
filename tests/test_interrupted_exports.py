"""Interrupted exports and runs: a registered version is never visible without its hashes,
a version without them is refused, a garbage ``meta.json`` is one error, and a run a
killed command left RUNNING is marked FAILED by the next command that opens the store."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import mlflow
import pytest

from modeswitch.dataset.errors import InputError
from tests.helpers import synthetic_table

REPO = Path(__file__).resolve().parents[1]
FAMILIES = ("short_prompt_short_output", "batch_pressure")


def _router():
    from modeswitch.routers import get_router

    table = synthetic_table(FAMILIES, 20)
    return get_router("dt").fit(table, table["label"].astype(str))


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    from modeswitch.routers.export import export_router

    mlruns = tmp_path_factory.mktemp("store") / "mlruns"
    info = export_router(_router(), mlruns=str(mlruns), source_run_id="t", backend="transformers")
    return mlruns, info


def test_a_version_is_created_with_its_hashes_in_one_step(exported, monkeypatch):
    """An export killed after registering (here: before it could move the alias) leaves
    a version that already carries both hashes, so /latest loads it checked."""
    from modeswitch.routers.export import export_router, load_router

    mlruns, _ = exported

    def killed(*a, **k):
        raise KeyboardInterrupt("killed before the alias moved")

    monkeypatch.setattr(mlflow.MlflowClient, "set_registered_model_alias", killed)
    with pytest.raises(KeyboardInterrupt):
        export_router(_router(), mlruns=str(mlruns), source_run_id="t", backend="transformers")
    monkeypatch.undo()
    client = mlflow.MlflowClient()
    latest = max(client.search_model_versions("name = 'modeswitch-router'"), key=lambda v: int(v.version))
    assert {"router_sha256", "meta_sha256"} <= set(latest.tags)
    assert load_router(f"models:/modeswitch-router/{latest.version}", str(mlruns)).modes_


def test_a_version_without_hashes_is_refused(exported):
    from modeswitch.routers.export import load_router

    mlruns, info = exported
    load_router(info["uri"], str(mlruns))  # the tracking URI points at this store from here on
    client = mlflow.MlflowClient()
    client.delete_model_version_tag("modeswitch-router", info["version"], "router_sha256")
    try:
        with pytest.raises(InputError, match="has no recorded hashes"):
            load_router(f"models:/modeswitch-router/{info['version']}", str(mlruns))
    finally:
        client.set_model_version_tag("modeswitch-router", info["version"], "router_sha256",
                                     info["meta"]["sha256"])


@pytest.mark.parametrize("content", ["garbage{", "[1, 2]", "\udcff"])
def test_a_garbage_meta_json_is_one_error(exported, tmp_path, content):
    import shutil

    from modeswitch.routers.export import load_router

    mlruns, info = exported
    [meta] = [p for p in Path(mlruns).rglob("meta.json") if info["meta"]["sha256"] in p.read_text()]
    folder = tmp_path / "router"
    shutil.copytree(meta.parent.parent, folder)
    (folder / "artifacts" / "meta.json").write_bytes(content.encode("utf-8", "surrogateescape"))
    with pytest.raises(InputError, match="meta.json"):
        load_router(str(folder), str(mlruns))


def test_a_run_left_running_by_a_killed_command_is_marked_failed_by_the_next(tmp_path):
    from modeswitch.routers.training.tracking import ORPHANED_TAG, mark_orphaned_runs, setup

    mlruns = tmp_path / "mlruns"
    code = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(REPO)!r})
        import mlflow
        from pathlib import Path
        from modeswitch.routers.training.tracking import setup
        setup(Path({str(mlruns)!r}), "killed")
        run = mlflow.start_run(run_name="killed")
        print(run.info.run_id, flush=True)
        time.sleep(120)
    """)
    # mlflow.set_tracking_uri (earlier tests) exports $MLFLOW_TRACKING_URI: not for this child
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
    killed = p.stdout.readline().strip()
    setup(mlruns, "alive")
    with mlflow.start_run(run_name="alive") as alive:
        assert mark_orphaned_runs() == []  # both owners run: nothing marked
        p.send_signal(signal.SIGKILL)
        p.wait()
        client = mlflow.MlflowClient()
        assert client.get_run(killed).info.status == "RUNNING"
        setup(mlruns, "next")  # the next command that opens the store
        run = client.get_run(killed)
        assert run.info.status == "FAILED" and str(p.pid) in run.data.tags[ORPHANED_TAG]
        assert client.get_run(alive.info.run_id).info.status == "RUNNING"

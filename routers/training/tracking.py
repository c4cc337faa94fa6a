"""MLflow set-up: SQLite backend and artifacts under the project's ``mlruns/``.

Nothing is written outside ``mlruns/`` unless the user names another store:
``--tracking-uri`` (:func:`use_tracking_uri`) or ``MLFLOW_TRACKING_URI`` — e.g. an
``mlflow server`` with a PostgreSQL backend store and proxied artifacts, which
several processes and machines can write at once (SQLite serialises writers). That
store is then used as is, its artifacts where the server puts them. The
environment's setting is read once, at import: ``mlflow.set_tracking_uri`` itself
writes that variable, so reading it later could not tell the user's choice from ours.

Runs a killed command left behind. MLflow ends a run when its ``with`` block exits,
but a kill -9 exits nothing, and the run stays RUNNING for good. So every run this
process starts is tagged with its owner (:data:`OWNER_TAG`: host, pid and the
process's start time, which tells a reused pid apart), and :func:`setup`, which every
command that opens the store calls, marks FAILED each RUNNING run whose owner on this
host is gone. A run still owned by a live process (a second ``train`` on a shared
store) is left alone, as is one started on another host or without the tag.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import time
import warnings
from pathlib import Path

import psutil

_USER_URI = os.environ.get("MLFLOW_TRACKING_URI")

#: MLflow 3's UI opens an experiment by its kind; untagged ones open in the GenAI view
#: (traces, an empty overview). Ours are model training: runs, metrics, charts.
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"

#: a training run tuned per leave-one-family-out fold keeps every fold's parameters in
#: this artifact, by held-out family (the trainer writes it, the score step reads it)
FOLD_PARAMS = "fold_params.json"


def use_tracking_uri(uri: str | None) -> None:
    """Track in ``uri`` (``--tracking-uri``) instead of ``mlruns/`` for the rest of this
    process; None leaves the choice as it is."""
    global _USER_URI
    if uri:
        _USER_URI = uri


def tracking_uri(mlruns: Path) -> str:
    if _USER_URI:
        return _USER_URI
    mlruns = Path(mlruns).resolve()
    mlruns.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{mlruns / 'mlflow.db'}"


def setup(mlruns: Path, experiment: str) -> str:
    """Point MLflow at the store and select (or create) ``experiment``; return its id."""
    import mlflow  # lazy: MLflow is slow to import

    logging.getLogger("mlflow").setLevel(logging.WARNING)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    mlflow.set_tracking_uri(tracking_uri(mlruns))
    exp = mlflow.get_experiment_by_name(experiment)
    if exp is None:
        artifacts = None if _USER_URI else (Path(mlruns).resolve() / "artifacts" / experiment).as_uri()
        try:
            exp_id = mlflow.create_experiment(experiment, artifact_location=artifacts,
                                              tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND})
        except mlflow.exceptions.MlflowException as exc:
            # another process (a second `train` on a shared store) created it meanwhile
            if exc.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
            exp_id = mlflow.get_experiment_by_name(experiment).experiment_id
    else:
        exp_id = exp.experiment_id
        if exp.tags.get(EXPERIMENT_KIND_TAG) != EXPERIMENT_KIND:  # made before the tag existed
            mlflow.MlflowClient().set_experiment_tag(exp_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
    mlflow.set_experiment(experiment_id=exp_id)
    _tag_owner()
    mark_orphaned_runs()
    return exp_id


#: the run tag naming the process that started it: "host pid start-time"
OWNER_TAG = "modeswitch.owner"
#: the tag on a run this module marked FAILED, saying why
ORPHANED_TAG = "modeswitch.orphaned"


def _this_process() -> str:
    return f"{socket.gethostname()} {os.getpid()} {psutil.Process().create_time():.3f}"


def _owner_alive(owner: str) -> bool:
    """Whether the process that ``owner`` names (see :data:`OWNER_TAG`) still runs."""
    _host, pid, started = owner.split()
    try:
        return abs(psutil.Process(int(pid)).create_time() - float(started)) < 0.01
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def _tag_owner() -> None:
    """Every run this process starts carries :data:`OWNER_TAG` (an MLflow run-context
    provider: ``mlflow.start_run`` asks each for its tags)."""
    from mlflow.tracking.context.abstract_context import (  # lazy: MLflow is slow to import
        RunContextProvider,  # lazy: MLflow is slow to import
    )
    from mlflow.tracking.context.registry import (  # lazy: MLflow is slow to import
        _run_context_provider_registry as providers,  # lazy: MLflow is slow to import
    )

    class OwnerContext(RunContextProvider):
        def in_context(self):
            return True

        def tags(self):
            return {OWNER_TAG: _this_process()}

    if not any(type(p).__name__ == "OwnerContext" and type(p).__module__ == __name__ for p in providers):
        providers.register(OwnerContext)


def mark_orphaned_runs() -> list[str]:
    """Mark FAILED every RUNNING run of the store whose owning process on this host is
    gone (killed before it could end the run); return their ids."""
    import mlflow  # lazy: MLflow is slow to import

    client = mlflow.MlflowClient()
    experiments = [e.experiment_id for e in client.search_experiments()]
    if not experiments:
        return []
    host, marked = socket.gethostname(), []
    for run in client.search_runs(experiments, filter_string="attributes.status = 'RUNNING'", max_results=5000):
        owner = run.data.tags.get(OWNER_TAG, "")
        if len(owner.split()) != 3 or owner.split()[0] != host or _owner_alive(owner):
            continue
        client.set_tag(run.info.run_id, ORPHANED_TAG, f"process {owner.split()[1]} ended without ending this run; "
                                                      "marked FAILED by the next command on the store")
        client.set_terminated(run.info.run_id, status="FAILED")
        marked.append(run.info.run_id)
    return marked


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True, cwd=Path(__file__).parent).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def table_input(table, name: str = "training-table"):
    """``table`` (a training table) as an MLflow dataset and its input tags: its content
    hash as the digest, where it was read from as the source (``in-memory`` when it was
    built in Python), the source profile's hash and path as tags. Built once and logged
    on every run that used it (:func:`log_table_input`): MLflow profiles the whole frame."""
    import mlflow.data  # lazy: MLflow is slow to import

    from modeswitch.oracle.training_table import frame_hash  # lazy: pulls scipy

    meta = json.loads(table.attrs.get("modeswitch") or "{}")
    source = str(table.attrs.get("source_path") or "in-memory")
    tags = {"training_table_hash": frame_hash(table), "profile_hash": str(meta.get("profile_hash", "unknown")),
            "profile_source": str(meta.get("profile_source", "unknown"))[:500]}
    with warnings.catch_warnings():  # a plain path is a "local" source; MLflow warns about guessing it
        warnings.simplefilter("ignore")
        ds = mlflow.data.from_pandas(table, source=source, name=name,
                                     targets="label" if "label" in table else None,
                                     digest=tags["training_table_hash"])
    return ds, tags


def log_table_input(table, context: str, prepared=None) -> None:
    """Log ``table`` as the open run's input (the UI's Dataset column); ``prepared``: a
    :func:`table_input` result already built for it."""
    import mlflow  # lazy: MLflow is slow to import

    ds, tags = prepared or table_input(table)
    for attempt in range(3):
        try:
            mlflow.log_input(ds, context=context, tags=tags)
            return
        except mlflow.exceptions.MlflowException as exc:
            # two processes logging the same new dataset at once on a server store: MLflow
            # inserts it twice and the second insert fails; the retry finds it and links it
            if attempt == 2 or "already exists" not in str(exc):
                raise
            time.sleep(0.2)

"""MLflow set-up: SQLite backend and artifacts under the project's ``mlruns/``.

Nothing is written outside ``mlruns/`` unless the user sets ``MLFLOW_TRACKING_URI``
(then that server or store is used as is). The user's setting is read once, at
import: ``mlflow.set_tracking_uri`` itself writes that variable, so reading it
later could not tell the user's choice from ours.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

_USER_URI = os.environ.get("MLFLOW_TRACKING_URI")


def tracking_uri(mlruns: Path) -> str:
    if _USER_URI:
        return _USER_URI
    mlruns = Path(mlruns).resolve()
    mlruns.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{mlruns / 'mlflow.db'}"


def setup(mlruns: Path, experiment: str) -> str:
    """Point MLflow at the store and select (or create) ``experiment``; return its id."""
    import logging

    import mlflow

    logging.getLogger("mlflow").setLevel(logging.WARNING)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    mlflow.set_tracking_uri(tracking_uri(mlruns))
    exp = mlflow.get_experiment_by_name(experiment)
    if exp is None:
        artifacts = None if _USER_URI else (Path(mlruns).resolve() / "artifacts" / experiment).as_uri()
        exp_id = mlflow.create_experiment(experiment, artifact_location=artifacts)
    else:
        exp_id = exp.experiment_id
    mlflow.set_experiment(experiment_id=exp_id)
    return exp_id


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True, cwd=Path(__file__).parent).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"

"""One Optuna study tuned by several processes: ``train --workers N`` on one machine,
or several ``train`` runs (on many machines) sharing ``--storage postgresql://...``.

Optuna already does the coordination: every process asks the shared RDB storage
for its next trial and writes its result there, so the study holds the union of
all processes' trials, each once. What this module adds:

* :func:`optuna_storage`: the storage, with heartbeats when it is shared, so a trial whose process
  crashed (no heartbeat for :data:`GRACE_PERIOD_S`) is marked FAIL by the next
  process that starts optimising, instead of staying RUNNING for ever.
* :func:`tune_in_workers`: ``N - 1`` extra local processes on the same study
  (spawned, so each has its own interpreter and BLAS threads), stopping together
  when the study holds the requested number of finished trials (Optuna's
  ``MaxTrialsCallback``; trials already running then still finish, so a study may
  end up to ``N - 1`` trials over). Their trials are logged as nested MLflow runs
  under the family's training run, like the main process's.

On a shared study (an explicit storage, or several workers) each process seeds its
sampler from the config's seed, its host, process id and worker index, or all of
them would propose the same first parameters. So such a study is not reproducible
trial by trial; a one-process run on the default storage still is.

SQLite (the embedded default) serialises writers: fine for one process, workable
for a few on one machine, wrong across machines. Switch to PostgreSQL when several
processes write at once.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import socket
import time

from modeswitch.dataset.errors import InputError

#: a running trial writes a heartbeat this often ...
HEARTBEAT_INTERVAL_S = 30
#: ... and counts as crashed (FAIL) after this long without one
GRACE_PERIOD_S = 120


def optuna_storage(url: str, shared: bool = True, attempts: int = 5):
    """An RDB storage for ``url`` (sqlite:///..., postgresql://...); with heartbeats when
    ``shared`` (several processes on the study: a lone process has no one to fail its
    crashed trial for, and each heartbeat is a database write).

    Processes starting together on an empty database race to create Optuna's tables
    (PostgreSQL then refuses the loser's ``CREATE TYPE``): the loser waits and
    connects to the tables the winner made."""
    from optuna.storages import RDBStorage  # heavy (optuna, SQLAlchemy): only when tuning

    # lazy: SQLAlchemy comes with MLflow
    from sqlalchemy.exc import IntegrityError, ProgrammingError

    engine_kwargs = {"pool_pre_ping": True} if url.startswith("postgresql") else {}
    for attempt in range(attempts):
        try:
            beat = {"heartbeat_interval": HEARTBEAT_INTERVAL_S, "grace_period": GRACE_PERIOD_S} if shared else {}
            return RDBStorage(url, engine_kwargs=engine_kwargs, **beat)
        except (IntegrityError, ProgrammingError):
            if attempt == attempts - 1:
                raise
            time.sleep(0.5 * (attempt + 1))


def threads_per_worker(workers: int) -> int:
    """The BLAS and OpenMP threads each of ``workers`` local tuning processes may use:
    this machine's cores shared out, at least one. Why: every process's numpy, SciPy
    and scikit-learn start a pool as wide as the machine, so N workers run N times as
    many threads as cores, and OpenBLAS's threads spin while they wait, so a trial
    takes several times as long (docs/scaling-out.md)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, cores // max(1, workers))


def finished_states():
    from optuna.trial import TrialState  # heavy: only when tuning

    return (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)


def sampler_seed(seed: int, worker: int, shared: bool) -> int:
    """A sampler seed: ``seed`` for a study no other process tunes; on a shared study
    (an explicit storage, or several workers) one of its own per process, from the seed,
    host, process id and worker index, so no two processes propose the same trials."""
    if not shared:
        return seed
    key = f"{seed}:{socket.gethostname()}:{os.getpid()}:{worker}".encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:4], "little")


def tune_in_workers(workers: int, target, job: dict, parent_run_id: str | None) -> list:
    """Start ``workers - 1`` processes running ``target(job, worker index, parent_run_id)``
    (the trainer's :func:`~modeswitch.routers.training.trainer.worker_main`: a module-level function,
    as a spawned process imports it); returns them started (the caller optimises in its
    own process meanwhile, then :func:`join_workers`)."""
    ctx = multiprocessing.get_context("spawn")
    procs = []
    for k in range(1, workers):
        p = ctx.Process(target=target, args=(job, k, parent_run_id), name=f"optuna-worker-{k}",
                        daemon=True)
        p.start()
        procs.append(p)
    return procs


def stop_workers(procs) -> None:
    """The main process failed or was interrupted: its workers stop now (their running
    trials are left to the heartbeat), instead of using up the budget meanwhile."""
    for p in procs:
        p.terminate()
    for p in procs:
        p.join(30)


def join_workers(procs) -> None:
    for p in procs:
        p.join()
    bad = [f"{p.name} (exit {p.exitcode})" for p in procs if p.exitcode != 0]
    if bad:
        raise InputError(f"tuning workers failed: {', '.join(bad)}; their finished trials are in the "
                         "study, rerun to complete it")

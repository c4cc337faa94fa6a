"""The child processes one engine starts, so that closing it ends those and no others.

Several engines live in one process (a server's pool holds one per mode), and an engine
whose computation runs in child processes (vLLM's engine core) must leave its neighbours'
children alone when it closes: ending every child of the process would kill the engine
core of a busy neighbour. :class:`OwnChildren` records which children appeared while one
engine started; :meth:`OwnChildren.reap` ends those and their descendants.
"""

from __future__ import annotations

import os
from multiprocessing import resource_tracker

import psutil


def _direct_children() -> set[psutil.Process]:
    """This process's children (psutil compares them by pid and start time, so a reused
    pid is not mistaken for an old child)."""
    return set(psutil.Process().children())


def shared_helper_pids() -> set[int]:
    """Children every engine in the process shares, never one engine's to end: the
    multiprocessing resource tracker, started by whichever engine first needs it."""
    pid = getattr(getattr(resource_tracker, "_resource_tracker", None), "_pid", None)
    return {pid} if pid else set()


class OwnChildren:
    """Child processes started between :meth:`before` and :meth:`after` (one engine's
    start-up; the caller starts one engine at a time, as the server's pool does).

    ``before()`` notes the children already running, ``after()`` keeps the new ones, and
    ``reap()`` ends them with their descendants at close.
    """

    def __init__(self, grace_s: float = 5.0):
        self.grace_s = grace_s
        self._before: set[psutil.Process] | None = None
        self.procs_: list[psutil.Process] = []

    def before(self) -> OwnChildren:
        self._before = _direct_children()
        return self

    def after(self) -> OwnChildren:
        if self._before is None:
            raise RuntimeError("OwnChildren.after() called without before()")
        shared = shared_helper_pids()
        self.procs_ = [p for p in _direct_children() - self._before if p.pid not in shared]
        self._before = None
        return self

    def tree(self) -> list[psutil.Process]:
        """The recorded children and their descendants still alive. Read it before the
        engine's own shutdown: a descendant whose parent exits is re-parented away from
        this process and can no longer be found from it."""
        out = []
        for p in self.procs_:
            try:
                out.extend([p, *p.children(recursive=True)])
            except psutil.NoSuchProcess:
                pass
        return out

    def reap(self, tree: list[psutil.Process] | None = None) -> int:
        """Terminate (then, after ``grace_s``, kill) ``tree`` (default: :meth:`tree`) where
        still alive, and collect the exit statuses of this process's own children among
        them; returns how many were still running."""
        procs = self.tree() if tree is None else tree
        alive = []
        for p in procs:
            try:
                p.terminate()
                alive.append(p)
            except psutil.NoSuchProcess:
                pass
        _, left = psutil.wait_procs(alive, timeout=self.grace_s)
        for p in left:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(left, timeout=self.grace_s)
        for p in self.procs_:  # exited but not waited for (zombies): only our own
            try:
                os.waitpid(p.pid, os.WNOHANG)
            except ChildProcessError:
                pass
        self.procs_ = []
        return len(alive)

"""Closing one engine ends the child processes it started and no other engine's: a server
holds several vLLM engines in one process, each with an engine core of its own."""

import subprocess
import sys
import time
from multiprocessing import resource_tracker

import psutil
import pytest

from modeswitch.engine.backends.processes import OwnChildren

SLEEP = [sys.executable, "-c", "import time; time.sleep(120)"]
# a child that starts a grandchild of its own (as vLLM's engine core starts compile workers)
PARENT = [sys.executable, "-c",
          "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); "
          "time.sleep(120)"]


def _alive(proc: subprocess.Popen) -> bool:
    return proc.poll() is None


def _wait_for_grandchild(proc: subprocess.Popen, timeout: float = 30.0) -> psutil.Process:
    deadline = time.time() + timeout
    while time.time() < deadline:
        kids = psutil.Process(proc.pid).children()
        if kids:
            return kids[0]
        time.sleep(0.05)
    raise AssertionError(f"child {proc.pid} started no grandchild within {timeout:.0f} s")


def test_reap_ends_the_children_started_in_the_window_and_their_descendants_only():
    neighbour = subprocess.Popen(SLEEP)
    try:
        own = OwnChildren(grace_s=2).before()
        child = subprocess.Popen(PARENT)
        resource_tracker.ensure_running()  # shared by every engine: started here, still not own
        own.after()
        grandchild = _wait_for_grandchild(child)
        assert {p.pid for p in own.procs_} == {child.pid}
        assert {p.pid for p in own.tree()} == {child.pid, grandchild.pid}
        assert own.reap() == 2
        assert not _alive(child) and not grandchild.is_running()
        assert _alive(neighbour) and own.procs_ == []
        assert own.reap() == 0  # a second close finds nothing to end
    finally:
        neighbour.kill()
        neighbour.wait()


def test_after_without_before_is_an_error():
    with pytest.raises(RuntimeError, match="before"):
        OwnChildren().after()


def test_closing_one_vllm_engine_leaves_a_neighbours_engine_core_running(tiny_models, monkeypatch):
    """Two engines in one process (as in a server's pool); vLLM's start is replaced by a
    child process standing for its engine core, its shutdown by one that leaves the core
    running (the engine's close must end it). Closing the first leaves the second's core
    alive."""
    from modeswitch.engine.backends.vllm_backend import VllmEngine

    cores = {}

    class Core:
        def shutdown(self):
            pass

    def start(self):
        cores[self.mode.name] = subprocess.Popen(SLEEP)
        self.engine, self._loop = Core(), None

    monkeypatch.setattr(VllmEngine, "_start", start)
    a = VllmEngine("fp16_baseline", tiny_models.target, None, "cpu", max_model_len=256).load()
    b = VllmEngine("continuous_batching", tiny_models.target, None, "cpu", max_model_len=256).load()
    try:
        a.close()
        assert not _alive(cores["fp16_baseline"])
        assert _alive(cores["continuous_batching"]), "closing one engine ended another's core"
    finally:
        b.close()
    assert not _alive(cores["continuous_batching"])

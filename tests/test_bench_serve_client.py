"""The serving bench's own client and CPU accounting (``bench/serve_vs_engine.py``): the
lean stream reader counts what a client sees (text chunks, the routed mode, failures
with their status), and a server's CPU time splits into its own process and its
children. Against the server on test doubles (``test_serving_limits``): no model, no
timing claims (those come from the bench itself)."""

import asyncio
import importlib.util
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.helpers import start
from tests.test_serving_limits import CharTokenizer, Fixed, SlowEngine

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(BENCH))  # the bench reads its sibling serve_load, as when run as a script
    try:
        spec = importlib.util.spec_from_file_location("serve_vs_engine", BENCH / "serve_vs_engine.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        yield mod
    finally:
        sys.path.remove(str(BENCH))


@pytest.fixture(scope="module")
def url():
    from modeswitch.engine.serving import ServerConfig, create_app  # as the serving tests import it

    cfg = ServerConfig(model_path="unused", max_tokens_limit=64, context_tokens=8192)
    app = create_app(lambda: Fixed(), cfg, engine_factory=lambda mode: SlowEngine(mode, 0.001),
                     tokenizer=CharTokenizer(), supported_modes=["fp16_baseline"])
    server, th, port = start(app)
    yield f"http://127.0.0.1:{port}/v1"
    server.should_exit = True
    th.join(timeout=30)


def test_the_client_counts_text_chunks_and_the_routed_mode_of_every_stream(bench, url):
    res = asyncio.run(bench.load(url, [f"prompt {i}" for i in range(6)], concurrency=3, max_tokens=5))
    assert res["failed"] == 0
    # one character per token from the double, so one text chunk per token
    assert res["chunks"] == 5.0
    assert res["modes"] == {"fp16_baseline": 6}
    assert res["req_s"] > 0 and 0 < res["ttft_p50"] <= res["p50"] <= res["p99"]
    # the server's routing stages, read from its /metrics around the burst
    assert {"route", "serving_route"} <= set(res["stages"])


def test_a_burst_measured_against_a_server_gets_cpu_per_request(bench, url):
    class Idle:  # a server process's CPU readings: no time spent
        def cpu_seconds(self):
            return 1.0, 2.0

    # enough streams that reading them takes this process several clock ticks of CPU
    res = asyncio.run(bench.load(url, [f"p{i}" for i in range(100)], concurrency=10, max_tokens=8,
                                 server=Idle(), client_cpu=0))
    assert res["front_ms"] == 0.0 and res["engine_ms"] == 0.0
    assert res["client_ms"] > 0  # this process read the streams
    assert res["failed"] == 0


def test_a_refused_request_is_counted_as_a_failure_with_its_status(bench, url):
    res = asyncio.run(bench.load(url, ["too long an answer"], concurrency=1, max_tokens=65))
    assert res["failed"] == 1 and res["first_failure"].startswith("RuntimeError: HTTP 400")
    assert res["modes"] == {}


def test_cpu_time_splits_into_the_server_process_and_its_children(bench, tmp_path):
    # a "server" that idles while its child burns CPU, as a front end beside its engine
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.4: pass\ntime.sleep(30)"
    parent = f"import subprocess, sys, time\nsubprocess.Popen([sys.executable, '-c', {burn!r}])\ntime.sleep(30)"
    srv = bench.Server("fake", [sys.executable, "-c", parent], 0, None, tmp_path / "log")
    srv.fh = open(srv.log, "a")
    srv.proc = subprocess.Popen(srv.cmd, stdout=srv.fh, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 20
        while (cpu := srv.cpu_seconds())[1] < 0.4 and time.time() < deadline:
            time.sleep(0.1)
        front, engine = cpu
        assert engine >= 0.4 and front < engine
        # the child ends: the time it took still counts
        for child in psutil.Process(srv.proc.pid).children(recursive=True):
            child.kill()
            while time.time() < deadline + 10:  # a zombie until its parent reaps it
                try:
                    if child.status() == psutil.STATUS_ZOMBIE:
                        break
                except psutil.NoSuchProcess:
                    break
                time.sleep(0.05)
        assert srv.cpu_seconds()[1] >= engine
    finally:
        for child in psutil.Process(srv.proc.pid).children(recursive=True):
            child.kill()
        srv.stop()

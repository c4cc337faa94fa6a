"""Hostile and careless use of `modeswitch serve` and the CLI, rerun as one table.

The hardening issue's cases (bad clients, oversized and invalid requests, tampered
routers, CLI input errors, bad profile files) against the real server on the
project's tiny model and the real CLI, each in its own process as a user would run
them. One row per case: what was sent, what came back (HTTP status or exit code),
whether a Python traceback reached the user, and whether the outcome is the one
the server or CLI documents; then the totals the issue's "done when" asks for
(tracebacks shown, 5xx answers, requests left in flight after the disconnects,
the server's peak RSS under load against its memory budget).

    .venv/bin/python bench/hardening_cases.py [--model test-fixture|smollm2|PATH] [--disconnects 50]
        [--memory-budget-mb 1536] [--backend transformers|llamacpp]
        [--only-loading | --only-second-pass | --only-server | --only-third-pass]

The second pass (connection limits, a loop that never stalls, one writer per output,
OS and data errors as one line, interrupted exports and runs) is ``--only-second-pass``.
The third (slow bodies from many loopback addresses, feedback behind its own key and
tied to served requests, ``$MODESWITCH_MODEL`` as every command's default) is
``--only-third-pass``.
A read-only folder and a full disk are a read-only and a 256 KiB tmpfs where this user
may mount one (root in a container), else a mode-0555 folder and the full-disk cases
are skipped, saying so.

Takes 3-5 minutes on 2 cores (most of it starting Python processes and the load).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import skops.io as sio

from modeswitch.dataset.io import sha256_file
from modeswitch.dataset.requests import requests_frame
from modeswitch.dataset.workloads import get_workload
from modeswitch.engine.models.tiny import TEST_RECIPE, build_models
from modeswitch.routers import get_router
from modeswitch.routers.export import export_router, load_router
from modeswitch.routers.training.tracking import tracking_uri

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from tests.helpers import CODE_RUNNERS, crafted_skops, free_port, synthetic_profile, synthetic_table  # noqa: E402

#: the published A100 measurements (absent from a user's clone: their cases are skipped)
A100 = REPO.parent / "shared" / "reference" / "a100"
#: the workload families of the training tables the CLI cases and the exported router use
FAMILIES = ("short_prompt_short_output", "batch_pressure")

ROWS: list[tuple[str, str, str, bool, bool, bool]] = []  # group, case, got, traceback, 5xx, as documented


def row(group: str, case: str, got: str, ok: bool, traceback: bool = False, five: bool = False):
    ROWS.append((group, case, got, traceback, five, ok))
    print(f"  {'ok ' if ok else 'BAD'} {group:<8} {case:<58} {got}", flush=True)


# ------------------------------------------------------------------------ the CLI
def _child_env() -> dict:
    """This process's environment less $MLFLOW_TRACKING_URI, which ``mlflow.set_tracking_uri``
    (the exports here) sets: a command must find its store through its own --mlruns."""
    return {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}


def cli(args: list[str], cwd: Path, env: dict | None = None, timeout: float = 300) -> tuple[int, str]:
    try:
        p = subprocess.run([sys.executable, "-m", "modeswitch", *args], cwd=cwd, capture_output=True, text=True,
                           timeout=timeout, env={**_child_env(), **(env or {})})
    except subprocess.TimeoutExpired as exc:  # e.g. a `serve` that started: not the refusal expected
        out = (exc.stdout or b"").decode(errors="replace") + (exc.stderr or b"").decode(errors="replace")
        return 124, out + f"\n(still running after {timeout:.0f} s: stopped)"
    return p.returncode, p.stdout + p.stderr


def cli_case(group: str, case: str, args: list[str], cwd: Path, want_exit: int | tuple = 2, must_say: str = "",
             **kw):
    code, out = cli(args, cwd, **kw)
    tb = "Traceback (most recent call last)" in out
    said = must_say.lower() in out.lower()
    lines = [ln.strip() for ln in out.splitlines() if ln.strip() and not set(ln.strip()) <= set("╭╮╰╯─│ ")]
    last = next((ln for ln in reversed(lines) if ln.lower().startswith("error")), lines[-1] if lines else "")
    want = want_exit if isinstance(want_exit, tuple) else (want_exit,)
    row(group, case, f"exit {code}: {last[:90]}", code in want and not tb and said, traceback=tb)


def tables(tmp: Path) -> dict[str, Path]:
    """Training tables and profile files for the CLI cases (the tests' synthetic profile)."""

    table = synthetic_table(FAMILIES, 30)
    out = {}
    one = table[table["label"] == table["label"].iloc[0]].copy()
    out["one_class"] = tmp / "one_class.parquet"
    one.to_parquet(out["one_class"])
    out["three_rows"] = tmp / "three.parquet"
    table.head(3).to_parquet(out["three_rows"])
    prof = synthetic_profile()
    out["profile"] = tmp / "profile.parquet"
    prof.to_parquet(out["profile"])
    out["no_latency"] = tmp / "no_latency.parquet"
    prof.drop(columns=["latency_ms"]).to_parquet(out["no_latency"])
    out["inf_latency"] = tmp / "inf.parquet"
    prof.assign(latency_ms=np.inf).to_parquet(out["inf_latency"])
    out["twice"] = tmp / "twice.parquet"
    pd.concat([prof, prof]).to_parquet(out["twice"])
    out["string_latency"] = tmp / "string.csv"
    prof.assign(latency_ms="fast").to_csv(out["string_latency"], index=False)
    out["empty"] = tmp / "empty.parquet"
    out["empty"].write_bytes(b"")
    out["binary"] = tmp / "binary.csv"
    out["binary"].write_bytes(os.urandom(4096))
    trials = A100 / "profiles_a100_curated_sweep_trials.csv"
    if trials.exists():
        t = pd.read_csv(trials)
        idx = next(c for c in t.columns if "trial" in c.lower())
        wl = next(c for c in t.columns if "workload" in c.lower())
        out["trials"] = tmp / "trials.csv"
        t.head(20).to_csv(out["trials"], index=False)
        out["fractional_trial"] = tmp / "fractional.csv"
        t.assign(**{idx: t[idx].astype(float) + 0.5}).head(20).to_csv(out["fractional_trial"], index=False)
        out["empty_workload"] = tmp / "empty_workload.csv"
        t2 = t.head(20).copy()
        t2[wl] = t2[wl].astype(object)
        t2.loc[t2.index[0], wl] = ""
        t2.to_csv(out["empty_workload"], index=False)
    return out


def cli_cases(tmp: Path, mlruns: Path, uri: str):
    print("CLI")
    t = tables(tmp)
    for bad in ("models:/nope@champion", "models:/modeswitch-router@nosuchalias", "models:/modeswitch-router/99",
                "models:/", "runs:/deadbeef/model", "garbage::uri"):
        cli_case("cli", f"serve --router {bad}", ["serve", "--router", bad, "--mlruns", str(mlruns)], tmp)
    cli_case("cli", "serve --port 70000", ["serve", "--router", "rule", "--port", "70000"], tmp)
    cli_case("cli", "export --run deadbeef", ["export", "--run", "deadbeef", "--mlruns", str(mlruns)], tmp)
    if "fractional_trial" in t:
        for key in ("fractional_trial", "empty_workload"):
            cli_case("cli", f"import-profiles ({key.replace('_', ' ')})",
                     ["import-profiles", str(t[key]), "-o", str(tmp / f"{key}.parquet")], tmp)
    else:
        row("cli", "import-profiles cases", "skipped: ../shared/reference/a100 absent", True)
    ro = tmp / "readonly"
    ro.mkdir()
    ro.chmod(0o555)
    as_root = os.geteuid() == 0  # root writes through a read-only mode bit
    target = Path("/proc/modeswitch-out.parquet") if as_root else ro / "out.parquet"
    cli_case("cli", "requests -o onto a read-only path", ["requests", "--workloads", "batch_pressure", "-n", "4",
                                                          "-o", str(target)], tmp)
    cli_case("cli", "requests -o onto a directory", ["requests", "--workloads", "batch_pressure", "-n", "4",
                                                     "-o", str(tmp)], tmp)
    m2 = tmp / "mlruns-train"
    cli_case("cli", "train lr on a one-class table", ["train", "--data", str(t["one_class"]), "--routers", "lr",
                                                      "--trials", "2", "--split", "random", "--mlruns", str(m2)],
             tmp, want_exit=(0, 2))
    cli_case("cli", "train --split group on 3 rows", ["train", "--data", str(t["three_rows"]), "--routers", "dt",
                                                      "--trials", "2", "--split", "group", "--mlruns", str(m2)],
             tmp)
    half = _half_written_runs(m2)
    row("cli", "train: MLflow runs left RUNNING", f"{half} running", half == 0)
    print("profile files")
    for key in ("no_latency", "inf_latency", "twice", "string_latency", "empty", "binary"):
        cli_case("files", f"validate ({key.replace('_', ' ')})", ["validate", str(t[key])], tmp)
    if "trials" in t:
        cli_case("files", "import-profiles of one file twice",
                 ["import-profiles", str(t["trials"]), str(t["trials"]), "-o", str(tmp / "dup.parquet")], tmp)
        aggregates = tmp / "aggregates.parquet"
        cli(["import-profiles", str(A100 / "profiles_a100_curated_sweep.csv"), "-o", str(aggregates)], tmp)
        cli_case("files", "label an import of aggregate rows alone", ["label", "-p", str(aggregates)], tmp,
                 want_exit=0)
    journal = tmp / "torn.parquet.journal.jsonl"
    journal.write_text("")
    code, out = cli(["profile", "--quick", "--modes", "fp16_baseline", "--workloads", "short_prompt_short_output",
                     "--requests", "1", "--trials", "1", "-o", str(tmp / "torn.parquet")], tmp, timeout=600)
    tb = "Traceback (most recent call last)" in out
    row("files", "profile over an empty journal (killed before its header)", f"exit {code}",
        code == 0 and not tb and (tmp / "torn.parquet").exists(), traceback=tb)


def _half_written_runs(mlruns: Path) -> int:
    """RUNNING runs in the SQLite store, read with sqlite3 itself (read-only): an MLflow
    client opening a store another process is still creating races its schema set-up."""
    db = mlruns / "mlflow.db"
    if not db.exists():
        return 0
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10) as con:
            return con.execute("SELECT count(*) FROM runs WHERE status = 'RUNNING'").fetchone()[0]
    except sqlite3.OperationalError:  # the schema not created yet
        return 0


# --------------------------------------------------------------------- the server
#: the engine backend every served case runs (--backend)
BACKEND = "transformers"


class Server:
    def __init__(self, args: list[str], tmp: Path):
        self.port = free_port()
        self.log = open(tmp / f"serve-{self.port}.log", "w")  # noqa: SIM115 - closed in stop
        self.proc = subprocess.Popen([sys.executable, "-m", "modeswitch", "serve", "--port", str(self.port),
                                      "--backend", BACKEND, *args],
                                     cwd=tmp, stdout=self.log, stderr=subprocess.STDOUT, env=_child_env())
        deadline = time.time() + 300
        while time.time() < deadline:
            try:
                if self.get("/health")[0] == 200:
                    self.base_mb = self.rss_mb()  # before any engine: they load on first use
                    return
            except OSError:
                time.sleep(0.5)
        raise SystemExit(f"the server did not start; see {self.log.name}")

    def request(self, method: str, path: str, body: bytes | None = None, headers: dict | None = None,
                timeout: float = 120):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            c.request(method, path, body=body, headers=headers or {})
            r = c.getresponse()
            return r.status, r.read(), dict(r.getheaders())
        finally:
            c.close()

    def get(self, path: str, **kw):
        return self.request("GET", path, **kw)

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def in_flight(self, key: str) -> float:
        _, body, _ = self.get("/metrics", headers={"Authorization": f"Bearer {key}"})
        for line in body.decode().splitlines():
            if line.startswith("modeswitch_in_flight "):
                return float(line.split()[1])
        return float("nan")

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def openai_shaped(body: bytes) -> bool:
    try:
        err = json.loads(body)["error"]
        return isinstance(err, dict) and {"message", "type"} <= set(err)
    except (ValueError, KeyError, TypeError):
        return False


def usage_case(post, path: str, messages: list):
    """A stream with ``stream_options.include_usage``: its last event before ``[DONE]`` has
    no choices and the token counts, as OpenAI's and vLLM's servers send it."""
    status, body, _ = post(path, {"model": "modeswitch", "messages": messages, "max_tokens": 4, "stream": True,
                                  "stream_options": {"include_usage": True}})
    events = [e[6:] for e in body.decode(errors="replace").split("\n\n") if e.startswith("data: ")]
    try:
        last = json.loads(events[-2]) if events[-1:] == ["[DONE]"] and len(events) >= 2 else {}
    except ValueError:
        last = {}
    usage = last.get("usage") or {}
    ok = status == 200 and last.get("choices") == [] and usage.get("completion_tokens", 0) > 0
    row("server", "a stream with stream_options.include_usage", f"{status}, last event's usage {usage}", ok,
        five=status >= 500)


def server_cases(tmp: Path, key: str, disconnects: int, budget: float, mlruns: Path, uri: str):
    print("server")
    keyfile = tmp / "key"
    keyfile.write_text(key + "\n")
    srv = Server(["--router", "rule", "--api-key-file", str(keyfile), "--memory-budget-mb", str(budget),
                  "--max-in-flight", "256", "--header-timeout-s", str(HEADER_TIMEOUT_S),
                  "--body-timeout-s", str(BODY_TIMEOUT_S)], tmp)
    auth = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    try:
        def post(path, payload, raw: bytes | None = None, headers=None):
            body = raw if raw is not None else json.dumps(payload).encode()
            return srv.request("POST", path, body, {**auth, **(headers or {})})

        def case(name, path, payload, want: int, raw=None, headers=None, says: str = ""):
            t0 = time.perf_counter()
            status, body, _ = post(path, payload, raw, headers)
            took = time.perf_counter() - t0
            shaped = status == 200 or openai_shaped(body)
            said = says.lower() in body.decode(errors="replace").lower()
            row("server", name, f"{status} in {took * 1000:.0f} ms" + ("" if shaped else ", not OpenAI's shape")
                + ("" if said else f", without {says!r}"), status == want and shaped and said, five=status >= 500)

        chat = "/v1/chat/completions"
        msg = [{"role": "user", "content": "hello"}]
        case("a normal chat request", chat, {"model": "modeswitch", "messages": msg, "max_tokens": 4}, 200)
        case("a 200,000-character prompt", "/v1/completions",
             {"model": "modeswitch", "prompt": "word " * 40_000, "max_tokens": 4}, 400)
        case("a 20 MB body", "/v1/completions", None, 413, raw=b'{"prompt": "' + b"a" * 20_000_000 + b'"}')
        case("max_tokens over the server's limit", "/v1/completions",
             {"model": "modeswitch", "prompt": "hello", "max_tokens": 4000}, 400, says="limit")
        case("prompt + max_tokens over the context", "/v1/completions",
             {"model": "modeswitch", "prompt": "x " * 9000, "max_tokens": 1000}, 400, says="context")
        case("a lone surrogate in the prompt", "/v1/completions", None, 400,
             raw=b'{"model": "modeswitch", "prompt": "\\ud800", "max_tokens": 4}')
        for name, extra, want in (("n=2", {"n": 2}, 400), ("temperature=-1", {"temperature": -1}, 400),
                                  ("top_p=7", {"top_p": 7}, 400), ("max_tokens: true", {"max_tokens": True}, 400),
                                  ("unknown model", {"model": "gpt-5"}, 404)):
            case(name, chat, {"model": "modeswitch", "messages": msg, "max_tokens": 4, **extra}, want)
        case("role 'hacker'", chat, {"model": "modeswitch", "messages": [{"role": "hacker", "content": "x"}]}, 400)
        case("logprobs: true (no engine returns them)", chat,
             {"model": "modeswitch", "messages": msg, "max_tokens": 4, "logprobs": True}, 400, says="logprobs")
        case("a stop list of 10,000 strings", chat,
             {"model": "modeswitch", "messages": msg, "max_tokens": 4, "stop": ["x"] * 10_000}, 400, says="stop")
        usage_case(post, chat, msg)
        case("an undecodable body", chat, None, 400, raw=b"\xff\xfe{not json")
        case("a JSON array body", chat, None, 400, raw=b"[1, 2, 3]")
        case("JSON arrays nested 100,000 deep", chat, None, 400, raw=b"[" * 100_000, says="nested too deeply")
        status, body, _ = srv.request("GET", "/v1/nothing-here", headers=auth)
        row("server", "GET an unknown path", f"{status}", status == 404 and openai_shaped(body), five=status >= 500)
        status, body, _ = srv.request("DELETE", chat, headers=auth)
        row("server", "DELETE /v1/chat/completions", f"{status}", status == 405 and openai_shaped(body),
            five=status >= 500)
        for path in ("/docs", "/openapi.json"):
            status, _, _ = srv.get(path)
            row("server", f"GET {path} without the key", f"{status}", status == 401)
        status, _, _ = srv.get("/metrics")  # documented: liveness and metrics stay open to probes
        row("server", "GET /metrics without the key (open to probes)", f"{status}", status == 200)
        status, _, _ = srv.request("POST", chat, json.dumps({"messages": msg}).encode(),
                                   {"Authorization": "Bearer wrong", "Content-Type": "application/json"})
        row("server", "a wrong key", f"{status}", status == 401)
        # clients that hang up: half streamed, half whole, some after the first bytes
        body = lambda stream: json.dumps({"model": "modeswitch", "messages": msg, "max_tokens": 512,  # noqa: E731
                                          "stream": stream}).encode()
        socks = []
        for i in range(disconnects):
            s = socket.create_connection(("127.0.0.1", srv.port))
            b = body(i % 2 == 0)
            s.sendall(f"POST {chat} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
                      f"Content-Type: application/json\r\nContent-Length: {len(b)}\r\n\r\n".encode() + b)
            if i % 4 == 0:
                s.recv(64)
            socks.append(s)
        time.sleep(0.5)
        busy = srv.in_flight(key)
        for s in socks:
            s.close()
        t_closed, left = time.time(), None
        while time.time() < t_closed + 60:
            left = srv.in_flight(key)
            if left == 0:
                break
            time.sleep(0.1)
        took = time.time() - t_closed
        # 50 x 512 tokens would take minutes on this model: back to 0 in seconds means
        # the hung-up requests stopped generating
        row("server", f"{disconnects} clients hang up mid-request (max_tokens 512)",
            f"in flight {busy:.0f} before, {left:.0f} {took:.1f} s after", left == 0 and took < 10)
        st, after, _ = post(chat, {"model": "modeswitch", "messages": msg, "max_tokens": 4})
        mode = json.loads(after).get("modeswitch", {}).get("mode", "?") if st == 200 else "-"
        row("server", "the next request after them", f"{st}, routed to {mode}", st == 200, five=st >= 500)
        connection_cases(srv, key)
        # load: 200 concurrent requests while RSS is sampled
        peak, stop = [srv.rss_mb()], threading.Event()

        def sample():
            while not stop.is_set():
                peak.append(srv.rss_mb())
                time.sleep(0.2)

        statuses: list[int | str] = []

        def client(i):
            p = {"model": "modeswitch", "max_tokens": 32,
                 "messages": [{"role": "user", "content": f"def handler_{i}(request):"}]}
            try:
                statuses.append(post(chat, p)[0])
            except OSError as exc:  # a timeout or a reset: counted, not lost with the thread
                statuses.append(type(exc).__name__)

        th = threading.Thread(target=sample, daemon=True)
        th.start()
        clients = [threading.Thread(target=client, args=(i,)) for i in range(200)]
        t0 = time.perf_counter()
        for c in clients:
            c.start()
        for c in clients:
            c.join()
        stop.set()
        th.join()
        wall = time.perf_counter() - t0
        counts = {s: statuses.count(s) for s in sorted(set(statuses), key=str)}
        row("server", "200 concurrent requests (--max-in-flight 256)", f"{counts} in {wall:.1f} s",
            counts == {200: 200}, five=any(isinstance(s, int) and s >= 500 for s in counts))
        top = max(peak)
        health = json.loads(srv.get("/health")[1])
        mem = health.get("engine_memory_mb", {})
        row("server", f"peak RSS under that load vs --memory-budget-mb {budget:.0f}",
            f"{top:,.0f} MB (server before engines {srv.base_mb:,.0f} MB; engines counted "
            + ", ".join(f"{m} {v:,.0f} MB" for m, v in mem.items())
            + f" = {srv.base_mb + sum(mem.values()):,.0f} MB counted; {health.get('unloads', 0)} unloaded)",
            top <= budget)
    finally:
        srv.stop()
    # a tampered router: one byte of the stored router changed
    [stored] = list(mlruns.rglob("router.skops"))
    data = bytearray(stored.read_bytes())
    data[len(data) // 2] ^= 0xFF
    stored.write_bytes(bytes(data))
    cli_case("server", "serve a router whose stored bytes changed", ["serve", "--router", uri, "--mlruns",
                                                                     str(mlruns)], tmp, must_say="recorded at export")


#: the bench server's timeouts (`serve --header-timeout-s / --body-timeout-s`; defaults 10 s
#: and 30 s): shorter, so the cases that wait for them take seconds
HEADER_TIMEOUT_S = 3.0
BODY_TIMEOUT_S = 3.0
#: `serve --max-connections-per-peer`'s default
PEER_CAP = 256


def _closed_after(s: socket.socket, limit: float) -> float | None:
    """Seconds until the server closed ``s`` (EOF or reset), None if still open after ``limit``."""
    t0 = time.perf_counter()
    s.settimeout(limit)
    try:
        while s.recv(4096):
            pass
    except TimeoutError:
        return None
    except OSError:
        pass
    return time.perf_counter() - t0


def connection_cases(srv: Server, key: str):
    """Silent, trickling and stalled clients, and a request of 270,000 tiny messages."""
    auth = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    chat = "/v1/chat/completions"
    one = json.dumps({"model": "modeswitch", "messages": [{"role": "user", "content": "hi"}],
                      "max_tokens": 2}).encode()
    srv.request("POST", chat, one, auth)  # the mode's engine loaded: its first request pays for that
    silent = []
    for _ in range(300):  # from another loopback address than the real requests below
        s = socket.socket()
        s.bind(("127.0.0.2", 0))
        s.connect(("127.0.0.1", srv.port))
        silent.append(s)
    opened = time.perf_counter()
    time.sleep(0.3)
    capped = 0
    for s in silent:
        s.setblocking(False)
        try:
            capped += s.recv(1) == b""
        except BlockingIOError:
            pass
        except OSError:
            capped += 1
        s.setblocking(True)
    took, statuses = [], []
    for path, body in ((chat, one), ("/health", None), (chat, one)):
        t0 = time.perf_counter()
        statuses.append(srv.request("POST" if body else "GET", path, body, auth)[0])
        took.append(time.perf_counter() - t0)
    row("conn", "300 silent connections from one address, then real requests",
        f"{statuses}, slowest {max(took) * 1000:.0f} ms; {capped} closed by the per-address cap ({PEER_CAP})",
        statuses == [200, 200, 200] and max(took) < 2.0 and capped == 300 - PEER_CAP, five=any(x >= 500 for x in statuses))
    t_left = _closed_after(silent[-1], HEADER_TIMEOUT_S + 5)
    t_left = None if t_left is None else time.perf_counter() - opened
    row("conn", f"a silent connection (--header-timeout-s {HEADER_TIMEOUT_S:g})",
        f"closed {t_left:.1f} s after it opened" if t_left else "still open",
        t_left is not None and t_left <= HEADER_TIMEOUT_S + 1)
    for s in silent:
        s.close()
    # headers trickled one byte every 0.2 s: bytes do not extend the deadline
    s = socket.create_connection(("127.0.0.1", srv.port))
    t0, closed = time.perf_counter(), False
    for ch in (b"POST " + chat.encode() + b" HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 200):
        try:
            s.send(bytes([ch]))
        except OSError:
            closed = True
            break
        if _closed_after(s, 0.2) is not None:
            closed = True
            break
    took = time.perf_counter() - t0
    s.close()
    row("conn", "headers trickled a byte every 0.2 s", f"closed after {took:.1f} s" if closed else "still open",
        closed and took <= HEADER_TIMEOUT_S + 1)
    # a body announced as 5,000 bytes, 20 sent
    s = socket.create_connection(("127.0.0.1", srv.port))
    s.sendall(f"POST {chat} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\nContent-Type: "
              "application/json\r\nContent-Length: 5000\r\n\r\n".encode() + b'{"messages": [{"role"')
    t_body = _closed_after(s, BODY_TIMEOUT_S + 10)
    s.close()
    row("conn", f"a body announced as 5,000 bytes, 20 sent (--body-timeout-s {BODY_TIMEOUT_S:g})",
        f"closed after {t_body:.1f} s" if t_body else "still open",
        t_body is not None and t_body <= BODY_TIMEOUT_S + 1)
    # many tiny messages: /health keeps answering while they are refused
    for n in (100_000, 270_000):
        body = json.dumps({"model": "modeswitch", "messages": [{"role": "user", "content": ""}] * n},
                          separators=(",", ":")).encode()
        got, health = {}, []

        def big(body=body, got=got):
            try:
                got["status"], got["text"], _ = srv.request("POST", chat, body, auth)
            except OSError as exc:  # refused by its length before the client finished sending
                got["status"], got["text"] = 413, str(exc).encode()

        th = threading.Thread(target=big)
        th.start()
        while th.is_alive():
            t0 = time.perf_counter()
            srv.get("/health")
            health.append(time.perf_counter() - t0)
        th.join()
        worst = max(health) * 1000
        row("loop", f"{n:,} empty messages while /health is polled",
            f"{got['status']} ({got['text'][:60]!r}...); /health {len(health)} times, slowest {worst:.0f} ms",
            got["status"] in (400, 413) and worst < 100, five=got["status"] >= 500)


def _slow_bodies(port: int, key: str, path: str, count: int, addresses: int) -> list[socket.socket]:
    """``count`` connections from ``addresses`` loopback addresses (127.0.0.2 on), each with
    complete headers and the first bytes of a 5,000-byte body."""
    socks = []
    for i in range(count):
        s = socket.socket()
        s.bind((f"127.0.0.{2 + i % addresses}", 0))
        s.connect(("127.0.0.1", port))
        s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\nContent-Type: "
                  "application/json\r\nContent-Length: 5000\r\n\r\n".encode() + b'{"messages": [')
        socks.append(s)
    return socks


def slow_body_cases(srv: Server, key: str):
    """300 slow bodies with the key from 200 addresses: other clients are served at once."""
    auth = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    chat = "/v1/chat/completions"
    one = json.dumps({"model": "modeswitch", "messages": [{"role": "user", "content": "hi"}],
                      "max_tokens": 2}).encode()
    srv.request("POST", chat, one, auth)  # the mode's engine loaded: its first request pays for that
    socks = _slow_bodies(srv.port, key, chat, 300, 200)
    stop = threading.Event()

    def trickle():  # a byte on each every 0.5 s, bounded by the body timeout
        for _ in range(int(BODY_TIMEOUT_S / 0.5)):
            if stop.wait(0.5):
                return
            for s in socks:
                try:
                    s.send(b" ")
                except OSError:
                    pass

    th = threading.Thread(target=trickle, daemon=True)
    th.start()
    time.sleep(0.5)
    took, statuses = [], []
    for path, body in ((chat, one), ("/health", None), (chat, one)):
        t0 = time.perf_counter()
        statuses.append(srv.request("POST" if body else "GET", path, body, auth)[0])
        took.append(time.perf_counter() - t0)
    answered = 0
    for s in socks:
        s.setblocking(False)
        try:
            answered += s.recv(12).startswith(b"HTTP/1.1 503")
        except OSError:
            pass
    stop.set()
    th.join()
    for s in socks:
        s.close()
    row("conn", "300 slow bodies with the key from 200 addresses, then real requests",
        f"{statuses}, slowest {max(took) * 1000:.0f} ms; {answered} slow bodies answered 503",
        statuses == [200, 200, 200] and max(took) < 1.0 and answered == 0, five=any(x >= 500 for x in statuses))


def feedback_cases(srv: Server, key: str, admin: str):
    """Feedback takes the admin key, checked before the body is read."""
    url = "/admin/feedback"
    socks = _slow_bodies(srv.port, "wrong", url, 50, 50)
    t0, refused = time.perf_counter(), 0
    for s in socks:
        s.settimeout(2.0)
        try:
            refused += s.recv(12) == b"HTTP/1.1 401"
        except OSError:
            pass
        s.close()
    row("feedback", "50 slow bodies without a key from 50 addresses",
        f"{refused} answered 401 in {time.perf_counter() - t0:.2f} s", refused == 50)
    status, body, _ = srv.request("POST", url, b'{"violated": [tru', {"Content-Type": "application/json"})
    row("feedback", "a malformed body without a key", f"{status} {body[:60]!r}", status == 401, five=status >= 500)
    flood = json.dumps({"outcomes": [{"id": "chatcmpl-x", "violated": True}] * 10}).encode()
    statuses = {srv.request("POST", url, flood, {"Authorization": f"Bearer {key}"})[0] for _ in range(200)}
    row("feedback", "200 posts of outcomes with the API key", f"statuses {sorted(statuses)}", statuses == {401})
    status, body, _ = srv.request("POST", url, flood, {"Authorization": f"Bearer {admin}"})
    row("feedback", "outcomes with the admin key, to a router that does not adapt",
        f"{status} {body[:70]!r}", status == 409, five=status >= 500)


def third_pass_cases(tmp: Path):
    """Slow bodies, feedback and the environment's model (``--only-third-pass``)."""
    key, admin = "k-" + os.urandom(8).hex(), "a-" + os.urandom(8).hex()
    (tmp / "key").write_text(key + "\n")
    srv = Server(["--router", "rule", "--api-key-file", str(tmp / "key"), "--admin-key", admin,
                  "--header-timeout-s", str(HEADER_TIMEOUT_S), "--body-timeout-s", str(BODY_TIMEOUT_S)], tmp)
    try:
        print("server: slow bodies and feedback")
        slow_body_cases(srv, key)
        feedback_cases(srv, key, admin)
    finally:
        srv.stop()
    print("cli: $MODESWITCH_MODEL as every --model's default")
    missing = str(tmp / "no-such-model")
    for args in (["serve", "--router", "rule"], ["quality-sweep", "-o", "q.parquet"],
                 ["profile", "-o", "p.parquet"], ["model", "build"]):
        cli_case("env", f"{args[0]} {args[1]} with $MODESWITCH_MODEL a missing folder", args, tmp,
                 want_exit=(1, 2), must_say="no-such-model", env={"MODESWITCH_MODEL": missing}, timeout=120)


def _rewrite_registered(mlruns: Path, stored: Path, data: bytes) -> None:
    """Replace a registered router's file and rewrite every recorded hash to match, as an
    attacker who can write the store would (the hashes are integrity, not authentication)."""

    old = sha256_file(stored)
    stored.write_bytes(data)
    meta = stored.parent / "meta.json"
    meta.write_text(meta.read_text().replace(old, sha256_file(stored)))
    mlflow.set_tracking_uri(tracking_uri(mlruns))
    client = mlflow.MlflowClient()
    for mv in client.search_model_versions("name = 'modeswitch-router'"):
        client.set_model_version_tag(mv.name, mv.version, "router_sha256", sha256_file(stored))
        client.set_model_version_tag(mv.name, mv.version, "meta_sha256", sha256_file(meta))


def loading_cases(tmp: Path):
    """Stored routers crafted to run code or hang the loader, loaded by `serve` through the
    registry with its hashes rewritten to match: each refused by name, nothing run."""
    print("router loading")
    for i, function in enumerate(sorted(CODE_RUNNERS)):
        mlruns, uri = exported_router(tmp / f"payload{i}")
        [stored] = list(mlruns.rglob("router.skops"))
        marker = tmp / f"payload{i}" / "code-ran"
        _rewrite_registered(mlruns, stored, crafted_skops(
            stored.read_bytes(), function, f"open({str(marker)!r}, 'w').write('ran')"))
        for via in (uri, str(stored.parent.parent)):
            code, out = cli(["serve", "--router", via, "--mlruns", str(mlruns)], tmp, timeout=120)
            named = function in out and "Traceback" not in out
            row("loading", f"{function.rsplit('.', 1)[1]} via {'registry' if via == uri else 'folder'}",
                f"exit {code}, named: {named}, code ran: {marker.exists()}",
                code == 2 and named and not marker.exists())
    mlruns, uri = exported_router(tmp / "cyclic")
    [stored] = list(mlruns.rglob("router.skops"))

    est = sio.load(stored, trusted=sio.get_untrusted_types(file=stored))
    tr = est.pipeline_.named_steps["clf"].tree_
    tr.children_left[int(max(i for i in range(tr.node_count) if tr.children_left[i] >= 0))] = 0
    _rewrite_registered(mlruns, stored, sio.dumps(est))

    t0 = time.perf_counter()
    try:
        load_router(uri, str(mlruns))
        got, ok = "loaded", False
    except ValueError as exc:
        got, ok = str(exc)[:70], True
    took = time.perf_counter() - t0
    row("loading", "a decision tree whose children form a cycle", f"{took * 1000:.0f} ms: {got}", ok and took < 1.0)


# --------------------------------------------------------------- the second pass
MOUNTS: list[Path] = []


def _tmpfs(where: Path, options: str) -> bool:
    """Mount a small tmpfs at ``where`` (only root may; False where it cannot)."""
    where.mkdir()
    if os.geteuid() != 0:
        return False
    ok = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)],
                        capture_output=True).returncode == 0
    if ok:
        MOUNTS.append(where)
    return ok


def _unmount():
    while MOUNTS:
        subprocess.run(["umount", str(MOUNTS.pop())], capture_output=True)


def second_pass_cases(tmp: Path, mlruns: Path, uri: str):
    """One writer per output, OS and data errors as one line, options and TOML values
    out of range, interrupted exports and runs."""
    print("second pass: OS errors, data errors, options")
    table = synthetic_table(FAMILIES, 30)
    data = tmp / "sp-table.parquet"
    table.to_parquet(data)
    ro = tmp / "sp-readonly"
    if _tmpfs(ro, "ro,size=64k"):
        how = "a read-only tmpfs"
    else:
        ro.chmod(0o555)
        how = "mode 0555"
    if os.geteuid() == 0 and how == "mode 0555":
        row("os", "read-only folder cases", "skipped: root writes through mode 0555 and cannot mount here", True)
    else:
        quick = ["--quick", "--modes", "fp16_baseline", "--workloads", "short_prompt_short_output"]
        for case, args in (
                ("requests -o", ["requests", "--workloads", "batch_pressure", "-n", "4", "-o", str(ro / "r.jsonl")]),
                ("profile -o", ["profile", *quick, "-o", str(ro / "p.parquet")]),
                ("train --mlruns", ["train", "--data", str(data), "--routers", "dt", "--trials", "1",
                                    "--mlruns", str(ro / "m")]),
                ("serve --mlruns", ["serve", "--router", uri, "--mlruns", str(ro / "m")])):
            cli_case("os", f"{case} in a read-only folder ({how})", args, tmp, must_say=str(ro))
    full = tmp / "sp-full"
    if _tmpfs(full, "size=256k"):
        cli_case("os", "requests -n 5000 on a full disk (a 256 KiB tmpfs)",
                 ["requests", "-n", "5000", "-o", str(full / "r.jsonl")], tmp, must_say="no space left")
        synthetic_profile_path = tmp / "sp-profile.parquet"

        synthetic_profile().to_parquet(synthetic_profile_path)
        cli_case("os", "dataset build on a full disk", ["dataset", "build", "-p", str(synthetic_profile_path),
                                                         "-o", str(full / "t.parquet"), "--requests", "20000"],
                 tmp, must_say="no space left")
        left = sorted(p.name for p in full.iterdir())
        row("os", "files left on the full disk after both", f"{len(left)} {left[:3]}", not left)
    else:
        row("os", "full disk cases", "skipped: no tmpfs can be mounted here", True)
    cli_case("os", "serve --api-key-file naming a directory", ["serve", "--router", "rule", "--api-key-file", str(tmp)],
             tmp, must_say="is a directory")
    one = tmp / "sp-one-row.parquet"
    table.head(1).to_parquet(one)
    cli_case("data", "train --split random on a 1-row table", ["train", "--data", str(one), "--routers", "dt",
                                                               "--trials", "1", "--split", "random", "--mlruns",
                                                               str(tmp / "sp-m1")], tmp, must_say="1 row")
    huge = tmp / "sp-huge.parquet"

    reqs = requests_frame(get_workload("batch_pressure").sample(2, 0))
    reqs["prompt_tokens"] = reqs["prompt_tokens"].astype(float)
    reqs.loc[0, "prompt_tokens"] = 1e300
    reqs.to_parquet(huge)
    cli_case("data", "route a request with prompt_tokens 1e300", ["route", "--requests", str(huge)], tmp,
             must_say="prompt_tokens")
    huge_table = tmp / "sp-huge-table.parquet"
    bad = table.copy()
    bad.loc[0, "prompt_tokens"] = 1e300
    bad.to_parquet(huge_table)
    cli_case("data", "train on a table with prompt_tokens 1e300", ["train", "--data", str(huge_table), "--routers",
                                                                  "lr", "--trials", "1", "--mlruns",
                                                                  str(tmp / "sp-m-huge")], tmp, must_say="prompt_tokens")
    [meta] = [p for p in mlruns.rglob("meta.json")][:1]
    garbage = tmp / "sp-garbage-meta"
    shutil.copytree(meta.parent.parent, garbage)
    (garbage / "artifacts" / "meta.json").write_text("{not json" + "\x00" * 8)
    cli_case("data", "serve a stored router whose meta.json is garbage", ["serve", "--router", str(garbage),
                                                                          "--mlruns", str(mlruns)],
             tmp, must_say="meta.json")
    print("second pass: options and study.toml values out of range")
    for option, value in (("--memory-budget-mb", "-5"), ("--max-tokens-limit", "0"), ("--route-budget-us", "-1")):
        cli_case("options", f"serve {option} {value}", ["serve", "--router", "rule", option, value], tmp,
                 must_say=option, timeout=60)
    for key, value in (("requests_per_family", "1e20"), ("length_scale", "inf")):
        text = (REPO / "study.toml").read_text()
        lines = [f"{key} = {value}" if ln.split("=")[0].strip() == key else ln for ln in text.splitlines()]
        cfg = tmp / f"sp-study-{key}.toml"
        cfg.write_text("\n".join(lines) + "\n")
        cli_case("options", f"study.toml {key} = {value}", ["study", "run", "--config", str(cfg), "-o",
                                                             str(tmp / "sp-study")], tmp, must_say=key)
    print("second pass: one writer per output")
    out = tmp / "sp-twice.parquet"
    args = ["profile", "--quick", "--modes", "fp16_baseline", "--workloads", "short_prompt_short_output",
            "-o", str(out)]
    first = subprocess.Popen([sys.executable, "-m", "modeswitch", *args], cwd=tmp, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, env=_child_env())
    lock = out.with_name(out.name + ".journal.jsonl.lock")
    deadline = time.time() + 300
    while not lock.exists() and first.poll() is None and time.time() < deadline:
        time.sleep(0.1)
    code, text = cli(args, tmp)
    first_out, _ = first.communicate(timeout=900)
    journal = out.with_name(out.name + ".journal.jsonl")
    keys = [(r["request_id"], r["mode"], r["trial"], r.get("attempt", 0)) for r in
            (json.loads(ln) for ln in journal.read_text().splitlines()[1:]) if "kind" not in r] \
        if journal.exists() else []
    named = f"pid {first.pid}" in text
    row("writer", "a second profile on the output of one running",
        f"exit {code}, holder's pid named: {named}; first exit {first.returncode}; "
        f"journal {len(keys)} rows, {len(keys) - len(set(keys))} duplicated",
        code == 2 and named and first.returncode == 0 and bool(keys) and len(keys) == len(set(keys)),
        traceback="Traceback" in text + first_out)
    print("second pass: interrupted exports and runs")
    nohash, nohash_uri = exported_router(tmp / "sp-nohash")

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{nohash.resolve() / 'mlflow.db'}")
    client.delete_model_version_tag("modeswitch-router", "1", "router_sha256")
    cli_case("export", "serve a registered version without hashes", ["serve", "--router", "models:/modeswitch-router/1",
                                                                     "--mlruns", str(nohash)], tmp,
             must_say="no recorded hashes")
    killed_store = tmp / "sp-mlruns-killed"
    big = tmp / "sp-big.parquet"
    synthetic_table(FAMILIES, 200).to_parquet(big)
    victim = subprocess.Popen([sys.executable, "-m", "modeswitch", "train", "--data", str(big), "--routers", "dt",
                               "--trials", "200", "--mlruns", str(killed_store)], cwd=tmp,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_child_env())
    deadline = time.time() + 300
    while _half_written_runs(killed_store) == 0 and victim.poll() is None and time.time() < deadline:
        time.sleep(0.5)
    victim.kill()
    victim.wait()
    before = _half_written_runs(killed_store)
    code, _ = cli(["train", "--data", str(data), "--routers", "dt", "--trials", "1", "--mlruns", str(killed_store)],
                  tmp)
    after = _half_written_runs(killed_store)
    row("runs", "train killed -9 mid-run, then the next command on its store",
        f"{before} RUNNING after the kill, {after} after the next command (exit {code})",
        before > 0 and after == 0 and code == 0)


def exported_router(tmp: Path) -> tuple[Path, str]:

    table = synthetic_table(FAMILIES, 30)
    est = get_router("dt").fit(table, table["label"].astype(str))
    mlruns = tmp / "mlruns"
    info = export_router(est, mlruns=str(mlruns), source_run_id="hardening", backend="transformers")
    return mlruns, info["uri"]


def connection_pass(tmp: Path) -> None:
    """The connection and event-loop cases against a server of their own."""
    key = "k-" + os.urandom(8).hex()
    (tmp / "key").write_text(key + "\n")
    srv = Server(["--router", "rule", "--api-key-file", str(tmp / "key"),
                  "--header-timeout-s", str(HEADER_TIMEOUT_S), "--body-timeout-s", str(BODY_TIMEOUT_S)], tmp)
    try:
        print("server: connections and the loop")
        connection_cases(srv, key)
    finally:
        srv.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--disconnects", type=int, default=50)
    ap.add_argument("--memory-budget-mb", type=float, default=1536)
    ap.add_argument("--model", default="test-fixture",
                    help="the model every served and CLI case runs: 'test-fixture' (the tiny model's test "
                         "recipe, built here in seconds: the cases are about the server and the CLI, and the "
                         "memory budget is sized for it), 'smollm2', 'tiny' or a checkpoint folder")
    ap.add_argument("--backend", default="transformers", help="the engine backend the served cases run")
    ap.add_argument("--only-server", action="store_true",
                    help="the served cases alone: requests, disconnects, connections and the loop")
    ap.add_argument("--skip-cli", action="store_true")
    ap.add_argument("--only-loading", action="store_true", help="the stored-router cases alone")
    ap.add_argument("--only-second-pass", action="store_true",
                    help="the second pass alone: connection limits, the loop, writers, OS and data errors")
    ap.add_argument("--only-third-pass", action="store_true",
                    help="the third pass alone: slow bodies, feedback, the environment's model")
    args = ap.parse_args()
    global BACKEND
    BACKEND = args.backend
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="hardening-") as d:
        tmp = Path(d)
        model = args.model
        if model == "test-fixture":
            model = str(build_models(tmp / "models", TEST_RECIPE, log=lambda *a: None).target)
        os.environ["MODESWITCH_MODEL"] = model  # every child command's default --model
        try:
            if args.only_third_pass:
                third_pass_cases(tmp)
                return _summary(t0)
            mlruns, uri = exported_router(tmp)
            if args.only_second_pass:
                connection_pass(tmp)
                second_pass_cases(tmp, mlruns, uri)
                return _summary(t0)
            if args.only_server:
                server_cases(tmp, "k-" + os.urandom(8).hex(), args.disconnects, args.memory_budget_mb, mlruns, uri)
                connection_pass(tmp)
                return _summary(t0)
            loading_cases(tmp)
            if args.only_loading:
                return _summary(t0)
            server_cases(tmp, "k-" + os.urandom(8).hex(), args.disconnects, args.memory_budget_mb, mlruns, uri)
            if not args.skip_cli:
                cli_cases(tmp, mlruns, uri)
                second_pass_cases(tmp, mlruns, uri)
            third_pass_cases(tmp)
        finally:
            _unmount()
            for ro in ("readonly", "sp-readonly"):
                (tmp / ro).exists() and (tmp / ro).chmod(0o755)
    return _summary(t0)


def _summary(t0: float) -> int:
    bad = [r for r in ROWS if not r[5]]
    print(f"\n{len(ROWS)} cases in {time.time() - t0:.0f} s: {len(ROWS) - len(bad)} as documented, "
          f"{sum(r[3] for r in ROWS)} tracebacks shown, {sum(r[4] for r in ROWS)} answers 5xx")
    for g, c, got, *_ in bad:
        print(f"  not as documented: {g} {c}: {got}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

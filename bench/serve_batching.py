"""Serving a continuous-batching engine: concurrent requests in one batch vs one at a time.

In one process, two servers on loopback with the same router (always
``continuous_batching``) and the same model: one lets concurrent requests join
the engine's running batch (``batch_across_requests``, the default), the other
serves them one at a time (``--one-at-a-time``, how every engine served before).
Load rounds alternate between the two (the machine's drift falls on both), each
round ``--requests`` chats with at most ``--concurrency`` in flight. Prints
requests/s, latency p50/p99 per server (median over rounds) and the ratio, and the
largest batch the engine saw.

    .venv/bin/python bench/serve_batching.py [--requests 32] [--concurrency 16] [--max-tokens 32] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import openai

from modeswitch.engine.models.resolve import resolve_models
from modeswitch.engine.serving import ServerConfig, create_app
from modeswitch.routers.reference import FixedModeRouter


def load_round(client, n: int, concurrency: int, max_tokens: int, seed: int):
    """(requests/s, latency p50 ms, latency p99 ms) of one round."""
    def one(i):
        t0 = time.perf_counter()
        out = client.chat.completions.create(
            model="modeswitch", max_tokens=max_tokens,
            messages=[{"role": "user", "content": f"def task_{seed}_{i}(items):\n    result = []"}])
        assert out.usage.completion_tokens > 0
        return (time.perf_counter() - t0) * 1000

    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        lat = list(pool.map(one, range(n)))
    wall = time.perf_counter() - t0
    return n / wall, float(np.percentile(lat, 50)), float(np.percentile(lat, 99))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--model", default="tiny")
    args = ap.parse_args()

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

    # the repository's test helpers: importable once the repo root is on sys.path

    from tests.helpers import start

    target, _, _ = resolve_models(args.model, None, None, None, print, modes=())
    servers = {}
    for name, shared in (("one batch", True), ("one at a time", False)):
        cfg = ServerConfig(model_path=str(target), batch_across_requests=shared)
        app = create_app(lambda: FixedModeRouter(mode="continuous_batching").fit(), cfg,
                         supported_modes=["fp16_baseline", "continuous_batching"])
        srv, _, port = start(app)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0,
                               timeout=600)
        load_round(client, 2, 2, 4, seed=-1)  # load the engine and warm up
        servers[name] = (srv, app, client, [])
    for r in range(args.rounds):
        for _srv, _app, client, results in servers.values():
            results.append(load_round(client, args.requests, args.concurrency, args.max_tokens, seed=r))
    print(f"{args.requests} chats per round, {args.concurrency} in flight, {args.max_tokens} tokens each, "
          f"{args.rounds} rounds alternating; median over rounds")
    print(f"{'server':<15} {'requests/s':>11} {'p50 ms':>9} {'p99 ms':>9} {'largest batch':>14}")
    rows = {}
    for name, (srv, app, _, results) in servers.items():
        rps, p50, p99 = (statistics.median(x) for x in zip(*results))
        pool = app.state.serving.pool
        eng = pool.acquire("continuous_batching")
        pool.release("continuous_batching")
        rows[name] = rps
        print(f"{name:<15} {rps:11.2f} {p50:9.0f} {p99:9.0f} {eng.info.get('max_requests_in_batch', 0):>14}")
        srv.should_exit = True
    print(f"throughput ratio (one batch / one at a time): {rows['one batch'] / rows['one at a time']:.2f}x")


if __name__ == "__main__":
    main()

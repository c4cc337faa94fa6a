"""Load test: N concurrent chat requests against a running `modeswitch serve`.

Bounded: at most --concurrency requests in flight, --requests in all. Prints
throughput, end-to-end latency p50/p99, failures, the modes chosen, and routing
time p50/p99 both from the per-response ``x-modeswitch-route-us`` header (exact)
and from the server's Prometheus histogram (bucket estimate).

    .venv/bin/python bench/serve_load.py --url http://127.0.0.1:8000/v1 --requests 200 --concurrency 200
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import re
import time
import urllib.request

import numpy as np
import openai

from modeswitch.engine.serving.metrics import STAGES


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """Prometheus-style quantile from cumulative (upper bound, count) buckets."""
    total = buckets[-1][1]
    if total == 0:
        return float("nan")
    rank, prev_b, prev_c = q * total, 0.0, 0.0
    for b, c in buckets:
        if c >= rank:
            if b == float("inf"):
                return prev_b
            return prev_b + (b - prev_b) * (rank - prev_c) / max(c - prev_c, 1e-12)
        prev_b, prev_c = b, c
    return prev_b


def metrics_text(base: str) -> str:
    with urllib.request.urlopen(base + "/metrics") as r:
        return r.read().decode()


def routing_buckets(base: str, stage: str | None = None, text: str | None = None) -> list[tuple[float, float]]:
    """The routing histogram's cumulative buckets, or one stage's of modeswitch_stage_seconds,
    from ``text`` (one read of ``/metrics`` for several stages) or a fresh read."""
    text = metrics_text(base) if text is None else text
    out = []
    name = "modeswitch_routing_seconds_bucket" if stage is None else "modeswitch_stage_seconds_bucket"
    for line in text.splitlines():
        if not line.startswith(name + "{") or (stage is not None and f'stage="{stage}"' not in line):
            continue
        le = re.search(r'le="([^"]+)"', line).group(1)
        out.append((float(le), float(line.rsplit(" ", 1)[1])))
    return out




async def run(args):

    base = args.url.rsplit("/v1", 1)[0]
    before = routing_buckets(base)

    text = metrics_text(base)
    before_stage = {st: routing_buckets(base, st, text) for st in STAGES}
    client = openai.AsyncOpenAI(base_url=args.url, api_key=args.api_key, max_retries=0, timeout=args.timeout)
    sem = asyncio.Semaphore(args.concurrency)
    lat, route_us, modes, failures = [], [], collections.Counter(), []

    async def one(i):
        async with sem:
            t0 = time.perf_counter()
            try:
                raw = await client.chat.completions.with_raw_response.create(
                    model="modeswitch", max_tokens=args.max_tokens,
                    messages=[{"role": "user", "content": f"def handler_{i}(request):"}])
                raw.parse()
            except Exception as exc:  # noqa: BLE001 - counted and reported
                failures.append(f"{type(exc).__name__}: {exc}")
                return
            lat.append(time.perf_counter() - t0)
            route_us.append(float(raw.headers["x-modeswitch-route-us"]))
            modes[raw.headers["x-modeswitch-mode"]] += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(args.requests)))
    wall = time.perf_counter() - t0
    after = routing_buckets(base)
    delta = [(b, c - dict(before).get(b, 0.0)) for b, c in after]
    print(f"requests {args.requests}, concurrency {args.concurrency}, max_tokens {args.max_tokens}")
    print(f"completed {len(lat)}, failed {len(failures)} in {wall:.1f} s: "
          f"{len(lat) / wall:.2f} requests/s")
    if lat:
        print(f"latency p50 {np.percentile(lat, 50) * 1000:.0f} ms, p99 {np.percentile(lat, 99) * 1000:.0f} ms")
        print(f"routing (headers) p50 {np.percentile(route_us, 50):.2f} us, p99 {np.percentile(route_us, 99):.2f} us")
    print(f"routing (/metrics histogram, this run) p50 ~{histogram_quantile(0.5, delta) * 1e6:.2f} us, "
          f"p99 ~{histogram_quantile(0.99, delta) * 1e6:.2f} us")
    after_text = metrics_text(base)
    for st in STAGES:
        got = routing_buckets(base, st, after_text)
        if not got:
            continue
        d = [(b, c - dict(before_stage[st]).get(b, 0.0)) for b, c in got]
        print(f"stage {st:<14} p50 ~{histogram_quantile(0.5, d) * 1e6:10.2f} us, "
              f"p99 ~{histogram_quantile(0.99, d) * 1e6:10.2f} us (server histogram, bucket estimate)")
    print("modes: " + ", ".join(f"{m} {n}" for m, n in modes.most_common()))
    for f in failures[:5]:
        print("failure:", f)
    return 1 if failures else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000/v1")
    ap.add_argument("--api-key", default="none")
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--concurrency", type=int, default=200)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--timeout", type=float, default=600)
    raise SystemExit(asyncio.run(run(ap.parse_args())))


if __name__ == "__main__":
    main()

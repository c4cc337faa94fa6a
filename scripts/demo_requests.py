"""Send a few requests of different shapes to a running `modeswitch serve` with the
`openai` client and print the mode the router chose for each (used by `make demo`).

    .venv/bin/python scripts/demo_requests.py [--url http://127.0.0.1:8000/v1]
"""

from __future__ import annotations

import argparse
import json
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import openai
from rich.console import Console
from rich.table import Table

SYSTEM = ("You are a code assistant for the Python standard library. Answer with code only. "
          "Keep names short, prefer the standard library, and never invent modules. ") * 6


def wait_ready(url: str, timeout: float = 180.0):
    base = url.rsplit("/v1", 1)[0]
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(base + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise SystemExit(f"server at {base} not ready after {timeout:.0f} s")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000/v1")
    ap.add_argument("--api-key", default="none")
    args = ap.parse_args()
    wait_ready(args.url)
    c = openai.OpenAI(base_url=args.url, api_key=args.api_key, max_retries=0, timeout=300)
    rows = []

    def record(label, raw, t0):
        body = raw.parse()
        ms = body.model_extra.get("modeswitch", {})
        usage = body.usage
        rows.append((label, raw.headers.get("x-modeswitch-mode"), raw.headers.get("x-modeswitch-route-us"),
                     f"{(time.perf_counter() - t0) * 1000:.0f}", str(usage.prompt_tokens),
                     str(usage.completion_tokens), ms.get("fallback") or "-"))

    t0 = time.perf_counter()
    record("short completion", c.completions.with_raw_response.create(
        model="modeswitch", prompt="def read_config(path):", max_tokens=16), t0)
    t0 = time.perf_counter()
    record("long output", c.completions.with_raw_response.create(
        model="modeswitch", prompt="class Parser:\n    def __init__(self):", max_tokens=128), t0)
    t0 = time.perf_counter()
    record("long prompt", c.completions.with_raw_response.create(
        model="modeswitch", prompt=open(json.__file__).read()[:3000], max_tokens=16), t0)
    for i in range(2):
        t0 = time.perf_counter()
        record(f"shared system prompt #{i + 1}", c.chat.completions.with_raw_response.create(
            model="modeswitch", max_tokens=24,
            messages=[{"role": "system", "content": SYSTEM},
                      {"role": "user", "content": f"open a file number {i}"}]), t0)

    def one(i):
        t = time.perf_counter()
        return i, t, c.chat.completions.with_raw_response.create(
            model="modeswitch", max_tokens=24, messages=[{"role": "user", "content": f"import os  # {i}"}])

    with ThreadPoolExecutor(8) as ex:
        for i, t, raw in ex.map(one, range(8)):
            record(f"burst of 8, #{i + 1}", raw, t)
    t0 = time.perf_counter()
    pieces = [ch.choices[0].delta.content or "" for ch in c.chat.completions.create(
        model="modeswitch", max_tokens=24, stream=True,
        messages=[{"role": "user", "content": "def main():"}])]
    rows.append(("streamed chat", "(see /metrics)", "-", f"{(time.perf_counter() - t0) * 1000:.0f}",
                 "-", str(sum(1 for p in pieces if p)) + " chunks", "-"))

    table = Table(title="requests through the router (chosen mode per request)")
    for col in ("request", "mode", "route us", "latency ms", "prompt tok", "output tok", "fallback"):
        table.add_column(col)
    for r in rows:
        table.add_row(*r)
    Console(width=140).print(table)
    base = args.url.rsplit("/v1", 1)[0]
    with urllib.request.urlopen(base + "/metrics") as r:
        metrics = r.read().decode()
    wanted = ("modeswitch_requests_total{", "modeswitch_routing_seconds_count", "modeswitch_routing_seconds_sum",
              "modeswitch_fallbacks_total{")
    print("\n".join(line for line in metrics.splitlines() if line.startswith(wanted)))


if __name__ == "__main__":
    main()

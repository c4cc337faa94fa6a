"""The serving path's routing cost (prefix index, features, decision), warm and cold.

Why cold: in a server under load the routing code runs once per request between
HTTP parsing, JSON, pydantic, tokenising and the engine's own kernels, which evict
its instructions and data from the CPU caches; a hot loop (``bench/routing_overhead.py``)
keeps them cached and so shows the floor, not what ``/metrics`` reports under load.
Here every timed step runs either back to back (warm) or after a pass over 4 MB of
memory and a JSON dump of 2,000 small dicts (cold: roughly the caches a busy server
leaves; a last-level cache larger than 4 MB keeps some lines, so it is an
approximation; the server's own ``/metrics`` stages under load are the measure).

Rows, in one process, interleaved in rounds: the old ``Request(...)`` constructor vs
``serving_request`` (what the server's ``route()`` inlines), the prefix index on a 30-token prompt,
the rule baseline's and a compiled LightGBM router's decision, and ``features +
decision`` (the server's ``serving_route`` stage), and an empty timed call (the
timer's own cost) so the rest can be read against it.

    .venv/bin/python bench/serving_path.py [--decisions 4000] [--rounds 8]
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from modeswitch.dataset.requests import Request, serving_request
from modeswitch.engine.serving.pool import PrefixTracker
from modeswitch.engine.serving.routing import route
from modeswitch.routers import get_router
from modeswitch.routers.rule_baseline import RuleBaselineRouter


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--decisions", type=int, default=4000, help="timed calls per row and state")
    ap.add_argument("--rounds", type=int, default=8, help="rows interleaved in this many rounds")
    args = ap.parse_args()

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

    # the repository's test helpers: importable once the repo root is on sys.path

    from tests.helpers import synthetic_table

    table = synthetic_table(["short_prompt_short_output", "long_prompt_short_output", "shared_prefix_chat",
                             "batch_pressure"], 300)
    rule = RuleBaselineRouter().fit()
    lgbm = get_router("lgbm", feature_set="A", n_estimators=100).fit(table, table["label"].astype(str))
    compiled = lgbm.compile()
    rng = random.Random(0)
    prompts = [[rng.randrange(32000) for _ in range(30)] for _ in range(256)]
    tracker = PrefixTracker()
    cycle = itertools.cycle(prompts)  # the next prompt costs one C call, not a random draw
    req = serving_request("cmpl-0", 30, 32, 0, 64, 0.0)

    def features():
        return serving_request("cmpl-0", 30, 32, 0, 64, 0.0)

    # the server's own routing function, each row on a state with what it reads; the
    # stages it times go to lists, so a row shows what the server's histogram records

    modes = set(table["label"].astype(str)) | {"fp16", "continuous_batching"}
    fixed = get_router("reference", mode="continuous_batching").fit()
    recorded: dict[str, list[float]] = {}

    def served(name, router):
        sink = SimpleNamespace(observe=lambda s: None)
        stages = {"features": sink, "route": sink, "serving_route": SimpleNamespace(
            observe=recorded.setdefault(name, []).append)}
        state = SimpleNamespace(config=SimpleNamespace(reference="fp16", route_budget_us=1e9), modes=modes,
                                metrics=SimpleNamespace(routing=sink, stages=stages, fallbacks=SimpleNamespace(
                                    labels=lambda reason: SimpleNamespace(inc=lambda: None))),
                                memory_pressure=0.0)
        return lambda: route(state, router, "cmpl-0", 30, 32, 0, 64)

    steps = {
        "empty (timer only)": lambda: None,
        "Request(...) (before)": lambda: Request(id="cmpl-0", prompt_tokens=30, expected_output_tokens=32,
                                                 shared_prefix_tokens=0, concurrent_requests=64,
                                                 memory_pressure=0.0),
        "serving_request (features)": features,
        "prefix index, 30 tokens": lambda: tracker.observe(next(cycle)),
        "rule decision": lambda: rule.route(req),
        "lgbm compiled decision": lambda: compiled.route(req),
        "features + rule": lambda: rule.route(features()),
        "features + lgbm compiled": lambda: compiled.route(features()),
        "route(): fixed mode": served("route(): fixed mode", fixed),
        "route(): rule": served("route(): rule", rule),
        "route(): lgbm compiled": served("route(): lgbm compiled", compiled),
    }
    big = np.ones(4_000_000, dtype=np.uint8)
    junk = [{"id": i, "text": str(i)} for i in range(2000)]

    def evict():
        big.sum()
        json.dumps(junk)

    times = {(name, cold): [] for name in steps for cold in (False, True)}
    kept = {key: [] for key in times if key[0] in recorded}  # what route() recorded itself
    per_round = max(1, args.decisions // args.rounds)
    for f in steps.values():  # warm-up: specialised bytecode, loaded pages
        for _ in range(200):
            f()
    for _ in range(args.rounds):
        for name, f in steps.items():
            for cold in (False, True):
                out = times[(name, cold)]
                for _ in range(per_round):
                    if cold:
                        evict()
                    t0 = time.perf_counter_ns()
                    f()
                    out.append(time.perf_counter_ns() - t0)
                    if name in recorded:
                        kept[(name, cold)].append(recorded[name].pop() * 1e9)
    print(f"{per_round * args.rounds} timed calls per cell, {args.rounds} interleaved rounds; microseconds")
    print(f"{'step':<34} {'warm p50':>9} {'warm p99':>9} {'cold p50':>9} {'cold p99':>9} {'cold/warm':>10}")
    rows = [(name, times) for name in steps]
    rows += [(name, kept) for name in recorded]
    for name, source in rows:
        w = np.asarray(source[(name, False)]) / 1e3
        c = np.asarray(source[(name, True)]) / 1e3
        name = f"{name} (recorded)" if source is kept else name
        wp, cp = np.percentile(w, 50), np.percentile(c, 50)
        print(f"{name:<34} {wp:9.2f} {np.percentile(w, 99):9.2f} {cp:9.2f} {np.percentile(c, 99):9.2f} "
              f"{cp / wp:9.1f}x")


if __name__ == "__main__":
    main()

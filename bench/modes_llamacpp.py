"""Each mode on llama.cpp, side by side with the transformers backend and bare llama.cpp.

One run, one machine, every engine loaded at once and trials interleaved (trial t of
every engine back to back, so drift falls on all alike); each figure is the median of
the trials not flagged as contended (another process took more than ``--busy`` cores
meanwhile, read from ``/proc/stat``; all trials where none is clean, and said so).

1. **Decode and prefill tokens/s per mode**, one request of real benchmark text
   (``--prompt-tokens``, ``--new-tokens``, greedy, end of answer ignored):
   * the llama.cpp backend (llama-server, through the backend's own client);
   * the transformers backend in its modes with the same weights' formats;
   * bare llama.cpp: ``llama-bench`` on the same GGUF files (``pp`` and ``tg``), so the
     difference to the backend is what the server and its client cost.
   Each mode's decode is also set against the memory-bandwidth bound of its weight
   bytes (a decode step reads every weight once): bandwidth / weight bytes, with the
   bandwidth measured here by copying a buffer larger than the last-level cache.
2. **The scenarios the serving modes are for**, on the llama.cpp backend:
   * a shared-prefix request after its prefix was seen: prefix caching against the
     reference (each trial starts from an emptied cache primed with the prefix);
   * ``--batch`` requests arriving together: continuous batching against the reference
     serving them one after another (the group's latency: its last answer).

    make bench-modes [BENCH_ARGS="--trials 5 --threads 2"]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from modeswitch.dataset.requests import Request
from modeswitch.dataset.workloads.conditions import primer
from modeswitch.engine import prompts
from modeswitch.engine.backends import registry
from modeswitch.engine.backends.base import EngineSettings, start_unit
from modeswitch.engine.backends.llamacpp_backend import QSPEC_DRAFT, WEIGHTS, weight_key
from modeswitch.engine.energy import process_tree_cpu_seconds
from modeswitch.engine.hardware import hardware_string
from modeswitch.engine.models import gguf
from modeswitch.engine.models.llamacpp_tools import build_tools
from modeswitch.engine.models.resolve import resolve_models
from modeswitch.engine.modes import get_mode, reference_mode
from modeswitch.engine.noise import TrialClock

LLAMACPP_MODES = ["fp16_baseline", "int8_quant", "gptq_4bit", "awq_4bit", "kv_cache_compression",
                  "chunked_prefill", "ngram_speculative_decoding", "quantized_draft_speculative",
                  "speculative_decoding"]
TRANSFORMERS_MODES = ["fp16_baseline", "int8_quant", "gptq_4bit"]


def memory_bandwidth_gbs(mb: int = 512, reps: int = 5) -> float:
    """Best-of-``reps`` copy bandwidth (bytes read + written per second) of a ``mb`` buffer."""
    src = np.ones(mb * 2**20 // 8)
    dst = np.empty_like(src)
    best = 0.0
    for _ in range(reps):
        t = time.perf_counter()
        np.copyto(dst, src)
        best = max(best, 2 * src.nbytes / (time.perf_counter() - t))
    return best / 1e9


def engine_cpu_seconds() -> float:
    """CPU seconds of this process, its live children (llama-server) and the children it
    has waited for (llama-bench), so a bare run's own work is not read as other load."""
    return process_tree_cpu_seconds() + sum(resource.getrusage(resource.RUSAGE_CHILDREN)[:2])


def timed(fn) -> tuple[object, TrialClock]:
    with TrialClock(cpu=engine_cpu_seconds) as clock:
        out = fn()
    return out, clock


def tps(g, prompt_tokens: int) -> dict:
    decode_s = (g.latency_ms - g.ttft_ms) / 1e3
    return {"prefill_tps": prompt_tokens / (g.ttft_ms / 1e3),
            "decode_tps": (g.output_tokens - 1) / decode_s if decode_s > 0 else float("nan"),
            "latency_ms": g.latency_ms, "tokens": list(g.output_ids)}


def llama_bench(tools, path: Path, prompt: int, new: int, threads: int) -> dict:
    out = subprocess.run([str(tools.program("llama-bench")), "-m", str(path), "-p", str(prompt), "-n", str(new),
                          "-t", str(threads), "-r", "1", "-fa", "1", "-o", "json"],
                         capture_output=True, text=True, check=True).stdout
    rows = json.loads(out)
    pp = next(r for r in rows if r["n_prompt"] > 0 and r["n_gen"] == 0)
    tg = next(r for r in rows if r["n_gen"] > 0 and r["n_prompt"] == 0)
    return {"prefill_tps": pp["avg_ts"], "decode_tps": tg["avg_ts"]}


def median_clean(trials: list[dict], key: str, busy: float) -> tuple[float, int]:
    """(median of ``key`` over clean trials, trials flagged as contended)."""
    clean = [t for t in trials if not t["other_load"] > busy]
    use = clean or trials
    return statistics.median(t[key] for t in use), len(trials) - len(clean)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="smollm2 (default), tiny or a checkpoint folder")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--batch", type=int, default=8, help="requests arriving together (continuous batching)")
    ap.add_argument("--busy", type=float, default=0.5,
                    help="a trial during which other processes kept more cores busy than this is contended")
    ap.add_argument("--no-transformers", action="store_true", help="skip the transformers backend")
    ap.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = ap.parse_args()

    console = Console(width=170)
    target, draft, _ = resolve_models(args.model, None, None, None, console.print,
                                      modes=["fp16_baseline", "speculative_decoding"])
    tools = build_tools(log=console.print)
    files = gguf.build_ggufs(target, ("F32", "Q8_0", "Q4_K_M", "Q4_0"), tools, log=console.print)
    machine = hardware_string("cpu")
    bandwidth = memory_bandwidth_gbs()
    console.print(f"{machine}\nllama.cpp {tools.version}; copy bandwidth {bandwidth:.1f} GB/s; "
                  f"threads {args.threads}")

    ctx = 2 * args.prompt_tokens + args.new_tokens + 64  # the shared-prefix request is twice as long
    lc = registry.get_backend("llamacpp")
    settings = EngineSettings(str(target), str(draft) if draft else None, threads=args.threads, max_context=ctx)
    modes = [m for m in LLAMACPP_MODES if m in lc.runnable_modes(settings)]
    engines = {("llama.cpp backend", m): lc.load(m, settings) for m in modes}
    if not args.no_transformers:
        tf = registry.get_backend("transformers")
        tf.set_threads(args.threads)
        tf_settings = EngineSettings(str(target), threads=args.threads, max_context=ctx)
        engines.update({("transformers", m): tf.load(m, tf_settings) for m in TRANSFORMERS_MODES})
    tokenizer = next(iter(engines.values())).tokenizer
    builder = prompts.PromptBuilder(tokenizer)
    req, ids = builder.prepare(Request(id="bench-modes", family="long_prompt_long_output",
                                       prompt_tokens=args.prompt_tokens, expected_output_tokens=args.new_tokens))
    shared_req = Request(id="bench-prefix", family="shared_prefix_chat", prompt_tokens=2 * args.prompt_tokens,
                         shared_prefix_tokens=int(1.75 * args.prompt_tokens), expected_output_tokens=16)
    shared = builder.prepare(shared_req)
    prime = builder.prepare(primer(shared_req))
    group = [builder.prepare(Request(id=f"bench-batch-{i}", family="batch_pressure", prompt_tokens=128,
                                     expected_output_tokens=32, concurrent_requests=args.batch))
             for i in range(args.batch)]
    weights = {m: files[WEIGHTS[weight_key(get_mode(m))]].card["size_bytes"] for m in modes}
    for m in modes:
        s = get_mode(m).speculative
        if s is not None and s.method == "quantized_self":
            weights[m] += files[QSPEC_DRAFT[s.draft_quantization]].card["size_bytes"]

    runs: dict = {k: [] for k in engines}
    bare = {t: [] for t in ("F32", "Q8_0", "Q4_K_M", "Q4_0")}
    scen = {k: [] for k in ("prefix: reference", "prefix: prefix_caching", "batch: reference",
                            "batch: continuous_batching")}
    ref = reference_mode().name
    scen_engines = {"prefix: reference": (ref, [shared]), "prefix: prefix_caching": ("prefix_caching", [shared]),
                    "batch: reference": (ref, group), "batch: continuous_batching": ("continuous_batching", group)}
    scen_loaded = {}
    for name, (m, _) in scen_engines.items():
        key = ("llama.cpp backend", m)
        scen_loaded[name] = engines.get(key) or lc.load(m, settings)
    try:
        for trial in range(args.trials):
            for key, eng in engines.items():
                g, clock = timed(lambda e=eng: e.run([(req, ids)], ignore_eos=True)[0])
                runs[key].append({**tps(g, len(ids)), "other_load": clock.other_load})
            for gtype in bare:
                r, clock = timed(lambda t=gtype: llama_bench(tools, files[t].path, len(ids), args.new_tokens,
                                                               args.threads))
                bare[gtype].append({**r, "other_load": clock.other_load})
            for name, (_, grp) in scen_engines.items():
                eng = scen_loaded[name]
                start_unit(eng, [prime] if name.startswith("prefix") else [], ignore_eos=True)
                gens, clock = timed(lambda e=eng, grp=grp: e.run(grp, ignore_eos=True))
                scen[name].append({"latency_ms": max(g.latency_ms for g in gens), "other_load": clock.other_load})
            console.print(f"trial {trial + 1}/{args.trials} done")
    finally:
        for e in {id(e): e for e in list(engines.values()) + list(scen_loaded.values())}.values():
            e.close()

    report = {"machine": machine, "date": datetime.now(UTC).isoformat(timespec="seconds"),
              "llama_cpp": tools.version, "threads": args.threads, "bandwidth_gbs": bandwidth,
              "prompt_tokens": len(ids), "new_tokens": args.new_tokens, "trials": args.trials, "modes": {},
              "bare": {}, "scenarios": {}}
    ref_dec = median_clean(runs[("llama.cpp backend", ref)], "decode_tps", args.busy)[0]
    table = Table(title=f"{len(ids)} prompt tokens, {args.new_tokens} new, {args.threads} thread(s), median of "
                        f"{args.trials} interleaved trials (contended ones left out); {machine}")
    for c in ("engine", "mode", "weights", "MiB", "prefill tok/s", "decode tok/s", "decode vs reference",
              "bandwidth bound tok/s", "of bound", "same tokens as reference", "contended"):
        table.add_column(c)
    for (engine, m), trials in runs.items():
        pre, n1 = median_clean(trials, "prefill_tps", args.busy)
        dec, _ = median_clean(trials, "decode_tps", args.busy)
        if engine == "transformers":
            wbytes = files["F32"].card["size_bytes"] if m == ref else None
            wname = {"fp16_baseline": "fp32", "int8_quant": "int8 dynamic", "gptq_4bit": "int4 RTN"}[m]
            base = runs[("transformers", ref)]
        else:
            wbytes, base = weights[m], runs[("llama.cpp backend", ref)]
            wname = WEIGHTS[weight_key(get_mode(m))]
        bound = bandwidth * 1e9 / wbytes if wbytes else float("nan")
        same = trials[0]["tokens"] == base[0]["tokens"]
        ratio = dec / (ref_dec if engine != "transformers" else median_clean(base, "decode_tps", args.busy)[0])
        table.add_row(engine, m, wname, f"{wbytes / 2**20:.0f}" if wbytes else "-", f"{pre:.0f}", f"{dec:.1f}",
                      f"{ratio:.2f}x", f"{bound:.0f}" if wbytes else "-", f"{dec / bound:.0%}" if wbytes else "-",
                      "yes" if same else "no", f"{n1}/{len(trials)}")
        report["modes"][f"{engine}/{m}"] = {"weights": wname, "weight_bytes": wbytes, "prefill_tps": pre,
                                            "decode_tps": dec, "decode_vs_reference": ratio,
                                            "bandwidth_bound_tps": bound if wbytes else None,
                                            "same_tokens_as_reference": same, "contended": n1}
    for gtype, trials in bare.items():
        pre, n1 = median_clean(trials, "prefill_tps", args.busy)
        dec, _ = median_clean(trials, "decode_tps", args.busy)
        wbytes = files[gtype].card["size_bytes"]
        bound = bandwidth * 1e9 / wbytes
        table.add_row("llama-bench (bare)", "-", gtype, f"{wbytes / 2**20:.0f}", f"{pre:.0f}", f"{dec:.1f}", "-",
                      f"{bound:.0f}", f"{dec / bound:.0%}", "-", f"{n1}/{len(trials)}")
        report["bare"][gtype] = {"prefill_tps": pre, "decode_tps": dec, "contended": n1}
    console.print(table)

    scen_table = Table(title="serving scenarios on the llama.cpp backend (latency of the request, or of the "
                             "group's last answer; median of clean trials)")
    for c in ("scenario", "mode", "latency ms", "speed-up vs reference", "contended"):
        scen_table.add_column(c)
    for name, trials in scen.items():
        lat, n1 = median_clean(trials, "latency_ms", args.busy)
        base = median_clean(scen[name.split(":")[0] + ": reference"], "latency_ms", args.busy)[0]
        scen_table.add_row(name.split(":")[0], name.split(": ")[1], f"{lat:.0f}", f"{base / lat:.2f}x",
                           f"{n1}/{len(trials)}")
        report["scenarios"][name] = {"latency_ms": lat, "speedup": base / lat, "contended": n1}
    console.print(scen_table)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1))
        console.print(f"written: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The profiler: measure every (request, mode, trial) and write the profile table.

Resumable by construction: every finished measurement is appended to a journal
(``<output>.journal.jsonl``, one JSON line, flushed and fsynced) before the next
one starts. A rerun with the same settings skips what the journal holds, so an
interrupt loses nothing already measured; the parquet output is rebuilt from the
journal at the end (validated against the profile schema).

Modes run one at a time (load, warm up, measure, unload), the reference mode
first, so every other mode's output can be scored against the reference's
output for the same request (ROUGE-L).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import platform
import uuid
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd

from dataset.benchmarks import read_benchmark, score_answer
from dataset.profile_schema import validate_profile
from dataset.requests import Request
from dataset.workloads import get_workload

DEFAULT_WORKLOADS = (
    "short_prompt_short_output", "short_prompt_long_output", "long_prompt_short_output",
    "long_prompt_long_output", "shared_prefix_chat", "memory_pressure_long_context",
    "batch_pressure",
)


@dataclass
class ProfileSpec:
    """What to measure. Everything here (but ``quick``'s expansion) enters the
    journal's identity, so a rerun with other settings cannot mix rows."""

    model: str
    draft_model: str | None = None
    backend: str = "transformers"
    device: str = "cpu"
    modes: list[str] | None = None
    workloads: list[str] = field(default_factory=lambda: list(DEFAULT_WORKLOADS))
    requests: int = 3
    trials: int = 1
    seed: int = 0
    benchmarks: list[str] = field(default_factory=list)
    benchmark_requests: int = 2
    batch_size: int | None = None
    watts_per_core: float = 4.0
    threads: int | None = None
    #: keep every mode's engine loaded and measure each unit in all modes back to
    #: back (fair ratios on a noisy machine; needs memory for all engines at once)
    interleave: bool = False
    #: vLLM backend: pre-quantized checkpoints of the quantized modes (int8, gptq_4bit, awq_4bit)
    checkpoints: dict = field(default_factory=dict)

    def identity(self) -> str:
        d = asdict(self)
        return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]


@dataclass
class Unit:
    """What one profile row measures: one request, or a group arriving together."""

    id: str
    family: str
    requests: list[Request]
    #: untimed requests run first: the study times the follow-up to a request that
    #: shares its prefix ("prime, then follow"), so prefix caches are warm
    prime: list[Request] = field(default_factory=list)


def build_units(spec: ProfileSpec) -> list[Unit]:
    units = []
    for i, name in enumerate(spec.workloads):
        w = get_workload(name)
        if w.concurrent_requests > 1:
            n_conc = spec.batch_size or w.concurrent_requests
            for u in range(spec.requests):
                reqs = w.sample(n_conc, seed=spec.seed * 1000 + i * 100 + u)
                reqs = [dataclasses.replace(r, id=f"{name}-{spec.seed}-{u:03d}-{k}",
                                            concurrent_requests=n_conc) for k, r in enumerate(reqs)]
                units.append(Unit(f"{name}-{spec.seed}-{u:03d}", name, reqs))
        else:
            reqs = w.sample(spec.requests + 1, seed=spec.seed * 1000 + i)
            primer = [dataclasses.replace(reqs[-1], id=f"{name}-{spec.seed}-prime")] \
                if w.shared_prefix_tokens else []
            for r in reqs[:-1]:
                units.append(Unit(r.id, name, [r], prime=primer))
    for path in spec.benchmarks:
        for r in read_benchmark(path, spec.benchmark_requests, seed=spec.seed):
            units.append(Unit(r.id, r.family, [r]))
    return units


class Journal:
    """Append-only JSONL of finished rows; the first line identifies the run."""

    def __init__(self, path: Path, spec: ProfileSpec):
        self.path = path
        self.rows: list[dict] = []
        if path.exists():
            text = path.read_text()
            lines = text.splitlines()
            header = json.loads(lines[0]) if lines else {}
            if header.get("identity") != spec.identity():
                raise ValueError(
                    f"{path} holds a profile run with other settings "
                    f"({header.get('spec')}); choose another output path to start a new run"
                )
            self.run_id = header["run_id"]
            for i, line in enumerate(lines[1:], start=2):
                try:
                    self.rows.append(json.loads(line))
                except json.JSONDecodeError:
                    if i != len(lines):
                        raise ValueError(f"{path}: line {i} is corrupt") from None
                    # an interrupted last write: dropped, it will be measured again
            if not text.endswith("\n"):
                self._rewrite(header)
        else:
            self.run_id = uuid.uuid4().hex[:12]
            path.parent.mkdir(parents=True, exist_ok=True)
            self._append({"identity": spec.identity(), "run_id": self.run_id, "spec": asdict(spec)})

    def _rewrite(self, header: dict):
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text("\n".join(json.dumps(r) for r in [header] + self.rows) + "\n")
        os.replace(tmp, self.path)

    def _append(self, obj: dict):
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(obj, default=_json_default) + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    def keys(self) -> set[tuple]:
        return {(r["request_id"], r["mode"], r["trial"]) for r in self.rows}

    def add(self, row: dict):
        self._append(row)
        self.rows.append(json.loads(json.dumps(row, default=_json_default)))


def _json_default(o):
    if isinstance(o, (np.floating, np.integer)):
        return o.item()
    raise TypeError(type(o))


def _nan(x):
    return None if x is None or (isinstance(x, float) and np.isnan(x)) else x


def hardware_string(device: str) -> str:
    if device.startswith("cuda"):
        import torch

        return torch.cuda.get_device_name(0)
    model = platform.processor() or platform.machine()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model} ({os.cpu_count()} cores)"


def software_string() -> str:
    import torch
    import transformers

    return json.dumps({"python": platform.python_version(), "torch": torch.__version__,
                       "transformers": transformers.__version__})


def model_id(path: Path) -> str:
    """Folder name plus a short hash of the config and weights files' sizes and heads."""
    h = hashlib.sha256()
    for f in sorted(Path(path).glob("*")):
        if f.suffix in (".json", ".safetensors", ".bin"):
            h.update(f.name.encode())
            with open(f, "rb") as fh:
                h.update(fh.read(1 << 20))
            h.update(str(f.stat().st_size).encode())
    return f"{Path(path).name}@{h.hexdigest()[:12]}"


class Profiler:
    def __init__(self, spec: ProfileSpec, model_path: Path, draft_path: Path | None,
                 out: Path, console=None, on_row=None):
        self.spec, self.model_path, self.draft_path, self.out = spec, Path(model_path), draft_path, Path(out)
        self.console = console
        self.on_row = on_row
        self.journal_path = self.out.with_name(self.out.name + ".journal.jsonl")

    def plan(self):
        if self.spec.backend == "vllm":
            from engine.backends.vllm_backend import capabilities as vllm_caps

            caps = vllm_caps(self.spec.device, self.spec.checkpoints, draft=self.draft_path is not None)
        elif self.spec.backend == "transformers":
            from engine.backends.transformers_backend import capabilities

            caps = capabilities(self.spec.device)
        else:
            raise ValueError(f"unknown backend {self.spec.backend!r}; choose transformers or vllm")
        wanted = self.spec.modes or [m for m in caps.supported_modes()]
        supported, skipped = [], {}
        from engine.modes import get_mode

        for m in wanted:
            s = caps.support(m)
            spec = get_mode(m).speculative
            if not s.supported:
                skipped[m] = s.reason
            elif spec is not None and spec.method == "draft_model" and self.draft_path is None \
                    and spec.draft_model is None:
                skipped[m] = "no draft model given (--draft-model PATH)"
            else:
                supported.append(m)
        ref = caps.reference_mode
        modes = [ref] + [m for m in supported if m != ref]
        return caps, modes, skipped

    def run(self) -> pd.DataFrame:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        from engine.energy import make_meter

        if self.out.exists() and not self.journal_path.exists():
            raise FileExistsError(f"{self.out} already exists and is not a run in progress; "
                                  "choose another output path")
        caps, modes, skipped = self.plan()
        for m, why in skipped.items():
            self._say(f"[yellow]skip[/yellow] {m}: {why}")
        journal = Journal(self.journal_path, self.spec)
        done = journal.keys()
        units = build_units(self.spec)
        self._ctx = {
            "journal": journal, "caps": caps, "reference": modes[0],
            "meter": make_meter(self.spec.device, watts_per_core=self.spec.watts_per_core,
                                include_children=self.spec.backend == "vllm"),
            "hardware": hardware_string(self.spec.device), "software": software_string(),
            "model_id": model_id(self.model_path),
            "ref_output": {r["request_id"]: r["output_text"] for r in journal.rows
                           if r["mode"] == modes[0] and r["trial"] == 0},
            "prepared": None,
        }
        trials = range(self.spec.trials)
        total = len(units) * len(modes) * self.spec.trials
        columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn()]
        with Progress(*columns, console=self.console, transient=False) as progress:
            task = progress.add_task("profiling", total=total, completed=sum(
                1 for u in units for m in modes for t in trials if (u.id, m, t) in done))
            if self.spec.interleave:
                # every engine loaded at once; each unit is measured in every mode
                # back to back, so machine drift hits all modes alike
                todo_modes = [m for m in modes if any((u.id, m, t) not in done
                                                      for u in units for t in trials)]
                engines = {}
                try:
                    for m in todo_modes:
                        engines[m] = self._load(m, units, progress, task)
                    for unit in units:
                        for t in trials:
                            for m in todo_modes:
                                if (unit.id, m, t) not in done:
                                    self._measure(engines[m], m, unit, t, progress, task)
                finally:
                    for e in engines.values():
                        e.close()
            else:
                for m in modes:
                    todo = [(u, t) for u in units for t in trials if (u.id, m, t) not in done]
                    if not todo:
                        continue
                    # vLLM on CUDA applies memory pressure as a ballast taken before the
                    # engine starts, so each pressure level gets its own engine
                    by_pressure: dict[float, list] = {}
                    for unit, t in todo:
                        by_pressure.setdefault(self._pressure(unit), []).append((unit, t))
                    for pressure, items in by_pressure.items():
                        engine = self._load(m, units, progress, task, pressure)
                        try:
                            for unit, t in items:
                                self._measure(engine, m, unit, t, progress, task)
                        finally:  # engines (and vLLM's child processes) never outlive an error
                            engine.close()
                        del engine
            progress.update(task, description="done")
        return self.finish(journal)

    def _ballast_applies(self) -> bool:
        return self.spec.backend == "vllm" and self.spec.device.startswith("cuda")

    def _pressure(self, unit) -> float:
        return float(unit.requests[0].memory_pressure) if self._ballast_applies() else 0.0

    def _load(self, mode, units, progress, task, memory_pressure: float = 0.0):
        from engine.prompts import PromptBuilder

        progress.update(task, description=f"{mode}: loading")
        if self.spec.backend == "vllm":
            from engine.backends.vllm_backend import VllmEngine

            engine = VllmEngine(mode, self.model_path, self.draft_path, self.spec.device,
                                checkpoints=self.spec.checkpoints, memory_pressure=memory_pressure).load()
        else:
            from engine.backends.transformers_backend import TransformersEngine

            engine = TransformersEngine(mode, self.model_path, self.draft_path, self.spec.device,
                                        threads=self.spec.threads).load()
        if self._ctx["prepared"] is None:
            builder = PromptBuilder(engine.tokenizer)
            self._ctx["prepared"] = {u.id: [builder.prepare(r) for r in u.requests] for u in units}
            self._ctx["primers"] = {u.id: [builder.prepare(r) for r in u.prime] for u in units}
        progress.update(task, description=f"{mode}: warm-up")
        engine.warmup()
        return engine

    def _measure(self, engine, mode, unit, trial, progress, task):
        from engine.memory import PeakRSS
        from engine.quality import rouge_l

        ctx = self._ctx
        progress.update(task, description=f"{mode}: {unit.family}")
        group = ctx["prepared"][unit.id]
        ignore_eos = not any(r.benchmark_suite for r, _ in group)
        if ctx["primers"][unit.id]:
            engine.run(ctx["primers"][unit.id], ignore_eos=ignore_eos)
        meter = ctx["meter"]
        cuda = self.spec.device.startswith("cuda")
        if cuda:
            import torch

            torch.cuda.reset_peak_memory_stats()
        if cuda and self.spec.backend == "vllm":
            from engine.memory import GpuMemoryPeak

            index = int(self.spec.device.split(":")[1]) if ":" in self.spec.device else 0
            sampler = GpuMemoryPeak(index)  # the engine core allocates in a child process
        else:
            sampler = PeakRSS(children=self.spec.backend == "vllm")
        meter.start()
        with sampler:
            gens = engine.run(group, ignore_eos=ignore_eos)
        energy = meter.stop()
        # CPU: resident model + RSS growth; CUDA: the allocator's peak (weights included), or
        # for vLLM the device memory in use (NVML), ballast excluded
        if not cuda:
            peak_mb = engine.weights_mb + sampler.peak_growth_mb
        elif self.spec.backend == "vllm":
            peak_mb = sampler.peak_mb - engine.info.get("ballast_bytes", 0) / 2**20
        else:
            peak_mb = torch.cuda.max_memory_allocated() / 2**20
        text = "\n".join(g.text for g in gens)
        row = self._row(unit, group, gens, mode, trial, energy, meter,
                        peak_mb, text, ctx["journal"].run_id,
                        ctx["model_id"], ctx["hardware"], ctx["software"],
                        ctx["caps"].reference_mode, engine.info)
        if mode == ctx["reference"] and trial == 0:
            ctx["ref_output"][unit.id] = text
        base = ctx["ref_output"].get(unit.id)
        row["rouge_l_vs_baseline"] = None if base is None else rouge_l(text, base)
        ctx["journal"].add(row)
        progress.advance(task)
        if self.on_row:
            self.on_row(row)

    def finish(self, journal: Journal) -> pd.DataFrame:
        from dataset.io import write_parquet

        df = pd.DataFrame([{k: v for k, v in r.items() if k != "output_text"} for r in journal.rows])
        df = validate_profile(df, path=self.journal_path)
        write_parquet(df, self.out, overwrite=True)
        return df

    def _say(self, msg):
        if self.console is not None:
            self.console.print(msg)

    def _row(self, unit, group, gens, mode, trial, energy, meter, peak_mb, text, run_id, mid,
             hardware, software, ref_mode, info) -> dict:
        reqs = [r for r, _ in group]
        latency = max(g.latency_ms for g in gens)
        out_tokens = sum(g.output_tokens for g in gens)
        tbt = np.concatenate([g.tbt_ms for g in gens]) if gens else np.array([])
        acc = [score_answer(g.text, r.reference, r.evaluation_mode) for g, r in zip(gens, reqs)]
        acc = [a for a in acc if a is not None]
        notes = [f"energy: {meter.describe()}"]
        if any(r.memory_pressure > 0 for r in reqs) and not self._ballast_applies():
            notes.append("memory pressure not applied: no accelerator memory to take on CPU"
                         if self.spec.device == "cpu" else
                         "memory pressure not applied: the ballast is implemented for the vLLM backend")
        if energy.short_window:
            notes.append("energy window shorter than the meter's update period")
        r0 = reqs[0]
        return {
            "workload": unit.family, "family": unit.family, "request_id": unit.id, "mode": mode,
            "trial": trial, "is_aggregate": False, "n_trials": None,
            "prompt_tokens": float(np.mean([r.prompt_tokens for r in reqs])),
            "expected_output_tokens": float(np.mean([r.expected_output_tokens for r in reqs])),
            "shared_prefix_tokens": float(r0.shared_prefix_tokens),
            "concurrent_requests": float(len(reqs)),
            "memory_pressure": float(r0.memory_pressure),
            "benchmark_suite": r0.benchmark_suite, "evaluation_mode": r0.evaluation_mode,
            "latency_ms": latency,
            "ttft_ms": _nan(float(np.nanmean([g.ttft_ms for g in gens]))),
            "tbt_ms_mean": _nan(float(tbt.mean())) if len(tbt) else None,
            "tbt_ms_p95": _nan(float(np.percentile(tbt, 95))) if len(tbt) else None,
            "tokens_per_s": out_tokens / (latency / 1000) if latency > 0 else None,
            "output_tokens": float(out_tokens),
            "energy_j": energy.joules,
            "energy_per_token_j": energy.joules / out_tokens if out_tokens else None,
            "energy_source": energy.source, "peak_memory_mb": peak_mb,
            "accuracy": float(np.mean(acc)) if acc else None,
            "rouge_l_vs_reference": None, "rouge_l_vs_baseline": None,
            "reference_mode": ref_mode, "precision": info.get("precision"),
            "graph_capture": bool(info.get("graph_capture", False)), "backend": self.spec.backend,
            "model": mid,
            "hardware": hardware, "software": software, "run_id": run_id,
            "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "source": "; ".join(notes), "output_text": text,
        }

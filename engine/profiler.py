"""The profiler: measure every (request, mode, trial) and write the profile table.

Resumable by construction: every finished measurement is appended to a journal
(``<output>.journal.jsonl``, one JSON line, flushed and fsynced) before the next
one starts. A rerun with the same settings skips what the journal holds, so an
interrupt loses nothing already measured; the parquet output is rebuilt from the
journal at the end (validated against the profile schema).

Modes run one at a time (load, warm up, measure, unload), the reference mode
first, so every other mode's output can be scored against the reference's
output for the same request (ROUGE-L); with ``interleave`` every engine stays
loaded and each unit runs in every mode back to back.

Measurement hygiene (:mod:`engine.noise`): every (unit, mode) is measured in
``trials`` trials, trial-major (trial 0 of every unit, then trial 1, ...), so a
unit's trials are spread over the run instead of back to back. Each trial
records its wall and CPU time; the contention rule flags trials whose CPU share
dropped or whose wall time is far above the unit's other trials, and those are
re-measured (a new ``attempt`` of the same trial) up to ``max_remeasure`` times;
a flag that persists stays in the profile. Where the backend's thread pool is
settable and ``threads`` is not given, the thread count is chosen by a
measurement first (:func:`engine.noise.calibrate_threads`) and journalled, so a
resumed run keeps it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import platform
import socket
import uuid
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from dataset.benchmarks import read_benchmark, score_answer
from dataset.errors import InputError, InputFileError
from dataset.io import OutputLock, os_errors, write_text
from dataset.profile_schema import validate_profile
from dataset.requests import Request
from dataset.workloads import get_workload
from engine.hardware import hardware_string

if TYPE_CHECKING:  # the engine side loads lazily: building units needs none of it
    from engine.energy import EnergyReading
    from engine.noise import ThreadChoice

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
    #: interleaved trials per (unit, mode); the oracle reads their median
    trials: int = 3
    #: how often a contended trial is measured again before its flag is kept
    max_remeasure: int = 2
    seed: int = 0
    benchmarks: list[str] = field(default_factory=list)
    benchmark_requests: int = 2
    batch_size: int | None = None
    watts_per_core: float = 4.0
    #: torch threads; None: chosen by a measurement at the start of the run
    threads: int | None = None
    #: keep every mode's engine loaded and measure each unit in all modes back to
    #: back (fair ratios on a noisy machine; needs memory for all engines at once)
    interleave: bool = False
    #: vLLM backend: pre-quantized checkpoints of the quantized modes (int8, gptq_4bit, awq_4bit)
    checkpoints: dict = field(default_factory=dict)
    #: per-request conditions (:class:`dataset.workloads.conditions.ConditionDraw` as a
    #: dict); None: every family's own fixed condition
    conditions: dict | None = None
    #: every family's prompt, output and prefix lengths times this
    length_scale: float = 1.0

    def __post_init__(self):
        """Refuse counts and scales no run could use before anything is measured."""
        from dataset.limits import count, finite, requests_fit

        count("requests", self.requests)
        count("trials", self.trials)
        count("max_remeasure", self.max_remeasure, minimum=0)
        count("benchmark_requests", self.benchmark_requests, minimum=0)
        for name in ("batch_size", "threads"):
            if getattr(self, name) is not None:
                count(name, getattr(self, name))
        finite("length_scale", self.length_scale, positive=True)
        finite("watts_per_core", self.watts_per_core, minimum=0)
        requests_fit("requests", self.requests * max(1, len(self.workloads)))

    def identity(self) -> str:
        d = asdict(self)
        # fields added later enter the identity only when set, so journals written
        # before they existed still resume
        for key, default in (("conditions", None), ("length_scale", 1.0)):
            if d[key] == default:
                del d[key]
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
    from dataset.workloads.conditions import scaled

    units = []
    for i, name in enumerate(spec.workloads):
        w = scaled(get_workload(name), spec.length_scale)
        if spec.conditions is not None:
            units += _drawn_units(spec, w, i)
        elif w.concurrent_requests > 1:
            n_conc = spec.batch_size or w.concurrent_requests
            for u in range(spec.requests):
                reqs = w.sample(n_conc, seed=spec.seed * 1000 + i * 100 + u)
                reqs = [dataclasses.replace(r, id=f"{name}-{spec.seed}-{u:03d}-{k}",
                                            concurrent_requests=n_conc) for k, r in enumerate(reqs)]
                units.append(Unit(f"{name}-{spec.seed}-{u:03d}", name, reqs))
        else:
            # stratified: the units span the family's spread (see WorkloadSpec.sample)
            reqs = w.sample(spec.requests, seed=spec.seed * 1000 + i, stratified=True)
            primer = [dataclasses.replace(w.sample(1, seed=spec.seed * 1000 + i + 500)[0],
                                          id=f"{name}-{spec.seed}-prime")] \
                if w.shared_prefix_tokens else []
            for r in reqs:
                units.append(Unit(r.id, name, [r], prime=primer))
    for path in spec.benchmarks:
        for r in read_benchmark(path, spec.benchmark_requests, seed=spec.seed):
            units.append(Unit(r.id, r.family, [r]))
    return units


def _drawn_units(spec: ProfileSpec, w, i: int) -> list[Unit]:
    """Units of family ``w`` under per-request drawn conditions: lengths stratified over
    the family's spread, each unit its own concurrency (a group of that many requests),
    shared prefix (primed first by an untimed request with the same prefix) and
    memory pressure."""
    from dataset.workloads.conditions import ConditionDraw, draw_units

    draw = ConditionDraw.from_dict(spec.conditions)
    units = []
    for du in draw_units(w, spec.requests, draw, seed=spec.seed * 1000 + i, stratified=True):
        r = du.request
        prime = []
        if r.shared_prefix_tokens:
            prime = [dataclasses.replace(
                r, id=f"{r.id}-prime", prompt_tokens=r.shared_prefix_tokens + 8,
                expected_output_tokens=1, concurrent_requests=1)]
        units.append(Unit(r.id, w.name, du.group, prime=prime))
    return units


class Journal:
    """Append-only JSONL of finished rows; the first line identifies the run.

    Lines with a ``kind`` key are facts about the run, not rows (the thread
    calibration): ``meta[kind]`` holds the last one of each kind.

    One writer at a time: the journal is locked (:class:`dataset.io.OutputLock`) from
    before it is read until :meth:`close`, so a second run on the same output is refused
    with the first one's pid instead of appending duplicate rows beside it.
    """

    def __init__(self, path: Path, spec: ProfileSpec):
        self.path = path
        self.lock = OutputLock(path).acquire()
        self.rows: list[dict] = []
        self.meta: dict[str, dict] = {}
        text = path.read_text() if path.exists() else ""
        lines = text.splitlines()
        header = None
        if lines:
            try:
                header = json.loads(lines[0])
            except json.JSONDecodeError:
                if any(line.strip() for line in lines[1:]):
                    raise InputFileError(path, None, None, "line 1 (the run's header) is corrupt; rows follow "
                                         "it, so the file is not a torn start: move it aside") from None
        if path.exists() and header is None:  # killed before or while writing its header: nothing to keep
            path.unlink()
        if header is not None:
            if header.get("identity") != spec.identity():
                raise InputError(
                    f"{path} holds a profile run with other settings "
                    f"({header.get('spec')}); choose another output path to start a new run"
                )
            self.run_id = header["run_id"]
            for i, line in enumerate(lines[1:], start=2):
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError:
                    if i != len(lines):
                        raise InputFileError(path, None, None, f"line {i} is corrupt") from None
                    # an interrupted last write: dropped, it will be measured again
                    continue
                if "kind" in obj:
                    self.meta[obj["kind"]] = obj
                else:
                    self.rows.append(obj)
            if not text.endswith("\n"):
                self._rewrite(header)
        else:
            self.run_id = uuid.uuid4().hex[:12]
            path.parent.mkdir(parents=True, exist_ok=True)
            self._append({"identity": spec.identity(), "run_id": self.run_id, "spec": asdict(spec)})

    def close(self) -> None:
        """Let the next run have the output."""
        self.lock.release()

    def _rewrite(self, header: dict):
        lines = [header, *self.meta.values(), *self.rows]
        write_text("\n".join(json.dumps(r) for r in lines) + "\n", self.path, overwrite=True)

    def _append(self, obj: dict):
        with os_errors(self.path), open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(obj, default=_json_default) + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    def keys(self) -> set[tuple]:
        """(request id, mode, trial, attempt) of every journalled row."""
        return {(r["request_id"], r["mode"], r["trial"], r.get("attempt", 0)) for r in self.rows}

    def add_meta(self, kind: str, data: dict):
        obj = {"kind": kind, **data}
        self._append(obj)
        self.meta[kind] = obj

    def add(self, row: dict):
        self._append(row)
        self.rows.append(json.loads(json.dumps(row, default=_json_default)))


def _json_default(o):
    if isinstance(o, (np.floating, np.integer)):
        return o.item()
    raise TypeError(type(o))


def _nan(x):
    return None if x is None or (isinstance(x, float) and np.isnan(x)) else x


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


@dataclass(frozen=True)
class RowProvenance:
    """Where every row of one run comes from. The same for all its rows, so it is
    worked out once per run (hashing the weights and querying the hardware is not free)."""

    backend: str
    reference_mode: str
    model: str
    hardware: str
    software: str
    run_id: str
    #: who measured: ``host:pid`` of a serial run, ``ray:<node ip>:<actor id>`` of a Ray worker
    worker: str = ""
    #: the device the engine ran on (``cpu``, ``cuda:<index>``)
    device: str = ""


@dataclass
class ProfileRun:
    """What the measurements of one :meth:`Profiler.run` share.

    ``done`` is the journal's keys when the run started: the loops skip exactly
    those, so a resumed run measures what the interrupted one had left.
    ``ref_output`` holds the reference mode's first-trial text per unit (from the
    journal, then from this run), which every mode's output is scored against.
    ``prepared``/``primers`` are the units' token ids, built once from the first
    engine's tokenizer (every mode of one model shares it).
    """

    journal: Journal
    meter: object
    provenance: RowProvenance
    units: list[Unit]
    done: set[tuple]
    ref_output: dict[str, str]
    prepared: dict[str, list] | None = None
    primers: dict[str, list] | None = None
    #: the thread count measured with (None: the backend has no thread pool to set)
    threads: ThreadChoice | None = None

    @property
    def reference(self) -> str:
        return self.provenance.reference_mode


@dataclass
class Measurement:
    """One timed engine call: what a profile row is made from."""

    unit: Unit
    mode: str
    trial: int
    #: the unit's (request, prompt ids) pairs as the engine ran them
    group: list
    gens: list
    energy: EnergyReading
    peak_mb: float
    #: the engine's own account of how it ran (precision, graph capture, ballast)
    info: dict
    #: wall and CPU seconds of the engine call (:class:`engine.noise.TrialClock`)
    clock: object = None
    #: 0 for a trial's first measurement, then one per re-measurement of a contended one
    attempt: int = 0

    @property
    def requests(self) -> list[Request]:
        return [r for r, _ in self.group]

    @property
    def text(self) -> str:
        return "\n".join(g.text for g in self.gens)


def _shape_columns(m: Measurement) -> dict:
    """Which unit, mode and trial the row is, and the unit's request shape (a group's
    token counts are means over its requests, its concurrency their number)."""
    reqs = m.requests
    r0 = reqs[0]
    return {
        "workload": m.unit.family, "family": m.unit.family, "request_id": m.unit.id, "mode": m.mode,
        "trial": m.trial, "attempt": m.attempt, "is_aggregate": False, "n_trials": None,
        "prompt_tokens": float(np.mean([r.prompt_tokens for r in reqs])),
        "expected_output_tokens": float(np.mean([r.expected_output_tokens for r in reqs])),
        "shared_prefix_tokens": float(r0.shared_prefix_tokens),
        "concurrent_requests": float(len(reqs)),
        "memory_pressure": float(r0.memory_pressure),
        "benchmark_suite": r0.benchmark_suite, "evaluation_mode": r0.evaluation_mode,
    }


def _timing_columns(gens) -> dict:
    """A group finishes when its last request does, so latency is the maximum; tokens
    are summed over the group and time-between-tokens pooled over it."""
    latency = max(g.latency_ms for g in gens)
    out_tokens = sum(g.output_tokens for g in gens)
    tbt = np.concatenate([g.tbt_ms for g in gens]) if gens else np.array([])
    return {
        "latency_ms": latency,
        "ttft_ms": _nan(float(np.nanmean([g.ttft_ms for g in gens]))),
        "tbt_ms_mean": _nan(float(tbt.mean())) if len(tbt) else None,
        "tbt_ms_p95": _nan(float(np.percentile(tbt, 95))) if len(tbt) else None,
        "tokens_per_s": out_tokens / (latency / 1000) if latency > 0 else None,
        "output_tokens": float(out_tokens),
    }


def _resource_columns(m: Measurement) -> dict:
    out_tokens = sum(g.output_tokens for g in m.gens)
    return {
        "energy_j": m.energy.joules,
        "energy_per_token_j": m.energy.joules / out_tokens if out_tokens else None,
        "energy_source": m.energy.source, "peak_memory_mb": m.peak_mb,
    }


def _noise_columns(m: Measurement, threads) -> dict:
    """The trial's CPU time and share, from which the contention flag is worked out
    over the unit's trials when the profile is written (see :mod:`engine.noise`)."""
    c = m.clock
    return {
        "cpu_time_ms": None if c is None else c.cpu_s * 1000,
        "cpu_share": None if c is None else _nan(c.share),
        "other_load": None if c is None else _nan(c.other_load),
        "threads": None if threads is None else threads.threads,
    }


def _quality_columns(m: Measurement) -> dict:
    """Benchmark accuracy where the requests have gold answers. The ROUGE-L columns
    are filled in later: against the reference output, once it is known."""
    acc = [score_answer(g.text, r.reference, r.evaluation_mode) for g, r in zip(m.gens, m.requests)]
    acc = [a for a in acc if a is not None]
    return {
        "accuracy": float(np.mean(acc)) if acc else None,
        "rouge_l_vs_reference": None, "rouge_l_vs_baseline": None,
    }


def _provenance_columns(prov: RowProvenance, m: Measurement, notes: list[str]) -> dict:
    return {
        "reference_mode": prov.reference_mode, "precision": m.info.get("precision"),
        "graph_capture": bool(m.info.get("graph_capture", False)), "backend": prov.backend,
        "model": prov.model,
        "hardware": prov.hardware, "software": prov.software, "run_id": prov.run_id,
        "worker": prov.worker or None, "device": prov.device or None,
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "source": "; ".join(notes), "output_text": m.text,
    }


class _Bar:
    """The progress bar's one task: the loops only ever relabel it or advance it."""

    def __init__(self, progress, task):
        self.progress, self.task = progress, task

    def show(self, description: str):
        self.progress.update(self.task, description=description)

    def advance(self):
        self.progress.advance(self.task)

    def extend(self, n: int):
        """More work found on the way (re-measurements of contended trials)."""
        total = next(t.total for t in self.progress.tasks if t.id == self.task) or 0
        self.progress.update(self.task, total=total + n)


class Profiler:
    """Measure a :class:`ProfileSpec` into ``out`` (see the module docstring).

    The backend is looked up by name in the backend registry and used only through
    its :class:`~engine.backends.registry.Backend` methods, so any registered
    backend can be profiled without changes here.
    """

    def __init__(self, spec: ProfileSpec, model_path: Path, draft_path: Path | None,
                 out: Path, console=None, on_row=None):
        self.spec, self.model_path, self.draft_path, self.out = spec, Path(model_path), draft_path, Path(out)
        self.console = console
        self.on_row = on_row
        self.journal_path = self.out.with_name(self.out.name + ".journal.jsonl")
        self._run: ProfileRun | None = None
        self._nvml_index: int | None = None

    @cached_property
    def backend(self):
        """The registered backend named by the spec. Looked up on first use, so an
        unknown name fails when the run starts (the registry's error lists the known ones)."""
        from engine.backends.registry import get_backend

        return get_backend(self.spec.backend)

    @cached_property
    def settings(self):
        """What every engine of this run is built with (memory pressure: none; a
        ballast-applying backend gets its own per pressure level, see :meth:`_load`)."""
        from engine.backends.base import EngineSettings, context_for

        # caches sized for the longest request measured, not for the model's limit
        requests = [r for u in build_units(self.spec) for r in u.requests + u.prime]
        return EngineSettings(str(self.model_path), str(self.draft_path) if self.draft_path else None,
                              self.spec.device, threads=self.spec.threads,
                              checkpoints=dict(self.spec.checkpoints), max_context=context_for(requests))

    @property
    def _trials(self) -> range:
        return range(self.spec.trials)

    def plan(self):
        """(capabilities, modes to run with the reference first, skipped mode -> why)."""
        return self.backend.plan(self.settings, self.spec.modes)

    def run(self) -> pd.DataFrame:
        """Measure what the journal does not hold yet, then rebuild the profile from
        the journal (so a resumed run's parquet holds the earlier rows too)."""
        if self.out.exists() and not self.journal_path.exists():
            raise FileExistsError(f"{self.out} already exists and is not a run in progress; "
                                  "choose another output path")
        caps, modes, skipped = self.plan()
        for m, why in skipped.items():
            self._say(f"[yellow]skip[/yellow] {m}: {why}")
        journal = Journal(self.journal_path, self.spec)
        try:
            self._run = self._start(journal, caps.reference_mode, build_units(self.spec))
            with self._progress() as progress:
                bar = _Bar(progress, progress.add_task("profiling", total=self._total(modes),
                                                       completed=self._completed(modes)))
                self._choose_threads(modes, bar)
                if self.spec.interleave:
                    self._sweep_interleaved(modes, bar)
                else:
                    self._sweep_mode_by_mode(modes, bar)
                bar.show("done")
            return self.finish(journal)
        finally:
            journal.close()

    def _start(self, journal: Journal, reference: str, units: list[Unit]) -> ProfileRun:
        from engine.energy import make_meter

        return ProfileRun(
            journal=journal,
            meter=make_meter(self.spec.device, self.nvml_index, watts_per_core=self.spec.watts_per_core,
                             include_children=self.backend.child_processes),
            provenance=RowProvenance(
                backend=self.spec.backend, reference_mode=reference,
                model=model_id(self.model_path), hardware=hardware_string(self.spec.device),
                software=software_string(), run_id=journal.run_id,
                worker=f"{socket.gethostname()}:{os.getpid()}", device=self.spec.device),
            units=units, done=journal.keys(),
            ref_output={r["request_id"]: r["output_text"] for r in journal.rows
                        if r["mode"] == reference and r["trial"] == 0 and not r.get("attempt")},
        )

    def _progress(self):
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn()]
        return Progress(*columns, console=self.console, transient=False)

    def _total(self, modes) -> int:
        return len(self._run.units) * len(modes) * self.spec.trials

    def _completed(self, modes) -> int:
        run = self._run
        return sum(1 for u in run.units for m in modes for t in self._trials
                   if (u.id, m, t, 0) in run.done)

    def _todo(self, mode) -> list[tuple[Unit, int]]:
        """(unit, trial) pairs of ``mode`` the journal did not hold when the run started,
        trial-major: every unit's trial 0, then every unit's trial 1, ..."""
        run = self._run
        return [(u, t) for t in self._trials for u in run.units if (u.id, mode, t, 0) not in run.done]

    # ------------------------------------------------------------ hygiene
    def _choose_threads(self, modes, bar: _Bar):
        """Fix the thread count for the whole run: the spec's, the journal's (a resumed
        run), or one measured now on the reference engine (see engine.noise)."""
        from engine.noise import ThreadChoice, calibrate_threads

        run, backend = self._run, self.backend
        if backend.set_threads is None or self._cuda():
            return
        if self.spec.threads:
            run.threads = ThreadChoice(self.spec.threads, [], "set by --threads")
        elif "threads" in run.journal.meta:
            run.threads = ThreadChoice.from_dict(run.journal.meta["threads"])
        else:
            engine = self._load(modes[0], bar)
            try:
                unit = next((u for u in run.units if len(u.requests) == 1), run.units[0])
                req, ids = run.prepared[unit.id][0]
                probe_group = [(dataclasses.replace(req, expected_output_tokens=32), ids)]
                bar.show(f"choosing the thread count ({modes[0]})")
                candidates = [n for n in (1, 2, 4, 8, 16) if n <= (os.cpu_count() or 1)]
                run.threads = calibrate_threads(lambda: engine.run(probe_group, ignore_eos=True),
                                                backend.set_threads, candidates)
            finally:
                engine.close()
            run.journal.add_meta("threads", run.threads.to_dict())
        backend.set_threads(run.threads.threads)
        self.settings = dataclasses.replace(self.settings, threads=run.threads.threads)
        table = ", ".join(f"{r['threads']}: p80 {r['p80_wall_s'] * 1000:.0f} ms, share "
                          f"{r['median_share']:.2f}" for r in run.threads.table)
        self._say(f"threads: {run.threads.threads}" + (f" (measured: {table})" if table else
                                                        f" ({run.threads.rule})"))

    def _frame(self, modes=None) -> pd.DataFrame:
        """The journal's rows (of ``modes``, or all) as a table, with the contention flag
        worked out (it compares a unit's trials within one mode, so a subset is exact)."""
        from engine.noise import flag_contended

        df = pd.DataFrame([{k: v for k, v in r.items() if k != "output_text"}
                           for r in self._run.journal.rows if modes is None or r["mode"] in modes])
        if df.empty:
            return df
        if "attempt" not in df:
            df["attempt"] = 0
        df["attempt"] = df["attempt"].fillna(0).astype(int)
        threads = self._run.threads
        df["contended"] = flag_contended(df, expected_share=threads.clean_share if threads else None)
        return df

    def _to_remeasure(self, modes=None, units=None) -> pd.DataFrame:
        """(request_id, mode, trial, attempts) of trials the journal holds only contended
        attempts of and that have attempts left, within ``modes`` and ``units``."""
        from engine.noise import unresolved_trials

        df = self._frame(modes)
        if df.empty or not self.spec.max_remeasure:
            return pd.DataFrame(columns=["request_id", "mode", "trial", "attempts"])
        if units is not None:
            df = df[df["request_id"].isin(units)]
        left = unresolved_trials(df)
        return left[left["attempts"] <= self.spec.max_remeasure]

    def _pending_remeasures(self) -> dict[str, list]:
        """mode -> units with trials still to re-measure: what an interrupted run, or one
        judged by a stricter rule, has left."""
        left = self._to_remeasure()
        by_id = {u.id: u for u in self._run.units}
        out: dict[str, list] = {}
        for (mode, rid), _ in left.groupby(["mode", "request_id"]):
            if rid in by_id:
                out.setdefault(mode, []).append(by_id[rid])
        return out

    def _remeasure(self, engine_of, modes, bar: _Bar, units=None):
        """Measure contended trials again (a new attempt each) until each has a clean
        attempt or ``max_remeasure`` more; ``engine_of(mode)`` gives a loaded engine."""
        by_id = {u.id: u for u in (units if units is not None else self._run.units)}
        for _ in range(self.spec.max_remeasure):
            todo = self._to_remeasure(modes, by_id)
            if todo.empty:
                return
            bar.extend(len(todo))
            for r in todo.itertuples(index=False):
                self._measure(engine_of(r.mode), r.mode, by_id[r.request_id], int(r.trial), bar,
                              attempt=int(r.attempts))

    def _sweep_interleaved(self, modes, bar: _Bar):
        """Every engine loaded at once; each unit is measured in every mode back to
        back, so machine drift hits all modes alike."""
        run = self._run
        pending = self._pending_remeasures()
        todo_modes = [m for m in modes if self._todo(m) or pending.get(m)]
        engines = {}
        try:
            for m in todo_modes:
                engines[m] = self._load(m, bar)
            for t in self._trials:
                for unit in run.units:
                    for m in todo_modes:
                        if (unit.id, m, t, 0) not in run.done:
                            self._measure(engines[m], m, unit, t, bar)
            if todo_modes:
                self._remeasure(engines.__getitem__, todo_modes, bar)
        finally:
            for e in engines.values():
                e.close()

    def _sweep_mode_by_mode(self, modes, bar: _Bar):
        """One engine at a time (load, warm up, measure, unload), the reference first.
        A backend that applies memory pressure as a ballast taken before the engine
        starts gets one engine per pressure level."""
        pending = self._pending_remeasures()
        for m in modes:
            by_pressure: dict[float, list] = {}
            for unit, t in self._todo(m):
                by_pressure.setdefault(self._pressure(unit), []).append((unit, t))
            # a resumed run also finishes re-measuring what the journal left contended
            for unit in pending.get(m, []):
                by_pressure.setdefault(self._pressure(unit), [])
            for pressure, items in by_pressure.items():
                engine = self._load(m, bar, pressure)
                try:
                    for unit, t in items:
                        self._measure(engine, m, unit, t, bar)
                    units = {u.id: u for u, _ in items}
                    units.update({u.id: u for u in pending.get(m, []) if self._pressure(u) == pressure})
                    self._remeasure(lambda _m, e=engine: e, [m], bar, units=list(units.values()))
                finally:  # engines (and vLLM's child processes) never outlive an error
                    engine.close()
                del engine

    def _ballast_applies(self) -> bool:
        return self.backend.applies_ballast(self.spec.device)

    def _pressure(self, unit) -> float:
        return float(unit.requests[0].memory_pressure) if self._ballast_applies() else 0.0

    def _load(self, mode, bar: _Bar, memory_pressure: float = 0.0):
        """Load ``mode``'s engine and warm it up. The units' prompts are prepared from
        the first engine's tokenizer, before its warm-up, and reused by every mode."""
        bar.show(f"{mode}: loading")
        settings = dataclasses.replace(self.settings, memory_pressure=memory_pressure)
        engine = self.backend.engine(mode, settings).load()
        if self._run.prepared is None:
            self._prepare(engine.tokenizer)
        bar.show(f"{mode}: warm-up")
        engine.warmup()
        return engine

    def _prepare(self, tokenizer):
        from engine.prompts import PromptBuilder

        builder = PromptBuilder(tokenizer)
        units = self._run.units
        self._run.prepared = {u.id: [builder.prepare(r) for r in u.requests] for u in units}
        self._run.primers = {u.id: [builder.prepare(r) for r in u.prime] for u in units}

    def _cpu_clock(self):
        from engine.energy import cpu_seconds_clock
        from engine.noise import TrialClock

        return TrialClock(cpu_seconds_clock(self.backend.child_processes))

    def _measure(self, engine, mode, unit, trial, bar: _Bar, attempt: int = 0):
        """Time one unit in one mode and journal its row (before the next one starts)."""
        bar.show(f"{mode}: {unit.family}" + (f" (re-measure {attempt})" if attempt else ""))
        self._journal_row(self.measure_row(engine, mode, unit, trial, attempt))
        bar.advance()

    def _journal_row(self, row: dict):
        """Score ``row``'s output against the reference's (ROUGE-L), journal it, tell
        ``on_row``. The reference mode's first trial sets the unit's reference text, so
        a unit's reference row must be journalled before its other modes' rows."""
        from engine.quality import rouge_l

        run = self._run
        uid = row["request_id"]
        if row["mode"] == run.reference and row["trial"] == 0 and not row.get("attempt"):
            run.ref_output[uid] = row["output_text"]
        base = run.ref_output.get(uid)
        row["rouge_l_vs_baseline"] = None if base is None else rouge_l(row["output_text"], base)
        run.journal.add(row)
        if self.on_row:
            self.on_row(row)

    def measure_row(self, engine, mode, unit, trial, attempt: int = 0) -> dict:
        """One timed engine call of ``unit`` in ``mode``, as its profile row (with the
        output text; ROUGE-L not yet scored). A Ray worker calls this too."""
        run = self._run
        group = run.prepared[unit.id]
        # a request with real text (a benchmark's, or a family's prompt built from one:
        # it records its question's evaluation_mode) ends where the model ends its answer
        ignore_eos = not any(r.benchmark_suite or r.evaluation_mode for r, _ in group)
        if run.primers[unit.id]:
            engine.run(run.primers[unit.id], ignore_eos=ignore_eos)
        sampler = self._memory_sampler()
        clock = self._cpu_clock()
        run.meter.start()
        with sampler, clock:
            gens = engine.run(group, ignore_eos=ignore_eos)
        energy = run.meter.stop()
        m = Measurement(unit, mode, trial, group, gens, energy, self._peak_mb(engine, sampler),
                        engine.info, clock=clock, attempt=attempt)
        return self._row(m)

    def _cuda(self) -> bool:
        return self.spec.device.startswith("cuda")

    @property
    def nvml_index(self) -> int:
        """The GPU's index as NVML counts them (all GPUs, whatever CUDA_VISIBLE_DEVICES
        shows torch); a Ray worker sets its assigned GPU's."""
        if self._nvml_index is not None:
            return self._nvml_index
        device = self.spec.device
        return int(device.split(":")[1]) if ":" in device else 0

    def _memory_sampler(self):
        """A peak-memory sampler for one engine call. An engine that computes in child
        processes allocates there: on CUDA its device memory is read through NVML,
        on CPU the children's RSS counts too."""
        from engine.memory import GpuMemoryPeak, PeakRSS

        if self._cuda():
            import torch

            torch.cuda.reset_peak_memory_stats()
            if self.backend.child_processes:
                return GpuMemoryPeak(self.nvml_index)
        return PeakRSS(children=self.backend.child_processes)

    def _peak_mb(self, engine, sampler) -> float:
        """CPU: resident model + RSS growth; CUDA: the allocator's peak (weights
        included), or for a child-process engine the device memory in use (NVML),
        ballast excluded."""
        if not self._cuda():
            return engine.weights_mb + sampler.peak_growth_mb
        if self.backend.child_processes:
            return sampler.peak_mb - engine.info.get("ballast_bytes", 0) / 2**20
        import torch

        return torch.cuda.max_memory_allocated() / 2**20

    def finish(self, journal: Journal) -> pd.DataFrame:
        """Rebuild the profile from the journal (contention flags worked out over every
        unit's trials), validate it and write it; ``noise_`` holds its noise floor."""
        from dataset.io import write_parquet
        from engine.noise import noise_floor

        if self._run is None:  # finishing a journal without measuring (tests, tools)
            self._run = ProfileRun(journal, None, None, [], journal.keys(), {})
            if "threads" in journal.meta:
                from engine.noise import ThreadChoice

                self._run.threads = ThreadChoice.from_dict(journal.meta["threads"])
        df = validate_profile(self._frame(), path=self.journal_path)
        self.noise_ = noise_floor(df)
        write_parquet(df, self.out, overwrite=True)
        return df

    def _say(self, msg):
        if self.console is not None:
            self.console.print(msg)

    def _notes(self, m: Measurement) -> list[str]:
        """What a reader of the row must know: how energy was measured, and what was
        asked for but not done (memory pressure without a ballast, a too-short window)."""
        notes = [f"energy: {self._run.meter.describe()}"]
        if any(r.memory_pressure > 0 for r in m.requests) and not self._ballast_applies():
            notes.append("memory pressure not applied: no accelerator memory to take on CPU"
                         if self.spec.device == "cpu" else
                         "memory pressure not applied: the ballast is implemented for the vLLM backend")
        if m.energy.short_window:
            notes.append("energy window shorter than the meter's update period")
        return notes

    def _row(self, m: Measurement) -> dict:
        """The profile row of one measurement (the journal's line; the parquet drops
        ``output_text``). Column order: shape, timing, resources, quality, provenance."""
        return {**_shape_columns(m), **_timing_columns(m.gens), **_noise_columns(m, self._run.threads),
                **_resource_columns(m), **_quality_columns(m),
                **_provenance_columns(self._run.provenance, m, self._notes(m))}

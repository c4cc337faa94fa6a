"""The measuring loop: :class:`Profiler` runs the plan's units in every mode (mode by
mode, or interleaved), chooses the thread count, re-measures contended trials, and
rebuilds the profile from the journal (see :mod:`modeswitch.engine.profiler`)."""

from __future__ import annotations

import dataclasses
import os
import socket
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import pandas as pd
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from modeswitch.dataset.io import write_parquet
from modeswitch.dataset.profile_memory import MEMORY_NOTE
from modeswitch.dataset.profile_schema import validate_profile
from modeswitch.engine import noise, prompts
from modeswitch.engine.backends import registry
from modeswitch.engine.backends.base import EngineSettings, context_for, start_unit
from modeswitch.engine.energy import cpu_seconds_clock, make_meter
from modeswitch.engine.hardware import hardware_string
from modeswitch.engine.memory import GpuMemoryPeak, PeakRSS, release_freed_memory
from modeswitch.engine.noise import (
    ThreadChoice,
    TrialClock,
    calibrate_threads,
    noise_floor,
    unresolved_trials,
)
from modeswitch.engine.profiler.journal import Journal
from modeswitch.engine.profiler.plan import ProfileSpec, Unit, build_units
from modeswitch.engine.profiler.rows import (
    Measurement,
    RowProvenance,
    _noise_columns,
    _provenance_columns,
    _quality_columns,
    _resource_columns,
    _shape_columns,
    _timing_columns,
    model_id,
    software_string,
)
from modeswitch.engine.quality import rouge_l


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
    its :class:`~modeswitch.engine.backends.registry.Backend` methods, so any registered
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
        return registry.get_backend(self.spec.backend)

    @cached_property
    def settings(self):
        """What every engine of this run is built with (memory pressure: none; a
        ballast-applying backend gets its own per pressure level, see :meth:`_load`)."""
        # caches sized for the longest request measured, not for the model's limit
        units = self._run.units if self._run is not None else build_units(self.spec)
        requests = [r for u in units for r in u.requests + u.prime]
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
        df = pd.DataFrame([{k: v for k, v in r.items() if k != "output_text"}
                           for r in self._run.journal.rows if modes is None or r["mode"] in modes])
        if df.empty:
            return df
        if "attempt" not in df:
            df["attempt"] = 0
        df["attempt"] = df["attempt"].fillna(0).astype(int)
        threads = self._run.threads
        df["contended"] = noise.flag_contended(df, expected_share=threads.clean_share if threads else None)
        return df

    def _to_remeasure(self, modes=None, units=None) -> pd.DataFrame:
        """(request_id, mode, trial, attempts) of trials the journal holds only contended
        attempts of and that have attempts left, within ``modes`` and ``units``."""
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
        builder = prompts.PromptBuilder(tokenizer)
        units = self._run.units
        self._run.prepared = {u.id: [builder.prepare(r) for r in u.requests] for u in units}
        self._run.primers = {u.id: [builder.prepare(r) for r in u.prime] for u in units}

    def _cpu_clock(self):
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
        start_unit(engine, run.primers[unit.id], ignore_eos)
        held_mb = None if self._cuda() else self._held_mb(engine)  # before the window: a walk, untimed
        sampler = self._memory_sampler()
        clock = self._cpu_clock()
        run.meter.start()
        with sampler, clock:
            gens = engine.run(group, ignore_eos=ignore_eos)
        energy = run.meter.stop()
        m = Measurement(unit, mode, trial, group, gens, energy, self._peak_mb(engine, sampler, held_mb),
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
        on CPU the children's RSS counts too. On CPU the memory freed before the call
        is handed back first, so the call's RSS growth does not depend on what ran
        before it (:mod:`modeswitch.engine.memory`)."""
        if self._cuda():
            import torch  # lazy: torch is heavy

            torch.cuda.reset_peak_memory_stats()
            if self.backend.child_processes:
                return GpuMemoryPeak(self.nvml_index)
        else:
            release_freed_memory()
        return PeakRSS(children=self.backend.child_processes)

    @staticmethod
    def _held_mb(engine) -> float:
        """What the engine holds as the unit starts (every reachable tensor: weights, a
        draft, a paged KV cache, the prefix store as primed); an engine that cannot
        say (its memory lives in child processes) counts its weights."""
        held = getattr(engine, "held_mb", None)
        return float(held) if held is not None else engine.weights_mb

    def _peak_mb(self, engine, sampler, held_mb: float | None) -> float:
        """CPU: what the engine held as the unit started (``held_mb``) + the call's RSS
        growth; CUDA: the allocator's peak (weights included), or for a child-process
        engine the device memory in use (NVML), ballast excluded."""
        if not self._cuda():
            return held_mb + sampler.peak_growth_mb
        if self.backend.child_processes:
            return sampler.peak_mb - engine.info.get("ballast_bytes", 0) / 2**20
        import torch  # lazy: torch is heavy

        return torch.cuda.max_memory_allocated() / 2**20

    def finish(self, journal: Journal) -> pd.DataFrame:
        """Rebuild the profile from the journal (contention flags worked out over every
        unit's trials), validate it and write it; ``noise_`` holds its noise floor."""
        if self._run is None:  # finishing a journal without measuring (tests, tools)
            self._run = ProfileRun(journal, None, None, [], journal.keys(), {})
            if "threads" in journal.meta:
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
        if not self._cuda() and not self.backend.child_processes:  # a child's heap is not released here
            notes.append(MEMORY_NOTE)
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

"""Profiling sweeps sharded over Ray workers: ``modeswitch profile --ray [ADDRESS]``.

Why Ray: a sweep on a real model is many GPU-hours; past one GPU the cells must
spread over GPUs and machines, and Ray already schedules actors on a cluster's
GPUs and CPUs and tells the driver when one dies. Nothing here is a scheduler of
our own beyond handing the next cell to an idle actor.

How it runs. The driver (this process) owns the journal, as a serial run does: it
is the only writer, so rows land in the same resumable ``<output>.journal.jsonl``
and parquet, and a rerun (serial or distributed, same settings) skips what the
journal holds. Workers are Ray actors, one per GPU (``num_gpus=1``) or, on CPU,
one per slot of ``cpus_per_worker`` CPUs with torch's thread count set to that.
Each actor builds the same units from the same spec (deterministic), keeps its
engine loaded across the cells it is given and only reloads when its next cell
needs another mode (or memory-pressure level): the driver hands an idle actor a
cell of the mode it has loaded while there is one, else the mode with the most
cells per actor on it. The reference mode's cells go first (every other mode's
output is scored against its text, ROUGE-L, on the driver), then the other modes,
then the re-measurements of contended trials (rounds, as in a serial run).

Failure. An actor that dies (its process killed, its node lost) loses only the
cell it was measuring: that cell goes back to the queue, a replacement actor is
started, and the journal holds each (request, mode, trial, attempt) at most once
because only the driver writes it and it checks the key first. An error raised
by the measurement itself (a bad checkpoint, out of memory) is not retried: it
ends the run with that error, as a serial run would.

Ray is imported only here, and only when ``--ray`` is given; it comes with the
``distributed`` extra (``pip install 'modeswitch[distributed]'``).
"""

from __future__ import annotations

import dataclasses
import os
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from modeswitch.dataset.errors import InputError
from modeswitch.engine import profiler
from modeswitch.engine.energy import make_meter
from modeswitch.engine.hardware import hardware_string
from modeswitch.engine.noise import ThreadChoice
from modeswitch.engine.profiler import (
    Journal,
    Profiler,
    ProfileRun,
    ProfileSpec,
    RowProvenance,
    build_units,
    model_id,
    software_string,
)

#: an actor's cells: (unit id, mode, trial, attempt)
Cell = tuple[str, str, int, int]
#: replacement actors started over a run before it gives up (dying workers are a
#: cluster problem the user must see, not something to paper over for ever)
MAX_REPLACEMENTS = 8
#: a run in which no cell finishes for this long (seconds) is stopped with an error
STALL_S = 1800


class _NoBar:
    """The worker side has no progress bar (the driver's shows the whole run)."""

    def show(self, description: str):
        pass

    def advance(self):
        pass


class ProfileWorker:
    """One Ray actor's profiler: builds the run's units, loads one engine at a time,
    measures the cells it is handed and returns their rows (output text included;
    the driver scores and journals them)."""

    def __init__(self, spec: dict, model_path: str, draft_path: str | None, run_id: str,
                 reference: str, threads: int | None):
        import ray  # lazy: Ray is optional

        spec = ProfileSpec(**spec)
        self.profiler = p = Profiler(spec, Path(model_path), Path(draft_path) if draft_path else None,
                                     Path(os.devnull))
        ctx = ray.get_runtime_context()
        device = spec.device
        if device.startswith("cuda"):
            gpu = ray.get_gpu_ids()  # the physical GPU Ray gave this actor (torch sees it as cuda:0)
            p._nvml_index = int(gpu[0]) if gpu else 0
            device = f"cuda:{p._nvml_index}"
            p.spec = dataclasses.replace(spec, device="cuda:0")
        choice = None
        if threads and p.backend.set_threads is not None and not p._cuda():
            p.backend.set_threads(threads)
            p.settings = dataclasses.replace(p.settings, threads=threads)
            choice = ThreadChoice(threads, [], "one Ray worker slot's CPUs")
        p._run = ProfileRun(
            journal=None,
            meter=make_meter(p.spec.device, p.nvml_index, watts_per_core=spec.watts_per_core,
                             include_children=p.backend.child_processes),
            provenance=RowProvenance(
                backend=spec.backend, reference_mode=reference, model=model_id(p.model_path),
                hardware=hardware_string(p.spec.device), software=software_string(), run_id=run_id,
                worker=f"ray:{ctx.get_node_id()[:8]}:{ctx.get_actor_id()[:12]}", device=device),
            units=build_units(spec), done=set(), ref_output={}, threads=choice)
        self.units = {u.id: u for u in p._run.units}
        self.engine, self.loaded = None, None

    def measure(self, unit_id: str, mode: str, trial: int, attempt: int) -> dict:
        p, unit = self.profiler, self.units[unit_id]
        key = (mode, p._pressure(unit))
        if key != self.loaded:
            self.close()
            self.engine = p._load(mode, _NoBar(), key[1])
            self.loaded = key
        return p.measure_row(self.engine, mode, unit, trial, attempt)

    def close(self):
        if self.engine is not None:
            self.engine.close()
        self.engine, self.loaded = None, None


@dataclass(frozen=True)
class RayOptions:
    """How ``--ray`` spreads a run (not part of the run's identity: a serial run and a
    Ray run of the same spec share one journal)."""

    #: a cluster's address (auto, host:6379, ray://host:10001); None: $RAY_ADDRESS, else a local Ray
    address: str | None = None
    #: actors to start; None: one per GPU, or per ``cpus_per_worker`` CPUs
    workers: int | None = None
    #: CPU runs: CPUs (and torch threads) per actor; None: the spec's threads, else 1
    cpus_per_worker: int | None = None


def make_profiler(spec: ProfileSpec, model_path, draft_path, out, console=None,
                  ray: RayOptions | None = None) -> Profiler:
    """A serial :class:`Profiler`, or with ``ray`` a :class:`RayProfiler`."""
    if ray is None:
        # profiler.Profiler, looked up at call time (tests replace it)
        return profiler.Profiler(spec, model_path, draft_path, out, console=console)
    return RayProfiler(spec, model_path, draft_path, out, console=console, address=ray.address,
                       workers=ray.workers, cpus_per_worker=ray.cpus_per_worker)


@dataclass
class _Actor:
    handle: object
    name: str
    loaded: tuple | None = None
    busy: bool = False


@dataclass
class RayPlan:
    """How the run is spread: ``workers`` actors, each with these resources."""

    workers: int
    num_cpus: float
    num_gpus: float
    #: torch threads per CPU worker (None on GPU)
    threads: int | None
    cluster: dict = field(default_factory=dict)


class RayProfiler(Profiler):
    """A :class:`~modeswitch.engine.profiler.Profiler` whose cells run on Ray actors (see the module
    docstring). ``address``: a Ray cluster (``ray://host:10001``, ``host:6379`` or
    ``auto``); None starts a local Ray on this machine. ``workers``: how many actors
    (default: one per GPU, or per ``cpus_per_worker`` CPUs of the cluster)."""

    def __init__(self, spec: ProfileSpec, model_path: Path, draft_path: Path | None, out: Path,
                 console=None, on_row=None, address: str | None = None, workers: int | None = None,
                 cpus_per_worker: int | None = None, ray_init: dict | None = None):
        super().__init__(spec, model_path, draft_path, out, console=console, on_row=on_row)
        self.address, self.workers, self.cpus_per_worker = address, workers, cpus_per_worker
        self.ray_init = dict(ray_init or {})
        self.actors_: list[_Actor] = []
        self.replaced_ = 0

    # ----------------------------------------------------------------- set-up
    def _connect(self):
        try:
            import ray  # lazy: Ray is optional
        except ImportError:
            raise InputError("--ray needs Ray: pip install 'modeswitch[distributed]' (or `pip install ray`)") from None
        if not ray.is_initialized():
            kw = {"include_dashboard": False, "log_to_driver": False, **self.ray_init}
            ray.init(address=self.address, **kw)
        return ray

    def _plan(self, ray) -> RayPlan:
        """Actors and their resources, checked against the cluster: an actor it cannot
        place would wait for ever. On CPU the thread count is the journal's when a
        resumed run has one (its rows were measured with it, and the contention rule
        compares trials at one thread count)."""
        res = ray.cluster_resources()
        if self._cuda():
            gpus = int(res.get("GPU", 0))
            if gpus < 1:
                raise InputError(f"--device {self.spec.device}: the Ray cluster has no GPUs ({res})")
            if self.workers is not None and self.workers > gpus:
                raise InputError(f"--ray-workers {self.workers}: the cluster has {gpus} GPU(s), one per worker")
            return RayPlan(self.workers or gpus, 1, 1, None, res)
        journalled = self._run.journal.meta.get("threads", {}).get("threads")
        per = self.cpus_per_worker or self.spec.threads or journalled or 1
        if journalled and per != journalled:
            raise InputError(f"{self.journal_path} was measured with {journalled} thread(s); resume it with "
                             f"--ray-cpus-per-worker {journalled} (or start a new output)")
        cpus = int(res.get("CPU", 1))
        if per > cpus or (self.workers or 1) * per > cpus:
            raise InputError(f"{self.workers or 1} worker(s) x {per} CPU(s): the cluster has {cpus} CPUs")
        n = self.workers or max(1, cpus // per)
        return RayPlan(n, per, 0, per, res)

    def _start_actor(self, ray, plan: RayPlan, i: int) -> _Actor:
        cls = ray.remote(num_cpus=plan.num_cpus, num_gpus=plan.num_gpus, max_restarts=0,
                         max_task_retries=0)(ProfileWorker)
        name = f"worker-{i}"
        handle = cls.remote(
            dataclasses.asdict(self.spec), str(self.model_path),
            str(self.draft_path) if self.draft_path else None, self._run.journal.run_id,
            self._run.reference, plan.threads)
        return _Actor(handle, name)

    # ------------------------------------------------------------------- run
    def run(self):
        if self.out.exists() and not self.journal_path.exists():
            raise FileExistsError(f"{self.out} already exists and is not a run in progress; "
                                  "choose another output path")
        if self.spec.interleave:
            raise InputError("--interleave keeps every mode's engine loaded in one process; a --ray run "
                             "spreads modes over workers: use one or the other")
        ray = self._connect()
        caps, modes, skipped = self.plan()
        for m, why in skipped.items():
            self._say(f"[yellow]skip[/yellow] {m}: {why}")
        journal = Journal(self.journal_path, self.spec)
        units = build_units(self.spec)
        # the driver measures nothing: its provenance only names the reference mode
        # (every row's own provenance comes from the worker that measured it)
        prov = RowProvenance(self.spec.backend, caps.reference_mode, "", "", "", journal.run_id)
        self._run = ProfileRun(journal, None, prov, units, journal.keys(),
                               {r["request_id"]: r["output_text"] for r in journal.rows
                                if r["mode"] == caps.reference_mode and r["trial"] == 0
                                and not r.get("attempt")})
        self._landed = set(self._run.done)
        self._units = {u.id: u for u in units}
        plan = self._plan(ray)
        self._record_threads(plan)
        nodes = sum(1 for k in plan.cluster if k.startswith("node:") and "internal" not in k)
        self._say(f"ray: {plan.workers} worker(s), {plan.num_gpus or plan.num_cpus:g} "
                  f"{'GPU' if plan.num_gpus else 'CPU'} each, on {nodes} node(s)")
        if not plan.num_gpus and plan.workers > nodes:
            self._say("[yellow]note[/yellow]: CPU workers share a machine, so each one's trials run "
                      "beside another's load and are flagged contended (engine.noise), as they should "
                      "be; for clean CPU timings start one worker per machine (--ray-workers)")
        try:
            with self._progress() as progress:
                bar = progress.add_task("profiling", total=self._total(modes),
                                        completed=self._completed(modes))
                self._bar = (progress, bar)
                self.actors_ = [self._start_actor(ray, plan, i) for i in range(plan.workers)]
                self._next_actor = plan.workers
                ref, rest = modes[:1], modes[1:]
                for phase in (ref, rest):
                    self._dispatch(ray, plan, [(u.id, m, t, 0) for m in phase for (u, t) in self._todo(m)])
                for _ in range(self.spec.max_remeasure):
                    todo = self._to_remeasure(modes)
                    if todo.empty:
                        break
                    progress.update(bar, total=(progress.tasks[0].total or 0) + len(todo))
                    self._dispatch(ray, plan, [(r.request_id, r.mode, int(r.trial), int(r.attempts))
                                               for r in todo.itertuples(index=False)])
                progress.update(bar, description="done")
        finally:
            self._stop_actors(ray)
        try:
            return self.finish(journal)
        finally:
            journal.close()

    def _record_threads(self, plan: RayPlan):
        run = self._run
        if plan.threads is None or self.backend.set_threads is None:
            return
        run.threads = ThreadChoice(plan.threads, [], f"one Ray worker slot's CPUs ({plan.threads})")
        if "threads" not in run.journal.meta or run.journal.meta["threads"].get("threads") != plan.threads:
            run.journal.add_meta("threads", run.threads.to_dict())

    def _pick(self, actor: _Actor, queues: dict[tuple, deque]) -> Cell | None:
        """The next cell for an idle actor: one of the engine it has loaded, else from
        the (mode, pressure) queue with the most cells per actor already on it."""
        live = {k: q for k, q in queues.items() if q}
        if not live:
            return None
        if actor.loaded in live:
            return live[actor.loaded].popleft()
        on = {k: sum(1 for a in self.actors_ if a.loaded == k) for k in live}
        key = max(live, key=lambda k: (len(live[k]) / (on[k] + 1), k[0] == self._run.reference))
        actor.loaded = key
        return live[key].popleft()

    def _key(self, cell: Cell) -> tuple:
        return (cell[1], self._pressure(self._units[cell[0]]))

    def _dispatch(self, ray, plan: RayPlan, cells: list[Cell]):
        """Run ``cells`` on the actors until every one is journalled."""
        # lazy: Ray is optional
        from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError

        lost = (RayActorError, ActorDiedError, ActorUnavailableError)
        queues: dict[tuple, deque] = {}
        for c in cells:
            queues.setdefault(self._key(c), deque()).append(c)
        flying: dict = {}
        while any(queues.values()) or flying:
            for actor in self.actors_:
                if not actor.busy:
                    cell = self._pick(actor, queues)
                    if cell is None:
                        break
                    actor.busy = True
                    flying[actor.handle.measure.remote(*cell)] = (actor, cell)
            ready, _ = ray.wait(list(flying), num_returns=1, timeout=STALL_S)
            if not ready:
                raise RuntimeError(f"no Ray worker finished a cell in {STALL_S / 60:.0f} minutes (workers that "
                                   "cannot be placed, or a hung engine); the journal keeps every row so far")
            for ref in ready:
                actor, cell = flying.pop(ref)
                try:
                    row = ray.get(ref)
                except lost as exc:
                    self._replace(ray, plan, actor, exc)
                    queues.setdefault(self._key(cell), deque()).appendleft(cell)
                    continue
                except Exception:  # the measurement failed: keep what the others finish, then stop
                    self._land_finished(ray, flying)
                    raise
                actor.busy = False
                self._land(row)

    def _land_finished(self, ray, flying: dict):
        """Journal the cells still in flight that finish, before a failure ends the run."""
        for ref in list(flying):
            try:
                self._land(ray.get(ref, timeout=STALL_S))
            except Exception:  # noqa: BLE001 - failed or lost too: measured again on rerun
                pass

    def _land(self, row: dict):
        key = (row["request_id"], row["mode"], row["trial"], row.get("attempt", 0))
        if key in self._landed:  # never twice, whatever a worker sends
            return
        self._journal_row(row)
        self._landed.add(key)
        progress, bar = self._bar
        progress.advance(bar)

    def _replace(self, ray, plan: RayPlan, actor: _Actor, exc):
        """A dead actor: its cell is re-queued by the caller; a new actor takes its place."""
        self.replaced_ += 1
        if self.replaced_ > MAX_REPLACEMENTS:
            raise RuntimeError(f"{self.replaced_} Ray workers died in this run (last: {exc}); "
                               "the journal keeps every row measured so far: rerun to resume") from exc
        self._say(f"[yellow]worker {actor.name} died[/yellow] ({type(exc).__name__}); its cell goes "
                  "to another worker and a new worker starts")
        try:  # "unavailable" may be transient: a live actor would keep its GPU
            ray.kill(actor.handle, no_restart=True)
        except Exception:  # noqa: BLE001 - dead already
            pass
        i = self.actors_.index(actor)
        self.actors_[i] = self._start_actor(ray, plan, self._next_actor)
        self._next_actor += 1

    def _stop_actors(self, ray):
        for a in self.actors_:
            try:
                ray.kill(a.handle)
            except Exception:  # already dead: nothing to stop
                pass
        self.actors_ = []

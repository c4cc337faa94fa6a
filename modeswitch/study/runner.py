"""``modeswitch study run``: the whole CPU study, step by step, resumable.

Steps, each writing into the study folder: ``model`` (build or find the model),
``profile`` (every mode on every family, per-request drawn conditions, ``k``
interleaved trials; its own journal resumes a half-done sweep), ``costmodel`` (fit
and cross-validate), ``labels`` (the profiled requests, from their own trials),
``dataset`` (profiled requests labelled ``measured`` plus drawn ones labelled from
estimates), ``train:<split>`` and ``score:<split>`` for every split, and
``report`` (the opening table across splits, findings, MLflow).

Resumable: ``study_state.json`` records each finished step with its seconds and
outputs (written atomically after the step). A rerun with the same settings skips
finished steps and continues the interrupted one where it can (the profile's
journal; Optuna studies with their finished trials); a half-written score report
is moved aside (``.incomplete-<time>``), never overwritten; the other files a step
writes are replaced only while that step is unfinished (they can only be a
same-settings attempt's leftovers). A rerun with other settings into the same
folder is refused, except for train and score settings taken with ``--redo train``
(``--redo score``), and the quality sweep's passes with ``--redo quality`` (its journal
continues): the measurements are kept, the earlier settings recorded
(:meth:`Study._take_later_settings`). Every step prints the time it took, and
the report lists them.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
)

import modeswitch.engine.models.resolve as model_resolve
from modeswitch.dataset.errors import InputError
from modeswitch.dataset.features import reads_content
from modeswitch.dataset.io import atomic_path, write_parquet
from modeswitch.dataset.profile_memory import needs_remeasure, with_memory_from
from modeswitch.dataset.profile_schema import read_profile
from modeswitch.dataset.workloads import get_workload
from modeswitch.dataset.workloads.conditions import draw_units, scaled
from modeswitch.engine.backends import registry as backend_registry
from modeswitch.engine.distributed import make_profiler
from modeswitch.engine.hardware import hardware_string, other_kinds, recorded_hardware
from modeswitch.engine.profiler import ProfileSpec
from modeswitch.engine.profiler.journal import journal_identity
from modeswitch.engine.profiler.plan import profiled_leads
from modeswitch.engine.quality_sweep import (
    FLIP_AT,
    SweepSpec,
    flipped_share,
    read_sweep,
    run_sweep,
    sweep_passes,
)
from modeswitch.oracle import label_profile
from modeswitch.oracle.costmodel import CostModel, enough_requests, fit_validated
from modeswitch.oracle.training_table import build_training_table, profiled_requests
from modeswitch.routers.scoring.run import ScoreConfig, score_routers
from modeswitch.routers.training.table import (
    TrainingTable,  # heavy (scikit-learn): only when run
)
from modeswitch.routers.training.trainer import TrainConfig, train
from modeswitch.study import archive
from modeswitch.study.config import LATER_FIELDS, TABLES, StudyConfig
from modeswitch.study.report import write_study_report

STATE = "study_state.json"

#: the memory pass of a profile measured with the old CPU memory method (``_step_memory``)
MEMORY_PASS = "memory_pass.parquet"


def _aside(path: Path, tag: str) -> Path:
    """Rename ``path`` to ``<name>.<tag>`` (``-2``, ``-3``... where that is taken: two
    moves within a second must not replace each other's) and return the new path."""
    dest, k = path.with_name(f"{path.name}.{tag}"), 2
    while dest.exists():
        dest, k = path.with_name(f"{path.name}.{tag}-{k}"), k + 1
    path.rename(dest)
    return dest


@dataclass
class StepRecord:
    name: str
    seconds: float
    finished: str
    outputs: dict


class Study:
    """One study folder: its config, its state, its steps."""

    def __init__(self, cfg: StudyConfig, console=None, log: Callable[[str], None] | None = None,
                 ray=None, beside=None, redo=()):
        self.cfg = cfg
        #: another study's folder the report sets its figures beside (not a study setting:
        #: it changes what the report shows, not what is measured)
        self.beside = beside
        #: :class:`engine.distributed.RayOptions`: profile over Ray (None: in this process);
        #: how the cells are spread is not a study setting, so it is not in ``cfg``
        self.ray = ray
        self.out = Path(cfg.output)
        self.console = console
        self.log = log or (self._print if console is not None else print)
        #: the steps this run redoes (--redo): a change to the train or score settings is
        #: taken in the same folder only when the steps it touches are redone
        self.redo = [str(x) for x in redo]
        self.state = self._load_state()

    def _print(self, msg: str):
        self.console.print(escape(msg))

    # ------------------------------------------------------------- state
    def _load_state(self) -> dict:
        path = self.out / STATE
        if not path.exists():
            return {"identity": self.cfg.identity(), "config": self.cfg.to_dict(), "steps": {}}
        state = json.loads(path.read_text())
        if state.get("identity") != self.cfg.identity():
            self._take_later_settings(state, path)
        return state

    def _take_later_settings(self, state: dict, path: Path):
        """A study resumed with other settings. Why allow any: the measurements (hours)
        do not depend on how routers are trained or scored, so a researcher trying
        another certificate or target retrains in the same folder, with ``--redo train``
        (``--redo score`` for score settings alone); the earlier settings are kept in the
        state's ``settings_history`` and the earlier score reports moved aside, never
        overwritten. More (or fewer) quality-sweep passes are taken with ``--redo quality``:
        the sweep's journal continues, so only the new passes run. Anything else changed
        needs a new folder."""
        new = self.cfg.to_dict()
        old = {k: state.get("config", {}).get(k, LATER_FIELDS.get(k)) for k in new}
        changed = {k: (old[k], new[k]) for k in new if k != "output" and old[k] != new[k]}
        train, score = set(TABLES["train"]) - {"splits"}, set(TABLES["score"])
        if not self.cfg.swept_per_family:  # no sweep: its passes change nothing this study reads
            changed.pop("sweep_repeats", None)
        step = "quality" if "sweep_repeats" in changed else "train" if set(changed) & train else "score"
        if step != "quality" and "feature_set" in changed and not new["confidence"] and \
                reads_content(old["feature_set"]) != reads_content(new["feature_set"]):
            step = "dataset"  # the table carries content columns only for a content feature set
        if not changed:  # settings that no longer exist: nothing this study reads changed
            state["identity"], state["config"] = self.cfg.identity(), new
            return
        said = "; ".join(f"{k}: {a!r} -> {b!r}" for k, a, b in ((k, *v) for k, v in changed.items()))
        if not set(changed) <= train | score | {"sweep_repeats"}:
            raise InputError(f"{self.out} holds a study with other settings ({path}: {said}); give a new "
                             "[study] output folder to start another (results are never overwritten)")
        # whole steps only: --redo train:group would leave the other splits on the old settings;
        # a redo covers the change where it redoes the step (it, or a step the step reads)
        kinds = {s.split(":")[0] for s in self.steps()}
        redone = {x.split(":")[0] for r in self.redo if r in kinds for x in self._downstream(r)}
        if step not in redone:
            kind = {"dataset": "train", "quality": "quality-sweep"}.get(step, step)
            what = {"quality": "sweep with the new count of passes (the sweep's journal continues: a pass it "
                               "holds is not run again), rebuild the table, retrain and ",
                    "dataset": "rebuild the table, retrain and ", "train": "retrain and "}
            raise InputError(f"{self.out} was run with other {kind} settings ({said}); run again with --redo "
                             f"{step}{' (every split)' if step in ('train', 'score') else ''} to "
                             f"{what.get(step, '')}rescore in this folder (the measurements are kept, earlier "
                             "reports moved aside), or give a new [study] output folder")
        state.setdefault("settings_history", []).append(
            {"identity": state.get("identity"), "config": state.get("config"), "changed": changed,
             "until": datetime.now(UTC).isoformat(timespec="seconds")})
        state["identity"], state["config"] = self.cfg.identity(), new
        self.log(f"settings changed ({said}); the earlier ones kept in {path.name}'s settings_history")

    def _save_state(self):
        self.out.mkdir(parents=True, exist_ok=True)
        with atomic_path(self.out / STATE, overwrite=True) as tmp:
            Path(tmp).write_text(json.dumps(self.state, indent=1, default=str))

    def seed_from(self, src) -> list[str]:
        """Take the measuring steps this study has not run from the archive ``src``
        (:mod:`study.archive`); returns the steps taken."""
        taken = archive.seed(self.state, self.cfg, self.out, src, save=self._save_state)
        if taken:
            self.log(f"from the archive {src}: {', '.join(taken)} (copied, not measured again)")
        if taken and self.cfg.swept_per_family and not self.done("quality"):
            self.log(f"the archive's quality sweep was not taken (it judged another number of passes than the "
                     f"{self.cfg.sweep_repeats} asked, or it has none): this study sweeps its own")
        if "profile" in taken:
            self._warn_other_kind()
        if "quality" in taken:
            self._warn_other_kind("quality")
        return taken

    def _warn_other_kind(self, step: str = "profile"):
        """Say so when the profile (or the quality sweep) was measured on another kind of
        machine than this one. Why: which mode is fastest depends on the CPU's kernels
        (INT8 weight-only can be faster than the reference on one EPYC and slower on
        another), and so does a lossy mode's output (the same requests swept on two
        kinds of machine got other verdicts, while two passes on one machine agreed;
        docs/results.md). Labels from there need not hold here, and the live check counts such violations as ``other_hardware``; ``--redo
        profile`` (``--redo quality``) measures it here."""
        if step == "profile":
            path = self.outputs("profile").get("profile") or self.out / "profile.parquet"
        else:
            path = self.outputs("quality").get("sweep") or self.out / "quality_sweep.parquet"
        here = hardware_string(self.cfg.device)
        other = other_kinds(here, recorded_hardware(path))
        if other:
            what = "profile" if step == "profile" else "quality sweep"
            self.log(f"the {what} was measured on another kind of machine ({'; '.join(other)}) than this "
                     f"one ({here}): its labels need not hold here (the live check counts such "
                     f"violations as other_hardware); --redo {step} measures it on this machine")

    def archive_to(self, dest) -> dict:
        """Keep this study's finished measuring steps in ``dest`` (:mod:`study.archive`)."""
        return archive.archive(self.state, self.cfg, self.out, dest)

    def done(self, step: str) -> bool:
        return step in self.state["steps"]

    def needs(self, step: str) -> list[str]:
        """The steps ``step`` reads the outputs of."""
        base = ["model", "profile", "memory", "costmodel", "labels",
                *(["quality"] if self.cfg.swept_per_family else []), "dataset"]
        kind, _, split = step.partition(":")
        if kind == "quality":  # the sweep draws its requests from the settings; it reads no measurement
            return ["model"]
        if kind in base:
            return base[:base.index(kind)]
        if kind == "train":
            return base
        if kind == "score":
            return [*base, f"train:{split}"]
        return [x for x in self.steps() if x != "report"]

    def forget(self, step: str):
        """Mark a step (or every ``kind:*`` step for ``kind``) and every step that reads
        its outputs as not done, so the next run does them again (redoing the dataset
        retrains and rescores; a finished score report is moved aside as ``.previous``)."""
        names = self._downstream(step)
        if not names:
            raise InputError(f"--redo {step!r}: no such step; steps: {', '.join(self.steps())}")
        for x in names:
            if x in self.state["steps"] and x.startswith("score:"):
                self.state.setdefault("redone", []).append(x)
            self.state["steps"].pop(x, None)
        self._save_state()

    def _downstream(self, step: str) -> set[str]:
        """``step`` (or every ``kind:*`` step for ``kind``) and every step that reads its
        outputs, directly or not: what redoing it redoes (empty for no such step)."""
        order = self.steps()
        names = {x for x in order if x == step or x.split(":")[0] == step}
        grew = bool(names)
        while grew:
            more = {x for x in order if set(self.needs(x)) & names} - names
            names |= more
            grew = bool(more)
        return names

    def outputs(self, step: str) -> dict:
        return self.state["steps"][step]["outputs"]

    def steps(self) -> list[str]:
        s = ["model", "profile", "memory", "costmodel", "labels",
             *(["quality"] if self.cfg.swept_per_family else []), "dataset"]
        s += [f"train:{x}" for x in self.cfg.splits]
        s += [f"score:{x}" for x in self.cfg.splits]
        return s + ["report"]

    # --------------------------------------------------------------- run
    def run(self, only: list[str] | None = None) -> dict:
        """Run every step not finished yet (or only those named, whose earlier steps
        must be done); returns the state."""
        self.out.mkdir(parents=True, exist_ok=True)
        self._save_state()
        order = self.steps()
        for step in order:
            if only and step not in only and step.split(":")[0] not in only:
                continue
            if only:
                missing = [x for x in self.needs(step) if not self.done(x)
                           and x not in only and x.split(":")[0] not in only]
                if missing:
                    raise InputError(f"--only {step}: needs {', '.join(missing)} done first")
            if self.done(step):
                rec = self.state["steps"][step]
                self.log(f"[{step}] done before ({rec['seconds']:.0f} s); skipped")
                continue
            self.log(f"[{step}] starting")
            # an interrupted run's time on this step (a resumed profile continues from its
            # journal): the step's seconds count every run of it, not the last one only
            before = float(self.state.get("interrupted", {}).get(step, 0.0))
            t0 = time.perf_counter()
            kind, _, arg = step.partition(":")
            try:
                outputs = getattr(self, f"_step_{kind}")(*([arg] if arg else []))
            except BaseException:  # Ctrl-C included: keep the time spent before re-raising
                self.state.setdefault("interrupted", {})[step] = round(before + time.perf_counter() - t0, 1)
                self._save_state()
                raise
            this_run = time.perf_counter() - t0
            seconds = before + this_run
            self.state.get("interrupted", {}).pop(step, None)
            rec = {"seconds": round(seconds, 1), "outputs": outputs,
                   "finished": datetime.now(UTC).isoformat(timespec="seconds")}
            if before:
                rec["earlier_runs_seconds"] = round(before, 1)
            self.state["steps"][step] = rec
            self._save_state()
            self.log(f"[{step}] finished in {seconds:.0f} s"
                     + (f" ({this_run:.0f} s in this run, the rest in interrupted ones)" if before else ""))
        total = sum(s["seconds"] for s in self.state["steps"].values())
        self.log(f"study steps took {total / 60:.1f} min in all (this run and earlier ones)")
        return self.state

    # ------------------------------------------------------------- steps
    def _models(self):
        return model_resolve.resolve_models(self.cfg.model, self.cfg.draft_model, None, None, lambda *a: None,
                              modes=self.cfg.modes)

    def _step_model(self) -> dict:
        target, draft, card = model_resolve.resolve_models(self.cfg.model, self.cfg.draft_model, None, None, self.log,
                                             modes=self.cfg.modes)
        return {"target": str(target), "draft": str(draft) if draft else None,
                "params": (card or {}).get("target_params")}

    def profile_spec(self, target, draft):
        c = self.cfg
        return ProfileSpec(
            model=str(target), draft_model=str(draft) if draft else None, backend=c.backend,
            device=c.device, modes=list(c.modes) if c.modes else None, workloads=list(c.families),
            requests=c.requests_per_family, trials=c.trials, max_remeasure=c.max_remeasure,
            seed=c.seed, threads=c.threads, interleave=c.interleave,
            conditions=c.condition_draw().to_dict(), length_scale=c.length_scale)

    def _step_profile(self) -> dict:
        target, draft, _ = self._models()
        path = self.out / "profile.parquet"
        profiler = make_profiler(self.profile_spec(target, draft), target, draft, path,
                                 console=self.console, ray=self.ray)
        df = profiler.run()
        noise = profiler.noise_
        return {"profile": str(path), "rows": len(df), "units": int(df["request_id"].nunique()),
                "modes": int(df["mode"].nunique()),
                "contended_share": float(df["contended"].mean()) if "contended" in df else None,
                "noise_floor_median_cv": {str(k): float(v) for k, v in noise["median_cv"].items()}
                if noise is not None and "median_cv" in noise else {}}

    def _step_memory(self) -> dict:
        """Memory measured again where the profile measured it the old way (on CPU,
        rows without the memory note: ``dataset.profile_memory``): the profile's requests once more
        in every mode, one trial each, no re-measurement (memory needs no timing
        hygiene; this pass's timings are not used). Its own journal resumes it. A
        profile measured with the current method needs nothing."""
        profile = read_profile(self.out / "profile.parquet")
        stale = needs_remeasure(profile)
        if not stale.any():
            return {"memory": None, "why": "the profile measured memory with the current method"}
        if backend_registry.get_backend(self.cfg.backend).child_processes:
            self.log(f"memory: the {self.cfg.backend} backend computes in child processes, whose freed memory "
                     "this process cannot release; its CPU memory stays as the profile measured it")
            return {"memory": None, "why": f"{self.cfg.backend} engines compute in child processes"}
        target, draft, _ = self._models()
        path = self.out / MEMORY_PASS
        spec = dataclasses.replace(self.profile_spec(target, draft), trials=1, max_remeasure=0)
        self.log(f"memory: {int(stale.sum())} profile rows measured memory the old way (allocator history, "
                 f"weights only); measuring it again: {path.name}")
        t0 = time.perf_counter()
        df = make_profiler(spec, target, draft, path, console=self.console, ray=self.ray).run()
        seconds = time.perf_counter() - t0
        merged = with_memory_from(profile, df, path)
        ratio = _memory_ratios(merged)
        self.log(f"memory pass: {df['request_id'].nunique()} requests x {df['mode'].nunique()} modes in "
                 f"{seconds / 60:.1f} min; median peak vs the reference: "
                 + ", ".join(f"{m} {r:.2f}x" for m, r in ratio.items()))
        return {"memory": str(path), "rows": len(df), "replaced": int(stale.sum()),
                "median_ratio": {str(m): float(r) for m, r in ratio.items()}}

    def _profile(self):
        """The profile, with its memory from the memory pass where it was measured again."""
        profile = read_profile(self.out / "profile.parquet")
        memory = self.out / MEMORY_PASS
        if needs_remeasure(profile).any() and memory.exists():
            profile = with_memory_from(profile, read_profile(memory), memory)
        return profile

    def _step_costmodel(self) -> dict:
        profile = self._profile()
        why = enough_requests(profile)
        if why:  # as `--costmodel auto` does: the estimates are interpolated instead
            self.log(f"cost model: not fitted ({why}); estimates are interpolated (raise "
                     "[profile] requests_per_family for one)")
            return {"costmodel": None, "not_fitted": why}
        cm = fit_validated(profile, seed=self.cfg.seed, source=str(self.out / "profile.parquet"))
        path = cm.save(self.out / "costmodel.json", overwrite=True)
        v = cm.validation
        lat = v[v["metric"] == "latency_ms"].set_index("mode")["mape_costmodel"]
        ttft = v[v["metric"] == "ttft_ms"].set_index("mode")["mape_costmodel"]
        self.log(f"cost model: latency MAPE median {lat.median():.1%} (worst {lat.idxmax()} "
                 f"{lat.max():.1%}); TTFT median {ttft.median():.1%}")
        return {"costmodel": str(path), "latency_mape": {k: float(x) for k, x in lat.items()},
                "ttft_mape": {k: float(x) for k, x in ttft.items()}}

    def _costmodel(self):
        """The step's cost model, or None where the profile was too small to fit one."""
        path = self.out / "costmodel.json"
        return CostModel.load(path) if path.exists() else None

    def _step_labels(self) -> dict:
        labels, cand, skipped = label_profile(self._profile(), self.cfg.constraint_set(),
                                              source=str(self.out / "profile.parquet"))
        path = self.out / "labels.parquet"
        write_parquet(labels.reset_index(), path, overwrite=True)
        write_parquet(cand, self.out / "labels.candidates.parquet", overwrite=True)
        counts = labels["label"].value_counts()
        self.log("measured labels: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
        return {"labels": str(path), "n": len(labels), "skipped": len(skipped),
                "counts": {str(k): int(v) for k, v in counts.items()}}

    def drawn_requests(self) -> list:
        """The requests labelled from estimates: the profile's families at the same scale
        and condition draw, ids namespaced apart from the profiled ones."""
        c = self.cfg
        if c.drawn_requests <= 0:
            return []
        per = max(1, c.drawn_requests // len(c.families))
        draw = c.condition_draw()
        out = []
        for i, name in enumerate(c.families):
            w = scaled(get_workload(name), c.length_scale)
            for du in draw_units(w, per, draw, seed=10_000 + c.seed * 100 + i, with_companions=False):
                out.append(dataclasses.replace(du.request, id=f"draw-{du.request.id}"))
        return out

    def swept_requests(self) -> list:
        """The drawn requests the quality step measures: each family's first
        ``swept_per_family`` of its random draw."""
        per: dict[str, list] = {}
        for r in self.drawn_requests():
            if len(per.setdefault(r.family, [])) < self.cfg.swept_per_family:
                per[r.family].append(r)
        return [r for rs in per.values() for r in rs]

    def _step_quality(self) -> dict:
        """Measured quality for drawn requests: the reference and every lossy mode,
        batched and untimed (engine.quality_sweep); the dataset step takes each swept
        request's own ROUGE-L and accuracy, marked ``measured (sweep)``."""
        target, draft, _ = self._models()
        c = self.cfg
        path = self.out / "quality_sweep.parquet"
        swept = self.swept_requests()
        spec = SweepSpec(model=str(target), requests=tuple(swept),
                         draft_model=str(draft) if draft else None, backend=c.backend, device=c.device,
                         modes=tuple(c.modes) if c.modes else None, threads=c.threads,
                         arrival_groups=c.sweep_arrival_groups, repeats=c.sweep_repeats)
        if path.exists():
            old_frame = read_sweep(path)
            same = set(old_frame["request_id"].astype(str)) == {r.id for r in swept}
            if same and sweep_passes(old_frame) == c.sweep_repeats:  # finished before the state was saved
                return {"sweep": str(path), "requests": int(old_frame["request_id"].nunique())}
            # a redo with other settings: keep the old sweep aside, never overwrite it. Its
            # journal stays where only the passes changed (more passes continue it)
            journal = path.with_name(path.name + ".journal.jsonl")
            kept = journal_identity(journal) == spec.identity()
            throughput_csv = self.out / "quality_sweep_throughput.csv"
            stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
            for old in (path, throughput_csv) + (() if kept else (journal,)):
                if old.exists():
                    _aside(old, f"previous-{stamp}")
            n = sweep_passes(old_frame)
            why = (f"judged {n} pass{'es' * (n != 1)}, {c.sweep_repeats} asked" if same else "swept other requests")
            self.log(f"quality sweep: {path.name} {why}; kept aside as .previous-{stamp}; "
                     + ("its journal continues" if kept else "sweeping anew (no journal of these settings here)"))
        t0 = time.perf_counter()
        frame, throughput = run_sweep(spec, path, log=self.log)
        seconds = time.perf_counter() - t0
        with atomic_path(self.out / "quality_sweep_throughput.csv", overwrite=True) as tmp:
            throughput.to_csv(tmp, index=False)
        n = sweep_passes(frame)
        self.log(f"quality sweep: {frame['request_id'].nunique()} requests x {frame['mode'].nunique()} modes "
                 f"({n} pass{'es' * (n != 1)}), {seconds / 60:.1f} min this "
                 "run; requests/s per mode over every pass "
                 + ", ".join(f"{r.mode} {r.requests_per_s:.2f}" for r in throughput.itertuples()))
        flipped = flipped_share(frame) if c.sweep_repeats > 1 else float("nan")
        if not math.isnan(flipped):  # repeats, and lossy rows
            self.log(f"quality sweep: the {c.sweep_repeats} repeats disagree on ROUGE-L >= {FLIP_AT} for "
                     f"{flipped:.1%} of (request, lossy mode) pairs")
        return {"sweep": str(path), "requests": int(frame["request_id"].nunique()),
                **({"flipped": flipped} if not math.isnan(flipped) else {}),
                "requests_per_s": {r.mode: float(r.requests_per_s) for r in throughput.itertuples()}}

    def _step_dataset(self) -> dict:
        profile = self._profile()
        reqs = self.drawn_requests() + profiled_requests(profile)
        sweep = self.out / "quality_sweep.parquet"
        table = build_training_table(profile, reqs, self.cfg.constraint_set(),
                                     source=str(self.out / "profile.parquet"), costmodel=self._costmodel(),
                                     quality=read_sweep(sweep) if self.cfg.swept_per_family else None,
                                     content_model=self.outputs("model")["target"]
                                     if reads_content(self.cfg.feature_set) or self.cfg.confidence else None,
                                     confidence=self.cfg.confidence, device=self.cfg.device,
                                     threads=self.cfg.threads,
                                     built_from=profiled_leads(dataclasses.asdict(
                                         self.profile_spec(*self._models()[:2]))))
        path = self.out / "train.parquet"
        write_parquet(table, path, overwrite=True)
        src = table["label_source"].value_counts()
        self.log(f"training table: {len(table)} requests; label source "
                 + ", ".join(f"{k} {v}" for k, v in src.items()))
        return {"table": str(path), "n": len(table),
                "label_source": {str(k): int(v) for k, v in src.items()},
                "labels": {str(k): int(v) for k, v in table["label"].value_counts().items()}}

    def _table(self):
        """The study's training table (train.parquet), as training and scoring read it."""
        return TrainingTable.read(self.out / "train.parquet")

    def _step_train(self, split: str) -> dict:
        c = self.cfg
        families = {"routers": list(c.routers)} if c.routers else {}
        cfg = TrainConfig(feature_set=c.feature_set, split=split, test_size=c.test_size,
                          trials=c.tuning_trials, seed=42 + c.seed, mlruns=c.mlruns, labels=c.labels,
                          target_violation_rate=c.target_violation_rate, certificate=c.certificate,
                          router_params={k: dict(v) for k, v in c.router_params.items()},
                          tuning_objective=c.tuning_objective, lofo_tuning=c.lofo_tuning,
                          workers=c.workers, **families)
        if self.console is None:
            res = train(self._table(), cfg, None)
        else:
            with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                          TimeRemainingColumn(), console=self.console, transient=True) as bar:
                res = train(self._table(), cfg, bar)
        return {"runs": {r.router: r.run_id for r in res.itertuples()},
                "test_oracle_match": {r.router: float(r.test_oracle_match) for r in res.itertuples()}}

    def _step_score(self, split: str) -> dict:
        c = self.cfg
        out = self.out / f"score-{split}"
        if out.exists() and any(out.iterdir()):  # an interrupted earlier attempt, or a redo
            kind = "previous" if f"score:{split}" in self.state.get("redone", []) else "incomplete"
            aside = _aside(out, f"{kind}-{datetime.now():%Y%m%d-%H%M%S}")
            self.log(f"moved the unfinished report {out} aside to {aside}")
        runs = list(self.outputs(f"train:{split}")["runs"].values())
        table = self._table()
        cfg = ScoreConfig(mlruns=c.mlruns, run_ids=runs, decisions=c.decisions, live=c.live,
                          live_per_family=c.live_per_family,
                          live_trials=c.live_trials, live_threads=c.threads, live_max_remeasure=c.max_remeasure,
                          model=c.model, draft_model=c.draft_model,
                          device=c.device, backend=c.backend, seed=c.seed, name=f"{c.name}-{split}",
                          labels=c.labels, profile_plan=dataclasses.asdict(self.profile_spec(*self._models()[:2])))
        res = score_routers(table, cfg, out, progress=self.log if self.console is None else None)
        return {"report": str(out), "mlflow_run_id": res["mlflow_run_id"],
                "live_requests": None if res["live_per"] is None else int(res["live_per"]["request_id"].nunique()),
                "live_estimate_mape_pct": res["live_figures"].get("estimate_mape_pct"),
                **{f"live_{k}": v for k, v in res["live_figures"].items()
                   if k.startswith(("estimate_mape_pct_", "estimate_median_signed_pct_", "estimate_pairs_"))}}

    def _step_report(self) -> dict:
        return write_study_report(self)


def _memory_ratios(profile) -> dict:
    """Per mode, the median over requests of its peak memory / the reference's."""
    peak = profile.groupby(["request_id", "mode"])["peak_memory_mb"].median().unstack("mode")
    ref = str(profile["reference_mode"].dropna().iloc[0])
    if ref not in peak:
        return {}
    ratio = peak.div(peak[ref], axis=0).median()
    return {m: float(r) for m, r in ratio.drop(ref).sort_values().items() if math.isfinite(r)}

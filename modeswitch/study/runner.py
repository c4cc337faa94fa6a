"""``modeswitch study run``: the whole CPU study, step by step, resumable.

Steps, each writing into the study folder: ``model`` (build or find the model),
``profile`` (every mode on every family, per-request drawn conditions, ``k``
interleaved trials; its own journal resumes a half-done sweep), ``memory`` (memory
measured again where the profile measured it the old way), ``costmodel`` (fit and
cross-validate), ``labels`` (the profiled requests, from their own trials),
``quality`` (where the study sweeps: measured quality for some drawn requests),
``dataset`` (profiled requests labelled ``measured`` plus drawn ones labelled from
estimates), ``train:<split>`` and ``score:<split>`` for every split, and
``report`` (the opening table across splits, findings, MLflow). Each step's body is a
module of its own in :mod:`modeswitch.study.steps`, whose ``STEPS`` table gives their
order and what each reads; :class:`Study` keeps the run's state.

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

import json
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from rich.markup import escape

from modeswitch.dataset.errors import InputError
from modeswitch.dataset.features import reads_content
from modeswitch.dataset.io import atomic_path
from modeswitch.study import archive
from modeswitch.study.beside import wants_beside_profile
from modeswitch.study.config import LATER_FIELDS, TABLES, StudyConfig
from modeswitch.study.other_hardware import other_hardware_note
from modeswitch.study.requests import drawn_requests, swept_requests
from modeswitch.study.steps import run_step, step_names, step_reads
from modeswitch.study.steps.memory import profile_with_memory
from modeswitch.study.steps.model import resolve_quietly
from modeswitch.study.steps.profile import profile_spec

STATE = "study_state.json"


class Study:
    """One study folder: its config, its state, its steps."""

    def __init__(self, cfg: StudyConfig, console=None, log: Callable[[str], None] | None = None,
                 ray=None, beside=None, redo=()):
        self.cfg = cfg
        #: another study's folder the report sets its figures beside (not a study setting:
        #: it changes what the report shows, not what is measured)
        self.beside = beside
        #: the other study's folder where this backend is measured again on its requests
        #: (step ``beside``): one of the same model on another backend, else None
        self.beside_requests = beside if beside is not None and wants_beside_profile(cfg, beside) else None
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
        for step in [x for x in ("profile", "quality") if x in taken]:  # measured elsewhere: say so
            note = other_hardware_note(step, self.outputs(step), self.out, self.cfg.device)
            if note:
                self.log(note)
        return taken

    def archive_to(self, dest) -> dict:
        """Keep this study's finished measuring steps in ``dest`` (:mod:`study.archive`)."""
        return archive.archive(self.state, self.cfg, self.out, dest)

    def done(self, step: str) -> bool:
        return step in self.state["steps"]

    def needs(self, step: str) -> list[str]:
        """The steps ``step`` reads the outputs of (:data:`modeswitch.study.steps.STEPS`)."""
        return step_reads(self.cfg, step, self)

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
        """This study's steps, in the order they run (:data:`modeswitch.study.steps.STEPS`)."""
        return step_names(self.cfg, study=self)

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
            try:
                outputs = run_step(self, step)
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

    # ------------------------------------------------ what the steps read
    def _models(self):
        """The study's (target, draft, card), resolved without a word."""
        return resolve_quietly(self.cfg)

    def profile_spec(self, target, draft):
        return profile_spec(self.cfg, target, draft)

    def _profile(self):
        """The profile, with its memory from the memory pass where it was measured again."""
        return profile_with_memory(self.out)

    def drawn_requests(self) -> list:
        """The requests labelled from estimates (:func:`modeswitch.study.requests.drawn_requests`)."""
        return drawn_requests(self.cfg)

    def swept_requests(self) -> list:
        """The drawn requests the quality step measures."""
        return swept_requests(self.cfg)

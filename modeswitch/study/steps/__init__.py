"""The study's steps: one module each, and :data:`STEPS`, the one table of their order
and of what each reads.

Why a table apart from the modules: :class:`modeswitch.study.runner.Study` keeps the
run's state (which steps are done, their outputs, what a redo forgets) and needs only
each step's place and what it reads; the step bodies pull in the heavy parts
(profiling, fitting, training, scoring), so a step's module is imported when the step
runs, as :mod:`modeswitch.cli.lazy` loads a command.

Adding a step is one small module here, named as the step, with ``run(study)``
(``run(study, split)`` for a step run once per split) returning the outputs the state
records, and one line in :data:`STEPS`. A step reads the study through its settings
(``study.cfg``), its folder (``study.out``), ``study.log`` and the outputs of the steps
it reads (``study.outputs(step)``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class StepKind:
    """A step of the study, as :data:`STEPS` places it.

    ``per_split``: run once per split as ``<name>:<split>``. ``reads``: the steps whose
    outputs it reads; None reads every step before it (for a step run per split, those
    of its own split). ``when``: a setting that must be set (non-zero) for the step to be
    part of the study, looked up on the settings, else on the study (a choice of the
    run that is not a setting, such as ``--beside``).
    """

    name: str
    per_split: bool = False
    reads: tuple[str, ...] | None = None
    when: str | None = None


#: every step, in the order a study runs them
STEPS: dict[str, StepKind] = {s.name: s for s in (
    StepKind("model"),
    StepKind("profile"),
    StepKind("memory"),
    StepKind("costmodel"),
    StepKind("labels"),
    StepKind("quality", reads=("model",), when="swept_per_family"),  # draws its requests from the settings
    StepKind("dataset"),
    StepKind("train", per_split=True),
    StepKind("score", per_split=True),
    # this backend measured again on another backend's study's requests (--beside)
    StepKind("beside", reads=("model", "profile"), when="beside_requests"),
    StepKind("report"),
)}


def step_names(cfg, kinds=None, study=None) -> list[str]:
    """The study's steps in order (of ``kinds`` only, where given): each step whose
    ``when`` is set, once per split of ``cfg.splits`` for a step run per split."""
    out = []
    for kind in STEPS.values():
        if (kinds is not None and kind.name not in kinds) or (kind.when and not _set(kind.when, cfg, study)):
            continue
        out += [f"{kind.name}:{s}" for s in cfg.splits] if kind.per_split else [kind.name]
    return out


def _set(name: str, cfg, study) -> bool:
    return bool(getattr(cfg, name)) if hasattr(cfg, name) else bool(getattr(study, name, None))


def step_reads(cfg, step: str, study=None) -> list[str]:
    """The steps ``step`` reads the outputs of (a name no step has: every step but the
    last, as the last one reads)."""
    kind, _, split = step.partition(":")
    entry = STEPS.get(kind)
    if entry is None:
        return step_names(cfg, study=study)[:-1]
    if entry.reads is not None:
        return list(entry.reads)
    earlier = list(STEPS)[:list(STEPS).index(kind)]
    return [x for x in step_names(cfg, earlier, study)
            if not entry.per_split or not STEPS[x.partition(":")[0]].per_split or x.partition(":")[2] == split]


def step_body(kind: str) -> Callable[..., dict]:
    """The ``run`` of the module that holds step ``kind`` (imported now)."""
    return importlib.import_module(f"{__name__}.{STEPS[kind].name}").run


def run_step(study, step: str) -> dict:
    """Do ``step`` (``kind`` or ``kind:split``) for ``study``; returns its outputs. The
    study records nothing here: :meth:`modeswitch.study.runner.Study.run` does."""
    kind, _, split = step.partition(":")
    body = step_body(kind)
    return body(study, split) if STEPS[kind].per_split else body(study)

"""A study's measurements kept apart from its folder, and a new folder seeded from them.

Why: the profile and the quality sweep are a study's expensive part (hours each for
the real model on a 2-core CPU) and the only part that cannot be recomputed from the
rest: the cost model, labels, training table, routers, scores and report follow
from them in minutes to half an hour. An archive (``modeswitch study archive``) holds
the measuring steps' files and their state entries; ``modeswitch study run
--from-archive DIR`` copies them into a study folder that has not run them, each entry
marked ``copied_from``, and runs the rest. A study with other training, scoring or
constraint settings takes the same measurements, so an archive is matched on what
each step measured with, not on the whole study's identity:

* ``profile``, ``memory`` and ``costmodel``: the seed, the model and backend, the profile's
  settings and the drawn conditions;
* ``quality`` (the sweep): those, the drawn and swept request counts, whether it swept
  arrival groups (where it did: an archive swept before the option matches without it)
  and its passes (``sweep_repeats``). A study asking another count of passes takes the
  archive's other steps and sweeps its own: the archive keeps the sweep's table, not
  the journal a further pass would continue.

Nothing is overwritten: an archive folder must not hold the files it would write, and
seeding refuses a file the study folder holds already.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from modeswitch.dataset.errors import InputError
from modeswitch.dataset.io import atomic_path
from modeswitch.study.config import TABLES, StudyConfig

#: measuring step -> the files it writes into the study folder (what an archive keeps)
FILES = {
    "profile": ("profile.parquet",),
    "costmodel": ("costmodel.json",),
    "quality": ("quality_sweep.parquet", "quality_sweep_throughput.csv"),
    "memory": ("memory_pass.parquet",),
}
#: measuring steps that may finish with nothing to write (no cost model fitted; no memory pass needed)
MAY_WRITE_NOTHING = ("costmodel", "memory")
MANIFEST = "archive.json"


def measured_with(cfg: StudyConfig, step: str) -> str:
    """The settings ``step``'s measurements depend on, hashed (what an archive is matched on)."""
    d = cfg.to_dict()
    keys = ["seed", *TABLES["model"], *TABLES["profile"]]
    if step == "quality":
        keys += ["drawn_requests", "swept_per_family"]
        if cfg.sweep_arrival_groups:  # added later: archives swept before it still match without it
            keys.append("sweep_arrival_groups")
        if cfg.sweep_repeats != 1:  # the same
            keys.append("sweep_repeats")
    picked = {k: d[k] for k in keys}
    picked["conditions"] = cfg.condition_draw().to_dict()  # the draw itself: defaults written out or not
    return hashlib.sha256(json.dumps(picked, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _copy(src: Path, dest: Path) -> None:
    if dest.exists():
        raise InputError(f"{dest} exists already; an archive and a study folder are written once, never over")
    with atomic_path(dest) as tmp:
        shutil.copyfile(src, tmp)


def archive(state: dict, cfg: StudyConfig, out: Path, dest) -> dict:
    """Copy the finished measuring steps of the study in ``out`` (its ``state``) into
    ``dest``, with a manifest of each step's settings hash, seconds and outputs.
    Written into a sibling folder and renamed into place: ``dest`` appears whole or
    not at all."""
    dest = Path(dest)
    if dest.exists():
        raise InputError(f"{dest} exists already; an archive is written once, never over")
    steps = {s: state["steps"][s] for s in FILES if s in state["steps"]}
    if not steps:
        raise InputError(f"{out}: no measuring step ({', '.join(FILES)}) has finished; nothing to archive")
    files = []
    for step, rec in steps.items():
        for name in FILES[step]:
            if (out / name).exists():
                files.append(name)
            elif not (step in MAY_WRITE_NOTHING and rec["outputs"].get(step) is None):
                raise InputError(f"{out / name}: missing, though {step} finished; the archive would be incomplete")
    manifest = {"study": cfg.name, "config": cfg.to_dict(), "steps": {
        step: {"measured_with": measured_with(cfg, step), "seconds": rec["seconds"], "finished": rec["finished"],
               "outputs": rec["outputs"], "files": [n for n in FILES[step] if n in files]}
        for step, rec in steps.items()}}
    tmp = dest.with_name(f".{dest.name}.partial-{os.getpid()}")
    tmp.mkdir(parents=True)
    try:
        for name in files:
            shutil.copyfile(out / name, tmp / name)
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1, default=str))
        if dest.exists():
            raise InputError(f"{dest} exists already; an archive is written once, never over")
        tmp.rename(dest)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return manifest


def seed(state: dict, cfg: StudyConfig, out: Path, src, save=lambda: None) -> list[str]:
    """Copy into the study folder ``out`` every measuring step of the archive ``src``
    that the study has not run and that was measured with the study's settings; the
    step's record in ``state`` (changed in place, ``save`` called after each step) is
    the archive's, its outputs pointing into ``out`` and marked ``copied_from``. The
    cost model comes only with the archive's profile (it was fitted on it), and so does the memory pass (it measured that
    profile's requests again). Returns
    the steps taken."""
    src = Path(src)
    path = src / MANIFEST
    if not path.exists():
        raise InputError(f"{src}: not a study archive (no {MANIFEST}; `modeswitch study archive` writes one)")
    manifest = json.loads(path.read_text())
    have = state["steps"]
    profile_from_here = "profile" in manifest["steps"] and (
        "profile" not in have or have["profile"].get("copied_from") == str(src))
    wanted = [(step, rec) for step, rec in manifest["steps"].items()
              if step in FILES and step not in have and (step != "quality" or cfg.swept_per_family)
              and (step not in ("costmodel", "memory") or profile_from_here)]
    passes = int(manifest.get("config", {}).get("sweep_repeats", 1))
    if passes != cfg.sweep_repeats and any(step == "quality" and rec["measured_with"] == measured_with(
            cfg.replace(sweep_repeats=passes), step) for step, rec in wanted):
        # the same sweep but another count of passes: the archive holds its table, not the
        # journal a study would continue (or read fewer passes from), so the study sweeps
        # its own; the other steps are taken
        wanted = [(step, rec) for step, rec in wanted if step != "quality"]
    for step, rec in wanted:  # every check before the first copy: a refusal leaves the folder as it was
        if rec["measured_with"] != measured_with(cfg, step):
            raise InputError(f"{path}: its {step} step was measured with other settings than this study's "
                             f"({rec['measured_with']} vs {measured_with(cfg, step)}: the seed, [model], "
                             f"[profile], [conditions]{', drawn and swept counts, arrival groups, passes' if step == 'quality' else ''})")
        held = [out / n for n in FILES[step] if (out / n).exists()]
        held += [j for n in FILES[step] for j in (out / f"{n}.journal.jsonl", out / f"{n}.journal.jsonl.lock")
                 if j.exists()]
        if held:
            raise InputError(f"{held[0]} exists already (a run of {step} began here); seed a study folder "
                             f"that has not run {step}")
        missing = [n for n in rec.get("files", FILES[step]) if not (src / n).exists()]
        if missing:
            raise InputError(f"{src / missing[0]}: missing from the archive (its manifest lists it)")
    taken = []
    for step, rec in wanted:
        out.mkdir(parents=True, exist_ok=True)
        for name in rec.get("files", FILES[step]):
            _copy(src / name, out / name)
        outputs = {k: str(out / Path(v).name) if isinstance(v, str) and Path(v).name in FILES[step] else v
                   for k, v in rec["outputs"].items()}
        state["steps"][step] = {"seconds": rec["seconds"], "finished": rec["finished"], "outputs": outputs,
                                "copied_from": str(src)}
        save()
        taken.append(step)
    return taken

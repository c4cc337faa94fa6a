"""A note when a study's measurements come from another kind of machine than this one.

Why: which mode is fastest depends on the CPU's kernels (INT8 weight-only can be
faster than the reference on one EPYC and slower on another), and so does a lossy
mode's output (the same requests swept on two kinds of machine can get other
verdicts, while two passes on one machine agree; docs/results.md). A profile or a
quality sweep taken from an archive may have been measured elsewhere: labels from
there need not hold here, and the live check counts such violations as
``other_hardware``; ``--redo profile`` (``--redo quality``) measures it here.
"""

from __future__ import annotations

from pathlib import Path

from modeswitch.engine.hardware import hardware_string, other_kinds, recorded_hardware

#: measuring step -> (its outputs' key for the file, the file's default name, what to call it)
MEASURED = {
    "profile": ("profile", "profile.parquet", "profile"),
    "quality": ("sweep", "quality_sweep.parquet", "quality sweep"),
}


def other_hardware_note(step: str, outputs: dict, out: Path, device: str) -> str | None:
    """What to say when ``step``'s file (named in its ``outputs``, else its default name
    in the study folder ``out``) was measured on another kind of machine than this one
    running on ``device``; None where it was not."""
    key, default, what = MEASURED[step]
    path = outputs.get(key) or out / default
    here = hardware_string(device)
    other = other_kinds(here, recorded_hardware(path))
    if not other:
        return None
    return (f"the {what} was measured on another kind of machine ({'; '.join(other)}) than this "
            f"one ({here}): its labels need not hold here (the live check counts such "
            f"violations as other_hardware); --redo {step} measures it on this machine")

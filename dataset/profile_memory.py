"""Which profile rows measured memory as the request's own, and re-measured memory taken in.

Why: with the earlier method a CPU profile's ``peak_memory_mb`` was the model's
weights plus the process's RSS growth during the request, and both parts were wrong
for a comparison between modes (``modeswitch.engine.memory`` says what was measured): the growth
depended on what ran before the request (freed memory stays resident and is reused),
and what an engine holds besides its weights (continuous batching's paged KV cache)
was not counted. The memory limit judged those numbers, so a window that happened to
touch new pages could become a violation copied into many estimated rows
(docs/results.md).

Rows measured since carry :data:`MEMORY_NOTE` in their ``source``. An older profile
keeps its timings, which were measured with care and cost hours; its memory is
measured again apart (one pass of the same requests, untimed use of its rows) and
:func:`with_memory_from` puts that pass's figure in each row, saying so in ``source``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from modeswitch.dataset.errors import InputFileError

#: in a CPU row's ``source``: its memory is what the engine held + the request's own growth
MEMORY_NOTE = "memory: engine-held tensors + RSS growth after freed memory was released"
#: in a row's ``source`` once :func:`with_memory_from` has replaced its memory
REMEASURED_NOTE = "memory re-measured apart ({path}): " + MEMORY_NOTE


def needs_remeasure(profile: pd.DataFrame) -> pd.Series:
    """Rows whose memory was measured on CPU without :data:`MEMORY_NOTE` (or a
    re-measurement): the old method. GPU rows (the allocator's peak or NVML) and
    imported rows are fine as they are."""
    device = profile["device"].astype("string").fillna("") if "device" in profile else \
        pd.Series("", index=profile.index, dtype="string")
    source = profile["source"].astype("string").fillna("")
    on_cpu = device.str.startswith("cpu") & source.str.contains("energy:", regex=False)
    return on_cpu & ~source.str.contains(MEMORY_NOTE, regex=False)


def with_memory_from(profile: pd.DataFrame, memory: pd.DataFrame, path=None) -> pd.DataFrame:
    """``profile`` with each old-method row's ``peak_memory_mb`` replaced by the median
    of ``memory``'s rows for the same (request, mode): a pass that measured the same
    requests with the current method (``path``, named in the rows' ``source``).

    Every old-method row must be in the pass; one that is not is refused, naming it,
    rather than left with a figure from the old method beside new ones."""
    stale = needs_remeasure(profile)
    if not stale.any():
        return profile
    fresh = memory[~needs_remeasure(memory)]
    where = Path(path) if path is not None else Path("the memory pass")
    peak = fresh.groupby(["request_id", "mode"])["peak_memory_mb"].median()
    keys = pd.MultiIndex.from_frame(profile.loc[stale, ["request_id", "mode"]])
    new = peak.reindex(keys).to_numpy()
    missing = np.isnan(new)
    if missing.any():
        k = int(np.flatnonzero(stale.to_numpy())[int(missing.argmax())])
        raise InputFileError(where, None, "peak_memory_mb",
                             f"has no row for ({profile['request_id'].iloc[k]!r}, {profile['mode'].iloc[k]!r}) "
                             f"of the profile ({int(missing.sum())} of {len(new)} rows missing); run the "
                             "memory pass to its end")
    out = profile.copy()
    out.loc[stale, "peak_memory_mb"] = new
    note = REMEASURED_NOTE.format(path=where.name)
    out.loc[stale, "source"] = out.loc[stale, "source"].astype("string").fillna("") + "; " + note
    return out

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

Measurement hygiene (:mod:`modeswitch.engine.noise`): every (unit, mode) is measured in
``trials`` trials, trial-major (trial 0 of every unit, then trial 1, ...), so a
unit's trials are spread over the run instead of back to back. Each trial
records its wall and CPU time; the contention rule flags trials whose CPU share
dropped or whose wall time is far above the unit's other trials, and those are
re-measured (a new ``attempt`` of the same trial) up to ``max_remeasure`` times;
a flag that persists stays in the profile. Where the backend's thread pool is
settable and ``threads`` is not given, the thread count is chosen by a
measurement first (:func:`modeswitch.engine.noise.calibrate_threads`) and journalled, so a
resumed run keeps it.

The package's parts, by concern: :mod:`.plan` (the spec and its units),
:mod:`.journal` (the resumable journal), :mod:`.rows` (one measurement as one profile
row) and :mod:`.loop` (the :class:`Profiler` that runs them). Everything is importable
from ``modeswitch.engine.profiler`` as before.
"""

from modeswitch.engine.hardware import hardware_string
from modeswitch.engine.profiler.journal import Journal
from modeswitch.engine.profiler.loop import Profiler, ProfileRun
from modeswitch.engine.profiler.plan import DEFAULT_WORKLOADS, ProfileSpec, Unit, build_units
from modeswitch.engine.profiler.rows import Measurement, RowProvenance, model_id, software_string

__all__ = ["DEFAULT_WORKLOADS", "Journal", "Measurement", "ProfileRun", "ProfileSpec", "Profiler",
           "RowProvenance", "Unit", "build_units", "hardware_string", "model_id", "software_string"]

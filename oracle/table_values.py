"""Every number of a training table checked as the file is read, before a router sees it.

Why: a table is a file the user hands ``train`` and ``score``, and a value no request
can have reached the estimators unchecked. One row with ``prompt_tokens`` 1e300 went
through to scikit-learn, whose traceback ("Input X contains infinity or a value too
large for dtype('float32')") named neither the file, the row nor the column. Here
the first bad cell is one line naming all three (:class:`~modeswitch.dataset.errors.InputFileError`,
rows counted from 0 as pandas numbers them), as the profile's schema does.

What is refused: an infinity anywhere; a number larger than a 32-bit float holds
(scikit-learn's trees and LightGBM read features as float32, where it becomes an
infinity); a request field outside the range a :class:`~modeswitch.dataset.requests.Request`
allows, or missing; a latency that is not positive. A missing per-mode cost is left
alone: it means that mode was not measured there.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from modeswitch.dataset.errors import InputFileError

#: the largest magnitude a table's numbers may have: what a 32-bit float holds
LARGEST = float(np.finfo(np.float32).max)
#: the request fields every row needs, with their ranges as a Request bounds them:
#: (least allowed, first value not allowed above it; None: no bound)
REQUEST_RANGES = {"prompt_tokens": (0, None), "expected_output_tokens": (1, None),
                  "shared_prefix_tokens": (0, None), "concurrent_requests": (1, None),
                  "memory_pressure": (0, 1)}


def check_table_values(table: pd.DataFrame, path) -> None:
    """Raise an InputFileError naming ``path``, the row and the column of the first bad
    number in ``table`` (its first row, then its first column in table order); the count
    of the others follows in the message."""
    failures = [f for col in _numeric_columns(table) if (f := _column_failures(table[col], col))]
    if not failures:
        return
    total = sum(n for _, _, _, n in failures)
    row, col, problem, _ = min(failures, key=lambda f: f[0])
    more = f" (and {total - 1:,} more bad values in the table)" if total > 1 else ""
    raise InputFileError(path, row, col, problem + more)


def _numeric_columns(table: pd.DataFrame) -> list[str]:
    """Columns of numbers (booleans such as ``safe__<mode>`` are not)."""
    return [c for c in table.columns
            if pd.api.types.is_numeric_dtype(table[c]) and not pd.api.types.is_bool_dtype(table[c])]


def _column_failures(column: pd.Series, name: str) -> tuple[int, str, str, int] | None:
    """(first bad row, column, why, how many bad rows) for one column, or None."""
    vals = column.to_numpy(dtype=float, na_value=np.nan)
    missing = np.isnan(vals)
    low, high = REQUEST_RANGES.get(name, (None, None))
    bad = np.isinf(vals) | (np.abs(np.where(missing, 0.0, vals)) > LARGEST)
    if name in REQUEST_RANGES:
        bad |= missing
    if low is not None:
        bad |= ~missing & (vals < low)
    if high is not None:
        bad |= ~missing & (vals >= high)
    if name.startswith("latency_ms__"):
        bad |= ~missing & (vals <= 0)
    if not bad.any():
        return None
    row = int(np.flatnonzero(bad)[0])
    return row, name, _why(vals[row], name, low, high), int(bad.sum())


def _why(v: float, name: str, low, high) -> str:
    """What is wrong with the value ``v`` of column ``name``."""
    if np.isnan(v):
        return "missing; every row needs its request's " + name
    if np.isinf(v):
        return f"{v} is not a finite number"
    if abs(v) > LARGEST:
        return f"{v:g} is out of range: the routers read numbers as 32-bit floats, at most {LARGEST:.3g}"
    if name.startswith("latency_ms__"):
        return f"{v:g}: a latency must be > 0 (leave it empty where the mode was not measured)"
    if high is not None and v >= high:
        return f"{v:g} is out of range: must be from {low} to below {high}"
    return f"{v:g} is out of range: must be at least {low}"

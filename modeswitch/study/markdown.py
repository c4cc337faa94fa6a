"""Tables as GitHub markdown, as the study's reports print them."""

from __future__ import annotations

import math

import pandas as pd


def md_table(df: pd.DataFrame) -> str:
    """``df`` as a markdown table: floats to three significant digits, NaN as "-"."""
    cols = list(df.columns)
    lines = ["| " + " | ".join(map(str, cols)) + " |", "|" + "---|" * len(cols)]
    for row in df.itertuples(index=False):
        lines.append("| " + " | ".join("-" if (isinstance(v, float) and not math.isfinite(v))
                                       else (f"{v:.3g}" if isinstance(v, float) else str(v))
                                       for v in row) + " |")
    return "\n".join(lines)


def value_cell(row, col) -> float:
    """A mode-table row's ``col`` as a float for :func:`md_table` (NaN, shown "-", where the
    row or the value is missing)."""
    return float("nan") if row is None or col not in row or pd.isna(row[col]) else float(row[col])


def passing_cell(row) -> str:
    """A mode-table row's families passing, as "passing/families" ("-" without a row)."""
    return "-" if row is None else f"{int(row['families_passing'])}/{int(row['families'])}"

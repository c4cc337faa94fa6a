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

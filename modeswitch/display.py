"""Rich rendering helpers shared by CLI commands."""

from __future__ import annotations

import math
import sys

from rich.console import Console
from rich.table import Table

# Piped output (CI logs, `| less`) gets a wide fixed width instead of rich's 80
# columns, so tables of mode names stay readable.
_WIDTH = None if sys.stdout.isatty() else 160
console = Console(width=_WIDTH)
err_console = Console(stderr=True, width=_WIDTH)


def fmt(value, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        if value != 0 and (abs(value) >= 1e4 or abs(value) < 1e-3):
            return f"{value:.{digits}g}"
        return f"{value:.{digits}f}".rstrip("0").rstrip(".") if digits else f"{value:.0f}"
    try:
        import pandas as pd  # lazy: the CLI starts without pandas; only values it made reach here

        if pd.isna(value):
            return "-"
    except (TypeError, ValueError):
        pass
    return str(value)


def frame_table(df, title: str | None = None, index: bool = True, digits: int = 3) -> Table:
    """A rich Table from a DataFrame (index first when ``index``)."""
    table = Table(title=title, show_lines=False, header_style="bold")
    if index:
        table.add_column(str(df.index.name or ""), style="cyan", no_wrap=True)
    for c in df.columns:
        table.add_column(str(c), overflow="fold")
    for idx, row in zip(df.index, df.itertuples(index=False)):
        cells = [fmt(v, digits) for v in row]
        table.add_row(*([str(idx)] if index else []), *cells)
    return table

"""Profile tables from elsewhere: ``import-profiles`` (external measurements, e.g. the
study's A100 CSVs) and ``validate`` (every problem with file, row and column)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from modeswitch.cli.common import (
    friendly_errors,
    reading,
)
from modeswitch.dataset.importers import import_files
from modeswitch.dataset.profile_schema import read_profile, write_profile
from modeswitch.display import console

#: this module's commands; modeswitch.cli.lazy imports the module when one of them runs
app = typer.Typer(add_completion=False)


@app.command("import-profiles")
@friendly_errors
def import_profiles_cmd(
    files: Annotated[list[Path], typer.Argument(help="Published measurement CSV files.")],
    output: Annotated[Path, typer.Option("-o", "--output", help="Profile parquet to write.")],
    importer: Annotated[str | None, typer.Option(help="Force an importer (default: detect by columns).")] = None,
    overwrite: Annotated[bool, typer.Option(help="Replace an existing output file.")] = False,
):
    """Convert external measurements (e.g. the study's A100 CSVs) into a profile table."""
    with reading(", ".join(map(str, files))):
        df = import_files(files, importer)
    write_profile(df, output, overwrite=overwrite, source=", ".join(map(str, files)))
    agg = int(df["is_aggregate"].sum())
    console.print(
        f"wrote {len(df)} rows ({len(df) - agg} per-trial, {agg} aggregate) covering "
        f"{df['mode'].nunique()} modes x {df['workload'].nunique()} workloads to {output}"
    )


@app.command("validate")
@friendly_errors
def validate_cmd(
    files: Annotated[list[Path], typer.Argument(help="Profile files (.parquet or .csv).")],
):
    """Validate profile files against the schema; report every problem with row and column."""
    for f in files:
        with reading(f):
            df = read_profile(f)
        console.print(f"[green]ok[/green] {f}: {len(df)} rows")

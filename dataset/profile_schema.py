"""The tidy profile table: one row per measured (request or workload cell, mode, trial).

Every profile, measured by an engine here or imported from published data, has
these columns and is validated with pandera before anything reads it. Missing
values stay missing (NaN / <NA>): a metric nobody measured is never filled in.

Measured rows also carry their trial's CPU time and share and a ``contended``
flag (``modeswitch.engine.noise``); ``attempt`` counts re-measurements of one trial, so a
contended trial and its clean re-measurement are both kept.

Aggregate-only rows (published means without per-trial data) have
``is_aggregate=True``, ``trial`` missing and ``n_trials`` set; their
``latency_ms`` is the mean and ``latency_ms_p50/p95/p99`` the published
percentiles.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pandera.pandas as pa

from modeswitch.dataset.errors import InputFileError, read_table
from modeswitch.dataset.io import write_parquet

ENERGY_SOURCES = ("nvml_counter", "nvml_power_poll", "estimate", "published", "none")

IDENTITY_COLUMNS = ("workload", "family", "request_id", "mode", "trial", "attempt", "is_aggregate",
                    "n_trials")
SHAPE_COLUMNS = (
    "prompt_tokens",
    "expected_output_tokens",
    "shared_prefix_tokens",
    "concurrent_requests",
    "memory_pressure",
    "benchmark_suite",
    "evaluation_mode",
)
TIMING_COLUMNS = (
    "latency_ms",
    "latency_ms_std",
    "latency_ms_p50",
    "latency_ms_p95",
    "latency_ms_p99",
    "ttft_ms",
    "tbt_ms_mean",
    "tbt_ms_p95",
    "tokens_per_s",
    "output_tokens",
)
#: measurement hygiene: the trial's CPU time, CPU seconds per wall second, cores the
#: rest of the machine kept busy meanwhile, the contention flag
NOISE_COLUMNS = ("cpu_time_ms", "cpu_share", "other_load", "contended")
RESOURCE_COLUMNS = ("energy_j", "energy_per_token_j", "energy_source", "peak_memory_mb")
QUALITY_COLUMNS = ("accuracy", "rouge_l_vs_reference", "rouge_l_vs_baseline")
PROVENANCE_COLUMNS = (
    "reference_mode",
    "precision",
    "graph_capture",
    "threads",
    "backend",
    "model",
    "hardware",
    "software",
    "run_id",
    "measured_at",
    "source",
    "worker",
    "device",
)
PROFILE_COLUMNS = (
    IDENTITY_COLUMNS + SHAPE_COLUMNS + TIMING_COLUMNS + NOISE_COLUMNS + RESOURCE_COLUMNS
    + QUALITY_COLUMNS
    + PROVENANCE_COLUMNS
)


#: a measurement is a number or missing (NaN); an infinity is neither
_FINITE = pa.Check(lambda s: s.isna() | np.isfinite(s.astype(float)), name="finite_or_missing")


def _nonneg(name):
    return pa.Column(float, [pa.Check.ge(0), _FINITE], nullable=True, coerce=True, required=True)


def _unit(name):
    return pa.Column(float, [pa.Check.ge(0), pa.Check.le(1)], nullable=True, coerce=True)


def _text(nullable=True, checks=None):
    return pa.Column(str, checks or [], nullable=nullable, coerce=False)


PROFILE_SCHEMA = pa.DataFrameSchema(
    {
        "workload": _text(nullable=False, checks=[pa.Check.str_length(min_value=1)]),
        "family": _text(nullable=False, checks=[pa.Check.str_length(min_value=1)]),
        "request_id": _text(),
        "mode": _text(nullable=False, checks=[pa.Check.str_length(min_value=1)]),
        "trial": pa.Column("Int64", pa.Check.ge(0), nullable=True, coerce=True),
        "attempt": pa.Column("Int64", pa.Check.ge(0), nullable=True, coerce=True),
        "is_aggregate": pa.Column(bool, nullable=False, coerce=True),
        "n_trials": pa.Column("Int64", pa.Check.ge(1), nullable=True, coerce=True),
        "prompt_tokens": _nonneg("prompt_tokens"),
        "expected_output_tokens": _nonneg("expected_output_tokens"),
        "shared_prefix_tokens": _nonneg("shared_prefix_tokens"),
        "concurrent_requests": pa.Column(float, pa.Check.ge(1), nullable=True, coerce=True),
        "memory_pressure": pa.Column(
            float, [pa.Check.ge(0), pa.Check.lt(1)], nullable=True, coerce=True
        ),
        "benchmark_suite": _text(),
        "evaluation_mode": _text(),
        **{c: _nonneg(c) for c in TIMING_COLUMNS},
        "cpu_time_ms": _nonneg("cpu_time_ms"),
        "cpu_share": _nonneg("cpu_share"),
        "other_load": _nonneg("other_load"),
        "contended": pa.Column("boolean", nullable=True, coerce=True),
        "energy_j": _nonneg("energy_j"),
        "energy_per_token_j": _nonneg("energy_per_token_j"),
        "energy_source": _text(nullable=False, checks=[pa.Check.isin(ENERGY_SOURCES)]),
        "peak_memory_mb": _nonneg("peak_memory_mb"),
        **{c: _unit(c) for c in QUALITY_COLUMNS},
        "reference_mode": _text(nullable=False, checks=[pa.Check.str_length(min_value=1)]),
        "precision": _text(),
        "graph_capture": pa.Column("boolean", nullable=True, coerce=True),
        "threads": pa.Column("Int64", pa.Check.ge(1), nullable=True, coerce=True),
        "backend": _text(nullable=False),
        "model": _text(nullable=False),
        "hardware": _text(nullable=False),
        "software": _text(),
        "run_id": _text(nullable=False),
        "measured_at": _text(),
        "source": _text(),
        "worker": _text(),
        "device": _text(),
    },
    strict=False,
    ordered=False,
    name="profile",
)


class ProfileSchemaError(InputFileError):
    """A profile table failed validation; ``failures`` lists every problem found."""

    def __init__(self, path, failures: list[tuple]):
        self.failures = failures
        row, column, problem = failures[0]
        more = f" (and {len(failures) - 1} more problems)" if len(failures) > 1 else ""
        super().__init__(path, row, column, problem + more)

    def report(self, limit: int = 20) -> str:
        lines = [f"{self.path}: {len(self.failures)} problem(s)"]
        for row, column, problem in self.failures[:limit]:
            where = f"row {row}" if row is not None else "whole table"
            lines.append(f"  {where}, column '{column}': {problem}")
        return "\n".join(lines)


def empty_profile() -> pd.DataFrame:
    """A zero-row profile with every column, for builders to append to."""
    return pd.DataFrame({c: pd.Series(dtype=object) for c in PROFILE_COLUMNS})


def _missing_of(column: str):
    dtype = PROFILE_SCHEMA.columns[column].dtype
    kind = str(dtype)
    if kind.startswith("float"):
        return float("nan"), "float64"
    if kind == "Int64":
        return pd.NA, "Int64"
    if kind == "boolean":
        return pd.NA, "boolean"
    return None, "str"


def conform(df: pd.DataFrame) -> pd.DataFrame:
    """Add absent columns as missing values of the right dtype, in schema order.

    Missing markers (None, pd.NA) in numeric columns become NaN so that pandera's
    coercion sees only real values; anything that is not a number still fails
    validation with its row.
    """
    df = df.copy()
    for c in PROFILE_COLUMNS:
        missing, dtype = _missing_of(c)
        if c not in df.columns:
            df[c] = pd.Series([missing] * len(df), index=df.index, dtype=dtype)
        elif dtype == "float64" and df[c].dtype == object:
            df[c] = df[c].map(lambda v: float("nan") if v is None or v is pd.NA else v)
    extra = [c for c in df.columns if c not in PROFILE_COLUMNS]
    return df[list(PROFILE_COLUMNS) + extra]


#: what makes two rows the same measurement: importing or merging a file twice repeats them
UNIT_KEY = ("workload", "request_id", "mode", "trial", "attempt", "is_aggregate", "run_id")


def duplicate_failures(df: pd.DataFrame) -> list[tuple]:
    """Rows repeating an earlier row's measurement (same :data:`UNIT_KEY`)."""
    key = [c for c in UNIT_KEY if c in df.columns]
    if not len(df) or not key:
        return []
    group = pd.Series(df.groupby(key, dropna=False, sort=False).ngroup().to_numpy(), index=df.index)
    first = group.reset_index().groupby(0)["index"].first()
    dup = group.duplicated(keep="first")
    return [(int(row), "(row)", f"repeats row {int(first[group[row]])} (same {', '.join(key)}): "
                                "a file imported or merged twice? drop the copy")
            for row in df.index[dup][:20]]


def _cross_column_failures(df: pd.DataFrame) -> list[tuple]:
    """Checks that relate columns of a row, reported under the column to fix."""
    out = []
    if len(df) and not np.isfinite(df["latency_ms"].astype(float)).any():
        out.append((None, "latency_ms", "no row has a latency: nothing here can be labelled"))
    for row in df.index[~df["is_aggregate"] & df["trial"].isna()]:
        out.append((int(row), "trial", "a per-trial row (is_aggregate false) needs a trial index"))
    for row in df.index[df["is_aggregate"] & df["n_trials"].isna()]:
        out.append((int(row), "n_trials", "an aggregate row (is_aggregate true) needs n_trials"))
    return out + duplicate_failures(df)


def _failures(exc: pa.errors.SchemaErrors) -> list[tuple]:
    """One (row, column, problem) per failing cell, most specific first."""
    out = []
    fc = exc.failure_cases
    for rec in fc.to_dict(orient="records"):
        column = rec.get("column")
        index = rec.get("index")
        check = rec.get("check")
        case = rec.get("failure_case")
        row = None if index is None or pd.isna(index) else int(index)
        if check == "column_in_dataframe":
            out.append((None, case, "required column is missing"))
            continue
        if column is None or (not isinstance(column, str) and pd.isna(column)):
            column = check if row is None else "(row)"
        problem = f"value {case!r} fails {check}"
        if str(check).startswith("not_nullable"):
            problem = "value is missing but the column does not allow missing values"
        elif str(check).startswith("coerce_dtype") or str(check).startswith("dtype"):
            problem = f"value {case!r} has the wrong type ({check})"
        out.append((row, column, problem))
    # one problem per cell; a whole-column failure is dropped when rows explain it
    with_rows = {col for row, col, _ in out if row is not None}
    seen, unique = set(), []
    for row, col, problem in out:
        if (row, col) in seen or (row is None and col in with_rows):
            continue
        seen.add((row, col))
        unique.append((row, col, problem))
    unique.sort(key=lambda t: (-1 if t[0] is None else t[0], str(t[1])))
    return unique


def validate_profile(df: pd.DataFrame, path=None) -> pd.DataFrame:
    """Validate a profile table, returning it with coerced dtypes.

    Raises :class:`ProfileSchemaError` naming the file, the (0-based) data row and
    the column of each problem.
    """
    df = df.reset_index(drop=True)
    missing = [c for c in ("workload", "mode", "latency_ms", "reference_mode", "backend") if c not in df.columns]
    if missing:
        raise ProfileSchemaError(path, [(None, c, "required column is missing") for c in missing])
    try:
        out = PROFILE_SCHEMA.validate(conform(df), lazy=True)
    except pa.errors.SchemaErrors as exc:
        raise ProfileSchemaError(path, _failures(exc)) from None
    failures = _cross_column_failures(out)
    if failures:
        raise ProfileSchemaError(path, failures)
    return out


def read_profile(path) -> pd.DataFrame:
    """Read and validate a profile from parquet (or CSV)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"profile file {path} does not exist")
    if path.suffix.lower() == ".csv":  # text columns stay text where a column is empty
        text = [c for c, col in PROFILE_SCHEMA.columns.items() if str(col.dtype).startswith("str")]
        df = read_table(path, pd.read_csv, dtype={c: "string" for c in text})
    else:
        df = read_table(path, pd.read_parquet)
    return validate_profile(df, path=path)


def read_profiles(paths) -> pd.DataFrame:
    """Read several profiles and stack them (each validated on its own)."""
    frames = [read_profile(p) for p in paths]
    if len(frames) == 1:
        return frames[0]
    out = pd.concat(frames, ignore_index=True)
    dups = duplicate_failures(out)
    if dups:  # the same rows in two of the files (the row numbers count through the files in order)
        raise ProfileSchemaError(", ".join(map(str, paths)), dups)
    return out


def write_profile(df: pd.DataFrame, path, overwrite: bool = False, source=None) -> Path:
    """Validate, then write atomically; an existing file is kept unless ``overwrite``.
    Errors name ``source`` (where the rows came from), else the table bound for ``path``."""
    df = validate_profile(df, path=source or f"the table to write to {path}")
    return write_parquet(df, path, overwrite=overwrite)

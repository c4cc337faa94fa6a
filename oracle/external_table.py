"""Bring your own labels: a training table from your own per-mode costs, no profiler.

Why: a researcher who measured modes elsewhere (another serving stack, a published
sweep, a simulator) has, per request, each mode's cost; the routers need nothing
else. :func:`read_cost_table` reads such a table (CSV or parquet), checks it, labels
each request with the fastest mode that meets the constraints (the reference
always does) and returns a training table that ``train``, ``score`` and the Python
API take like one from ``dataset build``.

Columns (one row per request):

* required: ``request_id``, ``prompt_tokens``, ``expected_output_tokens``, and
  ``latency_ms__<mode>`` for the reference mode (``fp16_baseline``) and at least one
  other registered mode;
* optional request fields: ``shared_prefix_tokens`` (default 0),
  ``concurrent_requests`` (1), ``memory_pressure`` (0), ``family`` (``external``),
  ``benchmark_suite`` (none);
* optional per mode, relative to the reference: ``energy_ratio__<mode>``,
  ``memory_ratio__<mode>``, ``rouge_l_vs_baseline__<mode>``,
  ``accuracy_delta_pp__<mode>``; violations follow from them and the constraints
  (energy above ``max_energy_ratio``, memory above ``max_memory_ratio``, ROUGE-L
  below ``min_rouge_vs_baseline``, accuracy more than ``max_accuracy_drop_pp`` below;
  quality judged as the oracle judges it, on each (mode, family)'s mean under
  ``quality_scope="family"``, a lossless mode's divergence left to the floor under
  ``lossless_at_floor``: :mod:`modeswitch.oracle.family_rule`);
  or give ``violates_{quality,energy,memory}__<mode>`` (true/false) yourself, which
  wins over the ratios. A mode with no quality evidence at all follows
  ``missing_quality`` (the study's rule: unsafe). A latency left empty means the
  mode was not measured there: it cannot be the label.

Ties in latency go to the first mode in name order (the profile oracle's tie rules,
``latency_tie_rel`` and its energy / memory tie-breaks, are not applied here).
Errors name the file, the row (1-based, as a spreadsheet counts data rows) and the
column.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from modeswitch.dataset.errors import InputError, read_table
from modeswitch.dataset.features import features_frame
from modeswitch.dataset.requests import Request
from modeswitch.engine.modes import list_modes, reference_mode
from modeswitch.oracle.constraints import Constraints
from modeswitch.oracle.family_rule import lossless
from modeswitch.oracle.table_values import check_table_values
from modeswitch.oracle.training_table import PER_MODE, frame_hash

REQUIRED = ("request_id", "prompt_tokens", "expected_output_tokens")
OPTIONAL = {"shared_prefix_tokens": 0, "concurrent_requests": 1, "memory_pressure": 0.0,
            "family": "external", "benchmark_suite": None}
CONSTRAINT_NAMES = ("quality", "energy", "memory")


def _read(path: Path) -> pd.DataFrame:
    if not path.exists():
        raise InputError(f"{path}: no such file")
    if path.suffix.lower() in (".parquet", ".pq"):
        return read_table(path, pd.read_parquet)
    if path.suffix.lower() in (".csv", ".txt"):
        return read_table(path, pd.read_csv)
    raise InputError(f"{path}: a cost table is .csv or .parquet")


def read_training_table(path, constraints: Constraints | None = None) -> pd.DataFrame:
    """A training table from ``dataset build`` (parquet with its metadata), or a cost
    table (CSV, or parquet without that metadata) labelled here; read once. What
    ``train --data`` / ``score --data`` and the examples take. The file's path is kept
    in ``attrs["source_path"]`` (the runs' dataset source). Every number is checked
    before a router sees it (:mod:`modeswitch.oracle.table_values`): the first bad one is an error
    naming the file, the row and the column."""
    path = Path(path)
    raw = _read(path)
    if raw.attrs.get("modeswitch"):
        raw.attrs["source_path"] = str(path.resolve())
        table = raw
    else:
        try:
            table = cost_table(raw, path, constraints)
        except InputError as exc:
            if path.suffix.lower() in (".csv", ".txt"):
                raise
            raise InputError(f"not a training table from `dataset build` (no metadata), nor a cost table: "
                             f"{exc}") from None
    check_table_values(table, path)
    return table


def _numbers(df: pd.DataFrame, col: str, path: Path, *, minimum: float | None = None,
             allow_missing: bool = False) -> pd.Series:
    raw = df[col]
    vals = pd.to_numeric(raw, errors="coerce")
    bad = vals.isna() & raw.notna() & (raw.astype(str).str.strip() != "")
    if not allow_missing:
        bad |= vals.isna()
    bad |= vals.notna() & ~np.isfinite(vals.astype(float))
    if minimum is not None:
        bad |= vals.notna() & (vals < minimum)
    if bad.any():
        i = int(np.flatnonzero(bad.to_numpy())[0])
        need = "a finite number" + (f" >= {minimum:g}" if minimum is not None else "")
        raise InputError(f"{path}: row {i + 1}, column {col}: {raw.iloc[i]!r} is not {need}")
    return vals.astype(float)


def _flags(df: pd.DataFrame, col: str, path: Path) -> pd.Series:
    words = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}
    out = []
    for i, v in enumerate(df[col]):
        if isinstance(v, (bool, np.bool_)):
            out.append(bool(v))
            continue
        key = str(v).strip().lower()
        if key.endswith(".0"):
            key = key[:-2]
        if key not in words:
            raise InputError(f"{path}: row {i + 1}, column {col}: {v!r} is not true/false")
        out.append(words[key])
    return pd.Series(out, index=df.index, dtype=bool)


def read_cost_table(path, constraints: Constraints | None = None) -> pd.DataFrame:
    """The training table for a CSV/parquet of requests with per-mode costs (see the
    module docstring for its columns)."""
    path = Path(path)
    return cost_table(_read(path), path, constraints)


def cost_table(raw: pd.DataFrame, path: Path, constraints: Constraints | None = None) -> pd.DataFrame:
    """The training table for a read cost table ``raw`` (``path`` names it in errors)."""
    c = constraints or Constraints()
    missing = [col for col in REQUIRED if col not in raw.columns]
    if missing:
        raise InputError(f"{path}: missing column(s) {', '.join(missing)} (a cost table needs "
                         f"{', '.join(REQUIRED)} and latency_ms__<mode> per mode)")
    if not len(raw):
        raise InputError(f"{path}: no rows")
    ref = reference_mode().name
    known = {m.name for m in list_modes()}
    modes = sorted(col.split("__", 1)[1] for col in raw.columns if col.startswith("latency_ms__"))
    unknown = [m for m in modes if m not in known]
    if unknown:
        raise InputError(f"{path}: column latency_ms__{unknown[0]}: {unknown[0]!r} is not a registered "
                         f"mode (known: {', '.join(sorted(known))})")
    if ref not in modes or len(modes) < 2:
        raise InputError(f"{path}: missing column(s) latency_ms__{ref}" if ref not in modes else
                         f"{path}: only latency_ms__{ref}; give at least one other mode's latency_ms__<mode>")
    ids = raw["request_id"].astype(str)
    dup = ids.duplicated()
    if dup.any():
        i = int(np.flatnonzero(dup.to_numpy())[0])
        raise InputError(f"{path}: row {i + 1}, column request_id: {ids.iloc[i]!r} appears twice")

    fields = {"prompt_tokens": _numbers(raw, "prompt_tokens", path, minimum=1),
              "expected_output_tokens": _numbers(raw, "expected_output_tokens", path, minimum=1)}
    for col in OPTIONAL:
        if col in raw and col not in ("family", "benchmark_suite"):
            fields[col] = _numbers(raw, col, path, minimum=1 if col == "concurrent_requests" else 0)
    reqs = []
    for i in range(len(raw)):
        get = {k: v.iloc[i] for k, v in fields.items()}
        fam = raw["family"].iloc[i] if "family" in raw and pd.notna(raw["family"].iloc[i]) else OPTIONAL["family"]
        suite = raw["benchmark_suite"].iloc[i] if "benchmark_suite" in raw else None
        reqs.append(Request(id=ids.iloc[i], prompt_tokens=int(get["prompt_tokens"]),
                            expected_output_tokens=int(get["expected_output_tokens"]),
                            shared_prefix_tokens=int(get.get("shared_prefix_tokens", 0)),
                            concurrent_requests=int(get.get("concurrent_requests", 1)),
                            memory_pressure=float(get.get("memory_pressure", 0.0)),
                            family=str(fam), workload=str(fam),
                            benchmark_suite=None if suite is None or pd.isna(suite) else str(suite)))
    families = np.asarray([r.family for r in reqs], dtype=object)
    table = features_frame(reqs, "B", with_context=True)
    table.index.name = "request_id"
    table = table.reset_index()
    n = len(raw)
    for m in modes:
        col = f"latency_ms__{m}"
        lat = _numbers(raw, col, path, minimum=0, allow_missing=m != ref).to_numpy()
        if (lat <= 0).any():
            i = int(np.flatnonzero(lat <= 0)[0])
            raise InputError(f"{path}: row {i + 1}, column {col}: a latency must be > 0 "
                             "(leave it empty where the mode was not measured)")
        table[col] = lat
        is_ref = m == ref
        vals = {}
        for metric in PER_MODE[1:]:
            col = f"{metric}__{m}"
            if col in raw:
                vals[metric] = _numbers(raw, col, path, allow_missing=True).to_numpy()
            else:  # the reference is its own yardstick: ratios 1, ROUGE-L 1 vs itself
                vals[metric] = np.full(n, 1.0 if is_ref and metric != "accuracy_delta_pp" else np.nan)
            table[col] = vals[metric]
        rouge, acc = vals["rouge_l_vs_baseline"], vals["accuracy_delta_pp"]
        judged_rouge, judged_acc = rouge, acc
        if c.quality_scope == "family":  # the study's rule: each family's mean
            judged_rouge = pd.Series(rouge).groupby(families).transform("mean").to_numpy()
            judged_acc = pd.Series(acc).groupby(families).transform("mean").to_numpy()
        at_floor = c.lossless_at_floor and lossless(m)
        computed = {
            "energy": np.nan_to_num(vals["energy_ratio"], nan=0.0) > c.max_energy_ratio + 1e-12,
            "memory": np.nan_to_num(vals["memory_ratio"], nan=0.0) > c.max_memory_ratio + 1e-12,
            "quality": (((np.nan_to_num(judged_rouge, nan=1.0) < c.min_rouge_vs_baseline - 1e-12)
                         | (np.nan_to_num(judged_acc, nan=0.0) < -c.max_accuracy_drop_pp - 1e-12)) & (not at_floor))
            | (np.isnan(rouge) & np.isnan(acc) & (c.missing_quality == "unsafe")),
        }
        # the per-request view beside the verdict (offline scoring's divergence rate)
        table[f"diverges__{m}"] = ~np.asarray(is_ref) & (np.nan_to_num(rouge, nan=1.0) < c.min_rouge_vs_baseline - 1e-12)
        violates = {}
        for k in CONSTRAINT_NAMES:
            col = f"violates_{k}__{m}"
            v = _flags(raw, col, path).to_numpy() if col in raw else computed[k]
            violates[k] = np.zeros(n, bool) if is_ref else v
            table[col] = violates[k]
        table[f"safe__{m}"] = is_ref | (~(violates["quality"] | violates["energy"] | violates["memory"])
                                        & np.isfinite(lat))
    L = np.column_stack([np.where(table[f"safe__{m}"], table[f"latency_ms__{m}"], np.inf) for m in modes])
    table["label"] = np.asarray(modes, dtype=object)[L.argmin(axis=1)]
    table["label_source"] = "external"
    table["estimate_basis"] = "external"
    table["latency_basis"] = "external"
    table["quality_basis"] = "external"
    table["reference_mode"] = ref
    table["condition"] = "external"
    table.attrs["modeswitch"] = json.dumps({
        "modes": modes, "constraints": c.to_dict(), "profile_hash": frame_hash(raw),
        "profile_source": str(path.resolve()), "backends": [], "skipped": [],
        "label_sources": {"external": int(n)}, "costmodel": None})
    table.attrs["source_path"] = str(path.resolve())
    return table

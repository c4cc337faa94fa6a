"""The ModeSwitch-LLM authors' published A100 measurements (arXiv 2605.23057).

Three formats, told apart by their columns (see ``shared/reference/a100/README.md``
in the project's data folder):

* ``modeswitch_a100_trials``: one row per trial (TTFT, latency, tokens/s, energy
  per token, peak GPU memory) -> per-trial profile rows;
* ``modeswitch_a100_sweep``: mode x workload aggregates (latency mean/std/
  percentiles, tokens/s, ROUGE-L) -> aggregate rows, never expanded into trials;
* ``modeswitch_a100_stress``: long-context stress aggregates, single and hybrid.

Only published numbers are carried over; an empty cell stays missing. Some
columns are exact re-expressions rather than direct copies, and are named as such
in each row's ``source``: a stress mean taken as the midpoint of its published
symmetric 95% CI, a stress mean taken as FP16's mean plus the published paired
delta, and a sweep's trial count taken as ``num_runs - failed_runs`` where
``completed_runs`` is absent.

Columns, per format. *Markers* identify the format (a file is read by the format
whose markers it has, the most specific first); *required* columns missing are an
:class:`~modeswitch.dataset.errors.InputFileError` naming the file and the column(s);
*optional* columns missing mean missing values (NaN / <NA>) in every row.

=======  ===========================  ==========================  ================================
format   markers                      required                    optional
=======  ===========================  ==========================  ================================
trials   sweep, mode_name,            total_latency_ms            ttft_ms, tokens_per_second,
         workload_name, trial_index                               energy_per_token_j,
                                                                  peak_gpu_memory_mb, source
sweep    sweep, mode_name,            total_latency_ms_mean;      baseline_similarity_rouge_l_f1_mean,
         workload_name                completed_runs, or else     reference_rouge_l_f1_mean,
                                      num_runs and failed_runs    total_latency_ms_std/_p50/_p95/_p99,
                                      (an aggregate row needs     tokens_per_second_mean,
                                      its trial count)            trial_log_ttft_ms_mean,
                                                                  trial_log_energy_per_token_j_mean,
                                                                  trial_log_peak_gpu_memory_mb_mean,
                                                                  source
stress   sweep, mode_name,            num_runs; one of            ttft_ms_mean, peak_gpu_memory_mb_mean,
         workload_name,               total_latency_ms_mean_      tokens_per_second_mean_exact_best_mode_table,
         prompt_tokens_target,        exact_best_mode_table,      energy_per_token_j_mean_exact_best_mode_table,
         max_new_tokens               total_latency_ms_mean_      energy_per_token_j_mean_from_ci95_midpoint,
                                      from_paired_delta           source
=======  ===========================  ==========================  ================================

The sweep format is the fallback: a file with the identity columns but neither the
per-trial nor the stress markers is read as a sweep, so a sweep missing its
latency column is told so by name.

Workload names: the curated names map to the workloads registered in
``dataset/workloads/study.py``; ``shared_prefix_chat`` and its versioned forms
(``shared_prefix_chat_vN``) to ``shared_prefix_chat``; the later sweeps' benchmark
workloads ``<suite>_eval`` (``mmlu_pro_eval``, ``gsm8k_eval``, ``truthfulqa_eval``,
``gpqa_eval``, ``mlu_eval``) to family and ``benchmark_suite`` ``<suite>`` with the
suite's evaluation mode and that mode's output budget from
:mod:`modeswitch.dataset.benchmarks` (prompt length not published: missing); the stress
names ``ctxN_outM`` / ``sharedN_outM`` carry their own shape.
"""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path

import numpy as np
import pandas as pd

from modeswitch.dataset.benchmarks import OUTPUT_TOKENS
from modeswitch.dataset.errors import InputFileError
from modeswitch.dataset.importers import Importer, register_importer
from modeswitch.dataset.workloads import get_workload

PROVENANCE = {
    "backend": "vllm",
    "model": "meta-llama/Llama-3.1-8B-Instruct",
    "hardware": "NVIDIA A100 40GB",
    "software": "vLLM (version not published)",
    "reference_mode": "fp16_baseline",  # the study's name for its FP16 reference (its data, not our registry)
    "precision": "float16",
    "energy_source": "published",
}

_CURATED = {
    "short_prompt_short_output": "short_prompt_short_output",
    "short_prompt_long_output": "short_prompt_long_output",
    "long_prompt_short_output": "long_prompt_short_output",
    "long_prompt_long_output": "long_prompt_long_output",
    "memory_pressure_long_context": "memory_pressure_long_context",
}
_SHARED_PREFIX = re.compile(r"^shared_prefix_chat(?:_v\d+)?$")
#: benchmark suite -> evaluation mode (as in the suites' JSONL files, dataset/benchmarks.py)
_BENCHMARKS = {
    "mmlu_pro": "multiple_choice_accuracy",
    "gsm8k": "final_answer_exact_match",
    "truthfulqa": "multiple_choice_accuracy",
    "gpqa": "multiple_choice_accuracy",
    "mlu": "multiple_choice_accuracy",
}
_BENCHMARK = re.compile(r"^(" + "|".join(_BENCHMARKS) + r")_eval$")
_STRESS = re.compile(r"^(ctx|shared)(\d+)_out(\d+)$")
_SHAPE_KEYS = ("family", "prompt_tokens", "expected_output_tokens", "shared_prefix_tokens",
               "concurrent_requests", "memory_pressure", "benchmark_suite", "evaluation_mode")


def _measured_at(sweep: str):
    m = re.search(r"(\d{8})_(\d{6})", str(sweep))
    if not m:
        return None
    return datetime.strptime(m.group(1) + m.group(2), "%Y%m%d%H%M%S").isoformat()


def workload_shape(name: str, path: Path, row: int) -> dict:
    """Family and nominal shape of a published workload cell."""
    name = str(name)
    if name in _CURATED:
        spec = get_workload(_CURATED[name])
    elif _SHARED_PREFIX.match(name):
        spec = get_workload("shared_prefix_chat")
    elif m := _BENCHMARK.match(name):
        suite = m.group(1)
        mode = _BENCHMARKS[suite]
        return {
            "family": suite,
            # the benchmark prompts' lengths were not published
            "prompt_tokens": float("nan"),
            "expected_output_tokens": float(OUTPUT_TOKENS[mode]),
            "shared_prefix_tokens": 0.0,
            "concurrent_requests": 1.0,
            "memory_pressure": 0.0,
            "benchmark_suite": suite,
            "evaluation_mode": mode,
        }
    else:
        m = _STRESS.match(name)
        if not m:
            raise InputFileError(path, row, "workload_name", "the workload name is empty" if name in ("", "nan")
                                 else f"unknown published workload {name!r}")
        shared = m.group(1) == "shared"
        return {
            "family": "shared_prefix_long_context" if shared else "long_context",
            "prompt_tokens": float(m.group(2)),
            "expected_output_tokens": float(m.group(3)),
            # the stress tests' prefix length was not published
            "shared_prefix_tokens": float("nan") if shared else 0.0,
            "concurrent_requests": 1.0,
            "memory_pressure": 0.0,
            "benchmark_suite": None,
            "evaluation_mode": None,
        }
    return {
        "family": spec.name,
        "prompt_tokens": float(spec.prompt_tokens),
        "expected_output_tokens": float(spec.expected_output_tokens),
        "shared_prefix_tokens": float(spec.shared_prefix_tokens),
        "concurrent_requests": float(spec.concurrent_requests),
        "memory_pressure": float(spec.memory_pressure),
        "benchmark_suite": None,
        "evaluation_mode": None,
    }


def _require(raw: pd.DataFrame, path: Path, fmt: str, columns=(), one_of=()) -> None:
    """Raise an InputFileError naming the file and every required column it lacks.

    ``one_of``: groups of alternatives, each satisfied by any one of its columns.
    """
    missing = [c for c in columns if c not in raw.columns]
    problems = [", ".join(missing)] if missing else []
    for group in one_of:
        if not any(c in raw.columns for c in group):
            missing.append(group[0])
            problems.append("one of " + " / ".join(group))
    if missing:
        raise InputFileError(
            path, None, missing[0],
            f"column(s) required by {fmt} missing: {'; '.join(problems)}",
        )


def _base(raw: pd.DataFrame, path: Path) -> pd.DataFrame:
    shapes = [workload_shape(w, path, i) for i, w in enumerate(raw["workload_name"])]
    out = pd.DataFrame(shapes, columns=list(_SHAPE_KEYS))
    out.insert(0, "workload", raw["workload_name"].astype(str).values)
    out["mode"] = raw["mode_name"].astype(str).values
    out["run_id"] = raw["sweep"].astype(str).values
    out["measured_at"] = [_measured_at(s) for s in raw["sweep"]]
    for k, v in PROVENANCE.items():
        out[k] = v
    src = raw["source"].astype(str) if "source" in raw else pd.Series([""] * len(raw))
    out["source"] = [f"{path.name}: {s}" for s in src]
    return out


def _col(raw: pd.DataFrame, name: str, path: Path) -> pd.Series:
    """The column as numbers, positionally indexed; all-NaN when the file lacks it."""
    if name not in raw.columns:
        return pd.Series(np.nan, index=range(len(raw)), dtype="float64")
    values = raw[name].reset_index(drop=True)
    num = pd.to_numeric(values, errors="coerce")
    bad = num.isna() & values.notna()
    if bad.any():
        row = int(np.flatnonzero(bad.to_numpy())[0])
        raise InputFileError(path, row, name, f"not a number: {values.iloc[row]!r}")
    return num.astype("float64")


def _count(values: pd.Series, path: Path, name: str) -> pd.Series:
    """Whole-number counts as Int64 (missing stays <NA>)."""
    frac = values.notna() & (values != values.round())
    if frac.any():
        row = int(np.flatnonzero(frac.to_numpy())[0])
        raise InputFileError(path, row, name, f"not a whole number: {values.iloc[row]}")
    return values.astype("Int64")


def convert_trials(raw: pd.DataFrame, path: Path) -> pd.DataFrame:
    _require(raw, path, "modeswitch_a100_trials", TRIALS_MARKERS | {"total_latency_ms"})
    out = _base(raw, path)
    out["trial"] = _count(_col(raw, "trial_index", path), path, "trial_index").values
    out["is_aggregate"] = False
    out["ttft_ms"] = _col(raw, "ttft_ms", path).values
    out["latency_ms"] = _col(raw, "total_latency_ms", path).values
    out["tokens_per_s"] = _col(raw, "tokens_per_second", path).values
    out["energy_per_token_j"] = _col(raw, "energy_per_token_j", path).values
    out["peak_memory_mb"] = _col(raw, "peak_gpu_memory_mb", path).values
    return out


def convert_sweep(raw: pd.DataFrame, path: Path) -> pd.DataFrame:
    # the fallback format: say why the file was read as a sweep
    _require(raw, path, "modeswitch_a100_sweep (the file has neither the per-trial nor "
             "the stress marker columns)", ["total_latency_ms_mean"])
    published_count = "completed_runs" in raw.columns
    if not published_count and not {"num_runs", "failed_runs"} <= set(raw.columns):
        raise InputFileError(
            path, None, "completed_runs",
            "column(s) required by modeswitch_a100_sweep missing: completed_runs (or else "
            "num_runs and failed_runs), since an aggregate row needs its trial count",
        )
    out = _base(raw, path)
    out["is_aggregate"] = True
    if published_count:
        out["n_trials"] = _count(_col(raw, "completed_runs", path), path, "completed_runs").values
    else:
        n = _col(raw, "num_runs", path) - _col(raw, "failed_runs", path)
        out["n_trials"] = _count(n, path, "num_runs").values
        out["source"] = [s + " [n_trials = num_runs - failed_runs]" for s in out["source"]]
    for dst, src in [
        ("latency_ms", "total_latency_ms_mean"),
        ("latency_ms_std", "total_latency_ms_std"),
        ("latency_ms_p50", "total_latency_ms_p50"),
        ("latency_ms_p95", "total_latency_ms_p95"),
        ("latency_ms_p99", "total_latency_ms_p99"),
        ("tokens_per_s", "tokens_per_second_mean"),
        ("rouge_l_vs_reference", "reference_rouge_l_f1_mean"),
        ("rouge_l_vs_baseline", "baseline_similarity_rouge_l_f1_mean"),
        ("ttft_ms", "trial_log_ttft_ms_mean"),
        ("energy_per_token_j", "trial_log_energy_per_token_j_mean"),
        ("peak_memory_mb", "trial_log_peak_gpu_memory_mb_mean"),
    ]:
        out[dst] = _col(raw, src, path).values
    return out


_STRESS_LATENCY = ("total_latency_ms_mean_exact_best_mode_table",
                   "total_latency_ms_mean_from_paired_delta")


def convert_stress(raw: pd.DataFrame, path: Path) -> pd.DataFrame:
    _require(raw, path, "modeswitch_a100_stress", STRESS_MARKERS | {"num_runs"},
             one_of=[_STRESS_LATENCY])
    out = _base(raw, path)
    out["is_aggregate"] = True
    out["n_trials"] = _count(_col(raw, "num_runs", path), path, "num_runs").values
    out["ttft_ms"] = _col(raw, "ttft_ms_mean", path).values
    exact_lat = _col(raw, _STRESS_LATENCY[0], path)
    paired_lat = _col(raw, _STRESS_LATENCY[1], path)
    out["latency_ms"] = exact_lat.fillna(paired_lat).values
    exact_e = _col(raw, "energy_per_token_j_mean_exact_best_mode_table", path)
    mid_e = _col(raw, "energy_per_token_j_mean_from_ci95_midpoint", path)
    out["energy_per_token_j"] = exact_e.fillna(mid_e).values
    out["tokens_per_s"] = _col(raw, "tokens_per_second_mean_exact_best_mode_table", path).values
    out["peak_memory_mb"] = _col(raw, "peak_gpu_memory_mb_mean", path).values
    notes = []
    for i in range(len(raw)):
        parts = []
        if pd.isna(exact_lat.iloc[i]) and pd.notna(paired_lat.iloc[i]):
            parts.append("latency_ms = FP16 mean + published paired delta")
        if pd.isna(exact_e.iloc[i]) and pd.notna(mid_e.iloc[i]):
            parts.append("energy_per_token_j = midpoint of published 95% CI")
        notes.append("; ".join(parts))
    out["source"] = [s + (f" [{n}]" if n else "") for s, n in zip(out["source"], notes)]
    return out


COMMON = frozenset({"sweep", "mode_name", "workload_name"})
TRIALS_MARKERS = COMMON | {"trial_index"}
SWEEP_MARKERS = COMMON
STRESS_MARKERS = COMMON | {"prompt_tokens_target", "max_new_tokens"}

register_importer(Importer(
    "modeswitch_a100_trials", "published A100 per-trial measurements",
    TRIALS_MARKERS, convert_trials,
))
register_importer(Importer(
    "modeswitch_a100_sweep", "published A100 mode x workload aggregates",
    SWEEP_MARKERS, convert_sweep,
))
register_importer(Importer(
    "modeswitch_a100_stress", "published A100 long-context stress aggregates",
    STRESS_MARKERS, convert_stress,
))

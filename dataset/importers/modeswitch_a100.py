"""The ModeSwitch-LLM authors' published A100 measurements (arXiv 2605.23057).

Three formats, told apart by their columns (see ``shared/reference/a100/README.md``
in the project's data folder):

* ``modeswitch_a100_trials``: one row per trial (TTFT, latency, tokens/s, energy
  per token, peak GPU memory) -> per-trial profile rows;
* ``modeswitch_a100_sweep``: mode x workload aggregates (latency mean/std/
  percentiles, tokens/s, ROUGE-L) -> aggregate rows, never expanded into trials;
* ``modeswitch_a100_stress``: long-context stress aggregates, single and hybrid.

Only published numbers are carried over; an empty cell stays missing. Two stress
columns are exact re-expressions rather than direct copies, and are named as such
in each row's ``source``: a mean taken as the midpoint of its published symmetric
95% CI, and a mean taken as FP16's mean plus the published paired delta.
"""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path

import pandas as pd

from dataset.errors import InputFileError
from dataset.importers import Importer, register_importer
from dataset.workloads import get_workload

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
_STRESS = re.compile(r"^(ctx|shared)(\d+)_out(\d+)$")


def _measured_at(sweep: str):
    m = re.search(r"(\d{8})_(\d{6})", str(sweep))
    if not m:
        return None
    return datetime.strptime(m.group(1) + m.group(2), "%Y%m%d%H%M%S").isoformat()


def workload_shape(name: str, path: Path, row: int) -> dict:
    """Family and nominal shape of a published workload cell."""
    if name in _CURATED:
        spec = get_workload(_CURATED[name])
    elif re.fullmatch(r"shared_prefix_chat_v\d+", name):
        spec = get_workload("shared_prefix_chat")
    else:
        m = _STRESS.match(name)
        if not m:
            raise InputFileError(path, row, "workload_name", f"unknown published workload {name!r}")
        shared = m.group(1) == "shared"
        return {
            "family": "shared_prefix_long_context" if shared else "long_context",
            "prompt_tokens": float(m.group(2)),
            "expected_output_tokens": float(m.group(3)),
            # the stress tests' prefix length was not published
            "shared_prefix_tokens": float("nan") if shared else 0.0,
            "concurrent_requests": 1.0,
            "memory_pressure": 0.0,
        }
    return {
        "family": spec.name,
        "prompt_tokens": float(spec.prompt_tokens),
        "expected_output_tokens": float(spec.expected_output_tokens),
        "shared_prefix_tokens": float(spec.shared_prefix_tokens),
        "concurrent_requests": float(spec.concurrent_requests),
        "memory_pressure": float(spec.memory_pressure),
    }


def _base(raw: pd.DataFrame, path: Path) -> pd.DataFrame:
    shapes = [workload_shape(w, path, i) for i, w in enumerate(raw["workload_name"])]
    out = pd.DataFrame(shapes)
    out.insert(0, "workload", raw["workload_name"].astype(str).values)
    out["mode"] = raw["mode_name"].astype(str).values
    out["run_id"] = raw["sweep"].astype(str).values
    out["measured_at"] = [_measured_at(s) for s in raw["sweep"]]
    for k, v in PROVENANCE.items():
        out[k] = v
    src = raw["source"].astype(str) if "source" in raw else pd.Series([""] * len(raw))
    out["source"] = [f"{path.name}: {s}" for s in src]
    return out


def _col(raw, name):
    return pd.to_numeric(raw[name], errors="raise") if name in raw else float("nan")


def convert_trials(raw: pd.DataFrame, path: Path) -> pd.DataFrame:
    out = _base(raw, path)
    out["trial"] = raw["trial_index"].astype("Int64").values
    out["is_aggregate"] = False
    out["ttft_ms"] = _col(raw, "ttft_ms").values
    out["latency_ms"] = _col(raw, "total_latency_ms").values
    out["tokens_per_s"] = _col(raw, "tokens_per_second").values
    out["energy_per_token_j"] = _col(raw, "energy_per_token_j").values
    out["peak_memory_mb"] = _col(raw, "peak_gpu_memory_mb").values
    return out


def convert_sweep(raw: pd.DataFrame, path: Path) -> pd.DataFrame:
    out = _base(raw, path)
    out["is_aggregate"] = True
    out["n_trials"] = pd.to_numeric(raw["completed_runs"]).astype("Int64").values
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
        out[dst] = _col(raw, src).values
    return out


def convert_stress(raw: pd.DataFrame, path: Path) -> pd.DataFrame:
    out = _base(raw, path)
    out["is_aggregate"] = True
    out["n_trials"] = pd.to_numeric(raw["num_runs"]).astype("Int64").values
    out["ttft_ms"] = _col(raw, "ttft_ms_mean").values
    exact_lat = _col(raw, "total_latency_ms_mean_exact_best_mode_table")
    paired_lat = _col(raw, "total_latency_ms_mean_from_paired_delta")
    out["latency_ms"] = pd.Series(exact_lat).fillna(pd.Series(paired_lat)).values \
        if isinstance(paired_lat, pd.Series) else pd.Series(exact_lat).values
    exact_e = _col(raw, "energy_per_token_j_mean_exact_best_mode_table")
    mid_e = _col(raw, "energy_per_token_j_mean_from_ci95_midpoint")
    out["energy_per_token_j"] = pd.Series(exact_e).fillna(pd.Series(mid_e)).values
    out["tokens_per_s"] = _col(raw, "tokens_per_second_mean_exact_best_mode_table").values
    out["peak_memory_mb"] = _col(raw, "peak_gpu_memory_mb_mean").values
    notes = []
    for i in range(len(raw)):
        parts = []
        if pd.isna(exact_lat.iloc[i]) and isinstance(paired_lat, pd.Series) \
                and pd.notna(paired_lat.iloc[i]):
            parts.append("latency_ms = FP16 mean + published paired delta")
        if pd.isna(exact_e.iloc[i]) and pd.notna(mid_e.iloc[i]):
            parts.append("energy_per_token_j = midpoint of published 95% CI")
        notes.append("; ".join(parts))
    out["source"] = [s + (f" [{n}]" if n else "") for s, n in zip(out["source"], notes)]
    return out


COMMON = frozenset({"sweep", "mode_name", "workload_name"})

register_importer(Importer(
    "modeswitch_a100_trials", "published A100 per-trial measurements",
    COMMON | {"trial_index", "ttft_ms", "total_latency_ms", "tokens_per_second",
              "energy_per_token_j", "peak_gpu_memory_mb"},
    convert_trials,
))
register_importer(Importer(
    "modeswitch_a100_sweep", "published A100 mode x workload aggregates",
    COMMON | {"completed_runs", "total_latency_ms_mean", "reference_rouge_l_f1_mean",
              "baseline_similarity_rouge_l_f1_mean"},
    convert_sweep,
))
register_importer(Importer(
    "modeswitch_a100_stress", "published A100 long-context stress aggregates",
    COMMON | {"num_runs", "ttft_ms_mean", "prompt_tokens_target", "max_new_tokens",
              "peak_gpu_memory_mb_mean"},
    convert_stress,
))

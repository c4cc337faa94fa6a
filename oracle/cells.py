"""Summarise a profile into one metric row per (unit, mode).

A *unit* is what gets a label: a measured request (``request_id``) or, for
profiles measured per workload cell, the cell (``workload``).

Per metric, per-trial rows win: their median over the unit's clean trials
(:func:`modeswitch.engine.noise.clean_trials`: contended trials are left out where a clean
one exists) is used whenever any trial row has the metric, with the latency's
coefficient of variation beside it (``latency_cv``); otherwise the aggregate rows' means are combined, weighted by
``n_trials``. Aggregates that summarise the same trials as the per-trial rows
are therefore never double counted, and an aggregate-only metric (ROUGE-L in the
published sweep) still reaches the oracle.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from modeswitch.dataset.workloads import get_workload
from modeswitch.dataset.workloads.spec import condition_of
from modeswitch.engine.modes import mode_names
from modeswitch.engine.noise import clean_trials

METRICS = (
    "latency_ms",
    "ttft_ms",
    "tokens_per_s",
    "energy_per_token_j",
    "peak_memory_mb",
    "accuracy",
    "rouge_l_vs_reference",
    "rouge_l_vs_baseline",
)
#: metrics the cost model predicts from the request's shape (quality is looked up); here,
#: beside the metrics, because the cost model and the interpolation both read it
MODELLED = ("latency_ms", "ttft_ms", "energy_per_token_j", "peak_memory_mb")
SHAPE = (
    "prompt_tokens",
    "expected_output_tokens",
    "shared_prefix_tokens",
    "concurrent_requests",
    "memory_pressure",
)


class OracleError(ValueError):
    """The profile cannot be labelled as it stands; the message says why and where."""


@dataclass
class Cells:
    """``metrics``: indexed by (unit, mode); ``units``: one row per unit; ``trials``:
    the clean per-trial latency and energy per (unit, mode, trial) (a trial's clean
    attempts collapsed to their median), which the noise-aware oracle compares in
    pairs; empty for a profile of aggregates only."""

    metrics: pd.DataFrame
    units: pd.DataFrame
    trials: pd.DataFrame | None = None


def request_rows(profile: pd.DataFrame) -> pd.DataFrame:
    """The measured per-request rows of a profile (aggregates summarise cells, not
    requests): what a cost model is fitted on and what becomes a measured label."""
    return profile[~profile["is_aggregate"].astype(bool) & profile["request_id"].notna()]


def quality_key(frame: pd.DataFrame) -> pd.Series:
    """What quality is pooled over: the benchmark suite, else the family."""
    suite = frame["benchmark_suite"]
    return suite.where(suite.notna() & (suite != ""), frame["family"]).astype(str)


def family_condition(family, benchmark_suite, shape: dict) -> str:
    """The condition a unit is estimated (and cost-modelled) under: a benchmark's, else
    the one its own numbers imply (conditions may be drawn per request, across
    families), else, where a number is missing (a published cell), its family's."""
    if isinstance(benchmark_suite, str) and benchmark_suite:
        return "benchmark"
    nums = [shape.get(k) for k in ("shared_prefix_tokens", "memory_pressure", "concurrent_requests")]
    known = all(pd.notna(v) and np.isfinite(float(v)) for v in nums)
    if not known and isinstance(family, str):
        try:
            return get_workload(family).condition
        except KeyError:
            pass
    return condition_of(*nums)


def check_modes(profile: pd.DataFrame, source=None) -> None:
    known = set(mode_names())
    for column in ("mode", "reference_mode"):
        bad = ~profile[column].isin(known)
        if bad.any():
            row = int(np.flatnonzero(bad.to_numpy())[0])
            names = sorted(set(profile.loc[bad, column]))
            raise OracleError(
                f"{source or 'profile'}: row {row}, column '{column}': unknown mode(s) "
                f"{', '.join(names)}; register them in engine/modes/ first"
            )


def summarise(profile: pd.DataFrame, source=None) -> Cells:
    check_modes(profile, source)
    df = profile.copy()
    df["unit"] = df["request_id"].where(df["request_id"].notna(), df["workload"]).astype(str)

    refs = df.groupby("unit")["reference_mode"].unique()
    multi = refs[refs.map(len) > 1]
    if len(multi):
        u = multi.index[0]
        raise OracleError(
            f"{source or 'profile'}: unit {u!r} has rows with different reference modes "
            f"({', '.join(multi.iloc[0])}); a unit needs exactly one reference"
        )

    trials = clean_trials(df[~df["is_aggregate"]])
    aggs = df[df["is_aggregate"]].copy()
    keys = ["unit", "mode"]
    trial_mean = trials.groupby(keys)[list(METRICS)].median()
    lat = trials.groupby(keys)["latency_ms"]
    dispersion = pd.DataFrame({"latency_cv": lat.std(ddof=1) / lat.mean(),
                               "n_clean_trials": lat.count()})
    w = aggs["n_trials"].astype(float).fillna(1.0)
    weighted = aggs[list(METRICS)].mul(w, axis=0)
    mask = aggs[list(METRICS)].notna().astype(float).mul(w, axis=0)
    agg_sum = weighted.groupby([aggs["unit"], aggs["mode"]]).sum(min_count=1)
    agg_w = mask.groupby([aggs["unit"], aggs["mode"]]).sum()
    agg_mean = agg_sum / agg_w.replace(0, np.nan)
    agg_mean.index.names = keys
    metrics = trial_mean.combine_first(agg_mean) if len(trial_mean) else agg_mean
    metrics = metrics.reindex(columns=list(METRICS))
    n_rows = df.groupby(keys).size().rename("n_rows")
    metrics = metrics.join(n_rows).join(dispersion).sort_index()

    first = df.groupby("unit").agg(
        {
            "workload": "first",
            "family": "first",
            "reference_mode": "first",
            "benchmark_suite": "first",
            "evaluation_mode": "first",
            **{c: "mean" for c in SHAPE},
        }
    )
    first["condition"] = [
        family_condition(r.family, r.benchmark_suite, r._asdict()) for r in first.itertuples()
    ]
    per_trial = (trials.dropna(subset=["trial"])
                 .groupby(["unit", "mode", "trial"])[["latency_ms", "energy_per_token_j"]]
                 .median().reset_index())
    return Cells(metrics=metrics, units=first, trials=per_trial)

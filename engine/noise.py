"""Measurement hygiene: CPU time per trial, the contention rule, thread calibration,
and the noise floor of a profile.

Why: on a small shared machine one request in one mode can take many times longer
in one interleaved trial than in the next with torch on two threads, because
whenever anything else takes a core the OpenMP threads wait on each other. The
process CPU time per wall second tells those trials apart (near the thread count
clean, well below it contended; one thread: near 1 clean, lower when it has to
share its core), so every trial records both clocks and is judged by
:class:`ContentionRule`. Contended trials are re-measured up to a limit and keep
their flag when it persists; the oracle and the cost model read the median of a
unit's clean trials (:func:`clean_trials`), never a mean that a contended trial
drags up.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

#: a (unit, mode)'s trials in a profile: what the rule compares a trial with
TRIAL_GROUP = ["request_id", "mode"]


def machine_busy_seconds() -> float:
    """CPU seconds the whole machine has spent busy (every core, every process, and
    time the hypervisor stole), from ``/proc/stat``; NaN where there is none."""
    try:
        with open("/proc/stat") as fh:
            fields = fh.readline().split()[1:]
    except OSError:
        return math.nan
    v = [int(x) for x in fields]
    # user nice system idle iowait irq softirq steal [guest guest_nice: inside user]
    busy = v[0] + v[1] + v[2] + v[5] + v[6] + (v[7] if len(v) > 7 else 0)
    return busy / os.sysconf("SC_CLK_TCK")


class TrialClock:
    """Wall and CPU seconds of one engine call, and what the rest of the machine did
    meanwhile. ``cpu`` returns this engine's CPU seconds (the process's, or the
    process tree's when the engine computes in child processes); ``machine`` the
    whole machine's busy seconds. ``other_load`` = (machine - engine) CPU seconds per
    wall second: cores busy with other work. A neighbour that takes no CPU time from
    the engine's threads still slows them through shared caches, memory bandwidth and
    clock speed, which the engine's own CPU share does not show."""

    def __init__(self, cpu=time.process_time, wall=time.perf_counter, machine=machine_busy_seconds):
        self._cpu, self._wall, self._machine = cpu, wall, machine
        self.wall_s = self.cpu_s = self.machine_s = float("nan")

    def __enter__(self):
        self._m0, self._c0, self._w0 = self._machine(), self._cpu(), self._wall()
        return self

    def __exit__(self, *exc):
        self.cpu_s = self._cpu() - self._c0
        self.wall_s = self._wall() - self._w0
        self.machine_s = self._machine() - self._m0
        return False

    @property
    def other_load(self) -> float:
        if not (self.wall_s > 0) or not math.isfinite(self.machine_s):
            return float("nan")
        return max(self.machine_s - self.cpu_s, 0.0) / self.wall_s

    @property
    def share(self) -> float:
        """CPU seconds per wall second (about the number of busy threads)."""
        return self.cpu_s / self.wall_s if self.wall_s > 0 else float("nan")


@dataclass(frozen=True)
class ContentionRule:
    """When a trial counts as contended (documented here, tested in tests/test_noise.py).

    A trial of one (unit, mode) is contended when either

    * its CPU share (CPU seconds / wall seconds) is below ``min_share_ratio`` x the
      reference share: the largest share among that (unit, mode)'s trials, or the
      clean share the thread calibration measured, whichever is larger (another
      process took CPU time from the engine's threads); on several threads the
      calibration's share is capped by the mode's median share (a mode keeps busy only
      as many cores as its parallel parts allow: :func:`_expected_shares`); or
    * the rest of the machine kept more than ``max_other_load`` cores busy during
      it (:attr:`TrialClock.other_load`): on a small machine a neighbour slows a
      single-threaded engine through shared caches and memory bandwidth without
      taking CPU time from it (the same units run markedly slower in a pass another
      process shares the machine with, at a full CPU share); or
    * its wall time is more than ``max_wall_ratio`` x the median wall time of all
      that (unit, mode)'s trials (a slowdown neither clock shows: on a 2-core VM whole
      passes over a family can run slower for tens of seconds at a full CPU share and
      no other load, while clean trials of one unit agree far more closely).
      Needs at least three trials, so the median is one of the majority: one slow
      trial among three is caught, and one fast trial never flags the other two.

    Only slow or disturbed trials are flagged: nothing makes a trial faster than clean.
    """

    min_share_ratio: float = 0.8
    max_wall_ratio: float = 1.15
    max_other_load: float = 0.5

    def flags(self, walls, shares, expected_share: float | None = None, other_load=None) -> np.ndarray:
        """Per trial of one (unit, mode): contended?"""
        walls = np.asarray(walls, float)
        shares = np.asarray(shares, float)
        out = np.zeros(len(walls), dtype=bool)
        if other_load is not None:
            other = np.asarray(other_load, float)
            out |= np.isfinite(other) & (other > self.max_other_load)
        if len(walls) == 0:
            return out
        finite = shares[np.isfinite(shares)]
        ref = max(float(finite.max()) if len(finite) else 0.0, expected_share or 0.0)
        if ref > 0:
            out |= np.isfinite(shares) & (shares < self.min_share_ratio * ref)
        if len(walls) >= 3:
            out |= walls > self.max_wall_ratio * float(np.median(walls))
        return out


def flag_contended(df: pd.DataFrame, rule: ContentionRule | None = None,
                   expected_share: float | None = None) -> pd.Series:
    """The ``contended`` column of per-trial profile rows (missing where a row has no
    CPU time: an import, or an aggregate)."""
    rule = rule or ContentionRule()
    out = pd.Series(pd.NA, index=df.index, dtype="boolean")
    if "cpu_share" not in df.columns or df.empty:
        return out
    timed = df[df["cpu_share"].notna() & df["latency_ms"].notna()]
    expected = _expected_shares(timed, expected_share)
    for (_, mode), g in timed.groupby(TRIAL_GROUP, sort=False):
        other = g["other_load"] if "other_load" in g else None
        out.loc[g.index] = rule.flags(g["latency_ms"], g["cpu_share"], expected.get(mode, expected_share), other)
    return out


#: trials of a mode it takes for its median CPU share to stand for the mode
MIN_MODE_TRIALS = 5


def _expected_shares(timed: pd.DataFrame, expected_share: float | None) -> dict:
    """Per mode, the CPU share a clean trial keeps: the thread calibration's
    (``expected_share``), capped, for an engine on more than one thread, by the mode's
    median share over the run's trials.

    Why: one thread keeps one core busy in every mode, but several threads keep busy
    only as many cores as a mode's parallel parts allow, and that differs by mode: at
    2 threads the modes' median shares can sit well below the calibration request's,
    so the calibration's share alone flags most trials as contended, with no other
    load, and re-measuring cannot clear them (docs/results.md). The median is the mode's own clean share as long as most of its trials
    are clean (a neighbour is still caught by ``other_load``, and a slow trial by the
    wall-time rule)."""
    if not expected_share or expected_share <= 1.0 or "mode" not in timed:
        return {}
    med = timed.groupby("mode")["cpu_share"].agg(["median", "size"])
    return {m: min(float(expected_share), float(r["median"]))
            for m, r in med.iterrows() if r["size"] >= MIN_MODE_TRIALS}


def _flagged(s: pd.Series) -> pd.Series:
    """The contended flag as plain bools (missing: not flagged)."""
    return s.astype("boolean").fillna(False).astype(bool)


def unresolved_trials(df: pd.DataFrame) -> pd.DataFrame:
    """(request_id, mode, trial, attempts) of trials none of whose attempts is clean."""
    flagged = df[_flagged(df["contended"])] if "contended" in df else df.iloc[:0]
    if flagged.empty:
        return pd.DataFrame(columns=["request_id", "mode", "trial", "attempts"])
    per = df.groupby(["request_id", "mode", "trial"]).agg(
        attempts=("attempt", "size"), clean=("contended", lambda s: int((~_flagged(s)).sum())))
    bad = per[per["clean"] == 0].reset_index()
    return bad[["request_id", "mode", "trial", "attempts"]]


def clean_trials(df: pd.DataFrame) -> pd.DataFrame:
    """Per-trial rows the oracle and cost model use: a (unit, mode)'s clean trials,
    or all of them where none is clean (the flag persisted; still visible in the
    ``contended`` column)."""
    if "contended" not in df.columns or df.empty:
        return df
    bad = _flagged(df["contended"])
    unit = df["request_id"].where(df["request_id"].notna(), df.get("workload", df["request_id"]))
    key = unit.astype(str) + "\x00" + df["mode"].astype(str)
    any_clean = (~bad).groupby(key).transform("any").astype(bool)
    return df[~bad | ~any_clean]


def noise_floor(df: pd.DataFrame) -> pd.DataFrame:
    """Per family: how repeatable the profile's trials are.

    ``median_cv``/``p90_cv``: over (unit, mode)s with two or more clean trials, the
    coefficient of variation of their latency; ``contended_share``: flagged trials
    (every attempt) over all; ``persisting``: trials whose every attempt stayed
    contended.
    """
    rows = df[~df["is_aggregate"].astype(bool)] if "is_aggregate" in df else df
    out = []
    for fam, g in rows.groupby("family", sort=True):
        clean = g[~_flagged(g["contended"])] if "contended" in g else g
        by = clean.groupby(TRIAL_GROUP)["latency_ms"]
        cv = (by.std(ddof=1) / by.mean())[by.size() >= 2]
        flags = _flagged(g["contended"]) if "contended" in g else pd.Series(False, index=g.index)
        persisting = len(unresolved_trials(g)) if "contended" in g and "attempt" in g else 0
        n_trials = g.groupby(["request_id", "mode", "trial"]).ngroups if "trial" in g else len(g)
        out.append({
            "family": fam, "units": g["request_id"].nunique(), "rows": len(g),
            "median_cv": float(cv.median()) if len(cv) else math.nan,
            "p90_cv": float(cv.quantile(0.9)) if len(cv) else math.nan,
            "contended_share": float(flags.mean()) if len(flags) else math.nan,
            "persisting": persisting / n_trials if n_trials else math.nan,
        })
    return pd.DataFrame(out).set_index("family") if out else pd.DataFrame()


@dataclass
class ThreadChoice:
    """The torch thread count the profiler measured with, and the measurement that
    chose it (one row per candidate count)."""

    threads: int
    table: list[dict] = field(default_factory=list)
    rule: str = ""

    @property
    def clean_share(self) -> float | None:
        for r in self.table:
            if r["threads"] == self.threads:
                return r["median_share"]
        return None

    def to_dict(self) -> dict:
        return {"threads": self.threads, "table": self.table, "rule": self.rule}

    @classmethod
    def from_dict(cls, d: dict) -> ThreadChoice:
        return cls(int(d["threads"]), list(d.get("table", [])), d.get("rule", ""))


#: a thread count must use its threads at least this well (speed-up over one thread,
#: per thread, on the 80th-percentile wall time) to be chosen
MIN_PARALLEL_EFFICIENCY = 0.6
THREAD_RULE = ("each candidate count runs the same short request in interleaved reps; the "
               "largest count whose parallel efficiency (p80 wall at 1 thread / p80 wall at n "
               f"threads / n) is at least {MIN_PARALLEL_EFFICIENCY} wins: threads that barely "
               "speed a step up mostly wait on each other, and waiting threads are what a "
               "neighbour on a shared machine turns into a manyfold slowdown")


def calibrate_threads(probe, set_threads, candidates, reps: int = 5,
                      clock_factory=TrialClock) -> ThreadChoice:
    """Measure ``probe()`` under each thread count (``set_threads(n)``), interleaved
    rep by rep so drift hits every count alike, and choose by :data:`THREAD_RULE`."""
    candidates = sorted(set(int(c) for c in candidates if c >= 1))
    walls = {n: [] for n in candidates}
    shares = {n: [] for n in candidates}
    for _ in range(reps):
        for n in candidates:
            set_threads(n)
            with clock_factory() as c:
                probe()
            walls[n].append(c.wall_s)
            shares[n].append(c.share)
    table = [{"threads": n, "median_wall_s": float(np.median(walls[n])),
              "p80_wall_s": float(np.percentile(walls[n], 80)),
              "cv": float(np.std(walls[n], ddof=1) / np.mean(walls[n])) if reps > 1 else math.nan,
              "median_share": float(np.median(shares[n]))} for n in candidates]
    base = next((r["p80_wall_s"] for r in table if r["threads"] == 1), None)
    if base is None:  # no single-thread candidate: the fastest tail
        chosen = min(table, key=lambda r: r["p80_wall_s"])["threads"]
    else:
        for r in table:
            r["efficiency"] = base / r["p80_wall_s"] / r["threads"]
        chosen = max(r["threads"] for r in table if r["efficiency"] >= MIN_PARALLEL_EFFICIENCY
                     or r["threads"] == 1)
    set_threads(chosen)
    return ThreadChoice(chosen, table, THREAD_RULE)

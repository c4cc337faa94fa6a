"""Measurement hygiene: the contention rule, clean trials and the noise floor, the
thread calibration, and the profiler's re-measurement of contended trials."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from modeswitch.engine.noise import (
    ContentionRule,
    ThreadChoice,
    TrialClock,
    calibrate_threads,
    clean_trials,
    flag_contended,
    noise_floor,
    unresolved_trials,
)


def test_a_trial_whose_cpu_share_drops_is_contended():
    rule = ContentionRule()
    # one thread: clean trials use ~1.0 CPU s per wall s; a neighbour took half the core
    assert rule.flags([500, 510, 980], [1.01, 1.02, 0.52]).tolist() == [False, False, True]
    # 0.8 x the best share is the line
    assert rule.flags([500, 505], [1.0, 0.81]).tolist() == [False, False]
    assert rule.flags([500, 505], [1.0, 0.79]).tolist() == [False, True]
    # the calibration's clean share counts as a reference even when every trial dropped
    assert rule.flags([900, 910], [1.3, 1.35], expected_share=1.97).tolist() == [True, True]


def test_a_trial_far_slower_than_the_others_is_contended_even_at_full_share():
    rule = ContentionRule()
    assert rule.flags([500, 505, 700], [1.0, 1.0, 1.0]).tolist() == [False, False, True]
    assert rule.flags([500, 505, 570], [1.0, 1.0, 1.0]).tolist() == [False, False, False]
    # fast trials are never flagged; with two trials the wall rule has no majority
    assert rule.flags([500, 505, 300], [1.0, 1.0, 1.0]).tolist() == [False, False, False]
    assert rule.flags([500, 900], [1.0, 1.0]).tolist() == [False, False]


def test_a_trial_beside_a_busy_neighbour_is_contended_at_full_share():
    rule = ContentionRule()
    # same CPU share, but the rest of the machine kept a core busy during the third
    assert rule.flags([2000, 2050, 2900], [1.0, 1.0, 1.0],
                      other_load=[0.02, 0.1, 0.97]).tolist() == [False, False, True]
    # no machine counter (not Linux): the other rules only
    assert rule.flags([2000, 2050], [1.0, 1.0], other_load=[float("nan")] * 2).tolist() == [False, False]
    ticks = iter([0.0, 1.0])
    machine = iter([5.0, 6.6])
    walls = iter([0.0, 1.0])
    with TrialClock(cpu=lambda: next(ticks), wall=lambda: next(walls), machine=lambda: next(machine)) as c:
        pass
    assert c.other_load == pytest.approx(0.6)


def _rows():
    rows = []
    for rid, lats, shares in [("a", [100, 102, 300], [1.0, 1.0, 0.4]),
                              ("b", [200, 210, 205], [1.0, 1.0, 1.0]),
                              ("c", [400, 900, 950], [0.5, 0.45, 0.5])]:
        for t, (lat, sh) in enumerate(zip(lats, shares)):
            rows.append({"request_id": rid, "mode": "m", "family": "f", "trial": t, "attempt": 0,
                         "latency_ms": lat, "cpu_share": sh, "is_aggregate": False})
    return pd.DataFrame(rows)


def test_flags_clean_trials_and_what_is_left_unresolved():
    df = _rows()
    df["contended"] = flag_contended(df, expected_share=1.0)
    assert df.groupby("request_id")["contended"].sum().to_dict() == {"a": 1, "b": 0, "c": 3}
    clean = clean_trials(df)
    # a: its two clean trials; b: all; c: nothing clean, so all three, still flagged
    assert clean.groupby("request_id").size().to_dict() == {"a": 2, "b": 3, "c": 3}
    assert clean[clean["request_id"] == "c"]["contended"].all()
    left = unresolved_trials(df)
    assert sorted(zip(left["request_id"], left["trial"])) == [("a", 2), ("c", 0), ("c", 1), ("c", 2)]
    # a clean re-measurement of a's trial 2 resolves it
    more = pd.concat([df.drop(columns="contended"), pd.DataFrame([{
        "request_id": "a", "mode": "m", "family": "f", "trial": 2, "attempt": 1, "latency_ms": 101,
        "cpu_share": 1.0, "is_aggregate": False}])], ignore_index=True)
    more["contended"] = flag_contended(more, expected_share=1.0)
    assert ("a", 2) not in set(zip(unresolved_trials(more)["request_id"], unresolved_trials(more)["trial"]))


def test_on_several_threads_each_mode_is_held_to_its_own_share():
    """Two threads: the calibration kept 1.99 cores busy, but a mode whose parallel
    parts are smaller keeps 1.3 clean; held to the calibration's share, every one of its
    trials would read as contended and no re-measurement could clear them. Held to its
    own median, only the trial that lost CPU time is."""
    rows = []
    for mode, share in (("wide", 1.95), ("narrow", 1.3)):
        for u in range(4):
            for t in range(2):
                lost = mode == "narrow" and u == 0 and t == 1
                rows.append({"request_id": f"r{u}", "mode": mode, "family": "f", "trial": t, "attempt": 0,
                             "latency_ms": 500.0, "cpu_share": 0.7 if lost else share + 0.01 * t,
                             "is_aggregate": False})
    df = pd.DataFrame(rows)
    flags = flag_contended(df, expected_share=1.99)
    assert df[flags.astype(bool)][["mode", "request_id", "trial"]].values.tolist() == [["narrow", "r0", 1]]
    # one thread: the calibration's share stands (a narrow share there is lost CPU time)
    one = df.assign(cpu_share=df["cpu_share"] / 2)
    assert flag_contended(one, expected_share=0.99).astype(bool)[one["mode"] == "narrow"].all()


def test_noise_floor_reports_cv_and_contended_share():
    df = _rows()
    df["contended"] = flag_contended(df, expected_share=1.0)
    nf = noise_floor(df).loc["f"]
    b_cv = np.std([200, 210, 205], ddof=1) / np.mean([200, 210, 205])
    a_cv = np.std([100, 102], ddof=1) / 101
    assert nf["median_cv"] == pytest.approx(np.median([a_cv, b_cv]))
    assert nf["contended_share"] == pytest.approx(4 / 9)
    assert nf["persisting"] == pytest.approx(4 / 9)


def test_trial_clock_reads_cpu_and_wall():
    ticks = iter([0.0, 0.5])
    walls = iter([10.0, 11.0])
    with TrialClock(cpu=lambda: next(ticks), wall=lambda: next(walls), machine=lambda: 0.0) as c:
        pass
    assert (c.cpu_s, c.wall_s, c.share) == (0.5, 1.0, 0.5)


class FakeClock:
    """Probe timings by thread count: what calibrate_threads reads."""

    state = {"n": 1}
    walls = {1: 1.0, 2: 0.7, 4: 0.6}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        n = self.state["n"]
        self.wall_s, self.cpu_s = self.walls[n], self.walls[n] * n
        return False

    @property
    def share(self):
        return self.cpu_s / self.wall_s


def test_thread_calibration_takes_the_largest_count_that_uses_its_threads():
    set_n = lambda n: FakeClock.state.update(n=n)  # noqa: E731
    # 2 threads: 1.0/0.7/2 = 0.71 efficient; 4: 1.0/0.6/4 = 0.42 -> 2
    choice = calibrate_threads(lambda: None, set_n, [1, 2, 4], reps=3, clock_factory=FakeClock)
    assert choice.threads == 2 and FakeClock.state["n"] == 2
    assert {r["threads"] for r in choice.table} == {1, 2, 4}
    assert choice.clean_share == pytest.approx(2.0)
    # barely faster with two threads (the tiny model here): one thread
    FakeClock.walls = {1: 1.0, 2: 0.9, 4: 0.85}
    assert calibrate_threads(lambda: None, set_n, [1, 2, 4], reps=2,
                             clock_factory=FakeClock).threads == 1
    back = ThreadChoice.from_dict(json.loads(json.dumps(choice.to_dict())))
    assert back.threads == 2 and back.table == choice.table


def test_profiler_remeasures_contended_trials_and_keeps_every_row(tiny_models, tmp_path, monkeypatch):
    """Force the rule to flag every first attempt of trial 1: each gets re-measured once
    (attempt 1), both rows are kept, and the oracle reads the clean ones."""
    import modeswitch.engine.noise as noise
    from modeswitch.engine.profiler import Profiler, ProfileSpec

    def flag_trial_one(df, rule=None, expected_share=None):  # the real rule would depend on the machine
        return ((df["trial"] == 1) & (df["attempt"] == 0)).astype("boolean")

    monkeypatch.setattr(noise, "flag_contended", flag_trial_one)
    spec = ProfileSpec(model=str(tiny_models.target), draft_model=str(tiny_models.draft),
                       modes=["fp16_baseline", "int8_quant"], workloads=["short_prompt_short_output"],
                       requests=2, trials=2, max_remeasure=2)
    out = tmp_path / "p.parquet"
    prof = Profiler(spec, tiny_models.target, tiny_models.draft, out)
    df = prof.run()
    assert len(df) == 2 * 2 * 2 + 2 * 2  # every trial, plus one re-measurement of each trial 1
    again = df[df["attempt"] == 1]
    assert set(again["trial"]) == {1} and not again["contended"].any()
    assert df[(df["trial"] == 1) & (df["attempt"] == 0)]["contended"].all()
    assert df["cpu_share"].gt(0).all() and df["cpu_time_ms"].gt(0).all()
    # the thread count was measured, journalled and recorded on every row
    journal = out.with_name(out.name + ".journal.jsonl")
    meta = [json.loads(x) for x in journal.read_text().splitlines() if '"kind"' in x]
    assert meta and meta[0]["kind"] == "threads" and df["threads"].eq(meta[0]["threads"]).all()
    assert {"median_cv", "contended_share"} <= set(prof.noise_.columns)
    from modeswitch.oracle.cells import summarise

    cells = summarise(df)
    assert (cells.metrics["n_clean_trials"] == 2).all()


def test_a_resumed_run_remeasures_what_a_stricter_rule_flags(tiny_models, tmp_path, monkeypatch):
    """Rerunning a finished profile measures nothing new, unless trials are left
    contended (an interrupt during re-measuring, or a stricter rule): those it re-measures."""
    import modeswitch.engine.noise as noise
    from modeswitch.engine.profiler import Profiler, ProfileSpec

    spec = ProfileSpec(model=str(tiny_models.target), draft_model=str(tiny_models.draft),
                       modes=["fp16_baseline"], workloads=["short_prompt_short_output"],
                       requests=2, trials=3, max_remeasure=1, threads=1)
    out = tmp_path / "p.parquet"
    monkeypatch.setattr(noise, "flag_contended", lambda df, rule=None, expected_share=None:
                        pd.Series(False, index=df.index, dtype="boolean"))
    first = Profiler(spec, tiny_models.target, tiny_models.draft, out).run()
    assert len(first) == 6
    out.unlink()  # the journal stays: the next run resumes it
    # now every first attempt of trial 0 counts as contended
    monkeypatch.setattr(noise, "flag_contended", lambda df, rule=None, expected_share=None:
                        ((df["trial"] == 0) & (df["attempt"] == 0)).astype("boolean"))
    seen = []
    again = Profiler(spec, tiny_models.target, tiny_models.draft, out, on_row=seen.append).run()
    assert [(r["trial"], r["attempt"]) for r in seen] == [(0, 1), (0, 1)]
    assert len(again) == 8

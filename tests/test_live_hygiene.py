"""Live scoring measures as the profiler does: the profile's threads, every trial's CPU
share and the machine's other load, contended trials measured again, medians of clean ones.

The engine and the trial clock are scripted (no timing here): the clock reports the CPU
share a contended trial shows (another process had the core) on the calls listed."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import pytest

from modeswitch.dataset.requests import Request


@dataclass
class _Gen:
    text: str
    output_tokens: int
    latency_ms: float
    ttft_ms: float


class _Engine:
    tokenizer = None

    def __init__(self, mode, calls):
        self.mode, self.calls = mode, calls

    def run(self, group, ignore_eos=True):
        self.calls.append(self.mode)
        return [_Gen(f"words of {self.mode}", 4, 30.0, 10.0) for _ in group]

    def close(self):
        pass


class _Clock:
    def __init__(self, share):
        self.share, self.other_load = share, 0.0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.fixture
def live(monkeypatch):
    from modeswitch.engine import prompts
    from modeswitch.engine.backends import registry
    from modeswitch.routers.scoring import live as live_mod

    # as the real builder: (the request as prepared, its token ids)
    monkeypatch.setattr(prompts, "PromptBuilder", lambda tok: SimpleNamespace(prepare=lambda r: (r, [1, 2, 3])))

    def run(contended_calls=(), **kw):
        calls, seen = [], []

        def load(mode, settings):
            seen.append(settings)
            return _Engine(mode, calls)

        be = SimpleNamespace(plan=lambda s, modes: (modes, [], {}), load=load, child_processes=False)
        monkeypatch.setattr(registry, "get_backend", lambda name: be)
        n = iter(range(10_000))
        monkeypatch.setattr(live_mod, "_trial_clock",
                            lambda children: lambda: _Clock(0.3 if next(n) in contended_calls else 1.0))
        stream = [Request(id="r1", prompt_tokens=8, expected_output_tokens=4, family="a")]
        runs = live_mod.run_live(stream, {"x": ["fast"]}, "model", trials=3, **kw)
        return runs, calls, seen
    return run


def test_a_stream_with_repeated_ids_is_refused(monkeypatch):
    from modeswitch.dataset.errors import InputError
    from modeswitch.routers.scoring.live import run_live

    r = Request(id="r1", prompt_tokens=8, expected_output_tokens=4, family="a")
    with pytest.raises(InputError, match="repeats request ids: r1"):
        run_live([r, r], {"x": ["fast", "fast"]}, "model")


def test_the_profile_threads_reach_the_engines(live):
    _, _, seen = live(threads=1)
    assert {s.threads for s in seen} == {1}


def test_a_contended_trial_is_measured_again_and_left_out_of_the_median(live):
    from modeswitch.routers.scoring.live import _collapse

    # calls: t0 fp16, t0 fast, t1 fp16, t1 fast (contended), t2 fp16, t2 fast, then fast t1 again
    runs, calls, _ = live({3}, threads=1)
    fast = runs[runs["mode"] == "fast"].sort_values(["trial", "attempt"])
    assert calls.count("fast") == 4 and calls.count("fp16_baseline") == 3
    assert fast[["trial", "attempt"]].values.tolist() == [[0, 0], [1, 0], [1, 1], [2, 0]]
    assert fast["contended"].tolist() == [False, True, False, False]
    assert {"other_load", "cpu_share", "contended", "attempt", "rouge_l_vs_baseline"} <= set(runs.columns)
    med, per_trial = _collapse(runs)
    assert med.loc[("r1", "fast"), "trials"] == 3  # three trials, each by its clean attempt
    assert len(per_trial[("r1", "fast")]) == 3
    # each run's own text against the reference's first
    assert runs.loc[runs["mode"] == "fp16_baseline", "rouge_l_vs_baseline"].eq(1.0).all()
    assert runs.loc[runs["mode"] == "fast", "rouge_l_vs_baseline"].lt(1.0).all()


def test_a_trial_that_stays_contended_keeps_its_flag_and_stops(live):
    # fast's trial 0 is contended at every attempt: calls 1, then the re-measures 6 and 7
    runs, calls, _ = live({1, 6, 7}, threads=1, max_remeasure=2)
    first = runs[(runs["mode"] == "fast") & (runs["trial"] == 0)]
    assert first["attempt"].tolist() == [0, 1, 2] and first["contended"].all()
    assert calls.count("fast") == 5


def test_the_summary_counts_contended_and_remeasured_trials(live):
    from modeswitch.oracle.constraints import Constraints
    from modeswitch.routers.scoring.live import score_live

    runs, _, _ = live({3}, threads=1)
    stream = [Request(id="r1", prompt_tokens=8, expected_output_tokens=4, family="a")]
    _, _, summary = score_live(runs, stream, {"x": ["fast"]}, {"x": 0.0}, Constraints())
    assert summary["contended_trials_pct"] == pytest.approx(100 / 6)
    assert summary["contended_after_remeasure_pct"] == 0.0 and summary["remeasured_runs"] == 1


def test_live_threads_default_to_the_profile_then_one_on_cpu():
    from modeswitch.routers.scoring.run import ScoreConfig, live_threads

    assert live_threads(ScoreConfig(), {"threads": [2]}) == (2, "the profile's")
    assert live_threads(ScoreConfig(), {})[0] == 1
    assert live_threads(ScoreConfig(), {"threads": [1, 2]})[0] == 1  # mixed: the safe choice
    assert live_threads(ScoreConfig(device="cuda"), {})[0] is None
    assert live_threads(ScoreConfig(live_threads=3), {"threads": [1]}) == (3, "--live-threads")


def test_the_training_table_records_the_profile_threads():
    from modeswitch.dataset.workloads import get_workload
    from modeswitch.oracle.training_table import build_training_table, table_meta
    from tests.helpers import synthetic_profile

    reqs = get_workload("short_prompt_short_output").sample(10, seed=0)
    profile = synthetic_profile()
    assert table_meta(build_training_table(profile.drop(columns=["threads"], errors="ignore"), reqs))["threads"] == []
    profile["threads"] = 1
    assert table_meta(build_training_table(profile, reqs))["threads"] == [1]


def test_the_risk_table_reads_the_live_rate_against_its_slack():
    import pandas as pd

    from modeswitch.routers.scoring.coverage import risk_table

    router = SimpleNamespace(calibration_={"alpha": 0.01, "delta": 0.1, "n": 230, "threshold": 0.02,
                                           "rate": 0.0, "upper_bound": 0.00996})
    head = pd.DataFrame({"violation_rate_any": [0.02]}, index=["cost"])
    live = pd.DataFrame({"router": ["cost"], "violation_rate_any": [1 / 60]})
    row = risk_table({"cost": router}, head, live, held_out=240, live_requests=60).iloc[0]
    # 60 requests at delta 0.1: up to 2 violations by chance at a true 1 %
    assert row["live_slack"] == pytest.approx(2 / 60 - 0.01) and row["met_live"]
    assert row["held_out_slack"] == pytest.approx(4 / 240 - 0.01) and not row["met_offline"]


def test_live_runs_the_profiled_arrival_group_after_its_primer_from_an_emptied_cache(monkeypatch):
    """A row with company runs as the group the profiler measured (dataset's
    arrival_group), after the same primer, each unit from an emptied prefix cache."""
    from modeswitch.dataset.workloads.conditions import arrival_group, primer
    from modeswitch.engine import prompts
    from modeswitch.engine.backends import registry
    from modeswitch.routers.scoring import live as live_mod

    monkeypatch.setattr(prompts, "PromptBuilder", lambda tok: SimpleNamespace(prepare=lambda r: (r, [1, 2, 3])))
    log = []

    class Cached(_Engine):
        def run(self, group, ignore_eos=True):
            log.append([r.id for r, _ in group])
            return super().run(group, ignore_eos)

        def reset_prefix_cache(self):
            log.append("reset")

    be = SimpleNamespace(plan=lambda s, modes: (modes, [], {}), load=lambda m, s: Cached(m, []),
                         child_processes=False)
    monkeypatch.setattr(registry, "get_backend", lambda name: be)
    monkeypatch.setattr(live_mod, "_trial_clock", lambda children: lambda: _Clock(1.0))
    req = Request(id="r1", prompt_tokens=40, expected_output_tokens=4, family="a",
                  concurrent_requests=2, shared_prefix_tokens=16)
    live_mod.run_live([req], {"x": ["fp16_baseline"]}, "model", reference="fp16_baseline", trials=1)
    assert log == ["reset", [primer(req).id], [r.id for r in arrival_group(req)]]


def test_a_measured_request_runs_live_with_the_prompts_the_profiler_built(monkeypatch):
    """A table row holds a profiled unit's measured shape (the template's prompt lengths,
    averaged over its group), not the budgets its prompts were built from, so prompts
    rebuilt from the row differ (the live check then measures other text: on SmolLM2 a
    batch_pressure unit's 20-token budget became a 21-token prompt, and 21 built another
    prompt). With the profile's plan, live runs the unit's own requests and primers."""
    import dataclasses

    from modeswitch.dataset.errors import InputError
    from modeswitch.dataset.workloads.conditions import ConditionDraw
    from modeswitch.engine.backends import registry
    from modeswitch.engine.profiler import ProfileSpec
    from modeswitch.engine.profiler.plan import check_plan, profiled_units
    from modeswitch.oracle.training_table import profiled_requests
    from modeswitch.routers.scoring import live as live_mod
    from tests.helpers import profile, row

    def prepare(r):  # as the real builder: the template adds tokens, the text follows the budget
        return dataclasses.replace(r, prompt_tokens=r.prompt_tokens + 1), [hash((r.id, r.prompt_tokens))]

    builder = SimpleNamespace(prepare=prepare)
    monkeypatch.setattr(live_mod.prompts, "PromptBuilder", lambda tok: builder)
    draw = ConditionDraw(concurrency=(1, 4), concurrency_weights=(0.5, 0.5), shared_prefix_rate=0.5)
    spec = ProfileSpec(model="m", workloads=["batch_pressure", "long_prompt_short_output"], requests=4,
                       conditions=draw.to_dict(), length_scale=0.25)
    units = profiled_units(dataclasses.asdict(spec))
    assert len(units) == 8 and profiled_units(None) == {}
    # the rows a profile of these units holds: each unit's prepared shape, group-averaged
    rows = []
    for uid, (members, _) in units.items():
        prepared = [prepare(r)[0] for r in members]
        r0 = prepared[0]
        rows.append(row(uid, "fp16_baseline", 1.0, request_id=uid, family=r0.family,
                        prompt_tokens=sum(p.prompt_tokens for p in prepared) / len(prepared),
                        expected_output_tokens=r0.expected_output_tokens,
                        shared_prefix_tokens=r0.shared_prefix_tokens, concurrent_requests=len(prepared),
                        memory_pressure=r0.memory_pressure))
    from_rows = {r.id: r for r in profiled_requests(profile(rows))}
    stream = [from_rows[u] for u in units]
    profiled = [[prepare(r)[1] for r in members] for members, _ in units.values()]

    def timed_groups(**kw):
        seen = []

        class Logged(_Engine):
            def run(self, group, ignore_eos=True):
                seen.append([ids for _, ids in group])
                return super().run(group, ignore_eos)

        be = SimpleNamespace(plan=lambda s, modes: (modes, [], {}), load=lambda m, s: Logged(m, []),
                             child_processes=False)
        monkeypatch.setattr(registry, "get_backend", lambda name: be)
        monkeypatch.setattr(live_mod, "_trial_clock", lambda children: lambda: _Clock(1.0))
        live_mod.run_live(stream, {"x": ["fp16_baseline"] * len(stream)}, "model", reference="fp16_baseline",
                          trials=1, **kw)
        primers = [[prepare(p)[1] for p in ps] for _, ps in units.values()] + \
                  [[prepare(p)[1]] for r in stream for p in [live_mod.primer(r)] if p]
        return [ids for ids in seen if ids not in primers]

    assert timed_groups(replay=units) == profiled
    assert timed_groups() != profiled  # rebuilt from the rows: other prompts
    leads = {k: members[0] for k, (members, _) in units.items()}
    check_plan(stream, leads, "live")
    other = dataclasses.replace(stream[0], concurrent_requests=stream[0].concurrent_requests + 1)
    with pytest.raises(InputError, match="another profile"):
        check_plan([other], leads, "live")


def test_the_plan_is_read_from_a_profilers_journal_and_a_bad_one_is_named(tmp_path):
    from modeswitch.dataset.errors import InputFileError
    from modeswitch.engine.profiler.journal import recorded_plan

    good = tmp_path / "p.parquet.journal.jsonl"
    good.write_text('{"identity": "i", "run_id": "r", "spec": {"model": "m", "requests": 4}}\n{"row": 1}\n')
    assert recorded_plan(good) == {"model": "m", "requests": 4}
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n")
    with pytest.raises(InputFileError, match="bad.jsonl.*line 1"):
        recorded_plan(bad)
    other = tmp_path / "other.jsonl"
    other.write_text('{"rows": []}\n')
    with pytest.raises(InputFileError, match="spec"):
        recorded_plan(other)

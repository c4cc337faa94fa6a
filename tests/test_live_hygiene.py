"""Live scoring measures as the profiler does: the profile's threads, every trial's CPU
share and the machine's other load, contended trials measured again, medians of clean ones."""

from __future__ import annotations

import time
from dataclasses import dataclass
from types import SimpleNamespace

import pytest

from dataset.requests import Request


@dataclass
class _Gen:
    text: str
    output_tokens: int
    latency_ms: float
    ttft_ms: float


class _Engine:
    """Spins the CPU for 30 ms per run (a clean trial: CPU share about 1), except on the
    runs listed in ``idle``, where it sleeps instead (share about 0: another process had
    the core), as a contended trial looks to the CPU clock."""

    tokenizer = None

    def __init__(self, mode, calls, idle):
        self.mode, self.calls, self.idle = mode, calls, idle

    def run(self, group, ignore_eos=True):
        n = sum(1 for c in self.calls if c == self.mode)
        self.calls.append(self.mode)
        t0 = time.perf_counter()
        if n in self.idle.get(self.mode, ()):
            time.sleep(0.03)
        else:
            while time.perf_counter() - t0 < 0.03:
                pass
        ms = (time.perf_counter() - t0) * 1e3
        return [_Gen("same words", 4, ms, ms / 2) for _ in group]

    def close(self):
        pass


def _backend(idle, seen):
    calls: list[str] = []

    def load(mode, settings):
        seen.append(settings)
        return _Engine(mode, calls, idle)

    return SimpleNamespace(plan=lambda s, modes: (modes, [], {}), load=load, child_processes=False,
                           set_threads=None), calls


@pytest.fixture
def live(monkeypatch):
    from engine import prompts
    from engine.backends import registry

    monkeypatch.setattr(prompts, "PromptBuilder", lambda tok: SimpleNamespace(prepare=lambda r: r))

    def run(idle, **kw):
        from routers.scoring.live import run_live

        seen = []
        be, calls = _backend(idle, seen)
        monkeypatch.setattr(registry, "get_backend", lambda name: be)
        stream = [Request(id="r1", prompt_tokens=8, expected_output_tokens=4, family="a")]
        runs = run_live(stream, {"x": ["fast"]}, "model", trials=3, **kw)
        return runs, calls, seen
    return run


def test_the_profile_threads_reach_the_engines(live):
    _, _, seen = live({}, threads=1)
    assert {s.threads for s in seen} == {1}


def test_a_contended_trial_is_measured_again_and_left_out_of_the_median(live):
    from routers.scoring.live import _collapse

    # the second of fast's three runs sleeps: flagged, run again (its 4th run spins)
    runs, calls, _ = live({"fast": {1}}, threads=1)
    fast = runs[runs["mode"] == "fast"].sort_values(["trial", "attempt"])
    assert calls.count("fast") == 4 and calls.count("fp16_baseline") == 3
    assert fast[["trial", "attempt"]].values.tolist() == [[0, 0], [1, 0], [1, 1], [2, 0]]
    assert fast["contended"].tolist() == [False, True, False, False]
    assert fast.loc[fast["contended"], "cpu_share"].iloc[0] < 0.5 <= fast.loc[~fast["contended"], "cpu_share"].min()
    assert {"other_load", "cpu_share", "contended", "attempt"} <= set(runs.columns)
    med, per_trial = _collapse(runs)
    assert med.loc[("r1", "fast"), "trials"] == 3  # three trials, each by its clean attempt
    assert len(per_trial[("r1", "fast")]) == 3


def test_a_trial_that_stays_contended_keeps_its_flag_and_stops(live):
    runs, calls, _ = live({"fast": {0, 3, 4}}, threads=1, max_remeasure=2)
    first = runs[(runs["mode"] == "fast") & (runs["trial"] == 0)]
    assert first["attempt"].tolist() == [0, 1, 2] and first["contended"].all()
    assert calls.count("fast") == 5


def test_live_threads_default_to_the_profile_then_one_on_cpu():
    from routers.scoring.run import ScoreConfig, live_threads

    assert live_threads(ScoreConfig(), {"threads": [2]}) == 2
    assert live_threads(ScoreConfig(), {}) == 1
    assert live_threads(ScoreConfig(), {"threads": [1, 2]}) == 1  # mixed: the safe choice
    assert live_threads(ScoreConfig(device="cuda"), {}) is None
    assert live_threads(ScoreConfig(live_threads=3), {"threads": [1]}) == 3


def test_the_training_table_records_the_profile_threads():
    from dataset.workloads import get_workload
    from oracle.training_table import build_training_table, table_meta
    from tests.helpers import synthetic_profile

    reqs = get_workload("short_prompt_short_output").sample(10, seed=0)
    profile = synthetic_profile()
    assert table_meta(build_training_table(profile.drop(columns=["threads"], errors="ignore"), reqs))["threads"] == []
    profile["threads"] = 1
    assert table_meta(build_training_table(profile, reqs))["threads"] == [1]

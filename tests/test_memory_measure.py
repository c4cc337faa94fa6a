"""Peak memory on CPU is the request's own: what the engine holds plus the pages the
request touches, whatever ran before it (engine.memory; measured on the real model,
the old method put continuous batching at 1.00-1.03x the reference's memory)."""

import pytest
import torch

from modeswitch.dataset.requests import Request
from modeswitch.engine.backends.transformers_backend import TransformersEngine
from modeswitch.engine.memory import PeakRSS, _malloc_trim, held_bytes, release_freed_memory

CHUNK = 64 * 1024  # below glibc's mmap threshold: served from the heap, kept there when freed


def _growth(touch_mb: int, release: bool) -> float:
    """RSS growth of a window that touches ``touch_mb`` of fresh heap chunks."""
    if release:
        release_freed_memory()
    with PeakRSS(interval_s=0.001) as s:
        held = [bytearray(CHUNK) for _ in range(touch_mb * 2**20 // CHUNK)]
    del held
    return s.peak_growth_mb


@pytest.mark.skipif(_malloc_trim() is None, reason="the C library has no malloc_trim (not glibc)")
def test_a_windows_growth_counts_its_own_pages_once_freed_memory_is_released():
    # 200 MB of heap chunks freed below a live one: glibc keeps their pages resident
    freed = [bytearray(CHUNK) for _ in range(200 * 2**20 // CHUNK)]
    pin = bytearray(CHUNK)
    del freed
    # the old method: the window reuses those resident pages and seems to take nothing
    assert _growth(120, release=False) < 40
    freed = [bytearray(CHUNK) for _ in range(200 * 2**20 // CHUNK)]
    pin2 = bytearray(CHUNK)
    del freed
    # released first, the same window counts what it touched
    assert _growth(120, release=True) > 100
    del pin, pin2


class _Store:
    __slots__ = ("entries",)

    def __init__(self, entries):
        self.entries = entries


_GLOBAL = torch.zeros(1_000_000)  # reachable only through a module: not the engine's


def test_held_bytes_counts_every_reachable_tensor_once_and_stops_at_modules_and_types():
    lin = torch.nn.Linear(10, 10)  # 110 float32 parameters
    shared = torch.zeros(100)

    class Engine:
        def __init__(self):
            self.model = lin
            self.cache = {"k": [shared, shared[10:]], ("x", 1): (torch.ones(50, dtype=torch.float64),)}
            self.store = _Store([torch.zeros(25, dtype=torch.int8)])
            self.kind = Engine  # a type: not entered
            self.mod = pytest  # a module: not entered
            self.glob = lambda: _GLOBAL  # a function: not entered

    got = held_bytes(Engine())
    assert got == 110 * 4 + 100 * 4 + 50 * 8 + 25
    assert held_bytes(None) == 0


def test_continuous_batching_holds_its_paged_cache_beside_the_weights(tiny_models):
    ref = TransformersEngine("fp16_baseline", tiny_models.target, tiny_models.draft, max_context=512).load()
    cb = TransformersEngine("continuous_batching", tiny_models.target, tiny_models.draft, max_context=512).load()
    try:
        assert ref.held_mb == pytest.approx(ref.weights_mb, rel=1e-6)  # a reference holds its weights
        cfg = cb._cb_config()
        ids = list(range(5, 45))
        cb.run([(Request("a", 40, 4), ids)])  # the manager's cache is built by the first request
        conf = cb.model.config
        kv = 2 * conf.num_hidden_layers * conf.num_key_value_heads * (conf.hidden_size // conf.num_attention_heads)
        paged = cfg.num_blocks * cfg.page_size * kv * 4 / 2**20
        assert cb.held_mb >= cb.weights_mb + 0.9 * paged
        assert cb.held_mb > 1.5 * ref.held_mb
    finally:
        ref.close()
        cb.close()


# ---------------------------------------------- an old profile's memory measured again
def _rows(source: str, memory: float, device="cpu"):
    from tests.helpers import row

    return [row(f"r{i}", m, 100.0, memory=memory + (50 if m == "continuous_batching" else 0),
                request_id=f"r{i}", device=device, source=source, trial=t)
            for i in range(2) for m in ("fp16_baseline", "continuous_batching") for t in (0, 1)]


def test_an_old_profiles_memory_is_replaced_by_the_pass_and_the_rows_say_so(tmp_path):
    from modeswitch.dataset.errors import InputFileError
    from modeswitch.dataset.profile_memory import MEMORY_NOTE, needs_remeasure, with_memory_from
    from tests.helpers import profile

    energy = "energy: process CPU seconds x 4 W per busy core (estimate)"
    old = profile(_rows(energy, 500.0))
    assert needs_remeasure(old).all()
    # rows measured since, and GPU or imported rows, are fine as they are
    assert not needs_remeasure(profile(_rows(f"{energy}; {MEMORY_NOTE}", 500.0))).any()
    assert not needs_remeasure(profile(_rows("energy: NVML counter", 500.0, device="cuda:0"))).any()
    assert not needs_remeasure(profile(_rows("published", 500.0))).any()
    fresh = profile(_rows(f"{energy}; {MEMORY_NOTE}", 520.0))
    fresh.loc[fresh["mode"] == "continuous_batching", "peak_memory_mb"] = [1900.0, 1910.0, 1900.0, 1900.0]
    got = with_memory_from(old, fresh, tmp_path / "memory_pass.parquet")
    cb = got[got["mode"] == "continuous_batching"].set_index("request_id")["peak_memory_mb"]
    assert cb.loc["r0"].tolist() == [1905.0, 1905.0] and cb.loc["r1"].tolist() == [1900.0, 1900.0]  # medians
    assert (got.loc[got["mode"] == "fp16_baseline", "peak_memory_mb"] == 520.0).all()
    assert got["source"].str.contains("memory re-measured apart (memory_pass.parquet)", regex=False).all()
    assert not needs_remeasure(got).any() and got["latency_ms"].equals(old["latency_ms"])  # timings kept
    # a pass that misses a row is refused, naming it, rather than mixing the two methods
    with pytest.raises(InputFileError, match=r"memory_pass.parquet.*\('r1', 'continuous_batching'\).*2 of 8"):
        with_memory_from(old, fresh[~((fresh["request_id"] == "r1") & (fresh["mode"] == "continuous_batching"))],
                         tmp_path / "memory_pass.parquet")


@pytest.mark.slow
def test_the_study_measures_an_old_profiles_memory_again_and_reads_it_from_then_on(tiny_models, tmp_path):
    """The memory step: nothing for a profile measured with the current method; for an
    old one, a pass over the same requests, after which the study's profile carries it."""
    from modeswitch.dataset.io import write_parquet
    from modeswitch.dataset.profile_memory import MEMORY_NOTE, needs_remeasure
    from modeswitch.dataset.profile_schema import read_profile
    from modeswitch.study import Study, StudyConfig
    from modeswitch.study.steps import run_step

    cfg = StudyConfig(output=str(tmp_path / "m"), model=str(tiny_models.target), draft_model=str(tiny_models.draft),
                      families=("short_prompt_short_output",), modes=("fp16_baseline", "continuous_batching"),
                      requests_per_family=2, trials=2, length_scale=0.25, threads=1, drawn_requests=0)
    said = []
    study = Study(cfg, log=said.append)
    assert study.steps()[:4] == ["model", "profile", "memory", "costmodel"]
    assert study.needs("quality") == ["model"]  # the sweep reads no measurement
    run_step(study, "profile")
    path = tmp_path / "m" / "profile.parquet"
    assert run_step(study, "memory")["memory"] is None  # measured with the current method
    # the same profile as an older version wrote it: the old method's figures, no note
    prof = read_profile(path)
    prof["source"] = prof["source"].str.replace(f"; {MEMORY_NOTE}", "", regex=False)
    prof["peak_memory_mb"] = 1.0  # a figure no engine here holds: the pass must replace every row
    write_parquet(prof, path, overwrite=True)
    got = run_step(study, "memory")
    assert got["replaced"] == len(prof)
    passed = read_profile(got["memory"])  # one trial of every (request, mode), not re-measured
    assert (passed["trial"] == 0).all() and (passed["attempt"].fillna(0) == 0).all()
    assert set(zip(passed["request_id"], passed["mode"])) == set(zip(prof["request_id"], prof["mode"]))
    assert "continuous_batching" in got["median_ratio"] and got["median_ratio"]["continuous_batching"] > 1.5
    merged = study._profile()
    assert not needs_remeasure(merged).any() and (merged["peak_memory_mb"] > 1.0).all()
    assert merged["latency_ms"].equals(prof["latency_ms"])
    assert any("measured memory the old way" in line for line in said)

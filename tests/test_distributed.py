"""Profiling over Ray (``profile --ray``): the same rows as a serial run, resumable,
and a worker killed mid-run costs no row and repeats none. A real local Ray
instance with 2 CPUs, the tiny test model."""

import json

import pytest

from modeswitch.dataset.profile_schema import read_profile
from modeswitch.engine.profiler import Profiler, ProfileSpec

ray = pytest.importorskip("ray", reason="Ray is the `distributed` extra (make test installs it)")

MODES = ["fp16_baseline", "int8_quant"]
FAMILIES = ["short_prompt_short_output", "shared_prefix_chat"]


def spec(tiny_models):
    return ProfileSpec(model=str(tiny_models.target), draft_model=str(tiny_models.draft), modes=MODES,
                       workloads=FAMILIES, requests=2, trials=1, threads=1, max_remeasure=0)


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def serial(tiny_models, tmp_path_factory):
    out = tmp_path_factory.mktemp("serial") / "p.parquet"
    return Profiler(spec(tiny_models), tiny_models.target, tiny_models.draft, out).run()


def ray_run(tiny_models, out, on_row=None):
    from modeswitch.engine.distributed import RayProfiler

    p = RayProfiler(spec(tiny_models), tiny_models.target, tiny_models.draft, out, on_row=on_row,
                    cpus_per_worker=1)
    return p, p.run()


def keys(df):
    return sorted(zip(df["request_id"], df["mode"], df["trial"], df["attempt"]))


def journal_rows(out):
    lines = out.with_name(out.name + ".journal.jsonl").read_text().splitlines()[1:]
    return [r for r in map(json.loads, lines) if "kind" not in r]


@pytest.mark.slow
def test_ray_profiles_the_serial_runs_rows_with_workers_recorded(local_ray, tiny_models, tmp_path, serial):
    out = tmp_path / "p.parquet"
    p, df = ray_run(tiny_models, out)
    back = read_profile(out)  # schema-valid
    assert len(back) == 2 * 2 * 2
    assert keys(back) == keys(serial)
    assert back["worker"].str.startswith("ray:").all() and set(back["device"]) == {"cpu"}
    assert back["worker"].nunique() == 2  # both actors measured
    assert set(serial["worker"].str.split(":").str[0]) == {serial["worker"].iloc[0].split(":")[0]}
    assert (back["threads"] == 1).all()
    # ROUGE-L against the reference's output, scored on the driver as a serial run does
    ref = back[back["mode"] == "fp16_baseline"]
    assert (ref["rouge_l_vs_baseline"] == 1.0).all()
    assert back["rouge_l_vs_baseline"].notna().all()


@pytest.mark.slow
def test_a_killed_worker_costs_no_row_and_repeats_none(local_ray, tiny_models, tmp_path, serial):
    out = tmp_path / "p.parquet"
    state = {"n": 0}
    holder = {}

    def kill_one(row):
        state["n"] += 1
        if state["n"] == 2:  # the other actor is mid-cell or about to be
            for a in holder["p"].actors_:
                if a.busy:
                    ray.kill(a.handle, no_restart=True)
                    state["killed"] = a.name
                    break

    from modeswitch.engine.distributed import RayProfiler

    p = RayProfiler(spec(tiny_models), tiny_models.target, tiny_models.draft, out, on_row=kill_one,
                    cpus_per_worker=1)
    holder["p"] = p
    df = p.run()
    assert "killed" in state and p.replaced_ >= 1
    assert keys(df) == keys(serial)
    rows = journal_rows(out)
    assert len(rows) == len({(r["request_id"], r["mode"], r["trial"], r["attempt"]) for r in rows}) == 8
    assert df["worker"].nunique() >= 2


@pytest.mark.slow
def test_an_interrupted_ray_run_resumes_without_losing_or_repeating_rows(local_ray, tiny_models, tmp_path, serial):
    out = tmp_path / "p.parquet"
    seen = []

    def stop_after_three(row):
        seen.append(row)
        if len(seen) == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        ray_run(tiny_models, out, on_row=stop_after_three)
    assert not out.exists() and len(journal_rows(out)) == 3
    again = []
    _, df = ray_run(tiny_models, out, on_row=again.append)
    assert len(again) == 8 - 3
    assert keys(df) == keys(serial)
    first = {(r["request_id"], r["mode"]): r["latency_ms"] for r in seen}
    for (rid, mode), lat in first.items():  # the rows before the interrupt kept as they were
        assert df[(df["request_id"] == rid) & (df["mode"] == mode)]["latency_ms"].item() == lat
    # a serial rerun of the same settings finds nothing left to do
    none = []
    Profiler(spec(tiny_models), tiny_models.target, tiny_models.draft, out, on_row=none.append).run()
    assert none == []

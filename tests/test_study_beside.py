"""The study's side-by-side of two backends on the same requests, and its capture
section at a violation budget."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pandas as pd
import pytest

from modeswitch.dataset.errors import InputFileError
from modeswitch.engine.profiler.plan import ProfileSpec, build_units
from modeswitch.oracle import Constraints
from modeswitch.study.beside import (
    beside_spec,
    other_settings,
    same_backend_elsewhere,
    same_requests,
    side_by_side,
    side_by_side_section,
)
from modeswitch.study.capture_section import BUDGET, capture_section, split_capture

ARCHIVE = Path(__file__).resolve().parents[1] / "studies" / "cpu-smollm2-avx2"


@pytest.fixture(scope="module")
def archived() -> pd.DataFrame:
    return pd.read_parquet(ARCHIVE / "profile.parquet")


def test_the_beside_spec_draws_the_archived_requests(archived):
    """This study's spec (12 per family, another backend) on the archive's settings
    draws exactly the requests the archive measured."""
    spec = ProfileSpec(model="m", backend="llamacpp", requests=12, trials=1, threads=1, seed=0,
                       length_scale=0.25, conditions={})
    units = build_units(beside_spec(spec, other_settings(ARCHIVE)))
    drawn = {u.requests[0].id: u.requests[0] for u in units}
    shapes = archived.drop_duplicates("request_id").set_index("request_id")
    assert set(drawn) == set(shapes.index)
    for rid, r in drawn.items():
        row = shapes.loc[rid]
        assert (r.expected_output_tokens, r.concurrent_requests, r.memory_pressure) == \
            (row["expected_output_tokens"], row["concurrent_requests"], row["memory_pressure"])


def test_the_beside_spec_keeps_the_archived_requests_this_study_could_draw(archived):
    """A study whose arrival groups stop at 4 measures the archive's requests with
    groups of at most 4, under the ids the archive gave them; a plan without the cap
    keeps the identity it had before the cap existed."""
    ours = {"concurrency": [1, 2, 4], "concurrency_weights": [0.6, 0.2, 0.2]}
    spec = ProfileSpec(model="m", backend="llamacpp", requests=12, trials=1, threads=1, seed=0,
                       length_scale=0.25, conditions=ours)
    capped = beside_spec(spec, other_settings(ARCHIVE))
    assert capped.max_concurrency == 4
    kept = {u.requests[0].id: len(u.requests) for u in build_units(capped)}
    shapes = archived.drop_duplicates("request_id").set_index("request_id")["concurrent_requests"]
    assert kept == {rid: int(n) for rid, n in shapes.items() if n <= 4}
    assert 0 < len(kept) < len(shapes)
    uncapped = beside_spec(dataclasses.replace(spec, conditions={}), other_settings(ARCHIVE))
    assert uncapped.max_concurrency is None
    assert uncapped.identity() == dataclasses.replace(uncapped, max_concurrency=None).identity() \
        != dataclasses.replace(uncapped, max_concurrency=16).identity()


def test_a_folder_without_settings_is_refused_by_name(tmp_path):
    with pytest.raises(InputFileError, match=str(tmp_path)):
        other_settings(tmp_path)


def _other_backend(archived: pd.DataFrame, faster: str, by: float) -> pd.DataFrame:
    this = archived.copy()
    this["backend"] = "llamacpp"
    this.loc[this["mode"] == faster, "latency_ms"] *= by
    return this


def test_side_by_side_sets_each_backends_ratio_on_shared_requests(archived):
    this = _other_backend(archived, "int8_quant", 0.25)
    table, n = side_by_side(this, archived, Constraints())
    assert n == archived["request_id"].nunique()
    row = table.set_index("mode").loc["int8_quant"]
    assert row["latency ratio (llamacpp)"] == pytest.approx(row["latency ratio (transformers)"] * 0.25, rel=0.2)
    ref = table.set_index("mode").loc["fp16_baseline"]
    assert ref["latency ratio (llamacpp)"] == pytest.approx(1.0)


def test_requests_of_another_shape_are_left_out(archived):
    this = archived.copy()
    first = this["request_id"].iloc[0]
    this.loc[this["request_id"] == first, "expected_output_tokens"] += 7
    this.loc[this["request_id"] == this["request_id"].iloc[-1], "prompt_tokens"] += 1  # within the slack
    ids = same_requests(this, archived)
    assert first not in ids and len(ids) == archived["request_id"].nunique() - 1


def test_the_section_writes_its_table_and_names_both_machines(archived, tmp_path):
    this = _other_backend(archived, "gptq_4bit", 0.5)
    md = "\n".join(side_by_side_section(this, ARCHIVE, Constraints(), tmp_path))
    assert "latency ratio (llamacpp)" in md and "latency ratio (transformers)" in md
    assert "isa avx2" in md
    assert len(pd.read_csv(tmp_path / "side_by_side.csv")) == archived["mode"].nunique()


def _split_report(folder: Path, rows: list[tuple], by_family: list[tuple], frontier: list[tuple]) -> Path:
    folder.mkdir(parents=True)
    pd.DataFrame(rows, columns=["router", "request_id", "family", "reference_latency_ms", "oracle_latency_ms",
                                "latency_ms", "violates_any"]).to_csv(folder / "per_request.csv", index=False)
    pd.DataFrame(by_family, columns=["router", "family", "met"]).to_csv(folder / "risk_control_by_family.csv",
                                                                      index=False)
    pd.DataFrame(frontier, columns=["capture", "violations"]).to_csv(folder / "frontier.csv", index=False)
    return folder


def test_capture_at_the_budget_is_judged_per_router_and_family(tmp_path):
    rows = []
    for i in range(100):
        fam = "a" if i % 2 else "b"
        rows += [("oracle", f"r{i}", fam, 100.0, 40.0, 40.0, False),
                 ("reference", f"r{i}", fam, 100.0, 40.0, 100.0, False),
                 ("good", f"r{i}", fam, 100.0, 40.0, 50.0, i == 0),  # keeps 50/60, 1 % violations
                 ("shy", f"r{i}", fam, 100.0, 40.0, 85.0, False)]   # keeps 15/60
    report = _split_report(tmp_path / "group", rows,
                           [("good", "a", True), ("good", "b", True), ("shy", "a", True), ("shy", "b", True)],
                           [(0.9, 0.0), (0.97, BUDGET), (1.0, 0.05)])
    table, oracle = split_capture(report)
    t = table.set_index("router")
    assert oracle["saving"] == pytest.approx(0.6) and oracle["ceiling"] == pytest.approx(0.97)
    assert t.loc["good", "capture"] == pytest.approx(50 / 60) and t.loc["good", "goal"] == "met"
    assert t.loc["shy", "goal"] == "not met" and t.loc["shy", "families_met"] == "2/2"
    md = "\n".join(capture_section({"group": report, "random": report}))
    assert "### group" in md and "### random" not in md and "goal met by good" in md


def test_without_a_router_meeting_the_goal_the_ceiling_is_shown(tmp_path):
    rows = [(r, f"r{i}", "a", 100.0, 40.0, lat, False)
            for i in range(10) for r, lat in (("oracle", 40.0), ("shy", 90.0))]
    report = _split_report(tmp_path / "lofo", rows, [("shy", "a", False)], [(0.5, 0.01), (0.8, 0.1)])
    md = "\n".join(capture_section({"lofo": report}))
    assert "goal not met by any certified router; measured ceiling at <= 2%: 50.0%" in md


def test_two_kinds_of_machine_are_said_to_differ(archived, tmp_path):
    this = _other_backend(archived, "gptq_4bit", 0.5)
    this["hardware"] = "Intel Xeon (2 cores; isa avx2, avx512f)"
    md = "\n".join(side_by_side_section(this, ARCHIVE, Constraints(), tmp_path))
    assert "different kinds of machine" in md


def test_the_beside_step_runs_only_beside_another_backends_study(tmp_path):
    """--beside with the same model's study on another backend adds the step (reading
    the model and the profile) before the report; beside a study of this backend, or a
    folder without a profile, it does not."""
    from modeswitch.study import Study
    from modeswitch.study.config import StudyConfig

    cfg = StudyConfig(output=str(tmp_path / "s"), backend="llamacpp", splits=("group",))
    study = Study(cfg, log=lambda m: None, beside=ARCHIVE)
    assert study.steps()[-2:] == ["beside", "report"]
    assert study.needs("beside") == ["model", "profile"] and "beside" in study.needs("report")
    for other in (Study(cfg.replace(backend="transformers"), log=lambda m: None, beside=ARCHIVE),
                  Study(cfg, log=lambda m: None, beside=tmp_path)):
        assert "beside" not in other.steps()


def test_the_beside_spec_keeps_the_modes_both_measure():
    spec = ProfileSpec(model="m", backend="llamacpp", modes=["fp16_baseline", "int8_quant", "awq_4bit"])
    assert beside_spec(spec, {}, ["int8_quant", "fp16_baseline", "int8_weight_only"]).modes == \
        ["fp16_baseline", "int8_quant"]
    assert beside_spec(ProfileSpec(model="m"), {}, ["b", "a"]).modes == ["a", "b"]


def test_the_same_backend_on_another_machine_says_whether_each_direction_agrees(archived, tmp_path):
    """An archive of this backend and design from another kind of machine is set beside
    as it is: both machines' columns, and per mode whether it is faster on both."""
    from modeswitch.study.config import StudyConfig

    here = archived.copy()
    here["hardware"] = "Intel Xeon (2 cores; isa avx2, avx512f)"
    ref = here["mode"] == "fp16_baseline"
    slower = here["mode"] == "gptq_4bit"
    # on this machine GPTQ takes twice the reference's (median) latency on every request
    ref_ms = here[ref].groupby("request_id")["latency_ms"].median()
    here.loc[slower, "latency_ms"] = 2 * here.loc[slower, "request_id"].map(ref_ms).to_numpy()
    assert same_backend_elsewhere(StudyConfig(model="smollm2", backend="transformers"), ARCHIVE)
    assert not same_backend_elsewhere(StudyConfig(model="smollm2", backend="llamacpp"), ARCHIVE)
    assert not same_backend_elsewhere(StudyConfig(model="tiny", backend="transformers"), ARCHIVE)

    table, n = side_by_side(here, archived, Constraints())
    t = table.set_index("mode")
    assert n == archived["request_id"].nunique()
    assert t.loc["gptq_4bit", "latency ratio (transformers, here)"] == pytest.approx(2.0)
    theirs = t.loc["gptq_4bit", "latency ratio (transformers, other machine)"]
    assert t.loc["gptq_4bit", "direction agrees"] == ("no" if theirs < 0.98 else "yes" if theirs > 1.02 else "-")
    assert t.loc["fp16_baseline", "direction agrees"] == "-"  # the reference: a ratio of 1
    md = "\n".join(side_by_side_section(here, ARCHIVE, Constraints(), tmp_path))
    assert "direction agrees" in md and "different kinds of machine" in md
    # one kind of machine: no direction column
    same_kind, _ = side_by_side(archived.copy(), archived, Constraints())
    assert "direction agrees" not in same_kind

"""A study's measurements archived apart from its folder and seeded into another (study.archive)."""

import json

import pytest

from modeswitch.dataset.errors import InputError
from modeswitch.study import Study, StudyConfig


def _measured_study(tmp_path):
    """A study folder whose measuring steps have finished (their files stand in for
    measurements: only copying is tested here)."""
    cfg = StudyConfig(output=str(tmp_path / "a"), swept_per_family=2, drawn_requests=14)
    study = Study(cfg, log=lambda *_: None)
    study.out.mkdir(parents=True)
    for name, text in [("profile.parquet", "P"), ("costmodel.json", "{}"), ("quality_sweep.parquet", "Q"),
                       ("quality_sweep_throughput.csv", "mode,requests_per_s\n"), ("memory_pass.parquet", "M")]:
        (study.out / name).write_text(text)
    study.state["steps"] = {
        "model": {"seconds": 1.0, "finished": "t0", "outputs": {"target": "/models/x"}},
        "profile": {"seconds": 3600.0, "finished": "t1", "outputs": {"profile": str(study.out / "profile.parquet"),
                                                                      "rows": 784}},
        "costmodel": {"seconds": 20.0, "finished": "t2", "outputs": {"costmodel": str(study.out / "costmodel.json")}},
        "quality": {"seconds": 3000.0, "finished": "t3",
                    "outputs": {"sweep": str(study.out / "quality_sweep.parquet"), "requests": 14}},
        "memory": {"seconds": 1800.0, "finished": "t4", "outputs": {"memory": str(study.out / "memory_pass.parquet")}},
    }
    return cfg, study


def test_a_study_with_other_training_settings_starts_from_the_archived_measurements(tmp_path):
    cfg, study = _measured_study(tmp_path)
    manifest = study.archive_to(tmp_path / "archive")
    assert sorted(manifest["steps"]) == ["costmodel", "memory", "profile", "quality"]
    assert (tmp_path / "archive" / "profile.parquet").read_text() == "P"
    other = Study(cfg.replace(output=str(tmp_path / "b"), tuning_trials=3, feature_set="C"), log=lambda *_: None)
    assert other.seed_from(tmp_path / "archive") == ["profile", "costmodel", "quality", "memory"]
    assert (other.out / "quality_sweep.parquet").read_text() == "Q"
    assert other.outputs("memory") == {"memory": str(other.out / "memory_pass.parquet")}
    rec = other.state["steps"]["profile"]
    assert rec["outputs"] == {"profile": str(other.out / "profile.parquet"), "rows": 784}
    assert rec["copied_from"] == str(tmp_path / "archive") and rec["seconds"] == 3600.0
    saved = json.loads((other.out / "study_state.json").read_text())
    assert set(saved["steps"]) == {"profile", "costmodel", "quality", "memory"} and not other.done("model")
    assert other.seed_from(tmp_path / "archive") == []  # taken once; a rerun leaves the steps as they are


def test_measurements_taken_with_other_settings_are_refused_and_nothing_is_written_over(tmp_path):
    cfg, study = _measured_study(tmp_path)
    study.archive_to(tmp_path / "archive")
    with pytest.raises(InputError, match="exists already"):
        study.archive_to(tmp_path / "archive")
    bigger = Study(cfg.replace(output=str(tmp_path / "c"), requests_per_family=8), log=lambda *_: None)
    with pytest.raises(InputError, match="profile step was measured with other settings"):
        bigger.seed_from(tmp_path / "archive")
    resampled = Study(cfg.replace(output=str(tmp_path / "d"), swept_per_family=3), log=lambda *_: None)
    with pytest.raises(InputError, match="quality step was measured with other settings"):
        resampled.seed_from(tmp_path / "archive")
    unswept = Study(cfg.replace(output=str(tmp_path / "e"), swept_per_family=0), log=lambda *_: None)
    assert unswept.seed_from(tmp_path / "archive") == ["profile", "costmodel", "memory"]
    # more passes than the archive's one: its measurements are taken, the sweep is the study's own
    said = []
    twice = Study(cfg.replace(output=str(tmp_path / "g"), sweep_repeats=2), log=said.append)
    assert twice.seed_from(tmp_path / "archive") == ["profile", "costmodel", "memory"]
    assert not (twice.out / "quality_sweep.parquet").exists() and any("sweeps its own" in m for m in said)
    (tmp_path / "f").mkdir()
    (tmp_path / "f" / "profile.parquet").write_text("mine")
    with pytest.raises(InputError, match="exists already"):
        Study(cfg.replace(output=str(tmp_path / "f")), log=lambda *_: None).seed_from(tmp_path / "archive")
    assert (tmp_path / "f" / "profile.parquet").read_text() == "mine"
    with pytest.raises(InputError, match="not a study archive"):
        study.seed_from(tmp_path)


def test_an_archive_swept_with_other_passes_gives_its_other_steps(tmp_path):
    """Two passes archived, three (or one) asked: the table cannot be continued or cut
    without the sweep's journal, so the study sweeps its own and takes the rest."""
    cfg, study = _measured_study(tmp_path)
    two = Study(cfg.replace(sweep_repeats=2), log=lambda *_: None)
    two.state["steps"] = study.state["steps"]
    two.archive_to(tmp_path / "two")
    for k, out in ((3, "c"), (1, "d")):
        other = Study(cfg.replace(output=str(tmp_path / out), sweep_repeats=k), log=lambda *_: None)
        assert other.seed_from(tmp_path / "two") == ["profile", "costmodel", "memory"]
    same = Study(cfg.replace(output=str(tmp_path / "e"), sweep_repeats=2), log=lambda *_: None)
    assert "quality" in same.seed_from(tmp_path / "two")
    with pytest.raises(InputError, match="quality step was measured with other settings.*passes"):
        Study(cfg.replace(output=str(tmp_path / "f"), sweep_repeats=3, swept_per_family=3),
              log=lambda *_: None).seed_from(tmp_path / "two")


def test_a_study_that_measured_its_own_profile_takes_the_sweep_but_not_the_cost_model(tmp_path):
    """The archive's cost model was fitted on the archive's profile, and its memory pass
    measured that profile's requests again: neither goes beside another profile."""
    cfg, study = _measured_study(tmp_path)
    study.archive_to(tmp_path / "archive")
    own = Study(cfg.replace(output=str(tmp_path / "g")), log=lambda *_: None)
    own.state["steps"]["profile"] = {"seconds": 1.0, "finished": "t", "outputs": {}}
    assert own.seed_from(tmp_path / "archive") == ["quality"]
    running = Study(cfg.replace(output=str(tmp_path / "h")), log=lambda *_: None)
    running.out.mkdir()
    (running.out / "profile.parquet.journal.jsonl").write_text("{}\n")  # a profile under way here
    with pytest.raises(InputError, match="a run of profile began here"):
        running.seed_from(tmp_path / "archive")
    (tmp_path / "archive" / "costmodel.json").unlink()
    with pytest.raises(InputError, match="missing from the archive"):
        Study(cfg.replace(output=str(tmp_path / "i")), log=lambda *_: None).seed_from(tmp_path / "archive")
    assert not (tmp_path / "i").exists()


def test_a_profile_that_needed_no_memory_pass_archives_without_one(tmp_path):
    cfg, study = _measured_study(tmp_path)
    (study.out / "memory_pass.parquet").unlink()
    study.state["steps"]["memory"]["outputs"] = {"memory": None, "why": "the current method"}
    manifest = study.archive_to(tmp_path / "archive")
    assert manifest["steps"]["memory"]["files"] == []
    other = Study(cfg.replace(output=str(tmp_path / "b")), log=lambda *_: None)
    assert "memory" in other.seed_from(tmp_path / "archive") and other.outputs("memory")["memory"] is None


def test_a_profile_seeded_from_another_kind_of_machine_is_named(tmp_path):
    """Labels from a profile or sweep measured on another kind of CPU need not hold here
    (the fastest mode, and a lossy mode's output, depend on the kernels): seeding such a
    profile or sweep says so and how to measure it here; one measured on this kind says
    nothing."""
    import pandas as pd

    from modeswitch.engine.hardware import hardware_string

    cfg, study = _measured_study(tmp_path)
    said = []
    for name, line in (("elsewhere", "Some CPU (64 cores; L2 2048K; isa avx512f)"), ("here", hardware_string("cpu"))):
        pd.DataFrame({"hardware": [line]}).to_parquet(study.out / "profile.parquet")
        pd.DataFrame({"hardware": [line]}).to_parquet(study.out / "quality_sweep.parquet")
        study.archive_to(tmp_path / f"archive-{name}")
        said.clear()
        Study(cfg.replace(output=str(tmp_path / name)), log=said.append).seed_from(tmp_path / f"archive-{name}")
        warned = [s for s in said if "another kind of machine" in s]
        if name == "elsewhere":  # a lossy mode's output depends on the kernels too: the sweep is named
            assert len(warned) == 2 and all("Some CPU" in w for w in warned)
            assert "the profile" in warned[0] and "--redo profile" in warned[0]
            assert "the quality sweep" in warned[1] and "--redo quality" in warned[1]
        else:
            assert not warned


def test_a_sweep_of_arrival_groups_is_another_measurement_and_an_older_archive_still_matches():
    from modeswitch.study.archive import measured_with

    alone = StudyConfig(swept_per_family=2, drawn_requests=14)
    groups = alone.replace(sweep_arrival_groups=True)
    assert measured_with(groups, "quality") != measured_with(alone, "quality")
    assert measured_with(groups, "profile") == measured_with(alone, "profile")
    twice = groups.replace(sweep_repeats=2)  # a sweep with more passes is yet another
    assert measured_with(twice, "quality") != measured_with(groups, "quality")
    assert measured_with(groups.replace(sweep_repeats=1), "quality") == measured_with(groups, "quality")
    # off, the hash is the one archives were matched on before the option existed
    import hashlib

    from modeswitch.study.config import TABLES

    d = alone.to_dict()
    keys = ["seed", *TABLES["model"], *TABLES["profile"], "drawn_requests", "swept_per_family"]
    before = {**{k: d[k] for k in keys}, "conditions": alone.condition_draw().to_dict()}
    assert measured_with(alone, "quality") == hashlib.sha256(
        json.dumps(before, sort_keys=True, default=str).encode()).hexdigest()[:16]


def test_a_step_asked_for_again_is_not_taken_from_the_archive(tmp_path, monkeypatch):
    """`study run --from-archive A --redo costmodel`: the archive seeds first, the redo then
    forgets the step (and what reads it), so it runs again (before, the archive's copy
    came back after the redo and the step was skipped)."""
    from typer.testing import CliRunner

    from modeswitch.cli import app
    from modeswitch.cli import study as study_cli

    calls = []

    class Recorded(Study):
        def seed_from(self, src):
            calls.append(("seed", str(src)))
            return []

        def forget(self, step):
            calls.append(("forget", step))

        def run(self, only=None):
            calls.append(("run", only))
            return {}

    monkeypatch.setattr(study_cli, "Study", Recorded)
    config = tmp_path / "s.toml"
    config.write_text(f'[study]\noutput = "{tmp_path / "s"}"\n')
    res = CliRunner().invoke(app, ["study", "run", "--config", str(config), "--from-archive", str(tmp_path / "a"),
                                   "--redo", "costmodel", "--only", "costmodel"])
    assert res.exit_code == 0, res.output
    assert calls == [("seed", str(tmp_path / "a")), ("forget", "costmodel"), ("run", ["costmodel"])]

"""The profiler on the tiny test model: schema, quality columns, resume."""

import json

import pandas as pd
import pytest

from modeswitch.dataset.profile_schema import read_profile
from modeswitch.engine.profiler import Profiler, ProfileSpec

MODES = ["fp16_baseline", "int8_quant", "prefix_caching"]


def spec(tiny_models, **kw):
    base = dict(model=str(tiny_models.target), draft_model=str(tiny_models.draft), modes=MODES,
                workloads=["short_prompt_short_output", "shared_prefix_chat", "batch_pressure"],
                requests=1, trials=1, batch_size=3, threads=1, max_remeasure=0)
    base.update(kw)
    return ProfileSpec(**base)


def run(tiny_models, out, on_row=None, **kw):
    return Profiler(spec(tiny_models, **kw), tiny_models.target, tiny_models.draft, out,
                    on_row=on_row).run()


@pytest.fixture(scope="module")
def full(tiny_models, tmp_path_factory):
    out = tmp_path_factory.mktemp("prof") / "p.parquet"
    return out, run(tiny_models, out)


def test_profile_is_valid_and_complete(full):
    out, df = full
    back = read_profile(out)
    assert len(back) == len(df) == 3 * 3
    assert set(back["mode"]) == set(MODES)
    assert (back["backend"] == "transformers").all() and (back["reference_mode"] == "fp16_baseline").all()
    assert (back["energy_source"] == "estimate").all() and (back["energy_j"] > 0).all()
    assert (back["precision"] == "float32").all()
    assert back["ttft_ms"].notna().all() and (back["ttft_ms"] <= back["latency_ms"]).all()
    assert (back["peak_memory_mb"] > 0).all()
    ref = back[back["mode"] == "fp16_baseline"]
    assert (ref["rouge_l_vs_baseline"] == 1.0).all()
    # lossless prefix caching reproduces the reference output
    pc = back[back["mode"] == "prefix_caching"]
    assert (pc["rouge_l_vs_baseline"] == 1.0).all()
    batch = back[back["family"] == "batch_pressure"]
    assert (batch["concurrent_requests"] == 3).all()
    assert (batch["output_tokens"] > batch["expected_output_tokens"]).all()  # summed over the group


def test_interrupted_sweep_resumes_without_duplicates(tiny_models, tmp_path, full):
    out = tmp_path / "p.parquet"
    seen = []

    def stop_after_four(row):
        seen.append(row)
        if len(seen) == 4:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run(tiny_models, out, on_row=stop_after_four)
    assert not out.exists()
    journal = out.with_name(out.name + ".journal.jsonl")
    kept = [json.loads(x) for x in journal.read_text().splitlines()[1:]]
    kept = [r for r in kept if "kind" not in r]
    assert len(kept) == 4
    # a torn last line (crash mid-write) is dropped, not fatal
    with open(journal, "a") as fh:
        fh.write('{"request_id": "trunc')
    again = []
    df = run(tiny_models, out, on_row=again.append)
    assert len(again) == 9 - 4
    keys = list(zip(df["request_id"], df["mode"], df["trial"]))
    assert len(keys) == len(set(keys)) == 9
    assert set(keys) == set(zip(full[1]["request_id"], full[1]["mode"], full[1]["trial"]))
    # the rows measured before the interrupt are kept as they were
    first = {(r["request_id"], r["mode"]): r["latency_ms"] for r in kept}
    for (rid, mode), lat in first.items():
        assert df[(df["request_id"] == rid) & (df["mode"] == mode)]["latency_ms"].item() == lat
    # a complete run reruns nothing
    none = []
    run(tiny_models, out, on_row=none.append)
    assert none == []


def test_other_settings_cannot_reuse_a_journal(tiny_models, tmp_path):
    out = tmp_path / "p.parquet"
    with pytest.raises(KeyboardInterrupt):
        run(tiny_models, out, on_row=lambda r: (_ for _ in ()).throw(KeyboardInterrupt))
    with pytest.raises(ValueError, match="other settings"):
        run(tiny_models, out, seed=5)


def test_existing_finished_output_is_not_overwritten(tiny_models, tmp_path):
    out = tmp_path / "p.parquet"
    pd.DataFrame({"x": [1]}).to_parquet(out)
    with pytest.raises(FileExistsError):
        run(tiny_models, out)


def test_interleaved_sweep_measures_the_same_rows(tiny_models, tmp_path, full):
    seen = []
    df = run(tiny_models, tmp_path / "i.parquet", on_row=seen.append, interleave=True)
    keys = set(zip(df["request_id"], df["mode"], df["trial"]))
    assert keys == set(zip(full[1]["request_id"], full[1]["mode"], full[1]["trial"]))
    # each unit is measured in every mode before the next unit starts
    assert [r["mode"] for r in seen[:3]] == MODES


def test_unknown_backend_names_the_registered_ones_before_writing(tiny_models, tmp_path):
    from modeswitch.dataset.registry import UnknownNameError

    out = tmp_path / "p.parquet"
    with pytest.raises(UnknownNameError, match="unknown backend 'nope'; registered: .*transformers"):
        run(tiny_models, out, backend="nope")
    assert not out.exists() and not out.with_name(out.name + ".journal.jsonl").exists()


@pytest.mark.parametrize("content", ["", '{"identity": "abc", "ru', "  \n"])
def test_an_empty_or_torn_journal_starts_afresh(tiny_models, tmp_path, content):
    """A run killed before (or while) writing its header leaves nothing to keep."""
    from modeswitch.engine.profiler import Journal

    path = tmp_path / "p.parquet.journal.jsonl"
    path.write_text(content)
    j = Journal(path, spec(tiny_models))
    assert j.rows == [] and json.loads(path.read_text().splitlines()[0])["run_id"] == j.run_id


def test_a_corrupt_header_before_rows_is_named(tiny_models, tmp_path):
    from modeswitch.dataset.errors import InputFileError
    from modeswitch.engine.profiler import Journal

    path = tmp_path / "p.parquet.journal.jsonl"
    path.write_text('{"identity": \n{"mode": "fp16_baseline"}\n')
    with pytest.raises(InputFileError) as exc:
        Journal(path, spec(tiny_models))
    assert str(path) in str(exc.value) and "line 1" in str(exc.value)

"""The quality sweep: per-request quality of the lossy modes on the tiny model, resumable,
and the training table taking it as measured quality."""

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest

from modeswitch.dataset.errors import InputError, InputFileError
from modeswitch.dataset.workloads.conditions import drawn_requests
from modeswitch.engine.quality_sweep import SweepSpec, planned_modes, read_sweep, run_sweep
from modeswitch.oracle import sweep_quality
from modeswitch.oracle.training_table import build_training_table
from tests.helpers import synthetic_profile

FAMILIES = ["short_prompt_short_output", "long_prompt_short_output"]
REF = "fp16_baseline"


def sweep_spec(tiny_models, **kw):
    base = dict(model=str(tiny_models.target), requests=tuple(drawn_requests(FAMILIES, 3, seed=1, length_scale=0.25)),
                modes=(REF, "int8_quant"), batch_size=2, threads=1)
    base.update(kw)
    return SweepSpec(**base)


def test_the_sweep_measures_every_request_in_every_mode_and_resumes(tiny_models, tmp_path):
    spec = sweep_spec(tiny_models)
    out = tmp_path / "q.parquet"
    frame, throughput = run_sweep(spec, out, log=lambda *a: None)
    assert len(frame) == 6 * 2 and set(frame["mode"]) == {REF, "int8_quant"}
    ref = frame[frame["mode"] == REF]
    assert (ref["rouge_l_vs_baseline"] == 1.0).all()  # the reference against itself, same batch
    assert frame["rouge_l_vs_baseline"].between(0, 1).all() and (frame["output_tokens"] > 0).all()
    assert set(throughput["mode"]) == {REF, "int8_quant"} and (throughput["requests"] == 6).all()
    assert (throughput["requests_per_s"] > 0).all()
    pd.testing.assert_frame_equal(read_sweep(out), frame)
    # a finished output is never overwritten
    with pytest.raises(FileExistsError):
        run_sweep(spec, out, log=lambda *a: None)
    # resuming: the journal's batches are not run again
    journal = out.with_name(out.name + ".journal.jsonl")
    out.unlink()
    lines = journal.read_text().splitlines()
    journal.write_text("\n".join(lines[:-2]) + "\n")  # the last two batches lost
    again, _ = run_sweep(spec, out, log=lambda *a: None)
    assert len(again) == len(frame)
    assert len(journal.read_text().splitlines()) == len(lines)
    # another sweep into the same journal is refused
    out.unlink()
    with pytest.raises(InputError, match="other settings"):
        run_sweep(dataclasses.replace(spec, batch_size=3), out, log=lambda *a: None)


def test_by_default_the_sweep_runs_the_reference_and_the_lossy_modes_only(tiny_models):
    modes, _ = planned_modes(sweep_spec(tiny_models, modes=None))
    assert modes[0] == REF and "int8_quant" in modes
    assert not {"continuous_batching", "prefix_caching", "chunked_prefill"} & set(modes)


def test_a_bad_sweep_file_names_file_row_and_column(tmp_path):
    p = tmp_path / "bad.parquet"
    pd.DataFrame({"request_id": ["a", "a"], "mode": ["m", "m"], "reference_mode": [REF] * 2,
                  "rouge_l_vs_baseline": [0.5, 0.6], "accuracy": [np.nan] * 2}).to_parquet(p)
    with pytest.raises(InputFileError) as e:
        read_sweep(p)
    assert e.value.row == 1 and e.value.field == "request_id" and "bad.parquet" in str(e.value)
    pd.DataFrame({"request_id": ["a"], "mode": ["m"]}).to_parquet(p)
    with pytest.raises(InputFileError, match="reference_mode"):
        read_sweep(p)


def _sweep_of(requests, modes, rouge_of):
    return pd.DataFrame([{"request_id": r.id, "family": r.family, "mode": m, "reference_mode": REF,
                          "rouge_l_vs_baseline": 1.0 if m == REF else rouge_of(r), "accuracy": np.nan}
                         for r in requests for m in modes])


def test_the_training_table_takes_the_sweeps_quality_as_measured():
    profile = synthetic_profile()
    lossy = ["int8_quant", "gptq_4bit"]  # ROUGE-L 0.9 in the profile's plain cells (gptq: on short outputs)
    reqs = drawn_requests(["short_prompt_short_output", "long_prompt_short_output"], 6, seed=3)
    plain = build_training_table(profile, reqs)
    assert set(plain["quality_basis"]) <= {"estimated", "measured (profile)"}
    # the sweep says the first lossy mode diverges on half of each family's requests, enough
    # to sink the family's mean below 0.80; the rest stay as the profile has them
    bad = {r.id for r in reqs[::2]}
    sweep = _sweep_of(reqs, [REF, lossy[0]], lambda r: 0.1 if r.id in bad else 0.95)
    table = build_training_table(profile, reqs, quality=sweep)
    assert set(table["quality_basis"]) == {"measured (sweep)"}
    got = table.set_index("request_id")[f"rouge_l_vs_baseline__{lossy[0]}"]
    assert got[list(bad)].eq(0.1).all() and got.drop(list(bad)).eq(0.95).all()
    assert not table[f"safe__{lossy[0]}"].any()  # the family's mean (0.525) fails the rule
    assert json.loads(table.attrs["modeswitch"])["quality_sources"] == {"measured (sweep)": len(table)}
    # a mode the sweep did not run keeps the profile's figures (the plain table's)
    other = lossy[1]
    pd.testing.assert_series_equal(table[f"rouge_l_vs_baseline__{other}"], plain[f"rouge_l_vs_baseline__{other}"])


def test_without_a_sweep_the_family_table_is_the_profiles():
    table = pd.DataFrame({"group_units": [1]})
    assert sweep_quality.family_table(None, pd.DataFrame({"id": []}), table) is table


def test_with_arrival_groups_a_request_is_judged_on_its_groups_output(tiny_models, tmp_path):
    """As the profiler and the live check run it: the request with its companions, the
    group's joined output against the reference's; batches count sequences."""
    from modeswitch.dataset.workloads.conditions import arrival_group

    reqs = drawn_requests(FAMILIES, 2, seed=1, length_scale=0.25)
    reqs = [dataclasses.replace(r, concurrent_requests=3 if i % 2 else 1) for i, r in enumerate(reqs)]
    alone = sweep_spec(tiny_models, requests=tuple(reqs), batch_size=4)
    spec = dataclasses.replace(alone, arrival_groups=True)
    assert alone.identity() != spec.identity()
    # a sweep journalled before the option keeps its identity
    old = json.dumps({**{k: v for k, v in dataclasses.asdict(alone).items() if k not in ("arrival_groups", "repeats")},
                      "requests": [r.to_dict() for r in alone.requests]}, sort_keys=True, default=str)
    import hashlib

    assert alone.identity() == hashlib.sha256(old.encode()).hexdigest()[:16]
    for batch in spec.batches():  # 4 sequences at most, a group of 3 never split
        assert sum(len(arrival_group(r)) for r in batch) <= 4 or len(batch) == 1
    frame, throughput = run_sweep(spec, tmp_path / "g.parquet", log=lambda *a: None)
    assert len(frame) == len(reqs) * 2 and (throughput["requests"] == len(reqs)).all()
    single, _ = run_sweep(alone, tmp_path / "a.parquet", log=lambda *a: None)
    tokens = frame.set_index(["request_id", "mode"])["output_tokens"]
    one = single.set_index(["request_id", "mode"])["output_tokens"]
    grouped = [r.id for r in reqs if r.concurrent_requests == 3]
    assert (tokens.loc[grouped] > one.loc[grouped]).all()  # three members' tokens
    ref = frame[frame["mode"] == REF]
    assert (ref["rouge_l_vs_baseline"] == 1.0).all()
    journal = [json.loads(line) for line in (tmp_path / "g.parquet.journal.jsonl").read_text().splitlines()[1:]]
    members = {(o["request_id"], o["member"]) for row in journal if "outputs" in row for o in row["outputs"]}
    assert {(rid, 2) for rid in grouped} <= members


def _journal_row(mode, repeat, texts, reference="42"):
    return {"mode": mode, "repeat": repeat, "batch": 0, "seconds": 1.0, "requests": len(texts),
            "outputs": [{"request_id": rid, "member": 0, "text": t, "output_tokens": 3, "reference": reference,
                         "evaluation_mode": "final_answer_exact_match"} for rid, t in texts.items()]}


def test_with_repeats_a_request_is_safe_only_where_every_batch_judged_it_safe():
    """A batch of other shapes turns a greedy answer near a tie (measured on SmolLM2: 4.4 %
    of verdicts at concurrency 1 changed with the batch). The table keeps the worst repeat,
    and says where the repeats disagree."""
    from modeswitch.engine.quality_sweep import _results

    reqs = drawn_requests(FAMILIES[:1], 2, seed=1, length_scale=0.25)
    spec = SweepSpec(model="m", requests=tuple(reqs), modes=(REF, "int8_quant"), repeats=2)
    a, b = (r.id for r in reqs)
    same = "the answer is 42 and nothing else"
    wrong = "so it is 41"
    rows = [_journal_row(REF, 0, {a: same, b: same}),
            _journal_row("int8_quant", 0, {a: same, b: wrong}),  # pass 0: a as the reference's, b turned
            _journal_row(REF, 1, {a: wrong}),                     # pass 1: the reference turned on a,
            _journal_row("int8_quant", 1, {a: same, b: same})]   # and b's reference was lost
    frame, throughput = _results(spec, rows, REF)
    got = frame.set_index(["request_id", "mode"])
    worst = got.loc[(a, "int8_quant")]
    assert worst["repeats"] == 2 and worst["rouge_l_vs_baseline"] < 0.5 and worst["flipped"]
    assert worst["rouge_l_spread"] == pytest.approx(1.0 - worst["rouge_l_vs_baseline"])
    # accuracy: the reference's best pass (right once), the mode's worst (right both times)
    assert got.loc[(a, REF), "accuracy"] == 1.0 and worst["accuracy"] == 1.0
    # b: judged in pass 0 only (no reference in pass 1), yet its wrong answer there counts
    lone = got.loc[(b, "int8_quant")]
    assert lone["repeats"] == 1 and lone["rouge_l_vs_baseline"] < 0.5 and lone["rouge_l_spread"] == 0
    assert not lone["flipped"] and lone["accuracy"] == 0.0
    assert (throughput["requests"] == [3, 4]).all()  # every pass counts in the throughput


def test_each_repeat_meets_other_companions_and_more_repeats_continue_the_journal(tiny_models, tmp_path):
    reqs = drawn_requests(FAMILIES, 4, seed=1, length_scale=0.25)
    once = sweep_spec(tiny_models, requests=tuple(reqs))
    twice = dataclasses.replace(once, repeats=2)
    assert once.identity() == twice.identity()  # the count of passes is not the journal's identity
    old = json.dumps({**{k: v for k, v in dataclasses.asdict(once).items() if k not in ("arrival_groups", "repeats")},
                      "requests": [r.to_dict() for r in once.requests]}, sort_keys=True, default=str)
    import hashlib

    assert once.identity() == hashlib.sha256(old.encode()).hexdigest()[:16]
    with pytest.raises(InputError, match="repeats 0"):
        dataclasses.replace(once, repeats=0)
    many = dataclasses.replace(twice, requests=tuple(drawn_requests(FAMILIES, 8, seed=1, length_scale=0.25)))
    first, second = ([[r.id for r in b] for b in many.batches(k)] for k in (0, 1))
    assert sorted(sum(first, [])) == sorted(sum(second, []))  # every request in every pass
    assert {frozenset(b) for b in first} != {frozenset(b) for b in second}
    for batch in second:  # a pass's batches still hold one family each
        assert len({r.split("-")[1] for r in batch}) == 1
    # one pass, then a second continuing its journal: the first pass's rows are kept, not run again
    first_frame, _ = run_sweep(once, tmp_path / "r.parquet", log=lambda *a: None)
    journal = tmp_path / "r.parquet.journal.jsonl"
    one_pass = journal.read_text().splitlines()
    assert (first_frame["repeats"] == 1).all()
    (tmp_path / "r.parquet").rename(tmp_path / "one.parquet")
    frame, throughput = run_sweep(twice, tmp_path / "r.parquet", log=lambda *a: None)
    assert journal.read_text().splitlines()[:len(one_pass)] == one_pass
    assert len(frame) == len(reqs) * 2 and (frame["repeats"] == 2).all()
    assert (throughput["requests"] == 2 * len(reqs)).all()
    rows = [json.loads(line) for line in journal.read_text().splitlines()[1:]]
    assert {r.get("repeat", 0) for r in rows} == {0, 1}
    assert len(rows) == 2 * (len(one_pass) - 1)  # each pass: every (mode, batch) once
    # and a one-pass sweep reads the first pass of the two-pass journal: the same table as before
    (tmp_path / "r.parquet").rename(tmp_path / "two.parquet")
    again_once, _ = run_sweep(once, tmp_path / "r.parquet", log=lambda *a: None)
    pd.testing.assert_frame_equal(again_once.drop(columns="hardware"), first_frame.drop(columns="hardware"))
    assert len(journal.read_text().splitlines()) == 1 + len(rows)  # nothing ran
    # resuming after a lost repeat-1 batch runs that batch alone
    (tmp_path / "r.parquet").unlink()
    lines = journal.read_text().splitlines()
    journal.write_text("\n".join(lines[:-1]) + "\n")
    again, _ = run_sweep(twice, tmp_path / "r.parquet", log=lambda *a: None)
    assert len(journal.read_text().splitlines()) == len(lines)
    pd.testing.assert_frame_equal(again.drop(columns="hardware"), frame.drop(columns="hardware"))
    # a journal continued on another kind of machine: said, and the table names both machines
    (tmp_path / "r.parquet").unlink()
    moved = json.loads(lines[-1])
    moved["hardware"] = "Some CPU (64 cores; L2 2048K)"
    journal.write_text("\n".join([*lines[:-1], json.dumps(moved)]) + "\n")
    said = []
    mixed, _ = run_sweep(twice, tmp_path / "r.parquet", log=said.append)
    assert any("another kind of machine" in m and "Some CPU" in m for m in said)
    ids = {o["request_id"] for o in moved["outputs"]}
    both = mixed[mixed["request_id"].isin(ids) & (mixed["mode"] == moved["mode"])]
    assert len(both) and both["hardware"].str.contains("Some CPU").all() and both["hardware"].str.contains(" | ").all()
    # the reference's pair in that batch too (a verdict compares two outputs), and no other
    moved_ref = mixed["request_id"].isin(ids) & (mixed["mode"] == REF)
    others = ~mixed.index.isin(both.index)
    if moved["mode"] != REF:  # the lossy pairs of those requests judged against a reference from here
        assert not mixed.loc[others & ~moved_ref, "hardware"].str.contains("Some CPU").any()
    from modeswitch.engine.hardware import recorded_hardware

    mixed.to_parquet(tmp_path / "mixed.parquet")  # the study reads each machine apart
    assert "Some CPU (64 cores; L2 2048K)" in recorded_hardware(tmp_path / "mixed.parquet")
    # a journal whose batch holds other requests than planned (batches drawn otherwise) is refused
    (tmp_path / "r.parquet").unlink()
    row = json.loads(lines[-1])
    row["outputs"] = row["outputs"][:-1]
    journal.write_text("\n".join([*lines[:-1], json.dumps(row)]) + "\n")
    with pytest.raises(InputFileError, match=f"row {len(lines) - 2}.*other requests"):
        run_sweep(twice, tmp_path / "r.parquet", log=lambda *a: None)

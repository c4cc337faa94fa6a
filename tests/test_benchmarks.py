import json

import pytest

from modeswitch.dataset.benchmarks import read_benchmark, score_answer
from modeswitch.dataset.errors import InputFileError


@pytest.mark.parametrize("out,ref,mode,want", [
    ("The answer is B.", "B|A,B,C,D", "multiple_choice_accuracy", 1.0),
    ("A or B? I pick C", "C|A,B,C,D", "multiple_choice_accuracy", 0.0),
    ("no letter", "A|A,B", "multiple_choice_accuracy", 0.0),
    ("so 7 + 3 = 10, then 1,024", "1024", "final_answer_exact_match", 1.0),
    ("it is 12", "13", "final_answer_exact_match", 0.0),
    ("no digits", "5", "final_answer_exact_match", 0.0),
    ("anything", None, "external_judge", None),
])
def test_scoring(out, ref, mode, want):
    assert score_answer(out, ref, mode) == want


def test_read_benchmark_validates(tmp_path):
    p = tmp_path / "b.jsonl"
    p.write_text(json.dumps({"id": "x", "prompt": "Q?", "benchmark_suite": "gsm8k",
                             "evaluation_mode": "final_answer_exact_match", "reference": "4"}) + "\n"
                 + json.dumps({"id": "y", "prompt": "", "benchmark_suite": "gsm8k",
                               "evaluation_mode": "final_answer_exact_match"}) + "\n")
    with pytest.raises(InputFileError) as exc:
        read_benchmark(p)
    assert (exc.value.row, exc.value.field) == (1, "prompt")


def test_shared_benchmark_samples_load_and_score(tmp_path):
    from tests.conftest import BENCHMARKS

    if not BENCHMARKS.is_dir():
        pytest.skip(f"benchmark samples not present at {BENCHMARKS}")
    for f in sorted(BENCHMARKS.glob("*.jsonl")):
        reqs = read_benchmark(f, n=5, seed=1)
        assert len(reqs) == 5
        r = reqs[0]
        assert r.benchmark_suite and r.evaluation_mode and r.prompt
        if r.evaluation_mode == "multiple_choice_accuracy":
            letter = r.reference.split("|")[0]
            assert score_answer(f"Answer: {letter}", r.reference, r.evaluation_mode) == 1.0


def test_an_evaluation_leaves_out_the_drafts_distillation_prompts(tmp_path):
    """The draft learned from the corpus's draft split: a profile or a training table
    built from a benchmark file skips those ids before drawing its sample."""
    import json

    from modeswitch.dataset.prompt_corpus import in_draft_split
    from modeswitch.engine.profiler import ProfileSpec, build_units

    f = tmp_path / "b.jsonl"
    ids = [f"q{i}" for i in range(80)]
    f.write_text("".join(json.dumps({"id": i, "prompt": f"What is {i}?", "benchmark_suite": "s",
                                     "evaluation_mode": "external_judge"}) + "\n" for i in ids))
    held = {i for i in ids if in_draft_split(i)}
    assert 0 < len(held) < 30  # about one in eight
    assert {r.id for r in read_benchmark(f, skip=in_draft_split)} == set(ids) - held
    assert len(read_benchmark(f, n=60, seed=3, skip=in_draft_split)) == 60
    units = build_units(ProfileSpec(model="m", workloads=["short_prompt_short_output"], requests=1,
                                    benchmarks=[str(f)], benchmark_requests=100))
    assert {u.id for u in units if u.family == "s"} == set(ids) - held


def test_draft_questions_take_suites_in_turn_and_skip_within_a_suite():
    """Suites in turn by name, each in its salted hashed order; a question ``take`` skips
    gives way to the same suite's next, so every suite keeps its turn."""
    import hashlib
    from pathlib import Path

    from modeswitch.dataset.prompt_corpus import PromptCorpus
    from modeswitch.dataset.requests import Request

    def q(suite, i, text):
        return Request(id=f"{suite}{i}", prompt_tokens=1, expected_output_tokens=1, prompt=text,
                       benchmark_suite=suite, evaluation_mode="external_judge")

    split = {"b": tuple(q("b", i, "x" * (10 if i % 2 else 1)) for i in range(6)),
             "a": tuple(q("a", i, "y") for i in range(6))}
    corpus = PromptCorpus(Path("."), {}, split)

    def order(suite, salt):
        return sorted(split[suite], key=lambda r: hashlib.sha256(f"{salt}:{r.id}".encode()).hexdigest())

    every = corpus.draft_questions("s", 4)
    assert [r.id for r, _ in every] == [order("a", "s")[0].id, order("b", "s")[0].id,
                                        order("a", "s")[1].id, order("b", "s")[1].id]
    assert [r.id for r, _ in corpus.draft_questions("t", 3)] != [r.id for r, _ in corpus.draft_questions("s", 3)]
    short = corpus.draft_questions("s", 6, lambda r: len(r.prompt) if len(r.prompt) == 1 else None)
    assert [r.benchmark_suite for r, _ in short] == ["a", "b", "a", "b", "a", "b"]
    assert all(made == 1 for _, made in short)
    assert [r.id for r, _ in short if r.benchmark_suite == "b"] == \
        [r.id for r in order("b", "s") if len(r.prompt) == 1]
    assert len(corpus.draft_questions("s", 99)) == 12  # as many as there are

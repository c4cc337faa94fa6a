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

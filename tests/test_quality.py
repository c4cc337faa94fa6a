import pytest

from modeswitch.engine.quality import rouge_l


def test_rouge_l_identical_partial_and_code():
    assert rouge_l("the cat sat", "the cat sat") == 1.0
    assert rouge_l("the cat", "the cat sat on the mat") == pytest.approx(2 * (1 * 2 / 6) / (1 + 2 / 6))
    # punctuation-only outputs are compared, not scored 0 against themselves
    assert rouge_l("    )))):", "    )))):") == 1.0
    assert rouge_l("x = f(a)", "x = g(b)") < 1.0
    assert rouge_l("   ", "\n") == 1.0
    assert rouge_l("abc", "") == 0.0

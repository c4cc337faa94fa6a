"""The per-mode table: latency ratio, similarity and accuracy against the reference."""

import pytest

from modeswitch.oracle.mode_table import format_mode_table, mode_table
from tests.helpers import profile, row

REF = "fp16_baseline"


def test_every_mode_gets_its_ratio_similarity_accuracy_and_verdicts():
    rows = []
    for u, rouge, acc in (("a", 0.90, 1.0), ("b", 0.72, 0.0)):
        rows += [row(u, REF, 100, accuracy=1.0), row(u, "gptq_4bit", 50, rouge_l_vs_baseline=rouge, accuracy=acc),
                 row(u, "continuous_batching", 110, rouge_l_vs_baseline=0.5, accuracy=1.0)]
    t = mode_table(profile(rows), n_boot=200).set_index("mode")
    assert list(t.index) == [REF, "gptq_4bit", "continuous_batching"]
    g = t.loc["gptq_4bit"]
    assert g["latency_ratio"] == pytest.approx(0.5)
    assert g["rouge_l_mean"] == pytest.approx(0.81)
    assert g["rouge_l_p10"] == pytest.approx(0.72 + 0.1 * (0.90 - 0.72))
    assert g["divergence_rate"] == pytest.approx(0.5)
    assert g["accuracy"] == pytest.approx(0.5) and g["accuracy_requests"] == 2
    assert g["accuracy_delta_pp"] == pytest.approx(-50.0)
    assert (g["families_passing"], g["families"]) == (0, 1)  # the accuracy drop fails the rule
    cb = t.loc["continuous_batching"]
    assert bool(cb["lossless"]) and cb["latency_ratio"] == pytest.approx(1.1)
    assert (cb["families_passing"], cb["divergence_rate"]) == (1, 1.0)  # the floor, as the labels judge it
    shown = format_mode_table(t.reset_index()).set_index("mode")
    assert shown.loc["gptq_4bit", "latency / reference (median)"].startswith("0.50 [")
    assert shown.loc["gptq_4bit", "families passing"] == "0/1"

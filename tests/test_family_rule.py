"""The study's quality rule per (mode, family), the per-request divergence beside it, and
lossless modes' divergence left to the floor."""

import pytest

from modeswitch.oracle import Constraints, label_profile
from modeswitch.oracle.family_rule import divergence_rates
from tests.helpers import profile, row

REF = "fp16_baseline"


def label_of(rows, **c):
    labels, cand, _ = label_profile(profile(rows), Constraints().replace(**c))
    return labels, cand.set_index(["unit", "mode"])


def two_units(rouge_a, rouge_b, mode="gptq_4bit", **extra):
    return [row("a", REF, 100), row("a", mode, 50, rouge_l_vs_baseline=rouge_a, **extra),
            row("b", REF, 100), row("b", mode, 50, rouge_l_vs_baseline=rouge_b, **extra)]


def test_a_family_mean_above_the_threshold_accepts_a_request_that_diverges():
    labels, cand = label_of(two_units(0.90, 0.72))  # mean 0.81
    assert labels["label"].tolist() == ["gptq_4bit", "gptq_4bit"]
    b = cand.loc[("b", "gptq_4bit")]
    assert b["diverges"] and b["safe"]
    assert b["judged_rouge_l"] == pytest.approx(0.81)
    assert "diverges here, but its family's mean meets the rule" in b["reason"]
    assert not cand.loc[("a", "gptq_4bit"), "diverges"]


def test_the_per_request_scope_keeps_the_stricter_rule():
    labels, cand = label_of(two_units(0.90, 0.72), quality_scope="request")
    assert labels.loc["a", "label"] == "gptq_4bit"
    assert labels.loc["b", "label"] == REF
    assert "ROUGE-L vs reference output 0.720 < 0.80" in cand.loc[("b", "gptq_4bit"), "reason"]


def test_a_family_mean_below_the_threshold_rejects_every_request_of_the_family():
    labels, cand = label_of(two_units(0.90, 0.60))  # mean 0.75
    assert labels["label"].tolist() == [REF, REF]
    reason = cand.loc[("a", "gptq_4bit"), "reason"]
    assert "ROUGE-L vs reference output (mean over 2 measured of short_prompt_short_output) 0.750" in reason
    assert not cand.loc[("a", "gptq_4bit"), "diverges"]  # its own output did not diverge


def test_families_are_judged_apart():
    rows = two_units(0.90, 0.60) + [row("c", REF, 100, family="batch_pressure"),
                                    row("c", "gptq_4bit", 50, rouge_l_vs_baseline=0.85,
                                        family="batch_pressure")]
    labels, _ = label_of(rows)
    assert labels.loc["c", "label"] == "gptq_4bit"
    assert labels.loc["a", "label"] == REF


def test_accuracy_is_judged_on_the_family_mean_paired_drop():
    rows = [row("a", REF, 100, accuracy=1.0), row("a", "gptq_4bit", 50, accuracy=1.0),
            row("b", REF, 100, accuracy=1.0), row("b", "gptq_4bit", 50, accuracy=0.0)]
    labels, cand = label_of(rows)  # mean drop 50 points
    assert labels["label"].tolist() == [REF, REF]
    assert cand.loc[("a", "gptq_4bit"), "judged_accuracy_delta_pp"] == pytest.approx(-50.0)
    assert "accuracy (mean over 2 measured" in cand.loc[("a", "gptq_4bit"), "reason"]
    rows = [row(u, m, lat, accuracy=1.0) for u in "abcdefghij" for m, lat in ((REF, 100), ("gptq_4bit", 50))]
    labels, _ = label_of(rows)
    assert set(labels["label"]) == {"gptq_4bit"}


def test_a_lossless_modes_divergence_is_the_floor_not_a_violation():
    rows = two_units(0.50, 0.40, mode="continuous_batching")
    labels, cand = label_of(rows)
    assert labels["label"].tolist() == ["continuous_batching", "continuous_batching"]
    a = cand.loc[("a", "continuous_batching")]
    assert a["at_floor"] and a["diverges"] and a["safe"]
    assert "a lossless mode's divergence is the reference's floor" in a["reason"]
    labels, _ = label_of(rows, lossless_at_floor=False)
    assert labels["label"].tolist() == [REF, REF]


def test_divergence_rates_sit_beside_the_rules_verdict():
    _, cand = label_of(two_units(0.90, 0.72))
    rates = divergence_rates(cand.reset_index(), 0.80).set_index("mode")
    assert rates.loc["gptq_4bit", "divergence_rate"] == pytest.approx(0.5)
    assert rates.loc["gptq_4bit", "rouge_l_mean"] == pytest.approx(0.81)
    assert bool(rates.loc["gptq_4bit", "passes_rule"])


def test_live_scoring_judges_a_routers_picks_per_family_and_reports_divergence_apart():
    import pandas as pd

    from modeswitch.dataset.requests import Request
    from modeswitch.routers.scoring.live import score_live, summarise_live

    stream = [Request(id=f"r{i}", prompt_tokens=10, expected_output_tokens=4, family=f)
              for i, f in enumerate("aabb")]
    rouge = {"r0": 0.90, "r1": 0.72, "r2": 0.90, "r3": 0.60}  # family a: mean 0.81, b: 0.75
    runs = pd.DataFrame(
        [{"request_id": r, "mode": REF, "latency_ms": 100.0, "energy_per_token_j": 1.0,
          "rouge_l_vs_baseline": 1.0} for r in rouge]
        + [{"request_id": r, "mode": "gptq_4bit", "latency_ms": 50.0, "energy_per_token_j": 0.5,
            "rouge_l_vs_baseline": v} for r, v in rouge.items()]
        + [{"request_id": r, "mode": "continuous_batching", "latency_ms": 80.0,
            "energy_per_token_j": 0.9, "rouge_l_vs_baseline": 0.3} for r in rouge])
    decisions = {"q": ["gptq_4bit"] * 4, "cb": ["continuous_batching"] * 4}
    per, _, _ = score_live(runs, stream, decisions, {}, Constraints())
    q = per[per["router"] == "q"]
    assert q["diverges"].tolist() == [False, True, False, True]
    assert q["violates_quality"].tolist() == [False, False, True, True]
    assert q["judged_rouge_l"].tolist() == pytest.approx([0.81, 0.81, 0.75, 0.75])
    cb = per[per["router"] == "cb"]
    assert cb["diverges"].all() and cb["at_floor"].all() and not cb["violates_quality"].any()
    s = summarise_live(per).set_index("router")
    assert s.loc["q", "violation_rate_quality"] == pytest.approx(0.5)
    assert s.loc["q", "divergence_rate"] == pytest.approx(0.5)
    per, _, _ = score_live(runs, stream, decisions, {}, Constraints(quality_scope="request"))
    assert per[per["router"] == "q"]["violates_quality"].tolist() == [False, True, False, True]

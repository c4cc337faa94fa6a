import math

import pytest

from modeswitch.oracle import Constraints, OracleError, label_profile
from tests.helpers import profile, row

REF = "fp16_baseline"


def label_of(rows, **c):
    labels, cand, skipped = label_profile(profile(rows), Constraints().replace(**c))
    return labels, cand.set_index(["unit", "mode"]), skipped


def test_fastest_safe_mode_wins():
    labels, cand, _ = label_of([row("w", REF, 100), row("w", "int8_quant", 60),
                                row("w", "gptq_4bit", 50)])
    assert labels.loc["w", "label"] == "gptq_4bit"
    assert labels.loc["w", "speedup"] == pytest.approx(2.0)
    assert cand.loc[("w", "int8_quant"), "reason"] == "safe, but not the fastest"


@pytest.mark.parametrize("energy,safe", [(1.0, True), (1.01, False), (0.5, True)])
def test_energy_constraint(energy, safe):
    labels, cand, _ = label_of([row("w", REF, 100, energy=1.0), row("w", "int8_quant", 50, energy=energy)])
    assert (labels.loc["w", "label"] == "int8_quant") == safe
    if not safe:
        assert "energy/token 1.010x > 1.00x (over by 0.010)" in cand.loc[("w", "int8_quant"), "reason"]


@pytest.mark.parametrize("memory,safe", [(102.0, True), (102.5, False)])
def test_memory_constraint(memory, safe):
    labels, cand, _ = label_of([row("w", REF, 100, memory=100), row("w", "int8_quant", 50, memory=memory)])
    assert (labels.loc["w", "label"] == "int8_quant") == safe
    assert bool(cand.loc[("w", "int8_quant"), "violates_memory"]) == (not safe)


def test_thresholds_are_configurable():
    rows = [row("w", REF, 100, energy=1.0), row("w", "int8_quant", 50, energy=1.2)]
    assert label_of(rows)[0].loc["w", "label"] == REF
    assert label_of(rows, max_energy_ratio=1.25)[0].loc["w", "label"] == "int8_quant"


@pytest.mark.parametrize("acc,safe", [(0.785, True), (0.784, False)])
def test_accuracy_constraint(acc, safe):
    # reference 0.80 -> a drop of 1.5 points is allowed, 1.6 is not
    labels, cand, _ = label_of([row("w", REF, 100, accuracy=0.80, rouge_l_vs_baseline=None),
                                row("w", "gptq_4bit", 50, accuracy=acc, rouge_l_vs_baseline=None)])
    assert (labels.loc["w", "label"] == "gptq_4bit") == safe
    assert labels.loc["w", "quality_signals"] == "accuracy"


@pytest.mark.parametrize("rb,safe", [(0.80, True), (0.79, False)])
def test_rouge_vs_reference_output_constraint(rb, safe):
    labels, cand, _ = label_of([row("w", REF, 100, rouge_l_vs_baseline=1.0),
                                row("w", "gptq_4bit", 50, rouge_l_vs_baseline=rb)])
    assert (labels.loc["w", "label"] == "gptq_4bit") == safe
    if not safe:
        assert "short by 0.010" in cand.loc[("w", "gptq_4bit"), "reason"]


@pytest.mark.parametrize("rr,safe", [(0.30, True), (0.28, True), (0.279, False)])
def test_rouge_vs_gold_drop_constraint(rr, safe):
    labels, _, _ = label_of([row("w", REF, 100, rouge_l_vs_reference=0.30),
                             row("w", "int8_quant", 50, rouge_l_vs_reference=rr)])
    assert (labels.loc["w", "label"] == "int8_quant") == safe


def test_missing_quality_is_unsafe_by_default_and_passes_only_with_the_flag():
    # the reference has no accuracy, so gptq's 0.1 compares with nothing: no evidence
    rows = [row("w", REF, 100, rouge_l_vs_baseline=None),
            row("w", "gptq_4bit", 50, accuracy=0.1, rouge_l_vs_baseline=None)]
    labels, cand, _ = label_of(rows)
    assert labels.loc["w", "label"] == REF
    assert labels.loc["w", "quality_signals"] == "none"
    assert labels.loc["w", "missing_quality"] == "unsafe"
    g = cand.loc[("w", "gptq_4bit")]
    assert g["violates_quality_missing"] and not g["safe"]
    assert "no quality evidence (missing-quality rule: unsafe)" in g["reason"]
    labels, cand, _ = label_of(rows, missing_quality="pass")
    assert labels.loc["w", "label"] == "gptq_4bit"
    assert labels.loc["w", "missing_quality"] == "pass"
    assert not cand.loc[("w", "gptq_4bit"), "violates_quality_missing"]


def test_a_mode_lacking_a_signal_the_unit_has_is_unsafe_not_an_error():
    rows = [row("w", REF, 100), row("w", "int8_quant", 60),
            row("w", "gptq_4bit", 50, rouge_l_vs_baseline=None)]
    labels, cand, _ = label_of(rows)
    assert labels.loc["w", "label"] == "int8_quant"
    assert cand.loc[("w", "gptq_4bit"), "quality_missing"] == "rouge_l_vs_baseline not measured"
    assert label_of(rows, missing_quality="pass")[0].loc["w", "label"] == "gptq_4bit"


def test_ties_break_by_energy_then_memory_then_reference_then_name():
    # equal latency: lower energy wins
    labels, _, _ = label_of([row("w", REF, 100), row("w", "int8_quant", 50, energy=0.9),
                             row("w", "gptq_4bit", 50, energy=0.8)])
    assert labels.loc["w", "label"] == "gptq_4bit"
    # equal latency and energy: lower memory wins
    labels, _, _ = label_of([row("w", REF, 100), row("w", "int8_quant", 50, memory=90),
                             row("w", "gptq_4bit", 50, memory=95)])
    assert labels.loc["w", "label"] == "int8_quant"
    # everything equal: the reference first, then names alphabetically
    labels, _, _ = label_of([row("w", "int8_quant", 100), row("w", REF, 100)])
    assert labels.loc["w", "label"] == REF
    labels, _, _ = label_of([row("w", REF, 200), row("w", "int8_quant", 100), row("w", "awq_4bit", 100)])
    assert labels.loc["w", "label"] == "awq_4bit"
    # row order does not matter
    labels2, _, _ = label_of([row("w", "awq_4bit", 100), row("w", "int8_quant", 100), row("w", REF, 200)])
    assert labels2.loc["w", "label"] == "awq_4bit"


def test_relative_tie_tolerance():
    rows = [row("w", REF, 100), row("w", "int8_quant", 50, energy=0.5), row("w", "gptq_4bit", 49, energy=0.9)]
    assert label_of(rows)[0].loc["w", "label"] == "gptq_4bit"
    assert label_of(rows, latency_tie_rel=0.05)[0].loc["w", "label"] == "int8_quant"


def test_missing_reference_is_an_error_not_a_silent_fp16():
    with pytest.raises(OracleError, match="no rows for its reference mode 'fp16_baseline'"):
        label_of([row("w", "int8_quant", 50), row("v", REF, 10)])
    labels, _, skipped = label_of([row("w", "int8_quant", 50), row("v", REF, 10)], on_incomplete="skip")
    assert list(labels.index) == ["v"] and "w" in skipped


def test_nan_metric_is_an_error_unless_skipping():
    rows = [row("w", REF, 100), row("w", "int8_quant", 50, energy=float("nan"))]
    with pytest.raises(OracleError, match="energy_per_token_j not measured"):
        label_of(rows)
    labels, cand, _ = label_of(rows, on_incomplete="skip")
    assert labels.loc["w", "label"] == REF
    assert cand.loc[("w", "int8_quant"), "reason"].startswith("rejected: not measured")
    with pytest.raises(OracleError, match="latency"):
        label_of([row("w", REF, 100), row("w", "int8_quant", float("nan"))])


def test_reference_without_latency_is_an_error():
    with pytest.raises(OracleError, match="has no latency"):
        label_of([row("w", REF, float("nan")), row("w", "int8_quant", 50)])


def test_unknown_mode_is_an_error_naming_the_row():
    with pytest.raises(OracleError, match="row 1, column 'mode': unknown mode"):
        label_of([row("w", REF, 100), row("w", "warp_drive", 1)])


def test_trials_are_averaged_and_aggregates_fill_only_missing_metrics():
    rows = [
        row("w", REF, 100, trial=0, rouge_l_vs_baseline=None),
        row("w", REF, 120, trial=1, rouge_l_vs_baseline=None),
        row("w", "int8_quant", 70, trial=0, rouge_l_vs_baseline=None),
        row("w", "int8_quant", 90, trial=1, rouge_l_vs_baseline=None),
        # an aggregate of the same trials: its latency must not be counted again,
        # but its ROUGE-L (absent from the trial rows) is used
        {**row("w", "int8_quant", 5000, trial=None, rouge_l_vs_baseline=0.5), "is_aggregate": True, "n_trials": 2},
        {**row("w", REF, 5000, trial=None, rouge_l_vs_baseline=1.0), "is_aggregate": True, "n_trials": 2},
    ]
    labels, cand, _ = label_of(rows)
    assert cand.loc[("w", "int8_quant"), "latency_ms"] == pytest.approx(80)
    assert labels.loc["w", "reference_latency_ms"] == pytest.approx(110)
    assert labels.loc["w", "label"] == REF  # ROUGE 0.5 < 0.80
    assert math.isclose(cand.loc[("w", "int8_quant"), "rouge_l_vs_baseline"], 0.5)


def test_constraints_from_toml(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text("[constraints]\nmax_energy_ratio = 1.1\nmin_rouge_vs_baseline = 0.7\n")
    c = Constraints.from_toml(p)
    assert c.max_energy_ratio == 1.1 and c.min_rouge_vs_baseline == 0.7 and c.max_memory_ratio == 1.02
    p.write_text("max_energy_ratoi = 1.1\n")
    from modeswitch.dataset.errors import InputFileError
    with pytest.raises(InputFileError, match="max_energy_ratoi"):
        Constraints.from_toml(p)
    p.write_text("min_rouge_vs_baseline = 2\n")
    with pytest.raises(InputFileError, match="min_rouge_vs_baseline"):
        Constraints.from_toml(p)


def test_per_request_profiles_are_labelled_per_request():
    rows = [row("w", REF, 100, request_id="r1"), row("w", "int8_quant", 50, request_id="r1"),
            row("w", REF, 100, request_id="r2"), row("w", "int8_quant", 150, request_id="r2")]
    labels, cand, _ = label_of(rows)
    assert labels["label"].to_dict() == {"r1": "int8_quant", "r2": REF}
    # one unit per request, each from its own rows: pooled over workload "w", int8_quant
    # would average 100 ms, tie with the reference and lose the tie for both requests
    assert list(labels.index) == ["r1", "r2"] and (labels["workload"] == "w").all()
    assert labels["label_latency_ms"].to_dict() == {"r1": 50, "r2": 100}
    assert cand.loc[("r1", "int8_quant"), "latency_ms"] == 50
    assert cand.loc[("r2", "int8_quant"), "latency_ms"] == 150
    assert cand.loc[("r2", "int8_quant"), "reason"] == "safe, but not the fastest"


def _trials(unit, mode, lats, energies=None):
    energies = energies or [1.0] * len(lats)
    return [row(unit, mode, lat, energy=e, trial=t, request_id=unit)
            for t, (lat, e) in enumerate(zip(lats, energies))]


def test_a_label_within_noise_stays_with_the_safer_mode():
    rows = _trials("u", REF, [100, 104, 98]) + _trials("u", "int8_quant", [97, 105, 99])
    labels, cand, _ = label_of(rows)
    assert labels.loc["u", "label"] == REF  # int8 is 1 % faster by median, not beyond noise
    assert "within noise" in labels.loc["u", "noise_rule"]
    assert "not beyond noise" in cand.loc[("u", "int8_quant"), "reason"]
    assert 0 < labels.loc["u", "confidence"] < 1
    assert label_of(rows, noise_aware=False)[0].loc["u", "label"] == "int8_quant"


def test_a_gain_beyond_noise_switches_with_its_margin_and_confidence():
    rows = _trials("u", REF, [100, 104, 98]) + _trials("u", "int8_quant", [80, 82, 79])
    labels, cand, _ = label_of(rows)
    lab = labels.loc["u"]
    assert lab["label"] == "int8_quant" and lab["noise_rule"] == "fastest, beyond noise"
    assert lab["confidence"] == 1.0
    assert 1.0 < lab["speedup_low"] <= lab["speedup"] <= lab["speedup_high"]


def test_within_noise_lossless_goes_before_lossy():
    rows = (_trials("u", REF, [100, 101, 102]) + _trials("u", "prefix_caching", [90, 95, 89])
            + _trials("u", "int8_quant", [88, 96, 87]))
    labels, _, _ = label_of(rows)
    assert labels.loc["u", "label"] == "prefix_caching"  # tied with int8 within noise, lossless
    assert labels.loc["u", "tied"] == "int8_quant,prefix_caching"


def test_energy_within_noise_of_the_limit_is_not_safe():
    rows = (_trials("u", REF, [100, 100, 100], [1.0, 1.0, 1.0])
            + _trials("u", "int8_quant", [60, 61, 59], [0.97, 1.03, 0.99]))
    labels, cand, _ = label_of(rows)
    g = cand.loc[("u", "int8_quant")]
    assert g["energy_ratio"] == pytest.approx(0.99) and g["violates_energy"]
    assert "within noise" in g["reason"] and labels.loc["u", "label"] == REF
    assert label_of(rows, noise_aware=False)[0].loc["u", "label"] == "int8_quant"

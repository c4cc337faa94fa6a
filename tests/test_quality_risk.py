"""Per-request quality risk (oracle.quality_risk): a model of P(fail) per lossy mode, fitted
on swept requests, trusted only where it beats the base rate on held-out families, and
judging the requests a sweep did not run under the per-request quality rule."""

import json

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from modeswitch.cli import app
from modeswitch.dataset.io import write_parquet
from modeswitch.dataset.workloads.conditions import drawn_requests
from modeswitch.oracle import quality_risk
from modeswitch.oracle.cells import OracleError
from modeswitch.oracle.constraints import Constraints
from modeswitch.oracle.label import _reason
from modeswitch.oracle.quality_risk import QualityRisk, failures, upper_rate
from modeswitch.oracle.training_table import build_training_table
from tests.helpers import synthetic_profile

REF = "fp16_baseline"


def _rows(ids, mode, rouge, accuracy=np.nan):
    return pd.DataFrame({"request_id": list(ids), "mode": mode, "reference_mode": REF,
                         "rouge_l_vs_baseline": rouge, "accuracy": accuracy})


def _synthetic(n=300, seed=0):
    """Five families; int8_quant fails where x > 0.5 in every family, gptq_4bit at random
    (more often in family f0)."""
    rng = np.random.default_rng(seed)
    ids = [f"r{i}" for i in range(n)]
    X = pd.DataFrame({"x": rng.normal(size=n), "z": rng.normal(size=n)}, index=ids)
    groups = pd.Series([f"f{i % 5}" for i in range(n)], index=ids)
    sweep = pd.concat([_rows(ids, REF, 1.0),
                       _rows(ids, "int8_quant", np.where(X["x"] > 0.5, 0.3, 0.95)),
                       _rows(ids, "gptq_4bit", np.where(rng.random(n) < np.where(groups == "f0", 0.6, 0.3),
                                                        0.3, 0.95)),
                       _rows(ids, "prefix_caching", 0.1)])  # lossless: its divergence is the floor
    return X, groups, sweep


def test_failures_count_divergence_and_accuracy_drops_but_not_lossless_modes_or_the_reference():
    sweep = pd.concat([_rows(["a", "b", "c"], REF, 1.0, accuracy=[1.0, 0.0, 1.0]),
                       _rows(["a", "b", "c"], "int8_quant", [0.95, 0.5, 0.95], accuracy=[0.0, 0.0, 1.0]),
                       _rows(["a"], "prefix_caching", 0.1)])
    f = failures(sweep, min_rouge=0.8, max_accuracy_drop_pp=1.5).set_index("request_id")
    assert set(f["mode"]) == {"int8_quant"}
    # a: right answer lost; b: diverged (its accuracy did not drop); c: fine
    assert f["failed"].to_dict() == {"a": True, "b": True, "c": False}


def test_a_signal_that_holds_in_every_family_is_learnt_and_trusted_noise_answers_an_upper_bound():
    X, groups, sweep = _synthetic()
    model = QualityRisk().fit(X, sweep, groups=groups)
    v = model.validation_.set_index("mode")
    assert set(v.index) == {"int8_quant", "gptq_4bit"}
    assert v.loc["int8_quant", "auc"] > 0.95 and v.loc["int8_quant", "brier"] < v.loc["int8_quant", "brier_base"]
    assert v.loc["int8_quant", "below_cut"] > 0 and v.loc["int8_quant", "below_cut_failure_rate"] <= 0.05
    assert model.uses_model_ == {"int8_quant": True, "gptq_4bit": False}
    p = model.predict_proba(X, groups=groups)
    fail = X["x"] > 0.5
    assert p.loc[fail, "int8_quant"].mean() > 0.7 and p.loc[~fail, "int8_quant"].mean() < 0.2
    # the untrusted mode answers each family's upper bound, above the family's own rate
    sw = sweep[sweep["mode"] == "gptq_4bit"].set_index("request_id")["rouge_l_vs_baseline"] < 0.8
    for fam, ids in groups.groupby(groups).groups.items():
        up = model.group_upper_["gptq_4bit"][fam]
        assert np.allclose(p.loc[ids, "gptq_4bit"], up) and up > sw[ids].mean()
    # a family the sweep never ran: the bound over every swept request
    other = model.predict_proba(X.head(2), groups=pd.Series("elsewhere", index=X.index[:2]))
    assert np.allclose(other["gptq_4bit"], model.pooled_upper_["gptq_4bit"])


def test_a_few_passes_do_not_make_a_mode_safe_on_the_rest_of_the_family():
    X, groups, sweep = _synthetic(n=15)  # three swept requests per family: not enough to validate
    sweep = sweep.assign(rouge_l_vs_baseline=np.where(sweep["mode"] == "int8_quant", 0.95,
                                                      sweep["rouge_l_vs_baseline"]))
    model = QualityRisk().fit(X, sweep, groups=groups)
    assert not model.uses_model_["int8_quant"] and model.base_rate_["int8_quant"] == 0
    assert upper_rate(0, 3, 0.95) == pytest.approx(1 - 0.05 ** (1 / 3))
    assert (model.predict_proba(X, groups=groups)["int8_quant"] > 0.6).all()  # 0 of 3 failed: up to 63 %
    assert upper_rate(0, 0, 0.95) == 1.0 and upper_rate(5, 5, 0.95) == 1.0


def test_rows_without_any_quality_signal_are_no_outcome():
    sweep = pd.concat([_rows(["a", "b"], REF, 1.0), _rows(["a", "b"], "int8_quant", [np.nan, 0.3])])
    f = failures(sweep, min_rouge=0.8, max_accuracy_drop_pp=1.5)
    assert f["request_id"].tolist() == ["b"] and f["failed"].tolist() == [True]


def test_lgbm_is_an_estimator_too():
    X, groups, sweep = _synthetic()
    v = QualityRisk(estimator="lgbm").validate(X, sweep, groups).set_index("mode")
    assert v.loc["int8_quant", "auc"] > 0.9 and v.loc["int8_quant", "trusted"]


def test_bad_use_is_a_clear_error():
    X, _, sweep = _synthetic(n=40)
    with pytest.raises(ValueError, match="unknown estimator 'svm'"):
        QualityRisk(estimator="svm").fit(X, sweep)
    with pytest.raises(OracleError, match="lacks nope"):
        QualityRisk(features=("x", "nope")).fit(X, sweep)
    with pytest.raises(OracleError, match="no swept request"):
        QualityRisk().fit(X.set_axis([f"other{i}" for i in range(len(X))]), sweep)
    with pytest.raises(OracleError, match="before fit"):
        QualityRisk().predict_proba(X)


FAMILIES = ["short_prompt_short_output", "short_prompt_long_output"]


def _table(rule, constraints, per_family=40):
    """Requests of two families, every other one swept in the reference and int8_quant;
    int8_quant's output diverges on long prompts per ``rule`` (request -> failed)."""
    reqs = drawn_requests(FAMILIES, per_family, seed=3)
    swept = reqs[::2]
    sweep = pd.concat([_rows([r.id for r in swept], REF, 1.0),
                       _rows([r.id for r in swept], "int8_quant", [0.3 if rule(r) else 0.95 for r in swept])])
    sweep["family"] = sweep["request_id"].map({r.id: r.family for r in reqs})
    table = build_training_table(synthetic_profile(), reqs, constraints, quality=sweep)
    return reqs, {r.id for r in swept}, table.set_index("request_id")


def test_under_the_per_request_rule_unswept_requests_are_judged_by_their_predicted_risk():
    long_prompt = lambda r: r.prompt_tokens > 140  # noqa: E731 - the rule, in both families
    c = Constraints(quality_scope="request", max_quality_risk=0.05)
    reqs, swept, t = _table(long_prompt, c)
    meta = json.loads(t.attrs["modeswitch"])["quality_risk"]
    v = {row["mode"]: row for row in meta["validation"]}
    assert meta["estimator"] == "logistic" and meta["requests_judged"] == len(reqs) - len(swept)
    assert v["int8_quant"]["trusted"] and v["int8_quant"]["auc"] > 0.9
    risk = t["quality_risk__int8_quant"]
    est = t["quality_basis"].eq("estimated")
    assert est.sum() == len(reqs) - len(swept) and risk[est].notna().all() and risk[~est].isna().all()
    # swept requests keep their own measured verdict
    for r in reqs:
        if r.id in swept:
            assert t.loc[r.id, "safe__int8_quant"] == (not long_prompt(r))
    # unswept ones: safe only where the model is confident the output holds
    unswept = t[est]
    assert (unswept["safe__int8_quant"] == (unswept["quality_risk__int8_quant"] <= 0.05)).all()
    assert not unswept.loc[unswept["prompt_tokens"] > 150, "safe__int8_quant"].any()
    assert unswept.loc[unswept["prompt_tokens"] < 125, "safe__int8_quant"].mean() > 0.5
    # a mode the sweep did not run keeps the interpolated figures: no risk column
    assert t["quality_risk__gptq_4bit"].isna().all()


def test_an_unpredictable_failure_leaves_unswept_requests_unsafe_and_says_why():
    rng = np.random.default_rng(7)
    coin = {r.id: bool(rng.random() < 0.5) for r in drawn_requests(FAMILIES, 40, seed=3)}
    c = Constraints(quality_scope="request", max_quality_risk=0.05)
    reqs, swept, t = _table(lambda r: coin[r.id], c)
    v = {row["mode"]: row for row in json.loads(t.attrs["modeswitch"])["quality_risk"]["validation"]}
    assert not v["int8_quant"]["trusted"]
    unswept = t[t["quality_basis"].eq("estimated")]
    assert not unswept["safe__int8_quant"].any() and unswept["violates_quality__int8_quant"].all()
    # each family's upper bound, one value per family, above the pooled failure rate
    per = unswept.groupby("family")["quality_risk__int8_quant"]
    assert (per.nunique() == 1).all() and (per.first() > v["int8_quant"]["failure_rate"]).all()


def test_the_studys_family_rule_and_the_off_switch_leave_the_risk_model_out():
    rule = lambda r: r.prompt_tokens > 140  # noqa: E731
    for c in (Constraints(), Constraints(quality_scope="request", quality_risk="off")):
        _, _, t = _table(rule, c, per_family=20)
        assert "quality_risk__int8_quant" not in t
        assert json.loads(t.attrs["modeswitch"])["quality_risk"] is None


def test_the_reason_names_the_predicted_risk():
    row = pd.Series({"is_reference": False, "chosen": False, "missing": "", "violates_energy": False,
                     "violates_memory": False, "violates_quality_accuracy": False,
                     "violates_quality_rouge_vs_baseline": False, "violates_quality_missing": False,
                     "violates_quality_rouge_vs_reference": False, "violates_quality_risk": True,
                     quality_risk.RISK: 0.31})
    assert "predicted risk of failing the quality rule 0.310 > 0.050" in _reason(row, Constraints())


def test_dataset_build_judges_unswept_requests_by_risk_and_shows_the_validation(tmp_path):
    prof, sweep_path, out = tmp_path / "profile.parquet", tmp_path / "sweep.parquet", tmp_path / "t.parquet"
    write_parquet(synthetic_profile(), prof)
    reqs = drawn_requests(FAMILIES, 40, seed=0)  # what `dataset build --requests 80` draws
    swept = reqs[::2]
    sweep = pd.concat([_rows([r.id for r in swept], REF, 1.0),
                       _rows([r.id for r in swept], "int8_quant",
                             [0.3 if r.prompt_tokens > 140 else 0.95 for r in swept])])
    write_parquet(sweep, sweep_path)
    res = CliRunner().invoke(app, ["dataset", "build", "-p", str(prof), "--requests", "80", "--no-profiled",
                                   "--workloads", ",".join(FAMILIES), "--quality", str(sweep_path),
                                   "--quality-scope", "request", "--max-quality-risk", "0.1", "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert "quality risk: 40 unswept requests judged at P(fail) <= 0.1" in res.output
    assert "quality-risk model (logistic)" in res.output and "int8_quant" in res.output
    t = pd.read_parquet(out)
    assert t["quality_risk__int8_quant"].notna().sum() == 40
    bad = CliRunner().invoke(app, ["dataset", "build", "-p", str(prof), "--max-quality-risk", "1.5",
                                   "-o", str(tmp_path / "u.parquet")])
    assert bad.exit_code != 0 and "--max-quality-risk" in bad.output


def test_the_oracle_reads_a_risk_column_under_the_per_request_rule_only():
    from modeswitch.oracle.label import decide

    metrics = pd.DataFrame({
        "unit": ["u", "u"], "mode": [REF, "int8_quant"], "latency_ms": [100.0, 60.0],
        "energy_per_token_j": [1.0, 0.8], "peak_memory_mb": [100.0, 90.0], "accuracy": [np.nan] * 2,
        "rouge_l_vs_reference": [np.nan] * 2, "rouge_l_vs_baseline": [1.0, 0.95],
        quality_risk.RISK: [np.nan, 0.3]}).set_index(["unit", "mode"])
    ref = pd.Series({"u": REF})
    family, _, _ = decide(metrics, ref, Constraints(noise_aware=False))
    request, cand, _ = decide(metrics, ref, Constraints(noise_aware=False, quality_scope="request"))
    assert family.loc["u", "label"] == "int8_quant"  # the risk column is not the family rule's
    assert request.loc["u", "label"] == REF
    row = cand.set_index("mode").loc["int8_quant"]
    assert row["violates_quality_risk"] and not row["violates_quality_rouge_vs_baseline"]

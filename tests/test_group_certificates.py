"""Certificates that hold in every family (routers.risk_control.learn_then_test_groups,
CertifiedRouter's group_conditional and cross_fit_groups), on synthetic data with a
known shift: int8 breaks the quality limit on shorter prompts in one family."""

import numpy as np
import pandas as pd
import pytest
from sklearn.base import clone

from modeswitch.routers.certified import CertifiedRouter
from modeswitch.routers.families.cost import LinearCostRouter
from modeswitch.routers.risk_control import (
    binomial_p_value,
    group_clusters,
    learn_then_test,
    learn_then_test_groups,
    min_calibration,
    sampling_slack,
)
from tests.test_cost_routers import REF, synthetic_table

ALPHA = 0.05


def shifted_table(n_per_family: int, seed: int, shifted=("c",), plain=("a", "b")) -> pd.DataFrame:
    """int8 unsafe above 450 prompt tokens in the plain families, above 150 in the shifted."""
    parts = [synthetic_table(n_per_family * len(plain), seed, families=plain, quant_unsafe_above=450)]
    if shifted:
        parts.append(synthetic_table(n_per_family * len(shifted), seed + 1000, families=shifted,
                                     quant_unsafe_above=150))
    return pd.concat(parts, ignore_index=True)


def family_rates(router, table) -> pd.Series:
    pick = np.asarray(router.predict(table), dtype=object)
    safe = np.array([table[f"safe__{m}"].iloc[i] if m != REF else True for i, m in enumerate(pick)], dtype=bool)
    return pd.Series(~safe, index=table.index).groupby(table["family"].to_numpy()).mean()


def test_a_group_that_violates_more_makes_the_threshold_stricter():
    groups = np.repeat(["a", "b", "c"], 300)
    thresholds = np.arange(0, 30)

    def violates(t):  # only group c violates: t of its 300 rows at threshold t
        v = np.zeros(900, dtype=bool)
        v[600:600 + t] = True
        return v

    pooled = learn_then_test(lambda t: int(violates(t).sum()), thresholds, 900, alpha=0.02)
    per = learn_then_test_groups(violates, thresholds, groups, alpha=0.02)
    assert per.threshold < pooled.threshold  # the pooled rate hides c's
    assert set(per.groups) == {"a", "b", "c"}
    c = per.groups["c"]
    assert c["violations"] == per.threshold and c["rate"] <= 0.02 and c["p_value"] <= 0.1
    assert per.groups["a"]["violations"] == 0 and per.to_dict()["groups"]["c"]["n"] == 300


def test_small_groups_are_pooled_into_a_cluster_that_can_be_certified():
    need = min_calibration(0.05, 0.1)  # 45
    groups = np.array(["big"] * 100 + ["s1"] * 20 + ["s2"] * 30)
    assert group_clusters(groups, 0.05) == {"big": ["big"], "s1+s2": ["s1", "s2"]}
    tiny = np.array(["big"] * 100 + ["s1"] * 10)
    assert group_clusters(tiny, 0.05) == {"big+s1": ["big", "s1"]}
    assert group_clusters(np.array(["x"] * (need - 1)), 0.05) == {"x": ["x"]}


def test_the_group_conditional_certificate_holds_in_every_family_on_new_requests():
    train, test = shifted_table(400, seed=1), shifted_table(400, seed=2)
    r = CertifiedRouter(LinearCostRouter(max_risk=0.5), target_violation_rate=ALPHA,
                        group_conditional=True).fit(train)
    assert set(r.calibration_["groups"]) == {"a", "b", "c"}
    assert r.threshold_ is not None  # something was certified: the test below is not vacuous
    rates = family_rates(r, test)
    slack = sampling_slack(ALPHA, 400)
    assert (rates <= ALPHA + slack).all(), rates.to_dict()
    assert (np.asarray(r.predict(test)) != REF).mean() > 0.2  # and it still routes away from the reference


def test_a_certificate_fitted_without_each_family_holds_on_a_new_shifted_family():
    """Calibration rows decided by clones that never saw their family: the shift a new
    family brings is in the calibration, so the new family keeps the target too."""
    train = shifted_table(400, seed=3)
    r = CertifiedRouter(LinearCostRouter(max_risk=0.5), target_violation_rate=ALPHA, group_conditional=True,
                        cross_fit_groups=True).fit(train)
    new = synthetic_table(400, seed=9, families=("d",), quant_unsafe_above=150)
    rate = family_rates(r, new)["d"]
    assert rate <= ALPHA + sampling_slack(ALPHA, 400)
    with pytest.raises(ValueError, match="family column"):
        CertifiedRouter(LinearCostRouter(), group_conditional=True).fit(train.drop(columns="family"))


def test_the_report_sets_the_target_beside_each_held_out_family():
    from types import SimpleNamespace

    from modeswitch.routers.scoring.coverage import risk_by_family

    cal = {"alpha": 0.02, "delta": 0.1, "groups": {"a+b": {"members": ["a", "b"], "rate": 0.01}}}
    per = pd.DataFrame({"router": ["cost"] * 200 + ["plain"] * 10,
                        "family": ["a"] * 100 + ["b"] * 100 + ["a"] * 10,
                        "violates_any": [False] * 100 + [True] * 20 + [False] * 80 + [True] * 10})
    got = risk_by_family({"cost": SimpleNamespace(calibration_=cal), "plain": SimpleNamespace()}, per)
    assert list(got["family"]) == ["a", "b"] and set(got["router"]) == {"cost"}
    a, b = got.iloc[0], got.iloc[1]
    assert a["held_out_rate"] == 0 and a["met"] and b["held_out_rate"] == 0.2 and not b["met"]
    assert b["slack"] == pytest.approx(sampling_slack(0.02, 100)) and b["calibration_rate_of_family"] == 0.01
    assert "sources" not in got


def test_the_report_counts_the_measurements_a_familys_violations_rest_on():
    """Estimated requests copied from one measured cell are one source, not many: the
    slack counts requests, the table says how many measurements they are."""
    from types import SimpleNamespace

    from modeswitch.routers.scoring.coverage import measurement_sources, risk_by_family

    table = pd.DataFrame({"request_id": [f"r{i}" for i in range(6)], "estimate_basis": [
        "measured request", "nearest cell c-2-00002 (outside measured range); pool: batch cells",
        "nearest cell c-2-00002 (outside measured range); pool: batch cells; cost model for 3/16 modes' latency",
        "nearest cell c-2-00002; pool: batch cells", "interpolated in (log prompt, log output); pool: plain cells",
        "measured request"]})
    src = measurement_sources(table)
    assert src["r1"] == src["r2"] == src["r3"] and src["r0"] != src["r5"] and src.nunique() == 4
    per = pd.DataFrame({"router": "cost", "family": "c", "request_id": table["request_id"],
                        "violates_any": [True, True, True, True, False, False]})
    cal = {"alpha": 0.02, "delta": 0.1}
    got = risk_by_family({"cost": SimpleNamespace(calibration_=cal)}, per, src).iloc[0]
    assert got["held_out_rate"] == 4 / 6 and got["sources"] == 4 and got["violating_sources"] == 2
    no_basis = measurement_sources(table.drop(columns="estimate_basis"))
    assert no_basis.nunique() == 6
    from modeswitch.routers.scoring.report import _coverage_md

    fam = risk_by_family({"cost": SimpleNamespace(calibration_=cal)}, per, src)
    md = "\n".join(_coverage_md({"risk": pd.DataFrame(), "risk_family": fam, "extrapolated": 0, "held_out": 6,
                                  "headlines": {}, "live": {}, "ranges": pd.DataFrame()}))
    assert "cost in c (66.7%, its violations from 2 of the family's 4 measurement sources)" in md


def test_the_report_says_what_a_family_certificate_promises_a_family_it_never_saw():
    """Leave one family out: each held-out family is new to its fold's certificate, held
    to six calibration families one by one; if families are exchangeable the new one is
    the worst of seven with chance 1/7, so about one fold in seven breaks per router."""
    from types import SimpleNamespace

    from modeswitch.routers.scoring.coverage import new_family_breaks, risk_by_family
    from modeswitch.routers.scoring.report import _coverage_md

    others = [f"f{i}" for i in range(6)]
    cal = {"alpha": 0.02, "delta": 0.1,
           "groups": {f: {"members": [f], "rate": 0.01} for f in others}}
    per = pd.DataFrame({"router": "cost", "family": ["new"] * 100 + ["old"] * 100,
                        "violates_any": [True] * 10 + [False] * 190})
    fam = risk_by_family({"cost": SimpleNamespace(calibration_=cal)}, per)
    assert list(fam["calibration_families"]) == [6, 6]
    got = new_family_breaks(fam)
    assert got == {"pairs": 2, "calibration_families": 6, "chance": pytest.approx(1 / 7),
                   "expected": pytest.approx(2 / 7), "broken": 1}
    md = "\n".join(_coverage_md({"risk": pd.DataFrame(), "risk_family": fam, "new_family": got,
                                  "extrapolated": 0, "held_out": 200, "headlines": {}, "live": {},
                                  "ranges": pd.DataFrame()}))
    assert "with chance 1/7 = 14%" in md and "at most about 0.3 of these 2 pairs by that alone; 1 did" in md
    # a family the certificate calibrated on is not new: nothing to say
    cal["groups"]["f0"]["members"] = ["f0", "new", "old"]
    assert new_family_breaks(risk_by_family({"cost": SimpleNamespace(calibration_=cal)}, per)) is None


def test_a_cross_fitted_certificate_calibrates_on_every_row_and_holds_on_a_new_family():
    """calibrate_on='all': every training row calibrates (decided by a clone fitted on the
    other families) and the served router learns from all of them. 180 rows at 2 %: a
    split certificate sees at most half (90 < the 114 that 2 % needs) and certifies
    nothing; on all rows it certifies, and a new family keeps the target."""
    train = shifted_table(60, seed=3, shifted=(), plain=("a", "b", "c"))
    split = CertifiedRouter(LinearCostRouter(max_risk=0.5), target_violation_rate=0.02,
                            cross_fit_groups=True).fit(train)
    assert split.threshold_ is None and split.calibration_["n"] == 90
    r = CertifiedRouter(LinearCostRouter(max_risk=0.5), target_violation_rate=0.02, cross_fit_groups=True,
                        calibrate_on="all").fit(train)
    assert r.calibration_["n"] == len(train) == 180
    assert r.threshold_ is not None
    new = synthetic_table(400, seed=9, families=("d",), quant_unsafe_above=450)
    assert family_rates(r, new)["d"] <= 0.02 + sampling_slack(0.02, 400)
    assert (np.asarray(r.predict(new)) != REF).mean() > 0.5
    with pytest.raises(ValueError, match="cross_fit_groups"):
        CertifiedRouter(LinearCostRouter(), calibrate_on="all").fit(train)
    with pytest.raises(ValueError, match="calibrate_on"):
        CertifiedRouter(LinearCostRouter(), calibrate_on="half").fit(train)


def test_the_calibration_picks_are_the_cross_fitted_deciders_and_tuning_scores_them(tmp_path):
    """``calibration_picks_``: every calibration row's pick at the certified threshold,
    by a clone that never saw its family; with a cross-fitted certificate Optuna scores
    each trial on them (one certified fit per trial, no inner folds)."""
    from modeswitch.routers.training.table import TrainingTable
    from modeswitch.routers.training.trainer import TrainConfig, _tunes_certified, tune

    train = shifted_table(60, seed=3, shifted=(), plain=("a", "b", "c"))
    r = CertifiedRouter(LinearCostRouter(max_risk=0.5), target_violation_rate=0.02, cross_fit_groups=True,
                        calibrate_on="all").fit(train)
    assert r.threshold_ is not None and list(r.calibration_rows_) == list(range(len(train)))
    fam = train["family"].to_numpy()
    for g in ("a", "b", "c"):
        clone_ = clone(r.router).fit(train[fam != g]).set_risk_threshold(r.threshold_)
        assert list(r.calibration_picks_[fam == g]) == list(clone_.predict(train[fam == g]))
    cfg = TrainConfig(routers=["cost_linear"], feature_set="B", trials=2, target_violation_rate=0.02,
                      certificate="per-family-cross-fit", mlruns=str(tmp_path / "m"))
    assert _tunes_certified("cost_linear", cfg) and not _tunes_certified("dt", cfg)
    assert not _tunes_certified("cost_linear", TrainConfig(certificate="per-family-held-out"))
    assert not _tunes_certified("cost_linear", TrainConfig(certificate="family-cross-fit", target_violation_rate=0))
    table = TrainingTable(train, {"modes": sorted({*train["label"]})})
    study = tune("cost_linear", cfg, table, np.arange(len(train)), "t")
    assert len(study.trials) == 2 and all("certified_threshold" in t.user_attrs for t in study.trials)
    # each trial is constrained per family: its transfer picks within target + slack
    names = {f"violations_beyond_slack:{g}" for g in ("a", "b", "c")}
    assert all(set(t.constraints) == names for t in study.trials)


def test_each_family_is_judged_at_the_threshold_certified_without_it():
    """``family_transfer``: a family's transfer picks are those of a clone that never saw
    it, at the threshold certified on the other families only. The shifted family (int8
    unsafe from 150 prompt tokens, not 450) pulls the certificate that includes it
    stricter; certified without it, the threshold is looser and its own rows violate
    more: what a new family like it would meet, and what tuning now judges."""
    train = shifted_table(80, seed=3)
    r = CertifiedRouter(LinearCostRouter(max_risk=0.5), target_violation_rate=ALPHA, cross_fit_groups=True,
                        calibrate_on="all", family_transfer=True).fit(train)
    fam = train["family"].to_numpy()
    assert set(r.transfer_thresholds_) == {"a", "b", "c"} and len(r.transfer_picks_) == len(train)
    for g, t in r.transfer_thresholds_.items():
        assert t is not None
        clone_ = clone(r.router).fit(train[fam != g]).set_risk_threshold(t)
        assert list(r.transfer_picks_[fam == g]) == list(clone_.predict(train[fam == g]))
    safe = train[[f"safe__{m}" for m in r.modes_]].to_numpy(bool)

    def rate(picks, g):
        rows = np.flatnonzero(fam == g)
        return np.mean([not safe[i, r.modes_.index(picks[i])] for i in rows])

    assert r.transfer_thresholds_["c"] > r.threshold_  # looser without the family that breaks
    assert rate(r.transfer_picks_, "c") > rate(r.calibration_picks_, "c")
    # the certificate itself is what it was without the option
    plain = CertifiedRouter(LinearCostRouter(max_risk=0.5), target_violation_rate=ALPHA, cross_fit_groups=True,
                            calibrate_on="all").fit(train)
    assert plain.threshold_ == r.threshold_ and not hasattr(plain, "transfer_picks_")
    with pytest.raises(ValueError, match="family_transfer needs cross_fit_groups"):
        CertifiedRouter(LinearCostRouter(), family_transfer=True).fit(train)


def test_the_best_trial_is_the_best_feasible_else_the_nearest_to_feasible():
    """routers.training.transfer.best_trial: a trial over its constraints loses to a worse
    feasible one; where none is feasible, the least excess wins, not the best value."""
    import optuna

    from modeswitch.routers.training.transfer import best_trial

    def study_of(trials):
        study = optuna.create_study()
        for value, excess in trials:
            t = study.ask()
            t.set_constraint("violations_beyond_slack:a", excess)
            study.tell(t, value)
        return study

    assert best_trial(study_of([(0.1, 0.02), (0.3, -0.01), (0.5, 0.0)])).value == 0.3
    assert best_trial(study_of([(0.1, 0.05), (0.3, 0.01), (0.2, 0.01)])).value == 0.2
    with pytest.raises(ValueError):
        best_trial(optuna.create_study())


def test_the_report_names_what_stopped_the_certificate():
    """The first threshold the walk refused, and the calibration picks that broke a limit
    there (routers.scoring.refusals): int8 on the shifted family's prompts of 350-450
    tokens (unsafe above 350 there, above 450 elsewhere), over the quality limit."""
    from modeswitch.routers.scoring.refusals import certificate_refusals, refusal_rows
    from tests.test_cost_routers import QUANT, synthetic_table

    train = pd.concat([synthetic_table(200, 5, families=("a", "b"), quant_unsafe_above=450),
                       synthetic_table(100, 1005, families=("c",), quant_unsafe_above=350)], ignore_index=True)
    r = CertifiedRouter(LinearCostRouter(max_risk=0.5), target_violation_rate=ALPHA, cross_fit_groups=True,
                        group_conditional=True, calibrate_on="all").fit(train)
    assert r.threshold_ is not None and r.refused_threshold_ is not None
    assert r.refused_threshold_ != r.threshold_ and (r.calibration_picks_ != REF).mean() > 0.5
    assert len(r.refused_picks_) == len(r.calibration_request_ids_) == len(train)
    # at the refused threshold the shifted family's picks violate too often for its test
    shifted = train["family"].to_numpy() == "c"
    safe = train[[f"safe__{m}" for m in r.modes_]].to_numpy(bool)

    def broke(picks):
        return np.array([p != REF and not safe[i, r.modes_.index(p)] for i, p in enumerate(picks)])

    assert binomial_p_value(int(broke(r.refused_picks_)[shifted].sum()), int(shifted.sum()), ALPHA) > 0.1
    assert broke(r.calibration_picks_)[shifted].sum() < broke(r.refused_picks_)[shifted].sum()
    got = refusal_rows(r, train.sample(frac=1, random_state=0))  # by request id, not position
    top = got.iloc[0]
    assert (top["family"], top["mode"], top["limit"]) == ("c", QUANT, "quality")
    assert top["violations"] == broke(r.refused_picks_)[shifted].sum() and top["calibration_rows"] == 100
    assert got["violations"].sum() == broke(r.refused_picks_).sum()
    assert top["threshold"] == r.threshold_ and top["refused_threshold"] == r.refused_threshold_
    both = certificate_refusals({"cost": {None: r}, "old": {None: object()}}, train)
    assert list(both.columns[:2]) == ["router", "held_out"] and set(both["router"]) == {"cost"}
    with pytest.raises(ValueError, match="not in the table"):
        refusal_rows(r, train.iloc[10:])

"""Cost-predicting routers (routers.families.cost) and certified thresholds
(routers.risk_control)."""

import numpy as np
import pandas as pd
import pytest
from sklearn.base import clone

from modeswitch.dataset.features import feature_columns, features_frame
from modeswitch.dataset.requests import Request
from modeswitch.routers.certified import CertifiedRouter
from modeswitch.routers.families.cost import (
    LightGBMCostRouter,
    LinearCostRouter,
    _CalibratedRisk,
    _RatioRisk,
)
from modeswitch.routers.risk_control import (
    binomial_p_value,
    calibration_split,
    learn_then_test,
    min_calibration,
    upper_bound,
)

REF = "fp16_baseline"
FAST = "continuous_batching"
QUANT = "int8_quant"


def _requests(n, seed, families=("a", "b", "c")):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        fam = families[i % len(families)]
        conc = int(rng.choice([1, 2, 4, 8, 16]))
        out.append(Request(id=f"{fam}-{seed}-{i}", prompt_tokens=int(rng.integers(20, 600)),
                           expected_output_tokens=int(rng.integers(4, 64)),
                           concurrent_requests=conc, family=fam, workload=fam))
    return out


def synthetic_table(n=600, seed=0, families=("a", "b", "c"), quant_unsafe_above=300, fast_energy_above=None):
    """Latency ratios with a known shape: continuous batching is faster the more
    requests arrive together (0.35x at 16, 1.3x alone); int8 is 0.8x everywhere but
    breaks the quality limit on prompts longer than ``quant_unsafe_above`` tokens.
    With ``fast_energy_above``, continuous batching's energy ratio grows with the prompt,
    ``0.7 + 0.3 x prompt / fast_energy_above`` (jittered 2 %), and breaks the 1.0x limit
    on prompts longer than that."""
    reqs = _requests(n, seed, families)
    X = features_frame(reqs, "B").reset_index()
    c = X["concurrent_requests"].to_numpy()
    p = X["prompt_tokens"].to_numpy()
    lat_ref = 100.0 + p * 0.2 + X["expected_output_tokens"].to_numpy() * 5 * c
    ratio_cb = 1.3 * c ** -0.4
    X[f"latency_ms__{REF}"] = lat_ref
    X[f"latency_ms__{FAST}"] = lat_ref * ratio_cb
    X[f"latency_ms__{QUANT}"] = lat_ref * 0.8
    for m in (REF, FAST, QUANT):
        for k in ("quality", "energy", "memory"):
            X[f"violates_{k}__{m}"] = False
    X[f"violates_quality__{QUANT}"] = p > quant_unsafe_above
    if fast_energy_above is not None:
        jitter = np.random.default_rng(seed + 100).normal(0, 0.02, len(X))
        X[f"energy_ratio__{REF}"] = 1.0
        X[f"energy_ratio__{QUANT}"] = 0.9
        X[f"energy_ratio__{FAST}"] = (0.7 + 0.3 * p / fast_energy_above) * np.exp(jitter)
        X[f"violates_energy__{FAST}"] = X[f"energy_ratio__{FAST}"] > 1.0
    for m in (REF, FAST, QUANT):
        X[f"safe__{m}"] = ~X[[f"violates_{k}__{m}" for k in ("quality", "energy", "memory")]].any(axis=1)
    lat = X[[f"latency_ms__{m}" for m in (REF, FAST, QUANT)]].to_numpy()
    safe = X[[f"safe__{m}" for m in (REF, FAST, QUANT)]].to_numpy()
    X["label"] = np.array([REF, FAST, QUANT])[np.where(safe, lat, np.inf).argmin(axis=1)]
    return X


def test_it_picks_a_mode_it_never_saw_as_a_label():
    """Training: at most two requests arrive together, where continuous batching (1.3x,
    0.98x) never beats int8 (0.8x, always safe here), so it is never a label. Its
    costs say it gains with company; with 8-16 requests together the linear router
    extrapolates that and picks it. (A tree ensemble cannot extrapolate past the
    largest concurrency it saw: no method predicts a condition never varied.)"""
    train = synthetic_table(900, seed=1, quant_unsafe_above=10_000)
    train = train[train["concurrent_requests"] <= 2].reset_index(drop=True)
    assert FAST not in set(train["label"]) and train["concurrent_requests"].nunique() == 2
    r = LinearCostRouter(max_risk=0.5).fit(train)
    test = synthetic_table(300, seed=4, quant_unsafe_above=10_000)
    busy = test[test["concurrent_requests"] >= 8]
    assert (r.predict(busy) == FAST).mean() > 0.9
    alone = test[test["concurrent_requests"] == 1]
    assert FAST not in set(r.predict(alone))


@pytest.mark.parametrize("cls", [LinearCostRouter, LightGBMCostRouter])
def test_risk_keeps_it_off_the_unsafe_mode(cls):
    r = cls(max_risk=0.2).fit(synthetic_table(900, seed=5))
    test = synthetic_table(300, seed=6)
    picks = r.predict(test)
    long_alone = (test["prompt_tokens"] > 400) & (test["concurrent_requests"] == 1)
    assert (picks[long_alone.to_numpy()] == QUANT).mean() < 0.1
    short_alone = (test["prompt_tokens"] < 200) & (test["concurrent_requests"] == 1)
    assert (picks[short_alone.to_numpy()] == QUANT).mean() > 0.8
    assert cls.__init__  # sklearn API: clone keeps the parameters, unfitted
    c = clone(r)
    assert c.get_params() == r.get_params() and not hasattr(c, "ratio_models_")


RISK_VARIANTS = [{"limit_risk": "classifier"}, {"limit_risk": "ratio"}, {"risk_calibration": "family-held-out"},
                 {"risk_score": "margin", "risk_calibration": "family-held-out"}]


def _tuned(variant) -> float:
    """A threshold that admits some of each mode: under the margin score 0.47 admits modes
    predicted at most 0.89x the reference's latency (int8 is 0.8x)."""
    return 0.47 if variant.get("risk_score") == "margin" else 0.3


@pytest.mark.parametrize("variant", RISK_VARIANTS)
@pytest.mark.parametrize("cls", [LinearCostRouter, LightGBMCostRouter])
def test_the_compiled_router_decides_as_the_pipeline(cls, variant):
    """The C kernel's cost decision (the linear weights folded, the LightGBM variant's
    trees summed per output and its region tree) answers what the pipeline answers,
    at any threshold: none certified (-1), 0, a tuned one, and 1; with the energy risk
    a classifier's or a logistic of the predicted energy ratio, and with the risk
    classifiers recalibrated on families they did not see."""
    r = cls(max_risk=_tuned(variant), **variant).fit(synthetic_table(600, seed=7, fast_energy_above=400))
    assert isinstance(r.risk_models_[FAST]["energy"], _RatioRisk) == (variant.get("limit_risk") == "ratio")
    assert isinstance(r.risk_models_[QUANT]["quality"], _CalibratedRisk) == ("risk_calibration" in variant)
    test = synthetic_table(400, seed=8, fast_energy_above=400)
    reqs = _requests(80, seed=21)
    for thr in (_tuned(variant), 0.3, 0.04, 0.0, -1.0, 1.0):
        r.threshold_ = thr
        for budget in ((0, 0), None):  # walk only, then with the region tree
            fast = r.compile(region_budget=budget, distil="never")
            assert fast is not None
            np.testing.assert_array_equal(fast.predict(test), r.predict(test))
            assert [fast.route(q) for q in reqs] == [r.route(q) for q in reqs]
    r.threshold_ = _tuned(variant)
    assert len(set(r.predict(test))) == 3  # the thresholds above were not all trivial
    if cls is LightGBMCostRouter:
        assert r.compile(distil="never").region_nodes_ > 0


@pytest.mark.parametrize("cls", [LinearCostRouter, LightGBMCostRouter])
def test_a_ratio_limit_risk_follows_the_predicted_ratio_into_a_family_it_never_saw(cls):
    """Continuous batching breaks the energy limit above 400 prompt tokens. Trained on
    families whose prompts span the limit, the ratio-based risk is the predicted energy
    ratio's distance from the limit: on a new family it keeps the mode off long prompts
    and on short ones, with its spread fitted on families held out in turn."""
    train = synthetic_table(900, seed=11, quant_unsafe_above=10_000, fast_energy_above=400)
    r = cls(max_risk=0.1, limit_risk="ratio").fit(train)
    risk = r.risk_models_[FAST]["energy"]
    assert isinstance(risk, _RatioRisk) and risk.slope > 0
    test = synthetic_table(300, seed=12, families=("new",), quant_unsafe_above=10_000, fast_energy_above=400)
    picks = r.predict(test)
    busy = test["concurrent_requests"].to_numpy() >= 8
    long = test["prompt_tokens"].to_numpy() > 460
    short = test["prompt_tokens"].to_numpy() < 300
    assert (picks[busy & long] == FAST).mean() < 0.1
    assert (picks[busy & short] == FAST).mean() > 0.8
    with pytest.raises(ValueError, match="limit_risk"):
        cls(limit_risk="guess").fit(train)


def test_recalibrated_risks_are_not_sure_of_a_family_they_never_saw():
    """int8 breaks the quality limit above 450 prompt tokens in two families and above
    150 in a third. A boosted classifier is near-certain either way; recalibrated on
    families held out in turn, it no longer calls a new family's 150-450-token prompts
    (unsafe there) safe with confidence: the held-out family taught it that such a call
    is wrong on a new family."""
    from tests.test_group_certificates import shifted_table

    train = shifted_table(200, seed=5)
    raw = LightGBMCostRouter().fit(train)
    cal = LightGBMCostRouter(risk_calibration="family-held-out").fit(train)
    assert isinstance(cal.risk_models_[QUANT]["quality"], _CalibratedRisk)
    new = synthetic_table(300, seed=6, families=("d",), quant_unsafe_above=150)
    mid = ((new["prompt_tokens"] > 150) & (new["prompt_tokens"] < 450)).to_numpy()
    q = list(raw.modes_).index(QUANT)
    sure_raw, sure_cal = raw.scores(new)[1][mid, q] < 0.05, cal.scores(new)[1][mid, q] < 0.05
    assert sure_raw.mean() > 0.1 and not sure_cal.any()  # 'safe' with confidence, and wrong
    with pytest.raises(ValueError, match="risk_calibration"):
        LightGBMCostRouter(risk_calibration="guess").fit(train)


def test_binomial_p_values_and_the_sample_size_they_need():
    assert min_calibration(0.01, 0.1) == 230
    assert binomial_p_value(0, 230, 0.01) <= 0.1 < binomial_p_value(0, 229, 0.01)
    assert upper_bound(0, 230, 0.1) == pytest.approx(0.01, abs=1e-3)
    fit, cal = calibration_split(100, 0.3, 0, groups=np.repeat(["x", "y"], 50))
    assert len(cal) == 30 and not set(fit) & set(cal) and len(fit) + len(cal) == 100
    # never fewer than asked for, whatever the groups' sizes (229 of 230 certifies nothing)
    groups = np.repeat(list("abcdefg"), [91, 90, 95, 88, 93, 92, 91])
    _, cal = calibration_split(len(groups), 230 / len(groups), 0, groups=groups)
    assert len(cal) == 230


def test_learn_then_test_meets_its_target_on_a_known_violation_curve():
    """Threshold t violates with probability t (a known curve): the certified threshold's
    true rate is at most alpha in at least 1 - delta of repeated calibrations."""
    alpha, delta, n = 0.05, 0.1, 2000
    grid = np.linspace(0, 0.2, 81)
    rng = np.random.default_rng(0)
    true_rates, certified = [], []
    for _ in range(300):
        u = rng.random(n)  # request i violates at threshold t iff u_i < t

        def violations_at(t, u=u):
            return int((u < t).sum())

        cal = learn_then_test(violations_at, grid, n, alpha, delta)
        certified.append(cal.threshold is not None)
        true_rates.append(cal.threshold if cal.threshold is not None else 0.0)
    true_rates = np.array(true_rates)
    assert np.mean(true_rates > alpha) <= delta  # the guarantee
    assert np.all(certified) and np.median(true_rates) > 0.04  # and not needlessly strict


def test_a_calibrated_cost_router_keeps_its_violation_rate():
    table = synthetic_table(3000, seed=10, quant_unsafe_above=200)
    # noisy labels of safety: int8 breaks quality at random on a fifth of short prompts too
    rng = np.random.default_rng(1)
    noise = (rng.random(len(table)) < 0.2) & (table["prompt_tokens"] <= 200)
    table[f"violates_quality__{QUANT}"] |= noise
    table[f"safe__{QUANT}"] = ~table[f"violates_quality__{QUANT}"]
    r = CertifiedRouter(LinearCostRouter(), target_violation_rate=0.05, calibration_share=0.4).fit(table)
    cal = r.calibration_
    assert cal["n"] == 1200 and cal["threshold"] is not None and cal["rate"] <= 0.05
    test = synthetic_table(3000, seed=11, quant_unsafe_above=200)
    noise = (rng.random(len(test)) < 0.2) & (test["prompt_tokens"] <= 200)
    test[f"safe__{QUANT}"] = ~(test[f"violates_quality__{QUANT}"] | noise)
    picks = r.predict(test)
    safe = np.array([test[f"safe__{m}"].iloc[i] for i, m in enumerate(picks)])
    assert 1 - safe.mean() <= 0.05 + 0.02  # target plus sampling slack on 3000 new requests
    assert (picks != REF).mean() > 0.3  # it still routes


@pytest.mark.parametrize("cls", [LinearCostRouter, LightGBMCostRouter])
def test_too_few_calibration_requests_certify_nothing_and_answer_the_reference(cls):
    table = synthetic_table(120, seed=12)
    r = CertifiedRouter(cls(), target_violation_rate=0.01, calibration_share=0.3).fit(table)
    assert r.calibration_["threshold"] is None and r.calibration_["n"] < 230
    assert set(r.predict(synthetic_table(50, seed=13))) == {REF}
    assert set(r.compile().predict(synthetic_table(50, seed=13))) == {REF}


@pytest.mark.parametrize("name", ["cost_linear", "cost_lgbm"])
@pytest.mark.parametrize("variant", RISK_VARIANTS)
def test_export_load_decides_identically(tmp_path, name, variant):
    from modeswitch.routers import get_router
    from modeswitch.routers.export import export_router, load_router

    est = get_router(name, max_risk=_tuned(variant), **variant).fit(
        synthetic_table(500, seed=14, fast_energy_above=400))
    assert isinstance(est.risk_models_[QUANT]["quality"], _CalibratedRisk) == ("risk_calibration" in variant)
    mlruns = str(tmp_path / "mlruns")
    info = export_router(est, mlruns=mlruns, source_run_id="r1", backend="transformers")
    loaded = load_router(info["uri"], mlruns, available_modes=[REF, FAST, QUANT])
    assert loaded.path_ == "compiled"
    reqs = _requests(60, seed=15)
    fast = est.compile()  # what serving runs here: the loaded router decides the same
    assert [loaded.route(q) for q in reqs] == [fast.route(q) for q in reqs]
    if fast.distilled_ is None:  # exact: the pipeline's decisions too
        assert [loaded.route(q) for q in reqs] == list(est.predict(features_frame(reqs, "B")))
    assert set(loaded.modes_) == {REF, FAST, QUANT}


def test_the_certifying_wrapper_takes_any_router_with_a_risk_score():
    """One wrapper certifies every family with a risk score (the cost routers, the guarded
    classifiers) and refuses a router without one; no family takes a target itself."""
    import inspect

    from modeswitch.routers import get_router, learned_families
    from modeswitch.routers.certified import has_risk_score

    for family in learned_families():
        assert "target_violation_rate" not in inspect.signature(get_router(family).__class__).parameters
    assert has_risk_score(get_router("cost_lgbm")) and has_risk_score(get_router("dt", safety_threshold=0.5))
    assert not has_risk_score(get_router("dt"))
    with pytest.raises(ValueError, match="no risk score"):
        CertifiedRouter(get_router("dt")).fit(synthetic_table(300, seed=16), synthetic_table(300, seed=16)["label"])


def test_a_guarded_classifier_certifies_its_safety_threshold():
    """The guarded classifiers' threshold on P(safe) is certified the same way: with a
    target, the threshold used is chosen on held-out rows and meets it on new ones."""
    from modeswitch.routers.families.dt import DecisionTreeRouter

    table = synthetic_table(3000, seed=20, quant_unsafe_above=200)
    rng = np.random.default_rng(2)
    noise = (rng.random(len(table)) < 0.2) & (table["prompt_tokens"] <= 200)
    table[f"safe__{QUANT}"] = ~(table[f"violates_quality__{QUANT}"] | noise)
    modes = [REF, FAST, QUANT]
    safe = pd.DataFrame({m: table[f"safe__{m}"].to_numpy() for m in modes})
    r = CertifiedRouter(DecisionTreeRouter(safety_threshold=0.3, fallback="reference", max_depth=6),
                        target_violation_rate=0.05).fit(table, table["label"], safe=safe)
    cal = r.calibration_
    assert cal["threshold"] is not None and cal["n"] == 900 and r.router_.safety_threshold_ >= 0.3
    test = synthetic_table(3000, seed=21, quant_unsafe_above=200)
    noise = (rng.random(len(test)) < 0.2) & (test["prompt_tokens"] <= 200)
    test[f"safe__{QUANT}"] = ~(test[f"violates_quality__{QUANT}"] | noise)
    picks = r.predict(test)
    ok = np.array([test[f"safe__{m}"].iloc[i] for i, m in enumerate(picks)])
    assert 1 - ok.mean() <= 0.05 + 0.02
    # without a target the given threshold is used as it is
    plain = DecisionTreeRouter(safety_threshold=0.3, fallback="reference").fit(table, table["label"], safe=safe)
    assert plain.safety_threshold_ == 0.3 and not hasattr(plain, "calibration_")


def test_a_target_outside_0_1_is_refused_not_certified():
    from modeswitch.dataset.errors import InputError
    from modeswitch.routers.training.trainer import TrainConfig

    for bad in (-0.01, 0.0, 1.0):
        with pytest.raises(ValueError, match="must lie in"):
            learn_then_test(lambda t: 0, [0.1], 500, bad, 0.1)
    with pytest.raises(InputError, match="target-violation-rate"):
        TrainConfig(target_violation_rate=1.5)
    assert TrainConfig(target_violation_rate=0).target_violation_rate == 0  # 0: off


def test_the_lightgbm_router_routes_a_request_as_it_predicts_a_frame():
    r = LightGBMCostRouter(max_risk=0.3).fit(synthetic_table(600, seed=30))
    reqs = _requests(80, seed=31)
    assert [r.route(q) for q in reqs] == list(r.predict(features_frame(reqs, "B")))
    ratio, risk = r.scores(features_frame(reqs, "A"))
    m = r.risk_models_[QUANT]["quality"]
    if hasattr(m, "predict_proba"):  # the booster's own probability is scikit-learn's
        np.testing.assert_allclose(LightGBMCostRouter._proba(m, r._features(features_frame(reqs, "A"))),
                                   m.predict_proba(r._features(features_frame(reqs, "A")))[:, 1])


def test_the_sampling_slack_covers_test_noise_at_its_confidence():
    """A router whose true violation rate is exactly the target exceeds target + slack
    on n test requests in at most delta of test sets (simulated)."""
    from modeswitch.routers.risk_control import sampling_slack

    rng = np.random.default_rng(3)
    for n in (120, 240, 700):
        slack = sampling_slack(0.01, n, 0.1)
        assert 0 < slack < 0.02
        rates = rng.binomial(n, 0.01, size=20_000) / n
        assert (rates > 0.01 + slack).mean() <= 0.1
        assert (rates > 0.01 + slack - 1 / n).mean() > 0.1  # and it is the smallest such slack



@pytest.mark.parametrize("cls", [LinearCostRouter, LightGBMCostRouter])
def test_feature_set_b_with_many_families_fits_and_predicts(cls):
    """Many one-hot categories make the input step's output sparse; the router still fits."""
    fams = tuple(f"fam{i}" for i in range(40))
    table = synthetic_table(400, seed=3, families=fams)
    r = cls(max_risk=0.3, feature_set="B").fit(table)
    assert r.X_sample_.shape[0] == 400 and r.X_sample_.ndim == 2
    assert set(r.predict(table)) <= {REF, FAST, QUANT}
    assert r.compile() is None and "numbers only" in r.compile_reason_


@pytest.mark.parametrize("cls", [LinearCostRouter, LightGBMCostRouter])
def test_measured_quality_rows_teach_the_per_request_boundary_that_inferred_verdicts_hide(cls):
    """Half the rows had their quality measured (int8 fails on long prompts only); the
    other half carry the oracle's verdict for unmeasured requests, unsafe everywhere (a
    quality-risk model that did not validate answers its base rate). Learning quality
    from every row teaches "int8 is unsafe"; from measured rows, where it is."""
    train = synthetic_table(900, seed=5)
    train["quality_basis"] = np.where(np.arange(len(train)) % 2 == 0, "measured (sweep)", "estimated")
    inferred = train["quality_basis"].eq("estimated")
    train.loc[inferred, f"violates_quality__{QUANT}"] = True
    test = synthetic_table(300, seed=6)
    short_alone = ((test["prompt_tokens"] < 200) & (test["concurrent_requests"] == 1)).to_numpy()
    long_alone = ((test["prompt_tokens"] > 400) & (test["concurrent_requests"] == 1)).to_numpy()
    every = cls(max_risk=0.2, quality_rows="all").fit(train).predict(test)
    measured = cls(max_risk=0.2, quality_rows="measured").fit(train).predict(test)
    assert (every[short_alone] == QUANT).mean() < 0.1
    assert (measured[short_alone] == QUANT).mean() > 0.8 and (measured[long_alone] == QUANT).mean() < 0.1
    # auto: all rows, unless the table's unmeasured verdicts came from a quality-risk model
    assert (cls(max_risk=0.2).fit(train).predict(test) == every).all()
    train[f"quality_risk__{QUANT}"] = np.where(inferred, 0.5, np.nan)
    assert (cls(max_risk=0.2).fit(train).predict(test) == measured).all()
    with pytest.raises(ValueError, match="quality_basis"):
        cls(quality_rows="measured").fit(train.drop(columns="quality_basis"))
    with pytest.raises(ValueError, match="quality_rows='sometimes'"):
        cls(quality_rows="sometimes").fit(train)


@pytest.mark.parametrize("cls", [LinearCostRouter, LightGBMCostRouter])
def test_the_margin_score_admits_a_mode_only_predicted_faster_by_the_margin(cls):
    """Under ``risk_score="margin"`` the threshold is a speed-up margin: at 0.4 a mode
    must be predicted at most 0.67x the reference's latency, so int8 (0.8x) is out and
    only continuous batching with company comes in; at 0.47 (0.89x) int8 comes in where
    its quality head passes its gate (short prompts), and no threshold, however loose,
    admits it where the gate fails (long prompts)."""
    train = synthetic_table(900, seed=5)
    r = cls(risk_score="margin", max_risk=0.4).fit(train)
    test = synthetic_table(400, seed=6)
    ratio, _ = r.scores(test)
    picks = np.asarray(r.predict(test))
    cols = [r.modes_.index(p) for p in picks]
    picked = np.exp(ratio[np.arange(len(test)), cols])[picks != REF]
    assert len(picked) and (picked <= 0.4 / 0.6 + 1e-9).all()
    assert QUANT not in set(picks) and FAST in set(picks)
    short_alone = ((test["prompt_tokens"] < 200) & (test["concurrent_requests"] == 1)).to_numpy()
    long_alone = ((test["prompt_tokens"] > 400) & (test["concurrent_requests"] == 1)).to_numpy()
    r.set_risk_threshold(0.47)
    picks = np.asarray(r.predict(test))
    assert (picks[short_alone] == QUANT).mean() > 0.8 and (picks[long_alone] == QUANT).mean() < 0.1
    r.set_risk_threshold(5.0)  # capped at 0.5 (the reference's own latency): a mode failing a gate scores 1
    assert r.threshold_ == r.loosest_threshold() == 0.5
    assert (np.asarray(r.predict(test))[long_alone] == QUANT).mean() < 0.1
    assert "<= 0.887x" in " ".join(why for _, why in r.set_risk_threshold(0.47).explain(test))
    with pytest.raises(ValueError, match="risk_score"):
        cls(risk_score="guess").fit(train)
    with pytest.raises(ValueError, match="quality_gate"):
        cls(risk_score="margin", quality_gate=2.0).fit(train)


def _with_content(X: pd.DataFrame, seed: int) -> pd.DataFrame:
    """``X`` with every content column: noise, but ``embed_pc1`` names the family, whose
    continuous batching is 1.5x slower in family ``a`` (so content predicts the training
    families' latency, and nothing about a new family's)."""
    from modeswitch.dataset.content_features import CONTENT_FEATURES

    rng = np.random.default_rng(seed)
    X = X.copy()
    for c in CONTENT_FEATURES:
        X[c] = rng.normal(size=len(X))
    fam = X["family"].astype(str).to_numpy()
    X["embed_pc1"] = np.where(fam == "a", 3.0, 0.0) + rng.normal(0, 0.1, len(X))
    X.loc[fam == "a", f"latency_ms__{FAST}"] *= 1.5
    return X


@pytest.mark.parametrize("cls", [LinearCostRouter, LightGBMCostRouter])
def test_shape_cost_features_keep_content_out_of_the_latency_and_limit_heads(cls):
    """``cost_features="shape"``: the latency, energy and memory heads read no content
    column (no split or weight on one), the quality heads still may, and the compiled
    router, fed the whole row, decides as the pipeline; ``log-shape``: no raw token
    count either, the log columns only."""
    from modeswitch.dataset.content_features import CONTENT_FEATURES
    from modeswitch.routers.families.cost_strategies import RAW_COUNT_FEATURES

    train = _with_content(synthetic_table(600, seed=31, fast_energy_above=400), 1)
    names = None
    for features, reads in (("all", True), ("shape", False), ("log-shape", False)):
        r = cls(feature_set="C", cost_features=features, max_risk=0.3).fit(train)
        names = [n.split("__", 1)[-1] for n in r.prep_.get_feature_names_out()]
        content = [i for i, n in enumerate(names) if n in CONTENT_FEATURES]
        raw = [i for i, n in enumerate(names) if n in RAW_COUNT_FEATURES]

        def weight(model, columns):
            if hasattr(model, "booster_"):
                return np.asarray(model.booster_.feature_importance("split"))[columns].sum()
            return np.abs(np.ravel(model.coef_)[columns]).sum()

        assert (weight(r.ratio_models_[FAST], content) > 1e-9) == reads
        assert (weight(r.risk_models_[FAST]["energy"], content) > 1e-9) == reads
        # log-shape: no raw token count read either (the log columns carry the shape)
        assert (weight(r.ratio_models_[FAST], raw) > 1e-9) == (features != "log-shape")
        if features == "log-shape":
            logs = [names.index("log_prompt_tokens"), names.index("log_expected_output_tokens")]
            assert weight(r.ratio_models_[FAST], logs) > 1e-9
        test = _with_content(synthetic_table(200, seed=32, fast_energy_above=400), 2)
        np.testing.assert_array_equal(r.compile(distil="never").predict(test), r.predict(test))
    with pytest.raises(ValueError, match="cost_features"):
        cls(cost_features="guess").fit(train)


def test_fixed_router_parameters_reach_the_fitted_router_and_name_their_own_tuning():
    """``TrainConfig.router_params`` (``--router-params``, study.toml
    ``[train.router_params.FAMILY]``): each family's fixed parameters reach its fit beside
    the tuned ones (over them where both name one); an unknown family or parameter is
    refused before any work; a changed setting names a new Optuna study."""
    from modeswitch.dataset.errors import InputError
    from modeswitch.routers.training.table import TrainingTable
    from modeswitch.routers.training.trainer import TrainConfig, _fit, _tuning_key, objective_of

    fixed = {"cost_lgbm": {"risk_score": "margin", "cost_features": "shape", "max_risk": 0.45}}
    cfg = TrainConfig(feature_set="B", target_violation_rate=0, router_params=fixed)
    frame = synthetic_table(300, seed=41)
    table = TrainingTable(frame, {"modes": [REF, FAST, QUANT]})
    est = _fit("cost_lgbm", {"max_risk": 0.2, "num_leaves": 7}, cfg, table, np.arange(300), False)
    assert (est.risk_score, est.cost_features, est.max_risk, est.num_leaves) == ("margin", "shape", 0.45, 7)
    # a changed search space (cost_linear's version 2, cost_lgbm's 3: limit_gate) names its own study too
    assert _tuning_key("cost_linear", cfg) == _tuning_key("cost_linear", TrainConfig()) != ""
    assert _tuning_key("cost_linear", TrainConfig(), search_space=1) == ""
    assert _tuning_key("cost_lgbm", TrainConfig()).startswith("-")
    assert _tuning_key("cost_lgbm", cfg) not in ("", _tuning_key("cost_lgbm", TrainConfig()))
    assert _tuning_key("cost_lgbm", TrainConfig(test_size=0.5)) not in ("", _tuning_key("cost_lgbm", cfg))
    # so does another tuning objective (its trials' scores are on another scale), for the
    # families it applies to: those whose trials are scored as certified
    certified = {"certificate": "per-family-cross-fit", "target_violation_rate": 0.02}
    regret, capture = TrainConfig(**certified), TrainConfig(**certified, tuning_objective="capture")
    assert objective_of("cost_linear", capture) == "capture" and objective_of("dt", capture) == "regret"
    assert _tuning_key("cost_linear", capture) != _tuning_key("cost_linear", regret)
    assert _tuning_key("dt", capture) == _tuning_key("dt", regret) == ""
    assert objective_of("cost_linear", TrainConfig(tuning_objective="capture")) == "regret"  # uncertified
    with pytest.raises(InputError, match="--tuning-objective 'speed'"):
        TrainConfig(tuning_objective="speed")
    with pytest.raises(InputError, match="takes no guess"):
        TrainConfig(router_params={"cost_lgbm": {"guess": 1}})
    with pytest.raises(InputError, match="nope"):
        TrainConfig(router_params={"nope": {}})


def lone_short_prompts_unseen(n: int, seed: int) -> pd.DataFrame:
    """Continuous batching 0.5x on short prompts in company, 0.9x on long ones in
    company, 1.15x alone; the training rows hold no short prompt that came alone (as a
    family of batch traffic would, with the lone short prompts' family left out)."""
    X = synthetic_table(n, seed, quant_unsafe_above=10_000)
    short = X["prompt_tokens"].to_numpy() < 300
    alone = X["concurrent_requests"].to_numpy() == 1
    X[f"latency_ms__{FAST}"] = X[f"latency_ms__{REF}"] * np.where(alone, 1.15, np.where(short, 0.5, 0.9))
    return X, short & alone


@pytest.mark.parametrize("regimes", ["none", "concurrency"])
def test_concurrency_regimes_keep_lone_requests_apart(regimes):
    """``cost_regimes="concurrency"``: every latency tree splits lone requests from those in
    company first, so a lone short prompt is predicted from lone long ones (batching gains
    nothing alone), not from short ones in company."""
    X, lone_short = lone_short_prompts_unseen(1200, seed=1)
    r = LightGBMCostRouter(feature_set="A", cost_regimes=regimes).fit(X[~lone_short].reset_index(drop=True))
    ratio, _ = r.scores(X[lone_short])
    predicted = ratio[:, r.modes_.index(FAST)]
    booster = r.ratio_models_[FAST].booster_
    roots = {t["tree_structure"].get("split_feature") for t in booster.dump_model()["tree_info"]}
    lone = feature_columns("A").index("concurrent_requests")
    if regimes == "concurrency":
        assert np.median(predicted) > 0.05  # slower than the reference alone: never admitted
        assert roots == {lone}
    else:  # without: short prompts "batch well", alone or not
        assert np.median(predicted) < -0.3
        assert roots != {lone}


def test_a_regime_without_rows_on_both_sides_is_not_forced():
    """Every request alone (a profile without conditions), or fewer lone ones than a leaf
    needs: LightGBM would crash the process on the forced split, so it is left out."""
    X, _ = lone_short_prompts_unseen(600, seed=3)
    alone = X[X["concurrent_requests"] == 1].reset_index(drop=True)
    r = LightGBMCostRouter(feature_set="A", cost_regimes="concurrency").fit(alone)
    assert np.isfinite(r.scores(alone)[0]).all()
    few = pd.concat([X[X["concurrent_requests"] > 1], alone.head(5)], ignore_index=True)
    r = LightGBMCostRouter(feature_set="A", cost_regimes="concurrency", min_child_samples=10).fit(few)
    roots = {t["tree_structure"].get("split_feature") for t in r.ratio_models_[FAST].booster_.dump_model()["tree_info"]}
    assert roots != {feature_columns("A").index("concurrent_requests")}


def test_the_cost_regimes_are_tuned_and_the_first_trial_has_none():
    from modeswitch.routers.training.first_trial import default_trial

    assert default_trial("cost_lgbm")["cost_regimes"] == "none"
    import optuna

    trial = optuna.create_study().ask()
    assert LightGBMCostRouter.search_space(trial)["cost_regimes"] in ("none", "concurrency")


def test_the_limit_gate_is_tuned_for_every_cost_router_and_the_first_trial_keeps_the_default():
    """The energy and memory gate shares the margin's budget (a stricter gate lets a
    looser margin certify): tuned, from the default 0.5, and a new space version so
    studies drawn from the old space start anew."""
    import optuna

    from modeswitch.routers.families.cost import LinearCostRouter
    from modeswitch.routers.training.first_trial import default_trial

    for family, cls in (("cost_lgbm", LightGBMCostRouter), ("cost_linear", LinearCostRouter)):
        assert default_trial(family)["limit_gate"] == 0.5
        trial = optuna.create_study().ask()
        assert 0.15 <= cls.search_space(trial)["limit_gate"] <= 0.6
    assert (LinearCostRouter.search_space_version, LightGBMCostRouter.search_space_version) == (2, 3)
    # the gate decides what a margin may admit: a stricter one admits fewer modes
    X, _ = lone_short_prompts_unseen(300, seed=3)
    # continuous batching breaks the energy limit now and then, more often the longer the prompt
    broke = np.random.default_rng(0).random(len(X)) < 0.4 * X["prompt_tokens"].rank(pct=True).to_numpy()
    X[f"violates_energy__{FAST}"] = broke
    X[f"safe__{FAST}"] = X[f"safe__{FAST}"].astype(bool) & ~broke
    r = LightGBMCostRouter(feature_set="A", risk_score="margin", limit_gate=0.6, min_child_samples=10).fit(X)
    loose = r.risk_scores(X)
    strict = r.set_params(limit_gate=0.05).risk_scores(X)
    assert (strict >= loose).all() and (strict == 1.0).sum() > (loose == 1.0).sum()


def test_an_unknown_cost_regime_is_refused_with_the_known_ones():
    X, _ = lone_short_prompts_unseen(200, seed=2)
    with pytest.raises(ValueError, match="'none', 'concurrency'"):
        LightGBMCostRouter(feature_set="A", cost_regimes="prefix").fit(X)

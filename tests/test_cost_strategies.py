"""The cost-predicting routers' switches as strategies (routers.families.cost_strategies):
each string value resolves to its strategy, an unknown one is refused naming the known
ones, and a router fitted with each value decides as the value says, checked here against
what the test computes itself from the fitted models and the training table."""

import json

import numpy as np
import pytest
from scipy.special import expit
from sklearn.linear_model import LogisticRegression, Ridge

from modeswitch.dataset.content_features import CONTENT_FEATURES
from modeswitch.dataset.features import CATEGORICAL_FEATURES, feature_columns
from modeswitch.oracle.sweep_quality import RISK, SWEEP
from modeswitch.routers.families import cost_strategies as cs
from modeswitch.routers.families.cost import (
    CONSTRAINTS,
    COST_FEATURES,
    LightGBMCostRouter,
    LinearCostRouter,
    _CalibratedRisk,
    _Constant,
    _RatioRisk,
)
from tests.test_cost_routers import (
    FAST,
    QUANT,
    REF,
    _with_content,
    lone_short_prompts_unseen,
    synthetic_table,
)

#: (router parameter, value, the router property that resolves it, the strategy's class)
RESOLVED = [("limit_risk", "classifier", "_limit_risk_strategy", cs.ClassifierLimit),
            ("limit_risk", "ratio", "_limit_risk_strategy", cs.RatioLimit),
            ("risk_calibration", "none", "_risk_calibration_strategy", cs.KeepProbabilities),
            ("risk_calibration", "family-held-out", "_risk_calibration_strategy", cs.FamilyHeldOut),
            ("risk_score", "probability", "_risk_score_strategy", cs.ProbabilityScore),
            ("risk_score", "margin", "_risk_score_strategy", cs.MarginScore),
            ("cost_features", "all", "_cost_features_strategy", cs.CostInputs),
            ("cost_features", "shape", "_cost_features_strategy", cs.CostInputs),
            ("cost_features", "log-shape", "_cost_features_strategy", cs.CostInputs),
            ("quality_rows", "auto", "_quality_rows_strategy", cs.AutoRows),
            ("quality_rows", "all", "_quality_rows_strategy", cs.AllRows),
            ("quality_rows", "measured", "_quality_rows_strategy", cs.MeasuredRows),
            ("cost_regimes", "none", "_cost_regimes_strategy", cs.NoRegimes),
            ("cost_regimes", "concurrency", "_cost_regimes_strategy", cs.ForcedSplit)]
REGISTRIES = {"limit_risk": cs.RISK_LIMITS, "risk_calibration": cs.RISK_CALIBRATIONS, "risk_score": cs.RISK_SCORES,
              "cost_features": cs.COST_INPUTS, "quality_rows": cs.QUALITY_ROWS, "cost_regimes": cs.COST_REGIMES}


@pytest.mark.parametrize(("param", "value", "prop", "kind"), RESOLVED)
def test_every_value_resolves_to_its_strategy_and_stays_the_parameter(param, value, prop, kind):
    """The string stays the parameter (get_params, clone, Optuna), and names one shared
    strategy: the router stores none of its own."""
    r = LightGBMCostRouter(**{param: value})
    strategy = getattr(r, prop)
    assert isinstance(strategy, kind) and strategy is REGISTRIES[param][value]
    assert strategy is getattr(LightGBMCostRouter(**{param: value}), prop)
    assert r.get_params()[param] == value
    assert not any(isinstance(v, type(strategy)) for v in vars(r).values())
    if param != "cost_regimes":
        assert getattr(LinearCostRouter(**{param: value}), prop) is strategy


def test_the_registries_hold_the_values_the_parameters_always_took():
    assert {p: list(reg) for p, reg in REGISTRIES.items()} == {
        "limit_risk": ["classifier", "ratio"], "risk_calibration": ["none", "family-held-out"],
        "risk_score": ["probability", "margin"], "cost_features": ["all", "shape", "log-shape"],
        "quality_rows": ["auto", "all", "measured"], "cost_regimes": ["none", "concurrency"]}
    assert COST_FEATURES == ("all", "shape", "log-shape")
    assert cs.COST_INPUTS["all"].masked == frozenset()
    assert cs.COST_INPUTS["shape"].masked == frozenset(CONTENT_FEATURES)
    assert cs.COST_INPUTS["log-shape"].masked == frozenset(CONTENT_FEATURES) | set(cs.RAW_COUNT_FEATURES)
    assert cs.COST_REGIMES["concurrency"].split == ("concurrent_requests", 1.5)


UNKNOWN = [(LinearCostRouter, "limit_risk", "'classifier', 'ratio'"),
           (LinearCostRouter, "risk_calibration", "'none', 'family-held-out'"),
           (LinearCostRouter, "risk_score", "'probability', 'margin'"),
           (LinearCostRouter, "cost_features", "'all', 'shape', 'log-shape'"),
           (LinearCostRouter, "quality_rows", "'auto', 'all', 'measured'"),
           (LightGBMCostRouter, "quality_rows", "'auto', 'all', 'measured'"),
           (LightGBMCostRouter, "cost_regimes", "'none', 'concurrency'")]


@pytest.mark.parametrize(("cls", "param", "known"), UNKNOWN)
def test_an_unknown_value_is_refused_naming_the_known_ones(cls, param, known):
    message = f"{cls.__name__}: {param}='guess'; known: {known}"
    with pytest.raises(ValueError) as fit_error:
        cls(**{param: "guess"}).fit(synthetic_table(60, seed=1))
    assert str(fit_error.value) == message
    with pytest.raises(ValueError) as lookup_error:
        cs.resolve(REGISTRIES[param], param, "guess", cls.__name__)
    assert str(lookup_error.value) == message
    with pytest.raises(ValueError, match="known: "):  # not a string at all: the same refusal
        cs.resolve(REGISTRIES[param], param, ["ratio"], cls.__name__)


def test_a_forced_split_on_a_column_the_feature_set_lacks_is_refused():
    lacking = cs.ForcedSplit("no_such_column", 2.0)
    with pytest.raises(ValueError) as e:
        lacking.forced_split("A", "LightGBMCostRouter: cost_regimes='x'")
    assert str(e.value) == "LightGBMCostRouter: cost_regimes='x' splits on no_such_column, which feature set A lacks"
    numeric = [c for c in feature_columns("A") if c not in CATEGORICAL_FEATURES]
    assert cs.COST_REGIMES["concurrency"].forced_split("A", "") == (numeric.index("concurrent_requests"), 1.5)
    assert cs.COST_REGIMES["none"].forced_split("A", "") is None


def test_a_router_saved_before_a_switch_existed_resolves_its_default():
    r = LinearCostRouter(risk_score="margin", limit_risk="ratio", cost_features="shape")
    for name in ("risk_score", "limit_risk", "cost_features"):
        del r.__dict__[name]  # as skops loads a router pickled before the parameter
    assert r._risk_score_strategy is cs.RISK_SCORES["probability"]
    assert r._limit_risk_strategy is cs.RISK_LIMITS["classifier"]
    assert r._cost_features_strategy is cs.COST_INPUTS["all"]
    assert r.loosest_threshold() == r.max_risk_ceiling


# ------------------------------------------------------------------ decisions
def _head(router, model, F) -> np.ndarray:
    """P(violates) of one fitted risk head, read off the model as the test knows it."""
    if isinstance(model, _Constant):
        return np.full(len(F), model.value)
    if isinstance(model, _RatioRisk):
        return expit(model.intercept + model.slope * model.regressor.predict(F))
    if isinstance(model, _CalibratedRisk):
        clf = model.classifier
        raw = clf.decision_function(F) if hasattr(clf, "decision_function") else clf.predict(F, raw_score=True)
        return expit(model.intercept + model.slope * raw)
    return model.predict_proba(F)[:, list(model.classes_).index(True)]


def _expected(router, X, threshold):
    """(ratio, score, picks) as the parameter's documented rule makes them, from the
    fitted per-mode models alone."""
    F = router.features(X)
    modes = router.modes_
    ratio, score = np.zeros((len(F), len(modes))), np.zeros((len(F), len(modes)))
    for j, m in enumerate(modes):
        if m == REF:
            continue
        mdl = router.ratio_models_[m]
        ratio[:, j] = mdl.predict(F)
        heads = np.array([_head(router, router.risk_models_[m][c], F) for c in CONSTRAINTS])
        if router.risk_score == "margin":
            gates = np.array([router.quality_gate if c == "quality" else router.limit_gate for c in CONSTRAINTS])
            score[:, j] = np.where((heads <= gates[:, None]).all(axis=0), 1 / (1 + np.exp(-ratio[:, j])), 1.0)
        else:
            score[:, j] = heads.max(axis=0)
    allowed = score <= threshold
    allowed[:, modes.index(REF)] = True
    picks = np.array(modes, dtype=object)[np.where(allowed, ratio, np.inf).argmin(axis=1)]
    return ratio, score, picks


SCORED = [{}, {"risk_score": "margin"}, {"limit_risk": "ratio"}, {"risk_calibration": "family-held-out"},
          {"risk_score": "margin", "limit_risk": "ratio", "risk_calibration": "family-held-out"}]


@pytest.mark.parametrize("variant", SCORED)
@pytest.mark.parametrize("cls", [LinearCostRouter, LightGBMCostRouter])
def test_each_risk_switch_decides_as_its_rule_computed_from_the_fitted_models(cls, variant):
    train = synthetic_table(360, seed=3, fast_energy_above=400)
    test = synthetic_table(150, seed=4, fast_energy_above=400)
    extra = {"n_estimators": 20, "min_child_samples": 10} if cls is LightGBMCostRouter else {}
    r = cls(max_risk=0.3, **extra, **variant).fit(train)
    assert isinstance(r.risk_models_[FAST]["energy"], _RatioRisk) == (variant.get("limit_risk") == "ratio")
    assert isinstance(r.risk_models_[QUANT]["quality"], _CalibratedRisk) == ("risk_calibration" in variant)
    margin = variant.get("risk_score") == "margin"
    loosest = 0.5 if margin else r.max_risk_ceiling
    assert r.loosest_threshold() == loosest
    for threshold in (0.3, 0.47, 0.9, -1.0):
        r.set_risk_threshold(threshold)
        used = min(threshold, 0.5) if margin else threshold
        assert r.threshold_ == used
        ratio, score, picks = _expected(r, test, used)
        got_ratio, got_score = r.scores(test)
        np.testing.assert_allclose(got_ratio, ratio, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(got_score, score, rtol=1e-12, atol=1e-12)
        assert list(r.predict(test)) == list(picks)
    r.set_risk_threshold(0.47)
    np.testing.assert_array_equal(r.compile(distil="never").predict(test), r.predict(test))
    ratio, score, picks = _expected(r, test, 0.47)
    why = [w for _, w in r.explain(test)]
    shown = [*np.flatnonzero(picks != REF)[:1], *np.flatnonzero(picks == REF)[:1]]
    assert shown
    for i in shown:
        j = r.modes_.index(picks[i])
        if margin and picks[i] != REF:
            text = (f"predicted {np.exp(ratio[i, j]):.2f}x the reference's latency <= {0.47 / 0.53:.3g}x, "
                    "every risk within its gate")
        elif margin:
            text = f"no mode predicted at most {0.47 / 0.53:.3g}x the reference's latency within its gates"
        elif picks[i] != REF:
            text = f"predicted {np.exp(ratio[i, j]):.2f}x the reference's latency, risk {score[i, j]:.2f} <= 0.47"
        else:
            text = "no faster mode predicted safe (threshold 0.47)"
        assert why[i] == f"{cls.__name__}: {text}"


@pytest.mark.parametrize("cls", [LinearCostRouter, LightGBMCostRouter])
def test_limit_and_calibration_switches_change_only_their_own_heads(cls):
    """``limit_risk="ratio"`` replaces the energy heads it can, nothing else; the family
    held-out calibration wraps the very classifier the plain router fits (one family:
    nothing to hold out, the classifier itself)."""
    train = synthetic_table(360, seed=5, fast_energy_above=400)
    extra = {"n_estimators": 20, "min_child_samples": 10} if cls is LightGBMCostRouter else {}
    plain = cls(**extra).fit(train)
    F_test = plain.features(synthetic_table(100, seed=6, fast_energy_above=400))
    ratio = cls(limit_risk="ratio", **extra).fit(train)
    cal = cls(risk_calibration="family-held-out", **extra).fit(train)
    for m in (FAST, QUANT):
        np.testing.assert_array_equal(ratio.ratio_models_[m].predict(F_test), plain.ratio_models_[m].predict(F_test))
        for c in CONSTRAINTS:
            p = _head(plain, plain.risk_models_[m][c], F_test)
            if not (m == FAST and c == "energy"):
                np.testing.assert_array_equal(_head(ratio, ratio.risk_models_[m][c], F_test), p)
            model = cal.risk_models_[m][c]
            if isinstance(model, _CalibratedRisk):
                inner = model.classifier
                np.testing.assert_array_equal(inner.predict_proba(F_test),
                                              plain.risk_models_[m][c].predict_proba(F_test))
    one = train[train["family"] == "a"].reset_index(drop=True)
    kept = cls(risk_calibration="family-held-out", **extra).fit(one)
    assert not any(isinstance(h, _CalibratedRisk) for heads in kept.risk_models_.values() for h in heads.values())


@pytest.mark.parametrize("features", ["all", "shape", "log-shape"])
def test_cost_features_pick_the_columns_the_latency_heads_learn_from(features):
    """The linear latency head equals a ridge the test fits itself on the same rows with
    the value's columns set to 0 (content; under ``log-shape`` the raw counts too)."""
    train = _with_content(synthetic_table(300, seed=31, fast_energy_above=400), 1)
    r = LinearCostRouter(feature_set="C", cost_features=features, alpha=0.7).fit(train)
    F = np.array(r.features(train), dtype=float)
    names = [n.split("__", 1)[-1] for n in r.prep_.get_feature_names_out()]
    masked = set() if features == "all" else set(CONTENT_FEATURES)
    if features == "log-shape":
        masked |= {"prompt_tokens", "expected_output_tokens", "output_prompt_ratio"}
    F[:, [i for i, n in enumerate(names) if n in masked]] = 0.0
    target = np.log(train[f"latency_ms__{FAST}"].to_numpy(float) / train[f"latency_ms__{REF}"].to_numpy(float))
    mine = Ridge(alpha=0.7).fit(F, target)
    np.testing.assert_allclose(r.ratio_models_[FAST].coef_, mine.coef_, rtol=1e-10, atol=1e-12)
    assert r.ratio_models_[FAST].intercept_ == pytest.approx(mine.intercept_, rel=1e-12)
    # the quality heads read every column, whatever the value
    content = [i for i, n in enumerate(names) if n in CONTENT_FEATURES]
    assert np.abs(np.ravel(r.risk_models_[QUANT]["quality"].coef_)[content]).sum() > 0


@pytest.mark.parametrize(("how", "inferred", "measured_only"),
                         [("all", True, False), ("measured", False, True), ("auto", True, True),
                          ("auto", False, False)])
def test_quality_rows_pick_the_rows_the_quality_heads_learn_from(how, inferred, measured_only):
    """The quality head equals a logistic regression the test fits on the value's rows:
    ``auto`` is ``measured`` only where the table's other verdicts are a risk model's."""
    train = synthetic_table(300, seed=8)
    measured = np.arange(len(train)) % 3 != 0
    train["quality_basis"] = np.where(measured, SWEEP, "family rule")
    if inferred:
        train[f"{RISK}__{QUANT}"] = 0.1
    r = LinearCostRouter(quality_rows=how, C=2.0).fit(train)
    rows = measured if measured_only else np.ones(len(train), bool)
    F = r.features(train)
    mine = LogisticRegression(C=2.0, max_iter=2000, random_state=0).fit(
        F[rows], train[f"violates_quality__{QUANT}"].to_numpy(bool)[rows])
    np.testing.assert_allclose(r.risk_models_[QUANT]["quality"].coef_, mine.coef_, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("regimes", ["none", "concurrency"])
def test_cost_regimes_fit_the_latency_trees_the_test_fits_with_its_own_forced_split(regimes, tmp_path):
    from lightgbm import LGBMRegressor

    X, _ = lone_short_prompts_unseen(400, seed=2)
    r = LightGBMCostRouter(feature_set="A", cost_regimes=regimes, n_estimators=15, min_child_samples=10).fit(X)
    F = r.features(X)
    target = np.log(X[f"latency_ms__{FAST}"].to_numpy(float) / X[f"latency_ms__{REF}"].to_numpy(float))
    forced = {}
    if regimes == "concurrency":
        path = tmp_path / "split.json"
        numeric = [c for c in feature_columns("A") if c not in CATEGORICAL_FEATURES]
        path.write_text(json.dumps({"feature": numeric.index("concurrent_requests"), "threshold": 1.5}))
        forced = {"forcedsplits_filename": str(path)}
    mine = LGBMRegressor(n_estimators=15, num_leaves=r.num_leaves, learning_rate=r.learning_rate, min_child_samples=10,
                         random_state=0, n_jobs=1, verbose=-1, **forced).fit(F, target)
    np.testing.assert_array_equal(r.ratio_models_[FAST].predict(F), mine.predict(F))


def test_a_router_with_every_switch_set_round_trips_through_skops_with_no_new_type(tmp_path):
    """The strategies are looked up by name, never stored: the saved router names only
    types the export's allow-list already trusts, and decides the same once loaded."""
    import skops.io as sio

    from modeswitch.routers.export import allowed_types

    train = _with_content(synthetic_table(300, seed=9, fast_energy_above=400), 1)
    r = LinearCostRouter(feature_set="C", risk_score="margin", limit_risk="ratio", risk_calibration="family-held-out",
                         cost_features="log-shape", quality_rows="all", max_risk=0.45).fit(train)
    path = tmp_path / "router.skops"
    sio.dump(r, path)
    types = sio.get_untrusted_types(file=path)
    assert set(types) <= allowed_types()
    back = sio.load(path, trusted=types)
    test = _with_content(synthetic_table(100, seed=10, fast_energy_above=400), 2)
    assert list(back.predict(test)) == list(r.predict(test))
    assert back._risk_score_strategy is cs.RISK_SCORES["margin"] and back.loosest_threshold() == 0.5

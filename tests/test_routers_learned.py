"""Learned routers: estimator API, costs, splits, and a small tracked training run."""

import json

import numpy as np
import pandas as pd
import pytest
from sklearn.base import clone
from sklearn.utils.estimator_checks import check_estimator

from modeswitch.dataset.errors import InputError
from modeswitch.dataset.workloads import get_workload
from modeswitch.oracle.training_table import build_training_table, table_meta
from modeswitch.routers import get_router, learned_families
from modeswitch.routers.training.costs import cost_matrix, objective_metrics, regret_weights
from modeswitch.routers.training.splits import split_indices
from tests.helpers import synthetic_profile

REF = "fp16_baseline"
# Inherent to the wrapped models, not to the wrapper: tree min-leaf sizes, forest
# bootstraps and LightGBM's min_child_samples count rows, not weights; lbfgs stops
# at a tolerance. scikit-learn's own estimators behave the same with such settings.
EXPECTED = {
    "check_sample_weight_equivalence_on_dense_data":
        "min_samples_leaf / bootstrap / min_child_samples count rows, not weight",
}


#: small models, so the checks run fast
FAST = {"rf": {"n_estimators": 10}, "lgbm": {"n_estimators": 10}, "cost_lgbm": {"n_estimators": 10}}
#: what scikit-learn checks on an estimator whose fit needs the training table, not a 2-D
#: array (the cost-predicting routers read per-mode cost columns): the parameter API
TABLE_ONLY_CHECKS = ("check_estimator_cloneable", "check_estimator_repr", "check_no_attributes_set_in_init",
                     "check_parameters_default_constructible", "check_do_not_raise_errors_in_init_or_set_params",
                     "check_get_params_invariance", "check_set_params", "check_mixin_order",
                     "check_estimator_tags_renamed", "check_valid_tag_types")


def family_estimator_checks(family: str, expected_failures: dict | None = None) -> None:
    """scikit-learn's estimator checks on a registered learned family (plug-ins too);
    ``expected_failures``: check name -> why, besides :data:`EXPECTED`."""
    from sklearn.utils import estimator_checks
    from sklearn.utils._tags import get_tags

    est = get_router(family, **FAST.get(family, {}))
    if not get_tags(est).input_tags.two_d_array:
        for name in TABLE_ONLY_CHECKS:
            getattr(estimator_checks, name)(type(est).__name__, est)
        return
    expected = {**EXPECTED, **(expected_failures or {})}
    if family == "dt":
        expected["check_class_weight_classifiers"] = (
            "the study's depth-5 / min-leaf-3 defaults underfit the check's synthetic data")
    check_estimator(est, expected_failed_checks=expected)


@pytest.mark.parametrize("family", learned_families())
def test_scikit_learn_estimator_checks(family):
    family_estimator_checks(family)


def test_every_family_declares_each_parameter_once():
    """Keyword-only parameters, each declared by one class: a family's signature is its
    own parameters and its bases' (what get_params, clone and Optuna see)."""
    import inspect

    from modeswitch.routers.families.base import LearnedRouter
    from modeswitch.routers.registry import get_family

    for family in learned_families():
        cls = get_family(family).factory
        params = inspect.signature(cls).parameters
        assert all(p.kind is p.KEYWORD_ONLY for p in params.values()), family
        assert {"feature_set", "random_state"} <= set(params) and issubclass(cls, LearnedRouter)
        assert set(cls().get_params()) == set(params)
        with pytest.raises(TypeError):
            cls(no_such_parameter=1)


@pytest.fixture(scope="module")
def table():
    reqs = []
    for i, name in enumerate(["short_prompt_short_output", "short_prompt_long_output",
                              "long_prompt_short_output", "long_prompt_long_output",
                              "shared_prefix_chat", "batch_pressure"]):
        reqs += get_workload(name).sample(40, seed=i)
    return build_training_table(synthetic_profile(), reqs)


def test_training_table_has_labels_costs_and_provenance(table):
    meta = table_meta(table)
    assert set(meta["modes"]) >= {REF, "gptq_4bit", "prefix_caching"}
    assert meta["constraints"]["min_rouge_vs_baseline"] == 0.8
    assert {"label", "label_source", "latency_ms__gptq_4bit", "safe__gptq_4bit",
            "violates_quality__gptq_4bit", "log_prompt_tokens", "family"} <= set(table.columns)
    assert set(table.loc[table["family"] == "shared_prefix_chat", "label"]) == {"prefix_caching"}
    assert set(table.loc[table["family"] == "long_prompt_long_output", "label"]) == {"speculative_decoding"}
    # the features vary inside a family (the study's did not)
    assert table.groupby("family")["prompt_tokens"].nunique().min() > 10


def test_costs_and_regret_weights(table):
    modes = table_meta(table)["modes"]
    c = cost_matrix(table, modes, unsafe_penalty=2.0)
    lab = [modes.index(x) for x in table["label"]]
    assert np.allclose(c[np.arange(len(table)), lab], 0)  # the oracle's pick costs nothing
    unsafe = ~table[[f"safe__{m}" for m in modes]].fillna(False).to_numpy(bool)
    assert (c[unsafe] >= 2.0).all()
    w = regret_weights(table, modes)
    assert w.mean() == pytest.approx(1.0) and (w > 0).all()
    ev = objective_metrics(table, table["label"], modes)
    assert ev["oracle_match"] == 1 and ev["objective"] == pytest.approx(0) and ev["violation_rate_any"] == 0
    bad = objective_metrics(table, ["gptq_4bit"] * len(table), modes)
    assert bad["violation_rate_quality"] > 0 and bad["objective"] > 0


def test_the_capture_objective_weighs_milliseconds_and_the_regret_objective_requests():
    """Two requests, one short and one long; a safe fast mode saves 50 % on either.
    Missing the saving on the short one costs as much mean regret as on the long one,
    but 1/11 of the pooled capture: the two objectives rank the picks apart."""
    modes = [REF, "fast"]
    table = pd.DataFrame({
        "request_id": ["short", "long"], "family": ["f", "f"], "label": ["fast", "fast"],
        f"latency_ms__{REF}": [20.0, 200.0], "latency_ms__fast": [10.0, 100.0],
        f"safe__{REF}": [True, True], "safe__fast": [True, True],
        **{f"violates_{k}__{m}": [False, False] for k in ("quality", "energy", "memory") for m in modes},
    })
    miss_short, miss_long = [REF, "fast"], ["fast", REF]
    regret = [objective_metrics(table, p, modes)["objective"] for p in (miss_short, miss_long)]
    capture = [objective_metrics(table, p, modes, objective="capture") for p in (miss_short, miss_long)]
    assert regret[0] == pytest.approx(regret[1]) == pytest.approx(0.5)
    assert capture[0]["capture"] == pytest.approx(100 / 110) and capture[1]["capture"] == pytest.approx(10 / 110)
    assert capture[0]["objective"] < capture[1]["objective"]
    # an unsafe pick pays the penalty on top of what it saves; the overhead is paid per request
    table.loc[0, "safe__fast"] = False
    hurt = objective_metrics(table, ["fast", "fast"], modes, unsafe_penalty=2.0, objective="capture")
    assert hurt["objective"] == pytest.approx(0 + 2.0 * 0.5)
    paid = objective_metrics(table, ["fast", "fast"], modes, overhead_ms=1.0, objective="capture")
    assert paid["capture"] == pytest.approx((110 - 2) / 110)
    with pytest.raises(InputError, match="tuning objective 'speed'"):
        objective_metrics(table, ["fast", "fast"], modes, objective="speed")


def test_the_decision_cost_counts_against_each_request_latency(table):
    modes = table_meta(table)["modes"]
    free = objective_metrics(table, table["label"], modes)
    paid = objective_metrics(table, table["label"], modes, overhead_ms=5.0)
    best = np.array([table[f"latency_ms__{m}"].iloc[i] for i, m in enumerate(table["label"])])
    assert free["decision_cost"] == 0 and paid["decision_cost"] == pytest.approx(np.mean(5.0 / best))
    assert paid["objective"] == pytest.approx(free["objective"] + paid["decision_cost"])


def test_tuning_scores_the_served_decision_and_its_cost(table, tmp_path, monkeypatch):
    """Each fold model is scored on what it serves, its measured decision cost included:
    made absurdly dear in proportion to the tree's depth, the cheapest depth tried wins."""
    import optuna

    from modeswitch.routers.training import served, trainer
    from modeswitch.routers.training.table import TrainingTable

    picks, p50_ms = served.served_decision(get_router("dt", feature_set="A").fit(table, table["label"].astype(str)),
                                           table.iloc[:50], decisions=200)
    assert len(picks) == 50 and 0 < p50_ms < 1.0  # compiled: well under a millisecond

    monkeypatch.setattr(trainer, "served_decision",
                        lambda est, valid: (est.predict(valid), 1e6 * est.max_depth))
    cfg = trainer.TrainConfig(routers=["dt"], trials=6, split="random", mlruns=str(tmp_path / "m"))
    data = TrainingTable.of(table)
    study = trainer.tune("dt", cfg, data, np.arange(len(table)), "served-cost")
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert study.best_params["max_depth"] == min(t.params["max_depth"] for t in done)
    assert all("decision_p50_us" in t.user_attrs for t in done)


def test_group_splits_never_leak_families(table):
    for split in ("group", "lofo"):
        for tr, te in split_indices(table, split):
            assert not set(table["family"].iloc[tr]) & set(table["family"].iloc[te])
    (tr, te), = split_indices(table, "random")
    assert len(te) == pytest.approx(0.25 * len(table), abs=2)
    assert len(split_indices(table, "lofo")) == table["family"].nunique()


def test_routers_learn_the_table_and_safety_guard_falls_back(table):
    X, y = table, table["label"].astype(str)
    dt = get_router("dt", feature_set="B", max_depth=8).fit(X, y)
    assert (dt.predict(X) == y).mean() > 0.9
    safe = pd.DataFrame({m: table[f"safe__{m}"].fillna(False).astype(bool) for m in table_meta(table)["modes"]})
    guarded = clone(dt).set_params(safety_threshold=1.01, fallback="reference").fit(X, y, safe=safe)
    pred, fell = guarded.predict_with_fallback(X)
    assert fell.all() and set(pred) == {REF}
    ruled = clone(dt).set_params(safety_threshold=0.5, fallback="rule").fit(X, y, safe=safe)
    pred, fell = ruled.predict_with_fallback(X)
    assert not fell.all()


def test_small_tracked_training_run(table, tmp_path):
    import mlflow

    from modeswitch.routers.training.trainer import TrainConfig, train

    cfg = TrainConfig(routers=["dt", "lgbm"], trials=4, split="group", mlruns=str(tmp_path / "mlruns"))
    res = train(table, cfg)
    assert list(res["router"]) == ["dt", "lgbm"]
    assert (res["test_oracle_match"].between(0, 1)).all() and res["rule_oracle_match"].notna().all()
    client = mlflow.MlflowClient()
    for r in res.itertuples():
        run = client.get_run(r.run_id)
        assert run.data.tags["split"] == "group" and "profile_hash" in run.data.tags
        assert "test_violation_rate_quality" in run.data.metrics
        children = client.search_runs([run.info.experiment_id],
                                      filter_string=f"tags.mlflow.parentRunId = '{r.run_id}'")
        assert len(children) == 4
        arts = {a.path for a in client.list_artifacts(r.run_id, "plots")}
        assert f"plots/confusion_matrix_{r.router}.png" in arts
        model = mlflow.sklearn.load_model(r.model_uri)
        assert len(model.predict(table.head(5))) == 5
    # everything stayed under the chosen mlruns folder
    assert (tmp_path / "mlruns" / "mlflow.db").exists() and (tmp_path / "mlruns" / "optuna.db").exists()
    assert any((tmp_path / "mlruns" / "artifacts").rglob("*.png"))


def test_paper_preset(table, tmp_path):
    from modeswitch.routers.training.trainer import TrainConfig, train

    res = train(table, TrainConfig(routers=["dt"], preset="modeswitch-paper", trials=0,
                                   mlruns=str(tmp_path / "m")))
    assert res["split"].item() == "random" and res["feature_set"].item() == "B"
    params = json.loads(res["params"].item())
    assert params == {"max_depth": 5, "min_samples_leaf": 3, "class_weight": "balanced"}


def test_a_failed_training_run_is_marked_failed_with_its_reason(tmp_path, monkeypatch):
    import mlflow

    import modeswitch.routers.training.trainer as trainer
    from modeswitch.dataset.workloads import get_workload
    from modeswitch.oracle.training_table import build_training_table
    from modeswitch.routers.training.tracking import tracking_uri
    from modeswitch.routers.training.trainer import TrainConfig, train
    from tests.helpers import synthetic_profile

    reqs = [r for i, n in enumerate(["short_prompt_short_output", "batch_pressure"])
            for r in get_workload(n).sample(20, seed=i)]
    table = build_training_table(synthetic_profile(), reqs)

    def broken(*a, **k):
        raise RuntimeError("disk full")

    monkeypatch.setattr(trainer, "_log_model", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        train(table, TrainConfig(routers=["dt"], trials=1, split="random", mlruns=str(tmp_path / "m")))
    client = mlflow.MlflowClient(tracking_uri(tmp_path / "m"))
    exp = [e for e in client.search_experiments() if e.name.startswith("modeswitch-train")][0]
    [run] = [r for r in client.search_runs([exp.experiment_id]) if "mlflow.parentRunId" not in r.data.tags]
    assert run.info.status == "FAILED" and run.data.tags["failure_reason"] == "RuntimeError: disk full"


def test_the_training_table_names_what_training_and_scoring_read(table):
    from modeswitch.routers.training.table import TrainingTable

    tt = TrainingTable.of(table)
    modes = table_meta(table)["modes"]
    assert tt.modes == modes and len(tt) == len(table)
    assert list(tt.labels) == list(table["label"].astype(str))
    assert list(tt.safe.columns) == modes and tt.safe.dtypes.eq(bool).all()
    assert list(tt.costs("latency_ms").columns) == modes
    assert "label" not in tt.feature_columns and not any("__" in c for c in tt.feature_columns)
    assert {"prompt_tokens", "family"} <= set(tt.feature_columns)
    (tr, te), = tt.folds("random")
    part = tt.rows(te)
    assert len(part) == len(te) and part.meta == tt.meta and part.hash != tt.hash
    est = tt.fit(get_router("dt"), tr)
    assert set(est.predict(part.frame)) <= set(modes)
    again = tt.refit(est, tr)
    assert again is not est and list(again.predict(part.frame)) == list(est.predict(part.frame))


def test_tuning_tries_the_family_defaults_first_once(table, tmp_path, monkeypatch):
    """A study's first trial is the family's own defaults (routers.training.first_trial),
    so a few random start-up draws cannot lose them; resumed with more trials, the
    defaults are not tried again."""
    import optuna

    from modeswitch.routers.training import trainer
    from modeswitch.routers.training.first_trial import default_trial
    from modeswitch.routers.training.table import TrainingTable

    expected = {"max_depth": 5, "min_samples_leaf": 3, "criterion": "gini", "class_weight": None,
                "regret_weights": False}
    assert default_trial("dt") == expected
    monkeypatch.setattr(trainer, "served_decision", lambda est, valid: (est.predict(valid), 0.0))
    data = TrainingTable.of(table)
    cfg = trainer.TrainConfig(routers=["dt"], trials=2, split="random", mlruns=str(tmp_path / "m"))
    study = trainer.tune("dt", cfg, data, np.arange(len(table)), "defaults-first")
    assert study.trials[0].params == expected
    assert study.trials[1].params != expected
    cfg = trainer.TrainConfig(routers=["dt"], trials=4, split="random", mlruns=str(tmp_path / "m"))
    study = trainer.tune("dt", cfg, data, np.arange(len(table)), "defaults-first")
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(done) == 4 and sum(t.params == expected for t in done) == 1



def test_a_grown_search_space_starts_from_the_old_best(table, tmp_path, monkeypatch):
    """A study under a new search space (a new ``search_space_version``) tries the
    defaults first and then the best of the same study under the earlier space, its new
    parameters at their defaults (routers.training.first_trial.carried_trial); a study
    that already ran is not seeded again."""
    import optuna

    from modeswitch.routers.registry import get_family
    from modeswitch.routers.training import trainer
    from modeswitch.routers.training.first_trial import carried_trial, default_trial
    from modeswitch.routers.training.table import TrainingTable

    monkeypatch.setattr(trainer, "served_decision", lambda est, valid: (est.predict(valid), 0.0))
    data = TrainingTable.of(table)
    cfg = trainer.TrainConfig(routers=["dt"], trials=4, split="random", mlruns=str(tmp_path / "m"))
    url = f"sqlite:///{(tmp_path / 'm').resolve() / 'optuna.db'}"
    (tmp_path / "m").mkdir()
    # the earlier space's study: its best a trial the new space's first draws would not make
    best = {"max_depth": 7, "min_samples_leaf": 9, "criterion": "entropy", "class_weight": "balanced",
            "regret_weights": True}
    old = optuna.create_study(study_name="space-v1", storage=url)
    trial = optuna.create_study().ask()  # the space's distributions
    get_family("dt").factory.search_space(trial)
    trial.suggest_categorical("regret_weights", [False, True])
    dists = trial.distributions
    for value, params in ((0.5, default_trial("dt")), (0.1, best)):
        old.add_trial(optuna.trial.create_trial(params=params, distributions=dists, value=value))
    # what the earlier best becomes: its own values, anything outside the space now dropped
    assert carried_trial("dt", best) == best
    assert carried_trial("dt", {**best, "max_depth": 10_000, "gone": 1}) == {
        **best, "max_depth": default_trial("dt")["max_depth"]}
    new = trainer.tune("dt", cfg, data, np.arange(len(table)), "space-v2", earlier=["space-v0", "space-v1"])
    assert new.trials[0].params == default_trial("dt") and new.trials[1].params == best
    again = trainer.TrainConfig(routers=["dt"], trials=6, split="random", mlruns=str(tmp_path / "m"))
    resumed = trainer.tune("dt", again, data, np.arange(len(table)), "space-v2", earlier=["space-v1"])
    finished = [t for t in resumed.trials if t.state.is_finished()]
    assert len(finished) == 6 and sum(t.params == best for t in finished) == 1  # not seeded again
    # a study with no earlier space is seeded with the defaults alone
    fresh = trainer.tune("dt", cfg, data, np.arange(len(table)), "no-earlier", earlier=["absent"])
    assert fresh.trials[0].params == default_trial("dt") and fresh.trials[1].params != best
    assert trainer._tuning_key("cost_lgbm", cfg, 1) == trainer._tuning_key("dt", cfg) == ""


def test_leave_one_family_out_tunes_each_fold_without_its_family(table, tmp_path, monkeypatch):
    """``lofo_tuning="nested"`` (the default): one Optuna study per fold, on its training
    families only, so no held-out family's outcomes choose its own parameters; every
    fold's parameters are logged (``fold_params.json``) and the score step refits each
    fold with its own. ``pooled``: one study on every row."""
    import mlflow

    from modeswitch.routers.scoring.run import _tuning_said, held_out_family_routers, load_routers
    from modeswitch.routers.training import trainer
    from modeswitch.routers.training.table import TrainingTable
    from modeswitch.routers.training.tracking import FOLD_PARAMS

    monkeypatch.setattr(trainer, "served_decision", lambda est, valid: (est.predict(valid), 0.0))
    tuned_on = {}
    real_tune = trainer.tune

    def recording_tune(family, cfg, data, train_idx, study_name, *args, **kwargs):
        tuned_on[study_name] = set(data.frame["family"].iloc[train_idx])
        return real_tune(family, cfg, data, train_idx, study_name, *args, **kwargs)

    monkeypatch.setattr(trainer, "tune", recording_tune)
    families = set(table["family"])
    cfg = trainer.TrainConfig(routers=["dt"], trials=3, split="lofo", mlruns=str(tmp_path / "m"))
    assert cfg.lofo_tuning == "nested"
    res = trainer.train(table, cfg)
    assert len(tuned_on) == len(families)
    for name, seen in tuned_on.items():
        held_out = name.partition("-without-")[2]
        assert held_out in families and seen == families - {held_out}, name
    run_id = res["run_id"].item()
    folds = mlflow.artifacts.load_dict(f"runs:/{run_id}/{FOLD_PARAMS}")
    assert set(folds) == families
    assert mlflow.MlflowClient().get_run(run_id).data.params["lofo_tuning"] == "nested"
    # the score step refits every fold with the parameters its own study chose
    trained = load_routers(table, str(tmp_path / "m"), [run_id])
    assert trained[0].fold_params == folds
    assert "dt: one Optuna study per fold" in _tuning_said(trained)  # the report's header says so
    refits = held_out_family_routers(TrainingTable.of(table), trained)["dt"].by_family
    for fam, fold in folds.items():
        got = refits[fam].get_params()
        assert {k: got[k] for k in fold["params"]} == fold["params"], fam
    assert len({json.dumps(f["params"], sort_keys=True) for f in folds.values()}) > 1  # they differ

    tuned_on.clear()
    pooled = trainer.TrainConfig(routers=["dt"], trials=3, split="lofo", lofo_tuning="pooled",
                                 mlruns=str(tmp_path / "p"))
    run_id = trainer.train(table, pooled)["run_id"].item()
    assert list(tuned_on.values()) == [families]
    trained = load_routers(table, str(tmp_path / "p"), [run_id])
    assert trained[0].fold_params is None and "(pooled)" in _tuning_said(trained)
    with pytest.raises(InputError, match="--lofo-tuning 'inner'"):
        trainer.TrainConfig(lofo_tuning="inner")


def test_a_refit_takes_a_folds_own_parameters_certified_or_not(table):
    """``TrainingTable.refit(..., params=)``: the clone gets the fold's parameters; on a
    certified router they go to the router it certifies."""
    from modeswitch.routers.certified import CertifiedRouter
    from modeswitch.routers.training.table import TrainingTable

    data = TrainingTable.of(table)
    rows = np.arange(len(table))
    plain = data.fit(get_router("dt", max_depth=3), rows)
    assert data.refit(plain, rows, params={"max_depth": 2}).get_params()["max_depth"] == 2
    assert plain.get_params()["max_depth"] == 3  # the fitted router is left as it was
    cert = CertifiedRouter(get_router("cost_linear", max_risk=0.2), target_violation_rate=0.05)
    refit = data.refit(cert, rows, params={"max_risk": 0.1})
    assert refit.router.max_risk == 0.1 and cert.router.max_risk == 0.2

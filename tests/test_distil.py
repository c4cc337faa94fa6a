"""A slow tree ensemble distilled into one tree (routers.compiler.distil): it keeps
the ensemble's decision on every training row, its agreement elsewhere is measured,
and the overhead report says so."""

import numpy as np
import pytest

from modeswitch.dataset.features import features_frame
from modeswitch.dataset.workloads import get_workload
from modeswitch.oracle.training_table import build_training_table
from modeswitch.routers import get_router
from modeswitch.routers.compiler import compile
from modeswitch.routers.compiler.router import DISTIL_WALKED_TREES
from modeswitch.routers.families.cost import LightGBMCostRouter
from modeswitch.routers.scoring import overhead
from tests.helpers import synthetic_profile
from tests.test_cost_routers import synthetic_table

FAMILIES = ["short_prompt_short_output", "long_prompt_short_output", "shared_prefix_chat", "batch_pressure"]


@pytest.fixture(scope="module")
def data():
    reqs = [r for i, n in enumerate(FAMILIES) for r in get_workload(n).sample(60, seed=i)]
    held = [r for i, n in enumerate(FAMILIES) for r in get_workload(n).sample(25, seed=40 + i)]
    table = build_training_table(synthetic_profile(), reqs)
    est = get_router("lgbm", feature_set="B", n_estimators=40).fit(table, table["label"].astype(str))
    return table, held, est


def test_an_ensemble_that_walks_many_trees_is_distilled_and_keeps_its_training_decisions(data):
    _, held, est = data
    # no region tree: every decision would walk the whole ensemble
    exact = compile(est, region_budget=(0, 0), distil="never")
    fast = compile(est, region_budget=(0, 0))
    kept = fast.distilled_
    assert exact.distilled_ is None and exact.size_["trees"] > DISTIL_WALKED_TREES
    assert kept is not None and kept.source_trees == exact.size_["trees"] and fast.size_["trees"] == 1
    M = np.ascontiguousarray(est.X_sample_, dtype=np.float64)
    np.testing.assert_array_equal(fast.predict_matrix(M), exact.predict_matrix(M))
    assert kept.agreement_train == 1.0
    assert 0.5 < kept.agreement_synthetic <= 1.0 and "agreement" in kept.describe()
    # the single-decision path (generated Python) answers as the batch path
    X = features_frame(held, "B")
    assert [fast.route(r) for r in held] == list(fast.predict(X))
    assert fast.source_code.startswith("def route(r):")


def test_a_model_the_region_tree_decides_or_a_lone_tree_is_kept_exact(data):
    table, held, est = data
    dt = get_router("dt", feature_set="B").fit(table, table["label"].astype(str))
    assert compile(dt).distilled_ is None
    assert compile(est, distil="never").distilled_ is None
    X = features_frame(held, "B")
    assert list(compile(dt).predict(X)) == list(dt.predict(X))
    with pytest.raises(ValueError, match="distil 'sometimes'"):
        compile(est, distil="sometimes")


def test_a_cost_router_is_distilled_with_its_certified_decision():
    r = LightGBMCostRouter(max_risk=0.3).fit(synthetic_table(600, seed=7))
    exact = r.compile(region_budget=(0, 0), distil="never")
    fast = r.compile(region_budget=(0, 0))
    assert fast.distilled_ is not None and fast.distilled_.agreement_train == 1.0
    M = np.ascontiguousarray(r.X_sample_, dtype=np.float64)
    np.testing.assert_array_equal(fast.predict_matrix(M), exact.predict_matrix(M))
    test = synthetic_table(300, seed=8)
    assert (fast.predict(test) == r.predict(test)).mean() > 0.9


def test_the_overhead_table_reports_size_agreement_and_distillation(data, monkeypatch):
    from modeswitch.routers.compiler import router as compiler_router

    _, held, est = data
    dt = get_router("dt", feature_set="B").fit(data[0], data[0]["label"].astype(str))
    monkeypatch.setattr(compiler_router, "DISTIL_WALKED_TREES", -1)  # distil any ensemble
    got = overhead.measure({"lgbm": est, "dt": dt}, held, decisions=200)
    lg, t = got["lgbm"], got["dt"]
    assert lg.path == "compiled (distilled)" and lg.trees == 1 and "distilled from" in lg.distilled
    assert 0.5 < lg.agreement <= 1.0
    assert t.path == "compiled" and t.agreement == 1.0 and t.distilled == "" and t.trees == 1 and t.nodes > 1
    assert t.outputs == len(dt.classes_)


def test_a_certified_cost_router_certifies_the_tree_it_serves(monkeypatch):
    """The certificate counts the violations of the tree served at each threshold, so it
    covers what is served: the calibration's count is the served tree's own."""
    from modeswitch.routers import served_tree
    from modeswitch.routers.certified import CertifiedRouter
    from modeswitch.routers.risk_control import calibration_split
    from tests.test_cost_routers import REF

    monkeypatch.setattr(served_tree, "DISTIL_WALKED_TREES", -1)  # distil whatever it walks
    X = synthetic_table(900, seed=7)
    r = CertifiedRouter(LightGBMCostRouter(max_risk=0.3), target_violation_rate=0.05).fit(X)
    assert r.threshold_ is not None and r.served_tree_ is not None
    assert r.distilled_["agreement_train"] == 1.0 and 0.5 < r.distilled_["agreement_calibration"] <= 1.0
    _, cal = calibration_split(len(X), r.calibration_share, r.random_state, X["family"].astype(str).to_numpy(),
                               alpha=0.05, delta=r.delta)
    picks = r.predict(X.iloc[cal])
    unsafe = [p != REF and not X[f"safe__{p}"].iloc[i] for p, i in zip(picks, cal)]
    assert sum(unsafe) == r.calibration_["violations"]
    fast = r.compile()
    assert fast.distilled_ is not None and fast.size_["trees"] == 1
    test = synthetic_table(300, seed=8)
    assert list(fast.predict(test)) == list(r.predict(test))
    exact = CertifiedRouter(LightGBMCostRouter(max_risk=0.3), target_violation_rate=0.05, served_tree="never").fit(X)
    assert exact.served_tree_ is None and exact.compile().distilled_ is None
    assert list(exact.compile().predict(test)) == list(exact.predict(test))

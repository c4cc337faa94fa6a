"""Compiled routers predict exactly what the original routers predict."""

import copy

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from modeswitch.dataset.features import features_frame
from modeswitch.dataset.requests import Request
from modeswitch.dataset.workloads import get_workload
from modeswitch.oracle.training_table import build_training_table
from modeswitch.routers import get_router
from modeswitch.routers.compiler import compile
from tests.helpers import synthetic_profile

FAMILIES = ["short_prompt_short_output", "short_prompt_long_output", "long_prompt_short_output",
            "long_prompt_long_output", "shared_prefix_chat", "batch_pressure"]


@pytest.fixture(scope="module")
def data():
    reqs = [r for i, n in enumerate(FAMILIES) for r in get_workload(n).sample(50, seed=i)]
    held = [r for i, n in enumerate(FAMILIES) for r in get_workload(n).sample(30, seed=50 + i)]
    return build_training_table(synthetic_profile(), reqs), held


@pytest.fixture(scope="module")
def fitted(data):
    table, _ = data
    y = table["label"].astype(str)
    out = {}
    for fs in "AB":
        for fam, kw in (("dt", {}), ("rf", {"n_estimators": 40}), ("lr", {}), ("lgbm", {"n_estimators": 30})):
            est = get_router(fam, feature_set=fs, class_weight="balanced", **kw).fit(table, y)
            out[(fam, fs)] = (est, compile(est, distil="never"))
    return out


KEYS = [(f, s) for s in "AB" for f in ("dt", "rf", "lr", "lgbm")]


@pytest.mark.parametrize("key", KEYS)
def test_equal_on_every_held_out_row(fitted, data, key):
    est, comp = fitted[key]
    _, held = data
    X = features_frame(held, key[1])
    assert list(comp.predict(X)) == list(est.predict(X))
    assert [comp.route(r) for r in held] == list(est.predict(X))
    assert list(comp.classes_) == list(est.classes_)


requests = st.builds(
    Request,
    id=st.just("h"),
    prompt_tokens=st.one_of(st.integers(0, 8192), st.sampled_from([0, 1, 128, 384, 768, 1024])),
    expected_output_tokens=st.one_of(st.integers(1, 2048), st.sampled_from([1, 8, 16, 32, 64, 128])),
    shared_prefix_tokens=st.sampled_from([0, 0, 0, 1, 512, 1024]),
    concurrent_requests=st.integers(1, 64),
    memory_pressure=st.sampled_from([0.0, 0.0, 0.25, 0.5, 0.99]),
    family=st.sampled_from(FAMILIES + [None, "never_seen_family"]),
    benchmark_suite=st.sampled_from([None, "gsm8k", "unseen_suite"]),
)


@pytest.mark.parametrize("key", KEYS)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(req=requests)
def test_equal_on_random_requests_including_edges_and_unseen_categories(fitted, key, req):
    est, comp = fitted[key]
    X = features_frame([req], key[1])
    want = est.predict(X)[0]
    got = comp.route(req)
    if key[0] == "lr" and got != want:
        # the scaling is folded into the weights, so a near-tie may round the other way
        p = np.sort(est.predict_proba(X)[0])
        assert p[-1] - p[-2] < 1e-9
    else:
        assert got == want


def test_safety_guarded_routers_are_refused(data):
    table, _ = data
    safe = {m: table[f"safe__{m}"].fillna(False) for m in ("fp16_baseline",)}
    est = get_router("dt", safety_threshold=0.5, fallback="reference").fit(
        table, table["label"].astype(str), safe=__import__("pandas").DataFrame(safe))
    with pytest.raises(ValueError, match="safety guard"):
        compile(est, distil="never")


@settings(max_examples=300, deadline=None)
@given(t=st.floats(-1e6, 1e6, allow_nan=False), dx=st.integers(-3, 3))
def test_float32_boundary_reproduces_float32_comparisons(t, dx):
    from modeswitch.routers.compiler.codegen import float32_boundary

    b, inclusive = float32_boundary(t)
    x = b
    for _ in range(abs(dx)):
        x = np.nextafter(x, np.inf if dx > 0 else -np.inf)
    x = float(x)
    assert (float(np.float32(x)) <= t) == (x <= b if inclusive else x < b)


# ---------------------------------------------------------------- region trees and walks
TREES = [(f, s) for s in "AB" for f in ("dt", "rf", "lgbm")]
BUDGETS = {"full": None, "tiny": (48, 10**9), "walk only": (0, 0)}


def _random_inputs(comp, rng, n=400):
    """Feature rows as the kernel takes them: numbers drawn around and beyond the
    training range, derived columns sometimes inconsistent with the raw ones, one-hot
    columns sometimes not one-hot at all (several set, 0.5)."""
    M = np.empty((n, comp.n_features))
    M[:, : comp.n_num] = rng.choice([0, 1, 16, 128, 700, 1500, 4096, 9000], size=(n, comp.n_num)) * \
        rng.uniform(0.5, 1.5, size=(n, comp.n_num))
    consistent = rng.random(n) < 0.5
    p, o = M[:, 0], M[:, 1]
    if comp.n_num > 4:
        M[consistent, 2] = o[consistent] / np.maximum(p[consistent], 1)
        M[consistent, 3] = np.log1p(p[consistent])
        M[consistent, 4] = np.log1p(o[consistent])
    cats = comp.n_features - comp.n_num
    if cats:
        M[:, comp.n_num:] = 0.0
        pick = rng.integers(-1, cats, size=n)
        for i, j in enumerate(pick):
            if j >= 0:
                M[i, comp.n_num + j] = 1.0
        odd = rng.random(n) < 0.1
        M[odd, comp.n_num:] = rng.choice([0.0, 0.5, 1.0], size=(odd.sum(), cats))
    return M


@pytest.mark.parametrize("budget", list(BUDGETS))
@pytest.mark.parametrize("key", TREES)
def test_region_tree_and_walk_equal_the_model_on_any_input(fitted, key, budget):
    est, _ = fitted[key]
    comp = compile(est, region_budget=BUDGETS[budget], distil="never")
    if budget == "walk only":
        assert comp.region_nodes_ == 0
    else:
        assert comp.region_nodes_ > 0
    clf = est.pipeline_.named_steps["clf"]
    for seed in range(3):
        M = _random_inputs(comp, np.random.default_rng(seed))
        assert list(comp.classes_[comp.predict_matrix(M)]) == list(clf.predict(M)), seed


def test_region_budget_splits_decisions_between_region_and_walk(fitted, data):
    est, _ = fitted[("rf", "B")]
    _, held = data
    X = features_frame(held, "B")
    full, tiny = compile(est, distil="never"), compile(est, region_budget=(48, 10**9), distil="never")
    assert 0.0 <= tiny.region_share(X) < full.region_share(X) <= 1.0
    # the smaller budget leaves more of the bin grid to the tree walk
    assert 0.0 <= full.region_walk_share_ < tiny.region_walk_share_ <= 1.0
    assert list(tiny.predict(X)) == list(full.predict(X)) == list(est.predict(X))
    # without the training sample the budget is spent by volume; still exact (on a copy:
    # the fitted routers are shared by the module's tests)
    blind_est = copy.deepcopy(est)
    del blind_est.X_sample_
    blind = compile(blind_est, distil="never")
    assert [blind.route(r) for r in held] == list(est.predict(X))


def test_training_sample_is_kept_in_the_kernels_layout(fitted, data):
    table, _ = data
    for key in TREES:
        est, comp = fitted[key]
        assert est.X_sample_.shape == (min(len(table), est.sample_rows), comp.n_features)


def test_released_routers_free_their_kernel_slots(fitted, data):
    import gc

    from modeswitch.routers.compiler import library

    est, _ = fitted[("lgbm", "B")]
    _, held = data
    lib = library()
    gc.collect()
    before = lib.models_alive()
    routes = [compile(est, region_budget=(256, 10**8), distil="never").route for _ in range(5)]
    assert lib.models_alive() == before + 5
    want = list(est.predict(features_frame(held, "B")))
    del routes
    gc.collect()
    assert lib.models_alive() == before
    again = compile(est, distil="never")  # reuses a freed slot
    assert [again.route(r) for r in held] == want


@pytest.mark.parametrize("fam", ["dt", "rf", "lgbm", "lr"])
def test_two_modes_compile_exactly(data, fam):
    """Binary problems: LightGBM and logistic regression keep one score, not two."""
    table, held = data
    y = table["label"].astype(str)
    top = y.value_counts().index[:2]
    sub, ysub = table[y.isin(top)], y[y.isin(top)]
    kw = {"rf": {"n_estimators": 30}, "lgbm": {"n_estimators": 30}}.get(fam, {})
    est = get_router(fam, feature_set="B", **kw).fit(sub, ysub)
    X = features_frame(held, "B")
    for budget in (None, (0, 0)):
        comp = compile(est, region_budget=budget, distil="never")
        assert [comp.route(r) for r in held] == list(est.predict(X))
        M = _random_inputs(comp, np.random.default_rng(7))
        if fam != "lr":
            assert list(comp.classes_[comp.predict_matrix(M)]) == \
                list(est.pipeline_.named_steps["clf"].predict(M))

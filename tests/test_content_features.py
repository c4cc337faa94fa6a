"""Content features (dataset.content_features, engine.content_table) and the routers
that read them (feature set C): the arithmetic, the table made from a real
checkpoint, a decision that shape features cannot make, and the compiled, exported
and served paths deciding alike."""

import dataclasses

import numpy as np
import pytest

from modeswitch.dataset.content_features import (
    CONTENT_FEATURES,
    SHARE_TOKENS,
    TAIL_TOKENS,
    ContentTable,
    token_flags,
)
from modeswitch.dataset.errors import InputError
from modeswitch.dataset.features import (
    FEATURE_SETS,
    feature_columns,
    features_frame,
    register_feature_set,
)
from modeswitch.dataset.requests import Request

REF, QUANT = "fp16_baseline", "int8_quant"


def test_features_are_shares_over_the_prompt_end_and_an_embedding_mean_over_its_tail():
    rng = np.random.default_rng(0)
    rows = np.hstack([rng.integers(0, 2, (50, 3)).astype(float), rng.normal(size=(50, 8))])
    table = ContentTable("m", rows)
    ids = list(rng.integers(0, 50, 400))
    got = table.features(ids)
    assert got.shape == (len(CONTENT_FEATURES),)
    np.testing.assert_allclose(got[:3], rows[ids[-SHARE_TOKENS:], :3].mean(axis=0))
    np.testing.assert_allclose(got[3:], rows[ids[-TAIL_TOKENS:], 3:].mean(axis=0))
    np.testing.assert_allclose(table.features(tuple(ids)), got)  # a tuple (the request's field) reads alike
    assert not table.features([]).any()
    with pytest.raises(ValueError, match="token id 50 is outside m's vocabulary of 50"):
        table.features([1, 50])
    with pytest.raises(ValueError, match="token id -1 is negative"):
        table.features([1, -1])
    assert token_flags("x = 1") == (1.0, 1.0, 0.0) and token_flags("naïve") == (0.0, 0.0, 1.0)


def test_feature_sets_are_registered_by_name_with_shape_first():
    assert feature_columns("C")[: len(FEATURE_SETS["A"])] == FEATURE_SETS["A"]
    with pytest.raises(InputError, match="unknown feature set 'Z'"):
        feature_columns("Z")
    with pytest.raises(ValueError, match="must start with feature set A"):
        register_feature_set("bad", ("digit_share",))
    with pytest.raises(ValueError, match="registered already"):
        register_feature_set("C", FEATURE_SETS["A"])
    req = Request(id="r", prompt_tokens=10, expected_output_tokens=4)
    with pytest.raises(InputError, match="carries none"):
        features_frame([req], "C", content=ContentTable("m", np.zeros((5, len(CONTENT_FEATURES)))))


@pytest.fixture(scope="module")
def content(tiny_models, tmp_path_factory):
    """The tiny model's content table, made from its checkpoint into a fresh cache."""
    import os

    from modeswitch.engine import content_table as ct

    old = os.environ.get("MODESWITCH_CACHE")
    os.environ["MODESWITCH_CACHE"] = str(tmp_path_factory.mktemp("content-cache"))
    try:
        ct.content_table.cache_clear()
        table = ct.content_table(str(tiny_models.target))
        yield table
    finally:
        ct.content_table.cache_clear()
        if old is None:
            os.environ.pop("MODESWITCH_CACHE", None)
        else:
            os.environ["MODESWITCH_CACHE"] = old


def test_the_table_is_made_from_the_checkpoint_and_cached(content, tiny_models):
    from transformers import AutoTokenizer

    from modeswitch.engine.content_table import content_table, input_embeddings

    tok = AutoTokenizer.from_pretrained(str(tiny_models.target))
    emb = input_embeddings(tiny_models.target)
    assert content.rows.shape == (emb.shape[0], len(CONTENT_FEATURES))
    seven = tok("7", add_special_tokens=False)["input_ids"]
    assert content.rows[seven, 0].all()  # a digit's token is flagged a digit
    pcs = content.rows[:, 3:]
    assert np.allclose(pcs.mean(axis=0), 0, atol=1e-6)  # centred projections ...
    assert (np.diff(pcs.var(axis=0)) <= 1e-9).all()  # ... on directions of falling variance
    again = content_table.__wrapped__(str(tiny_models.target))  # read back from the cache file
    np.testing.assert_array_equal(again.rows, content.rows)


def _table(content, n=240, seed=0):
    """Requests of one shape whose prompts differ only in content: int8 is 0.6x the
    reference's latency but fails quality on digit-heavy prompts (arithmetic), so only a
    router that reads the prompt can tell where it pays."""
    from modeswitch.oracle.content_columns import TOKEN_IDS

    rng = np.random.default_rng(seed)
    digits = np.flatnonzero(content.rows[:, 0] == 1)
    words = np.flatnonzero(content.rows[:, :3].sum(axis=1) == 0)
    reqs, heavy = [], []
    for i in range(n):
        is_heavy = i % 2 == 0
        pool = [digits, words] if is_heavy else [words]
        ids = tuple(int(rng.choice(rng.choice(np.array(pool, dtype=object)))) for _ in range(120))
        reqs.append(Request(id=f"r{i}", prompt_tokens=120, expected_output_tokens=16, prompt_token_ids=ids,
                            family="arith" if i % 4 < 2 else "chat"))
        heavy.append(is_heavy)
    X = features_frame(reqs, "C", content=content).reset_index()
    X[TOKEN_IDS] = [list(r.prompt_token_ids) for r in reqs]
    heavy = np.array(heavy)
    X[f"latency_ms__{REF}"] = 100.0
    X[f"latency_ms__{QUANT}"] = 60.0
    for m in (REF, QUANT):
        for k in ("quality", "energy", "memory"):
            X[f"violates_{k}__{m}"] = False
    X[f"violates_quality__{QUANT}"] = heavy
    for m in (REF, QUANT):
        X[f"safe__{m}"] = ~X[f"violates_quality__{m}"]
    X["label"] = np.where(heavy, REF, QUANT)
    return X, reqs, heavy


@pytest.mark.parametrize("family", ["cost_lgbm", "dt"])
def test_content_features_change_a_decision_that_shape_features_cannot(content, tiny_models, family):
    from modeswitch.routers import get_router

    X, reqs, heavy = _table(content)
    kw = {"n_estimators": 40, "min_child_samples": 5, "max_risk": 0.5} if family == "cost_lgbm" else {}
    shape = get_router(family, feature_set="A", **kw).fit(X, X["label"])
    reads = get_router(family, feature_set="C", content_model=str(tiny_models.target), **kw).fit(X, X["label"])
    test, test_reqs, test_heavy = _table(content, 80, seed=1)
    assert len(set(shape.predict(test))) == 1  # one shape: one answer for every prompt
    picks = np.asarray(reads.predict(test), dtype=object)
    assert (picks[test_heavy] == REF).mean() > 0.95 and (picks[~test_heavy] == QUANT).mean() > 0.95
    # the raw request's path, the compiled path and the frame agree
    comp = reads.compile()
    assert comp is not None and comp.content_ is not None
    assert [comp.route(q) for q in test_reqs] == list(picks)
    assert [reads.route(q) for q in test_reqs[:10]] == list(picks[:10])
    with pytest.raises(InputError, match="carries none"):
        comp.route(dataclasses.replace(test_reqs[0], prompt_token_ids=None))


def test_the_compiled_route_reads_the_token_ids_in_c_as_the_table_does(content, tiny_models):
    """The kernel's own content features (one C call per decision, no Python on the ids)
    equal ContentTable.features bit for bit, for prompts shorter and longer than the
    windows, and its errors name the id or the request as the Python path's do."""
    from modeswitch.routers import get_router

    X, reqs, _ = _table(content, 120)
    comp = get_router("cost_lgbm", feature_set="C", content_model=str(tiny_models.target), n_estimators=20,
                      min_child_samples=5, max_risk=0.5).fit(X).compile()
    rng = np.random.default_rng(3)
    vocab = len(content.rows)
    for n in (0, 1, 7, TAIL_TOKENS, TAIL_TOKENS + 1, SHARE_TOKENS, SHARE_TOKENS + 9, 5000):
        ids = [int(i) for i in rng.integers(0, vocab, n)]
        np.testing.assert_array_equal(comp.content_features(ids), content.features(ids))
        req = dataclasses.replace(reqs[0], prompt_token_ids=tuple(ids), prompt_tokens=max(n, 1))
        row = features_frame([req], "C", content=content)
        assert comp.route(req) == comp.predict(row)[0]  # the C call and the frame's path agree
    numpy_ids = dataclasses.replace(reqs[1], prompt_token_ids=np.asarray(reqs[1].prompt_token_ids))
    assert comp.route(numpy_ids) == comp.route(reqs[1])  # any sequence of integers reads alike
    with pytest.raises(InputError, match=f"token id {vocab} is outside .*vocabulary of {vocab}"):
        comp.route(dataclasses.replace(reqs[0], prompt_token_ids=(1, vocab)))
    with pytest.raises(InputError, match="token id -2 is negative"):
        comp.route(dataclasses.replace(reqs[0], prompt_token_ids=(1, -1, -2)))
    with pytest.raises(InputError, match="request r0: .* carries none"):
        comp.route(dataclasses.replace(reqs[0], prompt_token_ids=None))
    with pytest.raises(TypeError):
        comp.route(dataclasses.replace(reqs[0], prompt_token_ids=(1, "two")))


@pytest.mark.parametrize("certified", [False, True])
def test_export_load_and_serving_decide_as_the_fitted_content_router(content, tiny_models, tmp_path, certified):
    from modeswitch.engine.serving.routing import route
    from modeswitch.routers import get_router
    from modeswitch.routers.certified import CertifiedRouter
    from modeswitch.routers.export import export_router, load_router

    X, _, _ = _table(content, 480)
    est = get_router("cost_lgbm", feature_set="C", content_model=str(tiny_models.target), n_estimators=40,
                     min_child_samples=5, max_risk=0.5)
    est = (CertifiedRouter(est, target_violation_rate=0.05) if certified else est).fit(X)
    mlruns = str(tmp_path / "mlruns")
    info = export_router(est, mlruns=mlruns, source_run_id="r1", backend="transformers")
    loaded = load_router(info["uri"], mlruns, available_modes=[REF, QUANT])
    assert loaded.path_ == "compiled"
    assert loaded.meta_["feature_set"] == "C" and loaded.meta_["content_model"] == str(tiny_models.target)
    test, reqs, heavy = _table(content, 60, seed=2)
    want = list(est.predict(test))
    assert [loaded.route(q) for q in reqs] == want
    assert set(want) == {REF, QUANT}

    class _State:  # what route() reads of the server: its memory pressure, metrics and limits
        memory_pressure = 0.0
        modes = {REF, QUANT}

        class config:  # noqa: N801
            route_budget_us = 1e9
            reference = REF

        class metrics:  # noqa: N801
            class _H:
                def observe(self, v):
                    pass

                def labels(self, *a):
                    return self

                def inc(self):
                    pass

            stages = {"features": _H(), "route": _H(), "serving_route": _H()}
            routing = _H()
            fallbacks = _H()

    served = [route(_State, loaded, q.id, q.prompt_tokens, q.expected_output_tokens, 0, 1,
                    list(q.prompt_token_ids))[1].mode for q in reqs]
    assert served == want


def test_tuning_times_a_content_router_on_the_table_requests_token_ids(content, tiny_models):
    """Tuning's served decision (routers.training.served) routes the fold's rows as raw
    requests: a router reading the prompt gets their token ids from the table."""
    from modeswitch.routers import get_router
    from modeswitch.routers.training.served import served_decision

    X, _, heavy = _table(content)
    est = get_router("dt", feature_set="C", content_model=str(tiny_models.target)).fit(X, X["label"])
    picks, p50_ms = served_decision(est, X, decisions=200)
    assert list(picks) == list(est.predict(X)) and 0 < p50_ms < 5


def test_a_measured_requests_content_is_read_from_the_prompt_the_profiler_built(content, tiny_models):
    """A profile row holds its unit's measured shape (the template's prompt length), not
    the budget its prompt was built from, so a prompt rebuilt from the row is other text
    (on SmolLM2 a batch_pressure unit's 20-token budget made a 21-token prompt, and 21
    builds another). The table's content columns read the prompt the profiler built for
    the unit's lead (the profile's plan), as the live check replays it."""
    from transformers import AutoTokenizer

    from modeswitch.dataset.workloads.conditions import ConditionDraw
    from modeswitch.engine import prompts
    from modeswitch.engine.profiler import ProfileSpec
    from modeswitch.engine.profiler.plan import profiled_leads
    from modeswitch.oracle.content_columns import TOKEN_IDS, content_columns

    model = str(tiny_models.target)
    draw = ConditionDraw(concurrency=(1, 4), concurrency_weights=(0.5, 0.5), shared_prefix_rate=0.5)
    spec = ProfileSpec(model=model, workloads=["batch_pressure", "long_prompt_short_output"], requests=4,
                       conditions=draw.to_dict(), length_scale=0.25)
    leads = profiled_leads(dataclasses.asdict(spec))
    assert len(leads) == 8 and profiled_leads(None) == {}
    builder = prompts.PromptBuilder(AutoTokenizer.from_pretrained(model))
    built = {uid: builder.prepare(r)[1] for uid, r in leads.items()}
    # what the profile records: the measured length, one over the budget as a chat
    # template made it on SmolLM2 (the tiny model has no template)
    rows = [dataclasses.replace(r, prompt_tokens=len(built[uid]) + 1) for uid, r in leads.items()]
    planned = content_columns(rows, model, built_from=leads)
    assert list(planned.index) == [r.id for r in rows]
    assert all(planned.loc[uid, TOKEN_IDS] == list(ids) for uid, ids in built.items())
    rebuilt = content_columns(rows, model)  # from the rows: other prompts
    assert all(rebuilt.loc[uid, TOKEN_IDS] != planned.loc[uid, TOKEN_IDS] for uid in leads)
    first = rows[0]
    other = {first.id: dataclasses.replace(leads[first.id], family="shared_prefix_chat")}
    with pytest.raises(InputError, match="plan is of another profile"):
        content_columns(rows, model, built_from=other)
    # the table takes them: a measured row's token ids are its unit's own prompt
    from modeswitch.oracle.training_table import build_training_table, profiled_requests, table_meta
    from tests.helpers import profile, row

    prof = profile([row(uid, m, lat, request_id=uid, family=r.family, prompt_tokens=len(built[uid]) + 1,
                        expected_output_tokens=r.expected_output_tokens,
                        shared_prefix_tokens=r.shared_prefix_tokens,
                        concurrent_requests=r.concurrent_requests, memory_pressure=r.memory_pressure)
                    for uid, r in leads.items() for m, lat in (("fp16_baseline", 1.0), ("int8_quant", 0.6))])
    table = build_training_table(prof, profiled_requests(prof), content_model=model, built_from=leads)
    assert table_meta(table)["prompts_from_plan"] == len(leads)
    ids = table.set_index("request_id")[TOKEN_IDS]
    assert all(list(ids[uid]) == list(built[uid]) for uid in leads)

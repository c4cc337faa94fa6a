"""The OpenAI-compatible server on loopback with the real small engine, driven by the
``openai`` client; and the MLflow export/load round trip of a trained router."""

import json
import time
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from tests.helpers import http, start, synthetic_profile


class SwitchRouter:
    """A router whose behaviour a test can change: a fixed mode, or raising."""

    def __init__(self, mode="fp16_baseline"):
        self.mode = mode
        self.calls = 0

    def route(self, request):
        self.calls += 1
        if self.mode == "raise":
            raise RuntimeError("router broke")
        return self.mode


def counter(port, name, **labels) -> float:
    """A sample's value as ``/metrics`` serves it now (0 before it first counts): tests on
    the shared server assert what they add, whatever ran before them."""
    from prometheus_client.parser import text_string_to_metric_families

    text = http("GET", f"http://127.0.0.1:{port}/metrics")[2]
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
    return 0.0


def health(port) -> dict:

    return json.loads(http("GET", f"http://127.0.0.1:{port}/health")[2])


@pytest.fixture(scope="module")
def server(tiny_models):
    """One server for the tests that need the real engines (loading them is the slow part).
    Tests change its router only through the ``router`` fixture, which puts it back."""
    from modeswitch.engine.serving import ServerConfig, create_app

    holder = {"router": SwitchRouter(), "loads": 0}

    def loader():
        holder["loads"] += 1
        return holder["router"]

    cfg = ServerConfig(model_path=str(tiny_models.target), draft_path=str(tiny_models.draft),
                       max_tokens_limit=64, admin_key=ADMIN_KEY)
    app = create_app(loader, cfg, supported_modes=["fp16_baseline", "prefix_caching", "int8_quant",
                                                   "continuous_batching"])
    srv, th, port = start(app)
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
    yield {"client": client, "holder": holder, "app": app, "port": port}
    srv.should_exit = True
    th.join(timeout=30)


@pytest.fixture
def router(server):
    """The shared server's router for one test to change (its ``mode``) or swap (a reload);
    afterwards, whatever the test did or wherever it failed, the server routes to
    fp16_baseline with that same router again."""
    holder, original = server["holder"], server["holder"]["router"]
    yield original
    original.mode = "fp16_baseline"
    holder["router"] = original
    if server["app"].state.serving.router is not original:
        assert http("POST", f"http://127.0.0.1:{server['port']}/admin/reload")[0] == 200


def test_completion_reports_mode_and_routing_time(server, router):
    raw = server["client"].completions.with_raw_response.create(
        model="modeswitch", prompt="def parse(self, text):", max_tokens=8)
    body = raw.parse()
    assert raw.headers["x-modeswitch-mode"] == "fp16_baseline"
    assert float(raw.headers["x-modeswitch-route-us"]) >= 0
    assert body.usage.completion_tokens == 8 and body.choices[0].text
    assert body.model_extra["modeswitch"]["mode"] == "fp16_baseline"


def test_chat_and_streaming_give_the_same_text(server, router):
    c = server["client"]
    router.mode = "int8_quant"
    msgs = [{"role": "user", "content": "import os\nimport sys"}]
    full = c.chat.completions.create(model="modeswitch", messages=msgs, max_tokens=10)
    chunks = list(c.chat.completions.create(model="modeswitch", messages=msgs, max_tokens=10, stream=True))
    streamed = "".join(ch.choices[0].delta.content or "" for ch in chunks)
    assert full.model_extra["modeswitch"]["mode"] == "int8_quant"
    assert chunks[0].model_extra["modeswitch"]["mode"] == "int8_quant"
    assert streamed == full.choices[0].message.content  # greedy decoding: same tokens
    assert chunks[-1].choices[0].finish_reason in ("length", "stop")
    assert sum(1 for ch in chunks if ch.choices[0].delta.content) >= 2  # tokens arrived in pieces


def test_a_stream_sends_no_empty_events(server, router):
    """Each event of a completion stream carries text or the finish (at max_tokens, on the
    last text, as vLLM's does); the routing field rides on the first event only."""
    router.mode = "fp16_baseline"
    chunks = list(server["client"].completions.create(model="modeswitch", prompt="import os\nimport sys",
                                                      max_tokens=6, stream=True))
    assert all(ch.choices[0].text or ch.choices[0].finish_reason for ch in chunks)
    assert [bool((ch.model_extra or {}).get("modeswitch")) for ch in chunks] == [True] + [False] * (len(chunks) - 1)
    # one finish, on the last event (riding on its text when there is one:
    # tests/test_stream_events.py has each way a stream ends)
    assert [bool(ch.choices[0].finish_reason) for ch in chunks] == [False] * (len(chunks) - 1) + [True]


def test_streamed_completion_reports_mode_and_ends(server, router):
    router.mode = "prefix_caching"
    chunks = list(server["client"].completions.create(model="modeswitch", prompt="def parse(self, text):",
                                                      max_tokens=8, stream=True))
    assert chunks[0].model_extra["modeswitch"]["mode"] == "prefix_caching"
    assert chunks[-1].choices[0].finish_reason in ("length", "stop")
    assert "".join(ch.choices[0].text for ch in chunks)


def test_concurrent_requests_share_the_continuous_batching_engine(server, router):
    c = server["client"]
    router.mode = "continuous_batching"
    msgs = [[{"role": "user", "content": f"def f{i}(x):"}] for i in range(6)]
    with ThreadPoolExecutor(6) as pool:
        outs = list(pool.map(lambda m: c.chat.completions.create(model="modeswitch", messages=m,
                                                                    max_tokens=24), msgs))
    alone = c.chat.completions.create(model="modeswitch", messages=msgs[0], max_tokens=24)
    chunks = list(c.chat.completions.create(model="modeswitch", messages=msgs[0], max_tokens=24,
                                            stream=True))
    assert all(o.model_extra["modeswitch"]["mode"] == "continuous_batching" for o in outs)
    assert all(o.usage.completion_tokens == 24 for o in outs)
    # in a batch or alone, greedy decoding gives the same text; streamed too, in pieces
    assert outs[0].choices[0].message.content == alone.choices[0].message.content
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == alone.choices[0].message.content
    assert sum(1 for ch in chunks if ch.choices[0].delta.content) >= 2
    pool = server["app"].state.serving.pool
    engine = pool.acquire("continuous_batching")
    pool.release("continuous_batching")
    assert engine.info["max_requests_in_batch"] >= 2


def test_a_stream_asked_for_its_usage_ends_with_it(server, router):
    """``stream_options={"include_usage": True}`` through the openai client: a last chunk
    with no choices and the request's token counts (those of the whole response), every
    chunk before it ``usage: None``."""
    c = server["client"]
    msgs = [{"role": "user", "content": "def parse(self, text):"}]
    whole = c.chat.completions.create(model="modeswitch", messages=msgs, max_tokens=8)
    chunks = list(c.chat.completions.create(model="modeswitch", messages=msgs, max_tokens=8, stream=True,
                                            stream_options={"include_usage": True}))
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage
    assert all(ch.usage is None for ch in chunks[:-1]) and chunks[-2].choices[0].finish_reason
    whole = c.completions.create(model="modeswitch", prompt="import os", max_tokens=6)
    chunks = list(c.completions.create(model="modeswitch", prompt="import os", max_tokens=6, stream=True,
                                       stream_options={"include_usage": True}))
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + whole.usage.completion_tokens
    with pytest.raises(openai.BadRequestError, match="logprobs"):
        c.chat.completions.create(model="modeswitch", messages=msgs, max_tokens=2, logprobs=True, top_logprobs=2)


@pytest.mark.parametrize("mode", ["fp16_baseline", "continuous_batching"])
def test_a_stop_sequence_cuts_the_text_whole_and_streamed(server, router, mode):
    """A sequence from the middle of the text the model writes unstopped: the response
    is the text before it, generation ends there (fewer tokens), and streamed the same;
    on an engine of its own and in a running batch."""
    c = server["client"]
    router.mode = mode
    msgs = [{"role": "user", "content": "import os\nimport sys"}]
    full = c.chat.completions.create(model="modeswitch", messages=msgs, max_tokens=24)
    text = full.choices[0].message.content
    assert len(text) >= 9
    stop = text[len(text) // 3:len(text) // 3 + 2]
    want = text[:text.find(stop)]
    cut = c.chat.completions.create(model="modeswitch", messages=msgs, max_tokens=24, stop=["\x00never", stop])
    assert cut.choices[0].message.content == want and cut.choices[0].finish_reason == "stop"
    assert cut.usage.completion_tokens < full.usage.completion_tokens
    chunks = list(c.chat.completions.create(model="modeswitch", messages=msgs, max_tokens=24, stop=stop,
                                            stream=True))
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == want
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_bad_requests_get_400_with_a_clear_message(server):
    c = server["client"]
    before = counter(server["port"], "modeswitch_errors_total", kind="bad_request")
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        c.completions.create(model="modeswitch", prompt="x", max_tokens=0)
    with pytest.raises(openai.BadRequestError, match="exceeds this server's limit 64"):
        c.completions.create(model="modeswitch", prompt="x", max_tokens=65)
    with pytest.raises(openai.BadRequestError, match="messages"):
        c.chat.completions.create(model="modeswitch", messages=[], max_tokens=4)
    with pytest.raises(openai.BadRequestError, match="one prompt per request"):
        c.completions.create(model="modeswitch", prompt=["x", "y"], max_tokens=4)
    # the two bodies failing validation count as bad requests; the limit and prompt checks
    # answer 400 without counting
    assert counter(server["port"], "modeswitch_errors_total", kind="bad_request") - before == 2
    assert health(server["port"])["in_flight"] == 0  # rejected before being counted in


def test_router_failure_falls_back_to_the_reference_and_is_counted(server, router):
    port = server["port"]
    before = {r: counter(port, "modeswitch_fallbacks_total", reason=r) for r in ("error", "unknown_mode")}
    router.mode = "raise"
    r = server["client"].completions.with_raw_response.create(model="modeswitch", prompt="class A:", max_tokens=4)
    assert r.headers["x-modeswitch-mode"] == "fp16_baseline"
    assert r.parse().model_extra["modeswitch"]["fallback"] == "error"
    router.mode = "awq_4bit"  # a mode this engine does not offer
    r = server["client"].completions.with_raw_response.create(model="modeswitch", prompt="class A:", max_tokens=4)
    assert r.parse().model_extra["modeswitch"]["fallback"] == "unknown_mode"
    assert counter(port, "modeswitch_fallbacks_total", reason="error") - before["error"] == 1.0
    assert counter(port, "modeswitch_fallbacks_total", reason="unknown_mode") - before["unknown_mode"] == 1.0
    assert "modeswitch_routing_seconds_bucket" in http("GET", f"http://127.0.0.1:{port}/metrics")[2]


def test_reload_under_load_drops_nothing(server, router):
    c = server["client"]
    holder = server["holder"]
    before = holder["loads"]
    reloads = counter(server["port"], "modeswitch_router_reloads_total")

    def one(i):
        return c.completions.create(model="modeswitch", prompt=f"def f{i}(x):", max_tokens=6)

    with ThreadPoolExecutor(8) as ex:
        futs = [ex.submit(one, i) for i in range(16)]
        time.sleep(0.3)
        holder["router"] = SwitchRouter("prefix_caching")
        status = http("POST", f"http://127.0.0.1:{server['port']}/admin/reload")[0]
        results = [f.result(timeout=120) for f in futs]
    assert status == 200 and holder["loads"] == before + 1
    assert counter(server["port"], "modeswitch_router_reloads_total") - reloads == 1
    assert len(results) == 16 and all(x.usage.completion_tokens == 6 for x in results)
    after = c.completions.create(model="modeswitch", prompt="def g(x):", max_tokens=4)
    assert after.model_extra["modeswitch"]["mode"] == "prefix_caching"
    holder["router"] = SwitchRouter()
    http("POST", f"http://127.0.0.1:{server['port']}/admin/reload")
    h = health(server["port"])
    assert h["status"] == "ok" and h["in_flight"] == 0
    models = c.models.list()
    assert models.data[0].id == "modeswitch"


def test_health_reports_the_state_handlers_share(server, router):
    """``/health`` reads the same typed state the request handlers update."""
    state = server["app"].state.serving
    with ThreadPoolExecutor(4) as ex:
        list(ex.map(lambda i: server["client"].completions.create(model="modeswitch", prompt=f"x = {i}", max_tokens=4),
                    range(4)))
    h = health(server["port"])
    assert h["in_flight"] == state.in_flight == 0
    assert h["router"] == "SwitchRouter" and h["router_path"] is None  # a bare router: no path known
    assert h["engines_loaded"] == state.pool.loaded() and "fp16_baseline" in h["engines_loaded"]
    assert counter(server["port"], "modeswitch_in_flight") == 0


class FakeTokenizer:
    """Enough of a tokenizer for requests that never reach generation."""

    chat_template = None

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [ord(ch) for ch in text]}


def test_engine_load_failure_is_counted_and_leaves_nothing_in_flight(tiny_models):
    from modeswitch.engine.serving import LoadedRouter, ServerConfig, create_app

    def broken_factory(mode):
        raise RuntimeError(f"cannot load {mode}")

    cfg = ServerConfig(model_path=str(tiny_models.target))
    app = create_app(lambda: LoadedRouter(SwitchRouter(), path="compiled"), cfg, engine_factory=broken_factory,
                     tokenizer=FakeTokenizer(), supported_modes=["fp16_baseline"])
    srv, th, port = start(app)
    try:
        status, _, _ = http("POST", f"http://127.0.0.1:{port}/v1/completions", {"prompt": "x", "max_tokens": 2})
        assert status == 500
        assert counter(port, "modeswitch_errors_total", kind="engine_load") == 1
        h = health(port)
        assert h["in_flight"] == 0 and h["engines_loaded"] == []
        assert h["router"] == "SwitchRouter" and h["router_path"] == "compiled"  # the loader's LoadedRouter
    finally:
        srv.should_exit = True
        th.join(timeout=30)


def test_supported_modes_and_the_reference_come_from_the_backend_registry():
    from modeswitch.engine.backends.base import EngineSettings
    from modeswitch.engine.backends.registry import get_backend
    from modeswitch.engine.modes import get_mode, reference_mode
    from modeswitch.engine.serving import ServerConfig, supported_modes

    cfg = ServerConfig(model_path="unused")
    assert cfg.reference == reference_mode().name
    modes = supported_modes(cfg)
    assert modes == get_backend("transformers").runnable_modes(EngineSettings("unused"))
    assert modes[0] == cfg.reference
    # without a draft model, no mode that needs one is offered; with one, they are
    needs_draft = [m for m in supported_modes(ServerConfig("unused", draft_path="draft"))
                   if get_mode(m).missing_draft(None)]
    assert needs_draft and not set(needs_draft) & set(modes)


def test_api_key_is_enforced(tiny_models):
    from modeswitch.engine.serving import ServerConfig, create_app

    cfg = ServerConfig(model_path=str(tiny_models.target), api_key="s3cret")
    app = create_app(lambda: SwitchRouter(), cfg, supported_modes=["fp16_baseline"])
    srv, th, port = start(app)
    try:
        url = f"http://127.0.0.1:{port}"
        body = {"prompt": "x", "max_tokens": 2}
        status, _, text = http("POST", url + "/v1/completions", body)
        assert status == 401 and "API key" in text
        status, headers, _ = http("POST", url + "/v1/completions", body, {"Authorization": "Bearer s3cret"})
        assert status == 200 and headers["x-modeswitch-mode"] == "fp16_baseline"
        assert http("GET", url + "/health")[0] == 200  # liveness needs no key
    finally:
        srv.should_exit = True
        th.join(timeout=30)


def ten_mb_engines(closed: list):
    """An engine factory for the pool tests: 10 MB engines that record their mode in
    ``closed`` when closed."""

    class Fake:
        def __init__(self, mode):
            self.mode, self.weights_mb = mode, 10.0

        def close(self):
            closed.append(self.mode)

    return Fake


def test_engine_pool_unloads_least_recently_used_within_budget():
    from modeswitch.engine.serving.pool import EnginePool

    closed = []
    Fake = ten_mb_engines(closed)
    pool = EnginePool(Fake, budget_mb=25)
    for m in ("a", "b"):
        pool.acquire(m)
        pool.release(m)
    pool.acquire("a")
    pool.release("a")  # a is now the most recently used
    pool.acquire("c")  # 30 MB > 25: b (idle, least recent) goes
    assert closed == ["b"] and pool.loaded() == ["a", "c"]
    pool.release("c")
    pool.acquire("a")  # a busy
    pool.acquire("d")  # over budget again: a is busy, so c goes
    assert closed == ["b", "c"]


def test_the_budget_counts_the_server_s_own_memory(caplog):
    """``base_mb`` (the server before any engine) counts against the budget: with 15 MB of
    its own, a 25 MB budget holds one 10 MB engine, not two; an engine in use that cannot
    fit is kept, with a warning saying the budget is exceeded, and the idle one goes when
    its request ends."""
    import logging

    from modeswitch.engine.serving.pool import EnginePool
    from modeswitch.engine.serving.state import process_base_mb

    closed = []
    Fake = ten_mb_engines(closed)
    pool = EnginePool(Fake, budget_mb=25, base_mb=15)
    pool.acquire("a")
    pool.release("a")
    pool.acquire("b")  # 15 + 20 > 25: a (idle) goes
    assert closed == ["a"] and pool.loaded() == ["b"]
    with caplog.at_level(logging.WARNING, logger="modeswitch.serve"):
        pool.acquire("c")  # b busy: 15 + 20 > 25 stays, said once
    assert pool.loaded() == ["b", "c"] and "over the memory budget of 25 MB" in caplog.text
    pool.release("b")  # now idle while over budget: unloaded (closed in a thread)
    deadline = time.time() + 10
    while closed != ["a", "b"] and time.time() < deadline:
        time.sleep(0.01)
    assert closed == ["a", "b"] and pool.loaded() == ["c"] and pool.unloads == 2
    pool.release("c")  # within budget: stays
    time.sleep(0.05)
    assert pool.loaded() == ["c"] and closed == ["a", "b"]
    assert process_base_mb("cuda:0") == 0.0 and 50 < process_base_mb("cpu") < 10_000  # this test process


def test_the_budget_counts_the_kv_cache_an_engine_reserves(tiny_models):
    """A continuous-batching engine's paged cache dwarfs the tiny model's weights; the
    pool counts it (``memory_mb``), so a budget that fits two engines' weights fits one."""
    from modeswitch.engine.backends.transformers_backend import TransformersEngine
    from modeswitch.engine.modes import get_mode
    from modeswitch.engine.serving.pool import EnginePool

    eng = TransformersEngine(get_mode("continuous_batching"), str(tiny_models.target), None, "cpu").load()
    try:
        assert eng.cache_mb > 10 * eng.weights_mb and eng.memory_mb == eng.weights_mb + eng.cache_mb
    finally:
        eng.close()
    closed = []

    class Fake:
        def __init__(self, mode):
            self.mode, self.weights_mb, self.memory_mb = mode, 1.0, 20.0

        def close(self):
            closed.append(self.mode)

    pool = EnginePool(Fake, budget_mb=25)
    pool.acquire("a")
    pool.release("a")
    pool.acquire("b")  # 2 MB of weights, but 40 MB with their caches: a goes
    assert closed == ["a"] and pool.loaded() == ["b"]


def test_the_pool_calls_its_hooks_after_a_load_and_after_an_unload(caplog):
    """``on_load`` runs once the engine is in the table, ``on_unload`` once the engines
    unloaded are closed, on a load and on a release alike; a hook that fails is logged and
    the load still succeeds."""
    import logging

    from modeswitch.engine.serving.pool import EnginePool

    closed, calls = [], []
    Fake = ten_mb_engines(closed)
    pool = EnginePool(Fake, budget_mb=25, base_mb=10)
    pool.on_load = lambda: calls.append(("load", pool.loaded(), list(closed)))
    pool.on_unload = lambda: calls.append(("unload", pool.loaded(), list(closed)))
    pool.acquire("a")
    pool.release("a")
    pool.acquire("b")
    assert calls == [("load", ["a"], []), ("unload", ["b"], ["a"]), ("load", ["b"], ["a"])]
    pool.acquire("c")  # b is busy: kept, over the budget
    pool.release("b")  # b goes in a thread, and the hook runs there after its close
    deadline = time.time() + 10
    while len(calls) < 5 and time.time() < deadline:
        time.sleep(0.01)
    assert calls[3:] == [("load", ["b", "c"], ["a"]), ("unload", ["c"], ["a", "b"])]

    def broken():
        raise RuntimeError("no")

    pool.on_load = broken
    with caplog.at_level(logging.WARNING, logger="modeswitch.serve"):
        assert pool.acquire("d").mode == "d"
    assert "engine pool hook broken failed: RuntimeError: no" in caplog.text


def test_a_failed_engine_load_leaves_the_mode_unloadable():
    from modeswitch.engine.serving.pool import EnginePool

    closed, fail = [], {"a"}

    class Fake:
        def __init__(self, mode):
            if mode in fail:
                raise RuntimeError("out of memory")
            self.mode, self.weights_mb = mode, 10.0

        def close(self):
            closed.append(self.mode)

    pool = EnginePool(Fake, budget_mb=15)
    with pytest.raises(RuntimeError, match="out of memory"):
        pool.acquire("a")
    fail.clear()
    pool.acquire("a")
    pool.release("a")
    pool.acquire("b")  # 20 MB > 15: a is idle (its failed load is not counted as a user)
    assert closed == ["a"] and pool.loaded() == ["b"]


def test_prefix_tracker_finds_shared_prefixes():
    from modeswitch.engine.serving.pool import PrefixTracker

    t = PrefixTracker(min_tokens=4)
    assert t.observe(list(range(100))) == 0
    assert t.observe(list(range(50)) + [999] * 10) == 50
    assert t.observe([7, 8, 9]) == 0


def test_export_and_load_round_trip(tmp_path):
    import mlflow

    from modeswitch.dataset.features import features_frame
    from modeswitch.dataset.workloads import get_workload
    from modeswitch.oracle.training_table import build_training_table
    from modeswitch.routers import get_router
    from modeswitch.routers.export import export_router, load_router

    reqs = [r for i, n in enumerate(["short_prompt_short_output", "long_prompt_long_output",
                                     "shared_prefix_chat", "batch_pressure"])
            for r in get_workload(n).sample(40, seed=i)]
    table = build_training_table(synthetic_profile(), reqs)
    est = get_router("dt", feature_set="B").fit(table, table["label"].astype(str))
    mlruns = str(tmp_path / "mlruns")
    info = export_router(est, mlruns=mlruns, source_run_id="r1", backend="transformers")
    assert info["uri"] == "models:/modeswitch-router@champion" and str(info["version"]) == "1"
    modes = info["meta"]["modes"]
    loaded = load_router(info["uri"], mlruns, available_modes=modes + ["fp16_baseline"])
    assert loaded.path_ == "compiled"
    assert [loaded.route(r) for r in reqs] == list(est.predict(features_frame(reqs, "B")))
    pyf = mlflow.pyfunc.load_model(info["uri"])
    frame = features_frame(reqs[:5], "B")[["prompt_tokens", "expected_output_tokens", "shared_prefix_tokens",
                                           "concurrent_requests", "memory_pressure", "family",
                                           "benchmark_suite"]]
    assert list(pyf.predict(frame)) == list(est.predict(features_frame(reqs[:5], "B")))
    assert pyf.metadata.metadata["backend"] == "transformers"
    with pytest.raises(ValueError, match="does not offer"):
        load_router(info["uri"], mlruns, available_modes=["fp16_baseline"])
    again = export_router(est, mlruns=mlruns, source_run_id="r2")
    assert str(again["version"]) == "2"
    alias = mlflow.MlflowClient().get_model_version_by_alias("modeswitch-router", "champion")
    assert str(alias.version) == "2"


def test_clients_that_hang_up_leave_nothing_behind_on_the_real_engines(server, router):
    """Streamed and whole requests abandoned on the tiny model's engines (the batching one
    too): the in-flight count, engine leases and batch slots all come back."""
    import threading

    from tests.test_serving_limits import _send_and_leave

    port = server["port"]
    errors = []

    def leave(i, stream):
        _send_and_leave(port, {"model": "modeswitch", "prompt": f"def f{i}(x):", "max_tokens": 64,
                               "stream": stream}, 64 if i % 3 == 0 else 0, errors)

    for mode in ("continuous_batching", "fp16_baseline"):
        router.mode = mode
        ts = [threading.Thread(target=leave, args=(i, i % 2 == 0)) for i in range(10)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        deadline = time.time() + 120
        while health(port)["in_flight"] and time.time() < deadline:
            time.sleep(0.2)
        assert health(port)["in_flight"] == 0, mode
    assert not errors
    state = server["app"].state.serving
    assert all(n == 0 for n in state.pool._busy.values())  # every engine lease given back
    cb = state.pool._engines.get("continuous_batching")
    if cb is not None and getattr(cb, "_waiters", None) is not None:
        assert not cb._waiters  # no batch slot still waited on
    out = server["client"].completions.create(model="modeswitch", prompt="def g(x):", max_tokens=4)
    assert out.choices[0].text is not None


def test_requests_on_a_loaded_batching_engine_hold_no_worker_thread(server, router, monkeypatch):
    """Once the continuous-batching engine is loaded, a request's whole path (the state
    dependency, taking the engine, generation, whole or streamed) runs on the event loop:
    with every thread-pool hop made to fail, requests still succeed."""
    import fastapi.dependencies.utils
    import starlette.concurrency

    import modeswitch.engine.serving.generate
    import modeswitch.engine.serving.jobs

    c = server["client"]
    router.mode = "continuous_batching"
    c.completions.create(model="modeswitch", prompt="def warm(x):", max_tokens=2)  # loads it

    def no_thread(*a, **k):
        raise AssertionError("a request took a worker thread")

    for mod in (modeswitch.engine.serving.generate, modeswitch.engine.serving.jobs, fastapi.dependencies.utils,
                starlette.concurrency):
        monkeypatch.setattr(mod, "run_in_threadpool", no_thread)
    with ThreadPoolExecutor(8) as pool:
        outs = list(pool.map(lambda i: c.completions.create(model="modeswitch", prompt=f"def f{i}(x):",
                                                             max_tokens=12), range(8)))
    assert all(o.usage.completion_tokens == 12 for o in outs)
    chunks = list(c.completions.create(model="modeswitch", prompt="def f0(x):", max_tokens=12, stream=True))
    assert "".join(ch.choices[0].text for ch in chunks) == outs[0].choices[0].text
    assert sum(1 for ch in chunks if ch.choices[0].text) >= 2  # streamed as generated


def test_a_cancelled_batching_call_leaves_the_batch(tiny_models):
    """``arun`` on the continuous-batching engine: cancelling the awaiting task takes its
    request out of the running batch and its slot back; the engine serves on."""
    import asyncio

    from modeswitch.dataset.requests import Request
    from modeswitch.engine.backends.transformers_backend import TransformersEngine

    eng = TransformersEngine("continuous_batching", tiny_models.target).load()
    cancelled = []
    real_cancel = eng._cb.cancel_request
    eng._cb.cancel_request = lambda rid: (cancelled.append(rid), real_cancel(rid))
    try:
        ids = eng.tokenizer("def f(x):")["input_ids"]

        async def scenario():
            got, holder = [], {}

            def on_token(rid, new):  # cancels its own call a few tokens in
                got.extend(new)
                if len(got) >= 3:
                    holder["task"].cancel()

            holder["task"] = task = asyncio.create_task(eng.arun(
                [(Request(id="long", prompt_tokens=len(ids), expected_output_tokens=400), ids)], True, on_token))
            with pytest.raises(asyncio.CancelledError):
                await task
            assert not eng._waiters and len(got) < 400
            assert [r.split("#")[0] for r in cancelled] == ["long"]  # taken out of the running batch
            return await eng.arun([(Request(id="short", prompt_tokens=len(ids), expected_output_tokens=6), ids)], True)

        out = asyncio.run(scenario())
        assert out[0].output_tokens == 6
        assert out[0].output_ids == eng.run([(Request(id="again", prompt_tokens=len(ids), expected_output_tokens=6), ids)])[0].output_ids
    finally:
        eng.close()


def _exported_dt(tmp_path):
    from modeswitch.dataset.workloads import get_workload
    from modeswitch.oracle.training_table import build_training_table
    from modeswitch.routers import get_router
    from modeswitch.routers.export import export_router

    reqs = [r for i, n in enumerate(["short_prompt_short_output", "batch_pressure"])
            for r in get_workload(n).sample(30, seed=i)]
    table = build_training_table(synthetic_profile(), reqs)
    est = get_router("dt").fit(table, table["label"].astype(str))
    mlruns = str(tmp_path / "mlruns")
    return est, mlruns, export_router(est, mlruns=mlruns, source_run_id="r1", backend="transformers")


def test_a_tampered_router_artifact_is_refused(tmp_path, tiny_models):
    """The stored router is skops (no pickle), hashed at export in the registry: a changed
    file is refused by load_router and by `serve`, before anything in it is loaded."""
    from typer.testing import CliRunner

    from modeswitch.cli import app
    from modeswitch.routers.export import load_router

    est, mlruns, info = _exported_dt(tmp_path)
    assert info["meta"]["format"] == "skops" and len(info["meta"]["sha256"]) == 64
    assert load_router(info["uri"], mlruns).path_ == "compiled"
    [stored] = list((tmp_path / "mlruns").rglob("router.skops"))
    assert not list((tmp_path / "mlruns").rglob("router.joblib"))
    data = bytearray(stored.read_bytes())
    data[len(data) // 2] ^= 0xFF
    stored.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="does not match the one recorded at export"):
        load_router(info["uri"], mlruns)
    stored.write_bytes(bytes(data[: len(data) // 2]) + bytes([data[len(data) // 2] ^ 0xFF])
                       + bytes(data[len(data) // 2 + 1:]))  # restored
    assert load_router(info["uri"], mlruns).path_ == "compiled"
    [meta] = list((tmp_path / "mlruns").rglob("meta.json"))
    meta.write_text(meta.read_text().replace('"modes": [', '"modes": ["awq_4bit", ', 1))
    with pytest.raises(ValueError, match="meta.json differs from the one recorded"):
        load_router(info["uri"], mlruns)
    with pytest.raises(ValueError, match="not a model URI this can load"):
        load_router("models:/modeswitch-router/Production", mlruns)
    res = CliRunner().invoke(app, ["serve", "--router", info["uri"], "--mlruns", mlruns,
                                   "--model", str(tiny_models.target)])
    assert res.exit_code == 2 and "recorded at export" in res.output and "Traceback" not in res.output


def test_a_router_with_an_untrusted_type_is_not_exported_and_old_pickles_need_consent(tmp_path, monkeypatch):
    import joblib

    from modeswitch.routers.export import export_router, load_router_file

    class Sneaky:  # defined here: not a type the allow-list knows
        modes_ = ["fp16_baseline"]

        def get_params(self):
            return {}

    with pytest.raises(ValueError, match="types outside the trusted list"):
        export_router(Sneaky(), mlruns=str(tmp_path / "m"))
    est, _, _ = _exported_dt(tmp_path / "a")
    old = tmp_path / "router.joblib"
    joblib.dump(est, old)
    with pytest.raises(ValueError, match="a pickle file"):
        load_router_file(old, None)
    assert load_router_file(old, None, trust_pickle=True).classes_.tolist() == est.classes_.tolist()


def test_the_prefix_index_agrees_with_comparing_every_recent_prompt():
    """Random prompts sharing random prefixes: the block index's answer is the brute-force
    longest shared prefix, or at most min_tokens - 1 short of it, and forgets evicted prompts."""
    import numpy as np

    from modeswitch.engine.serving.pool import PrefixTracker

    rng = np.random.default_rng(0)
    t = PrefixTracker(max_prompts=8, min_tokens=16)
    bases = [list(rng.integers(0, 50, 400)) for _ in range(5)]
    recent = []
    for _ in range(300):
        base = bases[rng.integers(0, 5)]
        cut = int(rng.integers(0, 400))
        ids = base[:cut] + list(rng.integers(1000, 2000, int(rng.integers(1, 60))))
        truth = 0
        for b in recent[-8:]:
            n = min(len(ids), len(b))
            d = next((i for i in range(n) if ids[i] != b[i]), n)
            truth = max(truth, d)
        truth = truth if truth >= 16 else 0
        got = t.observe(ids)
        assert got <= truth and (truth - got < 16), (got, truth)
        assert got == 0 or got >= 16
        recent.append(ids)


#: the shared server's admin key (POST /admin/feedback)
ADMIN_KEY = "adm-key"


class AdaptingRouter(SwitchRouter):
    """A router that adapts online (as routers.adaptive.AdaptiveThresholdRouter): it serves
    the reference once it has been told of two violations."""

    def __init__(self):
        super().__init__("prefix_caching")
        self.outcomes = []

    def observe(self, violated):
        self.outcomes += list(violated)
        if sum(self.outcomes) >= 2:
            self.mode = "fp16_baseline"

    def state(self):
        return {"observed": len(self.outcomes), "violations": sum(self.outcomes)}


def test_feedback_reaches_a_router_that_adapts_and_is_refused_by_one_that_does_not(server, router):
    url = f"http://127.0.0.1:{server['port']}/admin/feedback"
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    status, _, text = http("POST", url, {"outcomes": [{"id": "cmpl-x", "violated": True}]}, admin)
    assert status == 409 and "does not adapt online" in text
    assert http("POST", url, {"outcomes": []}, admin)[0] == 400
    assert http("POST", url, {"outcomes": [{"id": "cmpl-x", "violated": "yes"}]}, admin)[0] == 400
    server["holder"]["router"] = adapting = AdaptingRouter()
    assert http("POST", f"http://127.0.0.1:{server['port']}/admin/reload")[0] == 200
    c = server["client"]
    served = [c.completions.create(model="modeswitch", prompt=f"x = {i}", max_tokens=2) for i in range(3)]
    assert all(r.model_extra["modeswitch"]["mode"] == "prefix_caching" for r in served)
    outcomes = [{"id": r.id, "violated": v} for r, v in zip(served, [False, True, True], strict=True)]
    status, _, text = http("POST", url, {"outcomes": outcomes}, admin)
    assert status == 200 and json.loads(text) == {"status": "observed", "outcomes": 3, "observed": 3,
                                                  "violations": 2}
    assert adapting.outcomes == [False, True, True]
    assert c.completions.create(model="modeswitch", prompt="x = 3", max_tokens=2).model_extra["modeswitch"]["mode"] \
        == "fp16_baseline"

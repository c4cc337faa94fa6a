"""The OpenAI-compatible server on loopback with the real small engine, driven by the
``openai`` client; and the MLflow export/load round trip of a trained router."""

import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest


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


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(app):
    """Run ``app`` with uvicorn on a free loopback port in a thread; returns (server, thread, port)."""
    import uvicorn

    port = free_port()
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    th = threading.Thread(target=srv.run, daemon=True)
    th.start()
    deadline = time.time() + 60
    while not srv.started and time.time() < deadline:
        time.sleep(0.05)
    assert srv.started, "server did not start"
    return srv, th, port


def http(method, url, body=None, headers=None):
    """(status, headers, text) with the standard library (no extra HTTP client needed)."""
    import json
    import urllib.error
    import urllib.request

    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, dict(r.headers), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read().decode()


@pytest.fixture(scope="module")
def server(tiny_models):
    from engine.serving import ServerConfig, create_app

    holder = {"router": SwitchRouter(), "loads": 0}

    def loader():
        holder["loads"] += 1
        return holder["router"]

    cfg = ServerConfig(model_path=str(tiny_models.target), draft_path=str(tiny_models.draft),
                       max_tokens_limit=64)
    app = create_app(loader, cfg, supported_modes=["fp16_baseline", "prefix_caching", "int8_quant",
                                                   "continuous_batching"])
    srv, th, port = start(app)
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
    yield {"client": client, "holder": holder, "app": app, "port": port}
    srv.should_exit = True
    th.join(timeout=30)


def test_completion_reports_mode_and_routing_time(server):
    raw = server["client"].completions.with_raw_response.create(
        model="modeswitch", prompt="def parse(self, text):", max_tokens=8)
    body = raw.parse()
    assert raw.headers["x-modeswitch-mode"] == "fp16_baseline"
    assert float(raw.headers["x-modeswitch-route-us"]) >= 0
    assert body.usage.completion_tokens == 8 and body.choices[0].text
    assert body.model_extra["modeswitch"]["mode"] == "fp16_baseline"


def test_chat_and_streaming_give_the_same_text(server):
    c = server["client"]
    server["holder"]["router"].mode = "int8_quant"
    msgs = [{"role": "user", "content": "import os\nimport sys"}]
    full = c.chat.completions.create(model="modeswitch", messages=msgs, max_tokens=10)
    chunks = list(c.chat.completions.create(model="modeswitch", messages=msgs, max_tokens=10, stream=True))
    streamed = "".join(ch.choices[0].delta.content or "" for ch in chunks)
    assert full.model_extra["modeswitch"]["mode"] == "int8_quant"
    assert chunks[0].model_extra["modeswitch"]["mode"] == "int8_quant"
    assert streamed == full.choices[0].message.content  # greedy decoding: same tokens
    assert chunks[-1].choices[0].finish_reason in ("length", "stop")
    assert sum(1 for ch in chunks if ch.choices[0].delta.content) >= 2  # tokens arrived in pieces
    server["holder"]["router"].mode = "fp16_baseline"


def test_concurrent_requests_share_the_continuous_batching_engine(server):
    c = server["client"]
    server["holder"]["router"].mode = "continuous_batching"
    msgs = [[{"role": "user", "content": f"def f{i}(x):"}] for i in range(6)]
    try:
        with ThreadPoolExecutor(6) as pool:
            outs = list(pool.map(lambda m: c.chat.completions.create(model="modeswitch", messages=m,
                                                                        max_tokens=24), msgs))
        alone = c.chat.completions.create(model="modeswitch", messages=msgs[0], max_tokens=24)
        chunks = list(c.chat.completions.create(model="modeswitch", messages=msgs[0], max_tokens=24,
                                                stream=True))
    finally:
        server["holder"]["router"].mode = "fp16_baseline"
    assert all(o.model_extra["modeswitch"]["mode"] == "continuous_batching" for o in outs)
    assert all(o.usage.completion_tokens == 24 for o in outs)
    # in a batch or alone, greedy decoding gives the same text; streamed too, in pieces
    assert outs[0].choices[0].message.content == alone.choices[0].message.content
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == alone.choices[0].message.content
    assert sum(1 for ch in chunks if ch.choices[0].delta.content) >= 2
    engine = server["app"].state.serving["pool"].acquire("continuous_batching")
    server["app"].state.serving["pool"].release("continuous_batching")
    assert engine.info["max_requests_in_batch"] >= 2


def test_bad_requests_get_400_with_a_clear_message(server):
    c = server["client"]
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        c.completions.create(model="m", prompt="x", max_tokens=0)
    with pytest.raises(openai.BadRequestError, match="exceeds this server's limit 64"):
        c.completions.create(model="m", prompt="x", max_tokens=65)
    with pytest.raises(openai.BadRequestError, match="messages"):
        c.chat.completions.create(model="m", messages=[], max_tokens=4)


def test_router_failure_falls_back_to_the_reference_and_is_counted(server):
    server["holder"]["router"].mode = "raise"
    try:
        r = server["client"].completions.with_raw_response.create(model="m", prompt="class A:", max_tokens=4)
    finally:
        server["holder"]["router"].mode = "fp16_baseline"
    assert r.headers["x-modeswitch-mode"] == "fp16_baseline"
    assert r.parse().model_extra["modeswitch"]["fallback"] == "error"
    server["holder"]["router"].mode = "awq_4bit"  # a mode this engine does not offer
    try:
        r = server["client"].completions.with_raw_response.create(model="m", prompt="class A:", max_tokens=4)
    finally:
        server["holder"]["router"].mode = "fp16_baseline"
    assert r.parse().model_extra["modeswitch"]["fallback"] == "unknown_mode"
    text = http("GET", f"http://127.0.0.1:{server['port']}/metrics")[2]
    assert 'modeswitch_fallbacks_total{reason="error"} 1.0' in text
    assert 'modeswitch_fallbacks_total{reason="unknown_mode"} 1.0' in text
    assert "modeswitch_routing_seconds_bucket" in text


def test_reload_under_load_drops_nothing(server):
    c = server["client"]
    holder = server["holder"]
    before = holder["loads"]

    def one(i):
        return c.completions.create(model="m", prompt=f"def f{i}(x):", max_tokens=6)

    with ThreadPoolExecutor(8) as ex:
        futs = [ex.submit(one, i) for i in range(16)]
        time.sleep(0.3)
        holder["router"] = SwitchRouter("prefix_caching")
        status = http("POST", f"http://127.0.0.1:{server['port']}/admin/reload")[0]
        results = [f.result(timeout=120) for f in futs]
    assert status == 200 and holder["loads"] == before + 1
    assert len(results) == 16 and all(x.usage.completion_tokens == 6 for x in results)
    after = c.completions.create(model="m", prompt="def g(x):", max_tokens=4)
    assert after.model_extra["modeswitch"]["mode"] == "prefix_caching"
    holder["router"] = SwitchRouter()
    http("POST", f"http://127.0.0.1:{server['port']}/admin/reload")
    health = __import__("json").loads(http("GET", f"http://127.0.0.1:{server['port']}/health")[2])
    assert health["status"] == "ok" and health["in_flight"] == 0
    models = c.models.list()
    assert models.data[0].id == "modeswitch"


def test_api_key_is_enforced(tiny_models):
    from engine.serving import ServerConfig, create_app

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


def test_engine_pool_unloads_least_recently_used_within_budget():
    from engine.serving.pool import EnginePool

    closed = []

    class Fake:
        def __init__(self, mode):
            self.mode, self.weights_mb = mode, 10.0

        def close(self):
            closed.append(self.mode)

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


def test_prefix_tracker_finds_shared_prefixes():
    from engine.serving.pool import PrefixTracker

    t = PrefixTracker(min_tokens=4)
    assert t.observe(list(range(100))) == 0
    assert t.observe(list(range(50)) + [999] * 10) == 50
    assert t.observe([7, 8, 9]) == 0


def test_export_and_load_round_trip(tmp_path):
    import mlflow

    from dataset.features import features_frame
    from dataset.workloads import get_workload
    from oracle.training_table import build_training_table
    from routers import get_router
    from routers.export import export_router, load_router
    from tests.test_routers_learned import synthetic_profile

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

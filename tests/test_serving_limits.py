"""The server under careless or hostile clients: disconnects release everything and stop
generation, limits answer before expensive work, every error has OpenAI's shape.

The engine here is a test double (a slow token loop that records how far it got): these
tests are about the server around it, and must not spend minutes generating."""

import json
import socket
import threading
import time

import pytest

from modeswitch.engine.results import Generation
from tests.helpers import http, start


class SlowEngine:
    """Emits one token every ``step_s`` up to max_tokens, calling on_token each time."""

    tokenizer = None
    info: dict = {}
    concurrent_runs = False
    weights_mb = 1.0
    produced: list = []

    def __init__(self, mode, step_s=0.01):
        self.mode, self.step_s = mode, step_s

    def run(self, group, ignore_eos=True, on_token=None):
        out = []
        for req, _ids in group:
            n = 0
            try:
                for n in range(1, req.expected_output_tokens + 1):
                    time.sleep(self.step_s)
                    if on_token is not None:
                        on_token(req.id, [65 + n % 26])
            finally:
                SlowEngine.produced.append(n)
            out.append(Generation(req.id, [65] * n, "A" * n, n * self.step_s * 1000, []))
        return out

    def close(self):
        pass


class CharTokenizer:
    chat_template = None
    calls = 0

    def __call__(self, text, add_special_tokens=True):
        CharTokenizer.calls += 1
        return {"input_ids": [ord(ch) % 256 for ch in text]}

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids)


class Fixed:
    def route(self, request):
        return "fp16_baseline"


def _server(step_s=0.01, **cfg_kw):
    from modeswitch.engine.serving import ServerConfig, create_app

    cfg = ServerConfig(model_path="unused", max_tokens_limit=4096, context_tokens=8192, **cfg_kw)
    app = create_app(lambda: Fixed(), cfg, engine_factory=lambda mode: SlowEngine(mode, step_s),
                     tokenizer=CharTokenizer(), supported_modes=["fp16_baseline"])
    return start(app), app


@pytest.fixture(scope="module")
def srv():
    (server, th, port), app = _server(max_body_bytes=64 * 1024, max_in_flight=64)
    yield {"port": port, "app": app}
    server.should_exit = True
    th.join(timeout=30)


def _health(port):
    return json.loads(http("GET", f"http://127.0.0.1:{port}/health")[2])


def _send_and_leave(port, body: dict, read_bytes: int = 0, errors: list | None = None, wait_s: float = 0.0):
    """Send a request on a raw socket, read a little (or nothing), then hang up; a failure
    to connect or send is recorded in ``errors`` (a thread's exception is otherwise lost)."""
    try:
        data = json.dumps(body).encode()
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  + f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
        if read_bytes:
            assert s.recv(read_bytes)
        time.sleep(wait_s)
        s.close()
    except Exception as exc:  # noqa: BLE001 - reported by the test
        if errors is not None:
            errors.append(exc)


def _wait_idle(port, timeout=30.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if _health(port)["in_flight"] == 0:
            return True
        time.sleep(0.1)
    return False


def test_fifty_disconnects_leave_nothing_in_flight_and_stop_generating(srv):
    port = srv["port"]
    SlowEngine.produced.clear()
    threads, errors = [], []
    for i in range(50):  # streamed (some gone after the headers, some at once) and whole
        body = {"prompt": f"def f{i}():", "max_tokens": 2000, "stream": i % 2 == 0}
        threads.append(threading.Thread(target=_send_and_leave,
                                        args=(port, body, 64 if i % 4 == 0 else 0, errors)))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert _wait_idle(port), _health(port)
    # 2,000 tokens at 10 ms would take 20 s each, 1,000 s one after another: the ones that
    # reached the engine stopped early, the others never started
    assert 1 <= len(SlowEngine.produced) <= 50 and max(SlowEngine.produced) < 2000
    status, headers, text = http("POST", f"http://127.0.0.1:{port}/v1/completions",
                                 {"prompt": "still", "max_tokens": 3})
    assert status == 200 and json.loads(text)["choices"][0]["text"]
    assert _health(port)["in_flight"] == 0


@pytest.mark.parametrize("method, path, body, status, says", [
    ("GET", "/v1/nothing", None, 404, "no endpoint GET /v1/nothing"),
    ("GET", "/v1/completions", None, 405, "GET is not allowed"),
    ("POST", "/v1/completions", {"prompt": "x", "n": 2}, 400, "n:"),
    ("POST", "/v1/completions", {"prompt": "x", "temperature": -1}, 400, "temperature"),
    ("POST", "/v1/completions", {"prompt": "x", "top_p": 7}, 400, "top_p"),
    ("POST", "/v1/completions", {"prompt": "x", "max_tokens": True}, 400, "max_tokens"),
    ("POST", "/v1/completions", {"prompt": "\ud800", "max_tokens": 2}, 400, "lone surrogate"),
    ("POST", "/v1/completions", {"prompt": "x", "model": "gpt-9"}, 404, "model 'gpt-9' is not served here"),
    ("POST", "/v1/chat/completions", {"messages": [{"role": "hacker", "content": "x"}]}, 400, "role"),
    ("POST", "/v1/completions", {"prompt": "x" * 300_000, "max_tokens": 2}, 413, "exceeds this server's limit"),
    ("POST", "/v1/completions", {"prompt": "x" * 8190, "max_tokens": 10}, 400, "exceed the model's context"),
])
def test_bad_requests_get_openai_shaped_errors_and_no_5xx(srv, method, path, body, status, says):
    got, _, text = http(method, f"http://127.0.0.1:{srv['port']}{path}", body)
    err = json.loads(text)["error"]
    assert got == status and says in err["message"], (got, text[:300])
    assert {"message", "type", "code"} <= set(err)
    assert _health(srv["port"])["in_flight"] == 0


def _post_raw(port: int, path: str, raw: bytes) -> tuple[int, dict]:
    """(status, JSON body) of a POST of exactly these bytes."""
    import urllib.error
    import urllib.request

    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=raw, method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.mark.parametrize("path, raw, says", [
    ("/v1/completions", b"{not json", "not valid JSON"),
    ("/v1/completions", b"\xff\xfe{not json", "not utf-16-le text"),  # a UTF-16 byte-order mark, then bytes
    ("/v1/completions", b'{"prompt": "\xff", "max_tokens": 2}', "not utf-8 text (invalid start byte at byte 12)"),
    # parsed on the loop (under 8 KiB) and in the pool (over it)
    ("/v1/completions", b"[" * 5_000, "nested too deeply"),
    ("/v1/chat/completions", b"[" * 60_000, "nested too deeply"),
    ("/v1/chat/completions", b'{"messages": [], "x": ' + b'{"a": ' * 10_000, "nested too deeply"),
    ("/v1/completions", b'{"prompt": "x", "max_tokens": ' + b"9" * 5_000 + b"}", "a number of 5,000 digits"),
])
def test_a_body_that_cannot_be_parsed_is_a_400_saying_why(srv, path, raw, says, caplog):
    status, body = _post_raw(srv["port"], path, raw)
    assert status == 400 and says in body["error"]["message"], (status, body)
    assert body["error"]["type"] == "invalid_request_error"
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"
    assert _health(srv["port"])["in_flight"] == 0


def test_a_huge_prompt_is_refused_before_it_is_tokenised():
    (server, th, port), _ = _server(max_body_bytes=64 * 1024 * 1024, max_in_flight=8)
    try:
        before = CharTokenizer.calls
        status, _, text = http("POST", f"http://127.0.0.1:{port}/v1/completions",
                               {"prompt": "x" * 2_000_000, "max_tokens": 2})
        assert status == 400 and "cannot fit the model's context" in text
        assert CharTokenizer.calls == before
    finally:
        server.should_exit = True
        th.join(timeout=30)


def test_a_full_server_answers_503_with_retry_after():
    (server, th, port), _ = _server(max_in_flight=2)
    try:
        results = []

        def slow():
            results.append(http("POST", f"http://127.0.0.1:{port}/v1/completions",
                                {"prompt": "slow", "max_tokens": 100})[0])

        ts = [threading.Thread(target=slow) for _ in range(2)]
        for t in ts:
            t.start()
        time.sleep(0.3)
        status, headers, text = http("POST", f"http://127.0.0.1:{port}/v1/completions",
                                     {"prompt": "one more", "max_tokens": 2})
        assert status == 503 and headers.get("retry-after") == "1" and "error" in json.loads(text)
        for t in ts:
            t.join()
        assert results == [200, 200] and _health(port)["in_flight"] == 0
    finally:
        server.should_exit = True
        th.join(timeout=30)


def test_the_api_docs_are_behind_the_key_when_one_is_set():
    from modeswitch.engine.serving import ServerConfig, create_app

    cfg = ServerConfig(model_path="unused", api_key="sekrit", context_tokens=512)
    app = create_app(lambda: Fixed(), cfg, engine_factory=lambda mode: SlowEngine(mode),
                     tokenizer=CharTokenizer(), supported_modes=["fp16_baseline"])
    server, th, port = start(app)
    try:
        for path in ("/openapi.json", "/docs"):
            assert http("GET", f"http://127.0.0.1:{port}{path}")[0] == 401
            got = http("GET", f"http://127.0.0.1:{port}{path}", headers={"Authorization": "Bearer sekrit"})
            assert got[0] == 200
        schema = json.loads(http("GET", f"http://127.0.0.1:{port}/openapi.json",
                                 headers={"Authorization": "Bearer sekrit"})[2])
        assert "/v1/completions" in schema["paths"]
    finally:
        server.should_exit = True
        th.join(timeout=30)


def test_clients_gone_while_queued_for_a_busy_engine_give_their_slots_back_at_once(srv):
    """One long request holds the (one-at-a-time) engine; twenty more queue behind it and
    hang up: their slots come back while the long one still runs."""
    port = srv["port"]
    done = []
    long = threading.Thread(target=lambda: done.append(http(
        "POST", f"http://127.0.0.1:{port}/v1/completions", {"prompt": "long", "max_tokens": 300})[0]))
    long.start()
    time.sleep(0.3)
    errors = []
    ts = [threading.Thread(target=_send_and_leave,
                           args=(port, {"prompt": f"q{i}", "max_tokens": 50, "stream": i % 2 == 0}, 0, errors, 0.3))
          for i in range(20)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors
    deadline = time.time() + 2.0  # the long request needs 3 s more: well within its run
    while _health(port)["in_flight"] > 1 and time.time() < deadline:
        time.sleep(0.05)
    assert _health(port)["in_flight"] == 1 and not done
    long.join()
    assert done == [200] and _wait_idle(port)


def test_a_chunked_body_over_the_limit_is_refused_while_it_arrives(srv):
    s = socket.create_connection(("127.0.0.1", srv["port"]), timeout=10)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Transfer-Encoding: chunked\r\n\r\n")
    chunk = b'{"prompt": "' + b"x" * 30_000
    for part in (chunk, b"y" * 30_000, b"z" * 30_000, b'"}'):
        s.sendall(f"{len(part):x}\r\n".encode() + part + b"\r\n")
    s.sendall(b"0\r\n\r\n")
    reply = b""
    while b"\r\n\r\n" not in reply or not reply.rstrip().endswith(b"}"):
        got = s.recv(65536)
        if not got:
            break
        reply += got
    s.close()
    assert reply.startswith(b"HTTP/1.1 413") and b"exceeds this server's limit" in reply


def test_metrics_break_a_request_down_by_stage(srv):
    port = srv["port"]
    assert http("POST", f"http://127.0.0.1:{port}/v1/completions", {"prompt": "x", "max_tokens": 2})[0] == 200
    text = http("GET", f"http://127.0.0.1:{port}/metrics")[2]
    for stage in ("arrive", "tokenize", "prefix", "features", "route", "serving_route", "load", "wait", "generate"):
        line = next(x for x in text.splitlines()
                    if x.startswith(f'modeswitch_stage_seconds_count{{stage="{stage}"}}'))
        assert float(line.split()[-1]) >= 1, stage


_CHAT = [{"role": "user", "content": "x"}]


@pytest.mark.parametrize("path, body, field, says", [
    ("/v1/chat/completions", {"messages": _CHAT, "logprobs": True}, "logprobs", "log-probabilities are not available"),
    ("/v1/chat/completions", {"messages": _CHAT, "top_logprobs": 2}, "top_logprobs", "not available"),
    ("/v1/chat/completions", {"messages": _CHAT, "top_logprobs": 21}, "top_logprobs", "less than or equal to 20"),
    ("/v1/chat/completions", {"messages": _CHAT, "top_logprobs": -1}, "top_logprobs", "greater than or equal to 0"),
    ("/v1/completions", {"prompt": "x", "logprobs": 0}, "logprobs", "log-probabilities are not available"),
    ("/v1/completions", {"prompt": "x", "logprobs": 6}, "logprobs", "less than or equal to 5"),
    ("/v1/completions", {"prompt": "x", "stop": ["a"] * 10_000}, "stop", "at most 16 stop sequences"),
    ("/v1/chat/completions", {"messages": _CHAT, "stop": "x" * 300}, "stop", "at most 256 characters"),
    ("/v1/completions", {"prompt": "x", "stream_options": {"include_usage": True}}, "stream_options",
     "only allowed when stream is true"),
    ("/v1/completions", {"prompt": "x", "stream": True, "stream_options": {"continuous_usage_stats": True}},
     "stream_options.continuous_usage_stats", "not permitted"),
])
def test_fields_the_server_cannot_honour_are_refused_naming_them(srv, path, body, field, says):
    status, _, text = http("POST", f"http://127.0.0.1:{srv['port']}{path}", {"max_tokens": 2, **body})
    message = json.loads(text)["error"]["message"]
    assert status == 400 and f"{field}: " in message and says in message, (status, message)


def test_fields_that_ask_nothing_of_the_output_are_accepted(srv):
    url = f"http://127.0.0.1:{srv['port']}"
    for path, body in (("/v1/chat/completions", {"messages": _CHAT, "logprobs": False, "top_logprobs": None}),
                       ("/v1/completions", {"prompt": "x", "logprobs": None, "stop": [""] * 16}),
                       ("/v1/completions", {"prompt": "x", "stream": True, "stream_options": {"include_usage": False}})):
        assert http("POST", url + path, {"max_tokens": 2, **body})[0] == 200, body


def _sse(port: int, path: str, body: dict) -> list:
    """A stream's events as parsed bodies, ``[DONE]`` as the string."""
    status, _, text = http("POST", f"http://127.0.0.1:{port}{path}", {**body, "stream": True})
    assert status == 200, text
    events = [line[6:] for line in text.split("\n\n") if line.startswith("data: ")]
    return [e if e == "[DONE]" else json.loads(e) for e in events]


def test_a_stop_sequence_ends_the_text_and_the_generation(srv):
    """The test engine writes B, C, D, ... one token each: "EF" spans two tokens, so
    the text is "BCD", the finish "stop", and generation ends at the fifth token, not
    at max_tokens; streamed the same, the usage last when asked for."""
    port = srv["port"]
    SlowEngine.produced.clear()
    body = {"prompt": "x", "max_tokens": 500, "stop": ["zz", "EF"]}
    status, _, text = http("POST", f"http://127.0.0.1:{port}/v1/completions", body)
    whole = json.loads(text)
    assert status == 200 and whole["choices"][0]["text"] == "BCD"
    assert whole["choices"][0]["finish_reason"] == "stop" and whole["usage"]["completion_tokens"] == 5
    assert SlowEngine.produced == [5]
    events = _sse(port, "/v1/completions", {**body, "stream_options": {"include_usage": True}})
    assert events[-1] == "[DONE]" and events[-2]["choices"] == []
    assert events[-2]["usage"] == {"prompt_tokens": 1, "completion_tokens": 5, "total_tokens": 6}
    assert "".join(e["choices"][0]["text"] for e in events[:-2]) == "BCD"
    assert events[-3]["choices"][0]["finish_reason"] == "stop"
    # by the stream's end generation has stopped and the request is counted out
    assert _health(port)["in_flight"] == 0 and len(SlowEngine.produced) == 2 and SlowEngine.produced[1] < 50
    # a stop sequence never written: the whole text, to max_tokens
    status, _, text = http("POST", f"http://127.0.0.1:{port}/v1/completions",
                           {"prompt": "x", "max_tokens": 6, "stop": "BD"})
    assert json.loads(text)["choices"][0] == {"index": 0, "text": "AAAAAA", "finish_reason": "length",
                                              "logprobs": None}

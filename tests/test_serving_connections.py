"""Connection-level limits and a loop that never stalls: silent, trickling and stalled
clients cannot take the slots real requests need, and a request of many tiny messages is
parsed and refused away from the event loop while ``/health`` keeps answering.

The server runs with ``engine.serving.connections.uvicorn_options``, as ``modeswitch
serve`` runs it, on the test doubles of ``test_serving_limits`` (no model)."""

import json
import socket
import threading
import time

import pytest

from modeswitch.engine.serving.tokens import chat_chars
from tests.helpers import http, start
from tests.test_serving_limits import CharTokenizer, Fixed, SlowEngine


def _server(**cfg_kw):
    from modeswitch.engine.serving import ServerConfig, create_app
    from modeswitch.engine.serving.connections import uvicorn_options

    cfg = ServerConfig(model_path="unused", max_tokens_limit=4096, context_tokens=8192, **cfg_kw)
    app = create_app(lambda: Fixed(), cfg, engine_factory=lambda mode: SlowEngine(mode, 0.001),
                     tokenizer=CharTokenizer(), supported_modes=["fp16_baseline"])
    server, th, port = start(app, **uvicorn_options(cfg))
    return server, th, port, app


@pytest.fixture
def serving(request):
    server, th, port, app = _server(**getattr(request, "param", {}))
    yield port, app
    server.should_exit = True
    th.join(timeout=30)


def _connect(port, source="127.0.0.1"):
    s = socket.socket()
    s.bind((source, 0))
    s.settimeout(10)
    s.connect(("127.0.0.1", port))
    return s


def _closed_within(s, seconds) -> float | None:
    """Seconds until the server closed ``s`` (reads EOF), or None if it stayed open."""
    t0 = time.perf_counter()
    s.settimeout(seconds)
    try:
        while s.recv(4096):
            pass
        return time.perf_counter() - t0
    except TimeoutError:
        return None
    except ConnectionResetError:
        return time.perf_counter() - t0


def _timed(method, url, body=None):
    t0 = time.perf_counter()
    status, _, text = http(method, url, body)
    return status, time.perf_counter() - t0, text


@pytest.mark.parametrize("serving", [{"max_in_flight": 8, "header_timeout_s": 30.0}], indirect=True)
def test_silent_connections_do_not_take_the_slots_of_real_requests(serving):
    """With max_in_flight 8 the old limit (8 + 32 sockets) was full after 40 silent
    connections; admission now counts requests, so 120 change nothing."""
    port, _ = serving
    silent = [_connect(port, "127.0.0.2") for _ in range(120)]
    try:
        time.sleep(0.2)
        status, took, text = _timed("POST", f"http://127.0.0.1:{port}/v1/completions",
                                    {"prompt": "hello", "max_tokens": 2})
        assert status == 200 and took < 2.0, (status, text[:200])
        status, took, _ = _timed("GET", f"http://127.0.0.1:{port}/health")
        assert status == 200 and took < 2.0
    finally:
        for s in silent:
            s.close()


@pytest.mark.parametrize("serving", [{"header_timeout_s": 0.5}], indirect=True)
def test_silent_and_trickling_connections_are_closed_by_the_header_timeout(serving):
    port, _ = serving
    silent = _connect(port)
    trickle = _connect(port)

    def drip():  # one header byte every 50 ms: bytes do not extend the deadline
        try:
            for ch in b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 200:
                trickle.send(bytes([ch]))
                time.sleep(0.05)
        except OSError:
            pass

    th = threading.Thread(target=drip, daemon=True)
    th.start()
    assert (t := _closed_within(silent, 5.0)) is not None and 0.3 < t < 2.0
    assert _closed_within(trickle, 5.0) is not None
    th.join(timeout=15)
    silent.close()
    trickle.close()


@pytest.mark.parametrize("serving", [{"body_timeout_s": 0.5}], indirect=True)
def test_a_stalled_body_is_closed_by_its_timeout_and_counted_out(serving):
    port, app = serving
    s = _connect(port)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: 5000\r\n\r\n" + b'{"prompt": "' + b"a" * 8)
    took = _closed_within(s, 10.0)
    s.close()
    assert took is not None and took < 3.0
    health = json.loads(http("GET", f"http://127.0.0.1:{port}/health")[2])
    assert health["in_flight"] == 0
    # nobody was left to answer; nothing was counted as an internal error
    errors = app.state.metrics.errors.labels("internal")._value.get()
    assert errors == 0


@pytest.mark.parametrize("serving", [{"max_connections_per_peer": 4, "header_timeout_s": 30.0}], indirect=True)
def test_one_address_holds_at_most_its_cap_and_loses_its_idle_connections_first(serving):
    port, _ = serving
    first = [_connect(port, "127.0.0.3") for _ in range(4)]
    time.sleep(0.2)
    fifth = _connect(port, "127.0.0.3")
    assert _closed_within(first[0], 3.0) is not None  # the oldest idle one made room
    assert _closed_within(fifth, 0.3) is None  # the newcomer stays
    # another address is not affected by this one's cap
    status, _, _ = http("POST", f"http://127.0.0.1:{port}/v1/completions", {"prompt": "hi", "max_tokens": 2})
    assert status == 200
    for s in [*first, fifth]:
        s.close()


def test_chat_size_counts_roles_and_markup_not_only_content():
    from modeswitch.engine.serving.app import INLINE_TOKENIZE_CHARS
    from modeswitch.engine.serving.schemas import Message

    empty = [Message(role="user", content="")] * 1000
    assert chat_chars(empty) > INLINE_TOKENIZE_CHARS  # tokenised in the pool, not on the loop


@pytest.mark.parametrize("serving", [{"max_body_bytes": 16 * 1024 * 1024}], indirect=True)
def test_health_answers_while_a_request_of_270000_messages_is_refused(serving):
    """Its 8 MB are more than any request fitting the context could need: refused by its
    length, unread (parsing it on the loop stalled the server for 1-3 s)."""
    port, _ = serving
    body = json.dumps({"messages": [{"role": "user", "content": ""}] * 270_000},
                      separators=(",", ":")).encode()
    before = CharTokenizer.calls
    result = {}

    def big():
        import urllib.error
        import urllib.request

        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
        try:
            urllib.request.urlopen(req, timeout=60)
        except urllib.error.HTTPError as e:
            result["status"], result["text"] = e.code, e.read().decode()
        except OSError as e:  # refused before the client finished sending
            result["status"], result["text"] = 413, str(e)

    th = threading.Thread(target=big)
    th.start()
    worst = 0.0
    while th.is_alive():
        _, took, _ = _timed("GET", f"http://127.0.0.1:{port}/health")
        worst = max(worst, took)
    th.join()
    assert result["status"] == 413, result
    assert CharTokenizer.calls == before
    assert worst < 0.5, worst


@pytest.mark.parametrize("serving", [{}], indirect=True)
def test_more_messages_than_context_tokens_are_refused_before_validation(serving, monkeypatch):
    """Under the body limit but over the context (8,192 here): parsed off the loop and
    refused by the message count, before a single message is validated or tokenised."""
    from modeswitch.engine.serving import schemas

    port, _ = serving
    validated = []
    monkeypatch.setattr(schemas.ChatBody, "model_validate", classmethod(lambda cls, d: validated.append(d)))
    status, _, text = http("POST", f"http://127.0.0.1:{port}/v1/chat/completions",
                           {"messages": [{"role": "user", "content": ""}] * 9_000})
    assert status == 400 and "9,000 messages cannot fit the model's context of 8192 tokens" in text, text[:300]
    assert validated == []


@pytest.mark.parametrize("serving", [{}], indirect=True)
def test_many_short_messages_are_tokenised_off_the_loop(serving, monkeypatch):
    port, _ = serving
    threads = []
    real = CharTokenizer.__call__

    def spy(self, text, add_special_tokens=True):
        threads.append(threading.current_thread().name)
        return real(self, text, add_special_tokens)

    monkeypatch.setattr(CharTokenizer, "__call__", spy)
    status, _, text = http("POST", f"http://127.0.0.1:{port}/v1/chat/completions",
                           {"messages": [{"role": "user", "content": "x"}] * 200, "max_tokens": 2})
    assert status == 200, text[:200]
    assert threads and all(t.startswith("tokenize") for t in threads)


def test_a_chat_template_gives_token_ids_not_the_encodings_keys():
    """The default model's tokenizer answers a BatchEncoding (a Mapping, not a dict)."""
    from modeswitch.engine.serving.schemas import Message
    from modeswitch.engine.serving.tokens import chat_ids

    try:
        from transformers import AutoTokenizer

        from modeswitch.engine.models.resolve import resolve_models
        from modeswitch.engine.modes import reference_mode

        # the tokenizer only: asking for the reference mode alone builds no draft
        target, _, _ = resolve_models(None, None, None, None, lambda *a: None, modes=[reference_mode().name])
        tok = AutoTokenizer.from_pretrained(target)
    except Exception as exc:  # noqa: BLE001 - no default model on this machine
        pytest.skip(f"the default model is not available here ({type(exc).__name__})")
    assert tok.chat_template
    ids = chat_ids(tok, [Message(role="user", content="hello")])
    assert ids and all(isinstance(i, int) for i in ids)


#: the key the slow-body tests' server requires
KEY = "k-slow-bodies"


def _slow_bodies(port, count, addresses, path="/v1/chat/completions", key=KEY, pace=None):
    """``count`` connections from ``addresses`` loopback addresses (127.0.0.2 on), each
    with complete headers (and ``key``) and the first bytes of a 5,000-byte body.
    ``pace(n)``, when given, is called after every 25 connections (n so far): a burst all
    at once is taken in out of order, paced ones as an attacker's arrive."""
    socks = []
    auth = f"Authorization: Bearer {key}\r\n".encode() if key else b""
    for i in range(count):
        if pace is not None and i and i % 25 == 0:
            pace(i)
        s = _connect(port, f"127.0.0.{2 + i % addresses}")
        s.sendall(b"POST " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  + auth + b"Content-Length: 5000\r\n\r\n" + b'{"messages": [')
        socks.append(s)
    return socks


def _trickle(socks, stop: threading.Event, rounds=20):
    """One byte on each connection every 0.2 s, ``rounds`` times at most."""
    for _ in range(rounds):
        if stop.wait(0.2):
            return
        for s in socks:
            try:
                s.send(b" ")
            except OSError:
                pass


def _arrived(server, count, within_s=5.0) -> int:
    """Wait (``within_s`` at most) until the server has read ``count`` requests' headers
    (each has a task of its own) and not answered them. Returns how many it has."""
    deadline = time.perf_counter() + within_s
    while len(server.server_state.tasks) < count and time.perf_counter() < deadline:
        time.sleep(0.02)
    return len(server.server_state.tasks)


def test_slow_bodies_from_many_addresses_do_not_lock_anyone_out():
    """300 connections from 200 addresses, with the key, trickling their bodies: they hold
    no request slot until their body is in, so a normal chat request and /health answer
    at once (each used to get a 503 until the body timeout closed them)."""
    server, th, port, _ = _server(api_key=KEY)
    socks = _slow_bodies(port, 300, 200, pace=lambda n: _arrived(server, n))
    stop = threading.Event()
    dripping = threading.Thread(target=_trickle, args=(socks, stop), daemon=True)
    dripping.start()
    try:
        assert _arrived(server, 300) >= 300
        headers = {"Authorization": f"Bearer {KEY}"}
        t0 = time.perf_counter()
        status, _, text = http("POST", f"http://127.0.0.1:{port}/v1/chat/completions",
                               {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}, headers)
        took = time.perf_counter() - t0
        assert status == 200 and took < 1.0, (status, took, text[:200])
        status, took, _ = _timed("GET", f"http://127.0.0.1:{port}/health")
        assert status == 200 and took < 1.0, (status, took)
    finally:
        stop.set()
        dripping.join(timeout=5)
        for s in socks:
            s.close()
        server.should_exit = True
        th.join(timeout=30)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/admin/feedback", "/admin/reload"])
def test_a_body_without_the_key_is_refused_401_before_it_is_read(path):
    """Checked from the headers: the 401 comes while the body is still arriving, and the
    connection is closed rather than left to wait for it (feedback takes the admin key)."""
    server, th, port, _ = _server(api_key=KEY, admin_key="k-admin")
    try:
        (s,) = _slow_bodies(port, 1, 1, path=path, key="wrong")
        s.settimeout(2.0)
        assert s.recv(4096).startswith(b"HTTP/1.1 401")
        assert _closed_within(s, 2.0) is not None
        s.close()
        # a malformed body without the key is a 401 too, not a 400 from parsing it
        status, _, text = http("POST", f"http://127.0.0.1:{port}{path}", "not an object")
        assert status == 401 and "key" in text, text
    finally:
        server.should_exit = True
        th.join(timeout=30)


def test_a_body_completing_when_every_slot_is_taken_gets_503(monkeypatch):
    """A request whose body arrives after its headers is checked when the body is in."""
    from modeswitch.engine.serving.connections import ConnectionLimits

    server, th, port, _ = _server(api_key=KEY)
    try:
        (s,) = _slow_bodies(port, 1, 1)
        assert _arrived(server, 1) == 1
        monkeypatch.setattr(ConnectionLimits, "busy", lambda self, tasks: self.max_requests + 1)
        s.sendall(b" " * (5000 - len(b'{"messages": [')))
        s.settimeout(5.0)
        head = s.recv(4096)
        assert head.startswith(b"HTTP/1.1 503") and b"retry-after: 1" in head.lower(), head[:300]
        s.close()
    finally:
        server.should_exit = True
        th.join(timeout=30)


def test_bodies_in_transit_are_capped_and_the_longest_sending_is_closed():
    server, th, port, _ = _server(api_key=KEY, max_receiving_bodies=3)
    try:
        socks = _slow_bodies(port, 3, 3, pace=None)
        assert _arrived(server, 3) == 3
        (fourth,) = _slow_bodies(port, 1, 1)
        assert _closed_within(socks[0], 3.0) is not None
        assert _closed_within(fourth, 0.3) is None
        for s in [*socks, fourth]:
            s.close()
    finally:
        server.should_exit = True
        th.join(timeout=30)

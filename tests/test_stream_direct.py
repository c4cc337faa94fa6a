"""Streams read straight from an engine that streams on the server's loop (``astream``,
as vLLM's AsyncLLM does), without a producer task and queue in between: the same events,
the same stages, errors reported in the stream, and a client that hangs up stops the
request in the engine.

The engine is a test double (an async token loop that records how each request ended):
these tests are about the server around it. The real vLLM engine's ``astream`` is
exercised by ``tests/backend_vllm`` (``make test-vllm``)."""

import asyncio
import json
import threading
import time

import pytest

from tests.helpers import http, start
from tests.test_serving_limits import CharTokenizer, _health, _send_and_leave, _wait_idle


class StreamingEngine:
    """A batching engine streaming one token every ``step_s`` on the running loop; ``run``
    and ``arun`` fail (a stream must not use them). ``fail_at``: the token at which a
    stream raises."""

    tokenizer = None
    info: dict = {}
    concurrent_runs = True
    weights_mb = 1.0
    ended: list = []  # (request id, tokens sent, how it ended)
    fail_at = None

    def __init__(self, mode, step_s=0.005):
        self.mode, self.step_s = mode, step_s

    #: every stream handed out, held here so that only the server's own close (not the
    #: collector finalising a dropped generator) can end one early
    streams: list = []
    #: the task reading each stream
    readers: list = []

    def astream(self, req, ids):
        StreamingEngine.streams.append(gen := self._tokens(req))
        return gen

    async def _tokens(self, req):
        n, how = 0, "done"
        StreamingEngine.readers.append(asyncio.current_task().get_coro().__qualname__)
        try:
            for n in range(1, req.expected_output_tokens + 1):
                await asyncio.sleep(self.step_s)
                if StreamingEngine.fail_at == n:
                    raise RuntimeError("engine fell over")
                yield [65 + n % 26]
        except GeneratorExit:
            how = "closed"
            raise
        except asyncio.CancelledError:
            how = "cancelled"
            raise
        except RuntimeError:
            how = "failed"
            raise
        finally:
            StreamingEngine.ended.append((req.id, n, how))

    async def arun(self, group, ignore_eos=True, on_token=None):
        raise AssertionError("a stream read through arun")

    def run(self, group, ignore_eos=True, on_token=None):
        raise AssertionError("a stream read through run")

    def close(self):
        pass


class Fixed:
    def route(self, request):
        return "continuous_batching"


@pytest.fixture(scope="module")
def srv():
    from modeswitch.engine.serving import ServerConfig, create_app

    cfg = ServerConfig(model_path="unused", max_tokens_limit=4096, context_tokens=8192, max_in_flight=64)
    app = create_app(lambda: Fixed(), cfg, engine_factory=lambda mode: StreamingEngine(mode),
                     tokenizer=CharTokenizer(), supported_modes=["fp16_baseline", "continuous_batching"])
    server, th, port = start(app)
    yield {"port": port, "app": app}
    server.should_exit = True
    th.join(timeout=30)


def _events(port, body, done=True):
    """A stream's events, parsed; ``done``: it ends with ``[DONE]`` (a failed one ends on
    its error event)."""
    status, headers, text = http("POST", f"http://127.0.0.1:{port}/v1/completions", {**body, "stream": True})
    assert status == 200, text
    events = [e[6:] for e in text.split("\n\n") if e]
    assert (events[-1] == "[DONE]") == done
    return headers, [json.loads(e) for e in (events[:-1] if done else events)]


def _metric(port, name):
    text = http("GET", f"http://127.0.0.1:{port}/metrics")[2]
    line = next((x for x in text.splitlines() if x.startswith(name)), None)
    return float(line.split()[-1]) if line else 0.0


def test_a_stream_is_read_from_the_engine_in_the_response_s_task(srv):
    port = srv["port"]
    StreamingEngine.ended.clear()
    generated = _metric(port, 'modeswitch_stage_seconds_count{stage="generate"}')
    headers, events = _events(port, {"prompt": "hi", "max_tokens": 5})
    assert headers["x-modeswitch-mode"] == "continuous_batching"
    assert "".join(e["choices"][0]["text"] for e in events) == "BCDEF"
    assert [e["choices"][0]["finish_reason"] for e in events] == [None] * 4 + ["length"]
    assert "modeswitch" in events[0] and all("modeswitch" not in e for e in events[1:])
    assert [how for _, _, how in StreamingEngine.ended] == ["done"]
    assert StreamingEngine.readers and "_generate" not in StreamingEngine.readers[-1]  # no producer task
    assert _metric(port, 'modeswitch_stage_seconds_count{stage="generate"}') == generated + 1
    # a whole response still runs through arun (here: it fails, as the double says)
    assert http("POST", f"http://127.0.0.1:{port}/v1/completions", {"prompt": "hi", "max_tokens": 2})[0] == 500
    assert _wait_idle(port)


def test_a_stream_failing_in_the_engine_reports_it_in_the_stream(srv):
    port = srv["port"]
    failed = _metric(port, 'modeswitch_errors_total{kind="generation"}')
    StreamingEngine.fail_at = 3
    try:
        headers, events = _events(port, {"prompt": "hi", "max_tokens": 8}, done=False)
    finally:
        StreamingEngine.fail_at = None
    assert [e["choices"][0]["text"] for e in events[:2]] == ["B", "C"]
    assert len(events) == 3 and "engine fell over" in events[2]["error"]["message"]
    assert [how for _, _, how in StreamingEngine.ended][-1] == "failed"
    assert _metric(port, 'modeswitch_errors_total{kind="generation"}') == failed + 1
    assert _wait_idle(port)


def test_clients_that_hang_up_stop_their_requests_in_the_engine(srv):
    port = srv["port"]
    StreamingEngine.ended.clear()
    threads, errors = [], []
    for i in range(10):  # 2,000 tokens at 5 ms would take 10 s each
        threads.append(threading.Thread(target=_send_and_leave, args=(
            port, {"prompt": f"q{i}", "max_tokens": 2000, "stream": True}, 64, errors, 0.1)))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert _wait_idle(port, timeout=10), _health(port)
    deadline = time.time() + 5
    while len(StreamingEngine.ended) < 10 and time.time() < deadline:
        time.sleep(0.05)
    assert len(StreamingEngine.ended) == 10
    assert all(how in ("closed", "cancelled") and n < 2000 for _, n, how in StreamingEngine.ended)

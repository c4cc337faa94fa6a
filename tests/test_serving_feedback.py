"""Feedback tied to served requests: only the admin key reaches ``/admin/feedback``, and
the server takes one outcome per request an adapting router routed, within its window.

The engine and tokenizer are the test doubles of ``test_serving_limits`` (no model)."""

import json
import time

import pytest

from tests.helpers import http, start
from tests.test_serving_connections import _closed_within, _slow_bodies
from tests.test_serving_limits import CharTokenizer, SlowEngine

KEY, ADMIN = "k-api", "k-admin"


class Adapting:
    """A router that adapts online: records every outcome it is told."""

    def __init__(self):
        self.outcomes = []

    def route(self, request):
        return "fp16_baseline"

    def observe(self, violated):
        self.outcomes += list(violated)

    def state(self):
        return {"observed": len(self.outcomes)}


@pytest.fixture
def served(request):
    from modeswitch.engine.serving import ServerConfig, create_app

    router = Adapting()
    cfg = ServerConfig(model_path="unused", context_tokens=8192, api_key=KEY,
                       **{"admin_key": ADMIN, **getattr(request, "param", {})})
    app = create_app(lambda: router, cfg, engine_factory=lambda mode: SlowEngine(mode, 0.001),
                     tokenizer=CharTokenizer(), supported_modes=["fp16_baseline"])
    server, th, port = start(app)
    yield f"http://127.0.0.1:{port}", router, port
    server.should_exit = True
    th.join(timeout=30)


def _chat(base) -> str:
    """One served chat request; its id (the body's, which the header repeats)."""
    status, headers, text = http("POST", base + "/v1/chat/completions",
                                 {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
                                 {"Authorization": f"Bearer {KEY}"})
    assert status == 200, text
    rid = json.loads(text)["id"]
    assert headers["x-modeswitch-request-id"] == rid
    return rid


def _feedback(base, outcomes, key=ADMIN):
    status, _, text = http("POST", base + "/admin/feedback",
                           {"outcomes": [{"id": i, "violated": v} for i, v in outcomes]},
                           {"Authorization": f"Bearer {key}"})
    return status, text


def test_an_outcome_per_served_request_and_no_other(served):
    base, router, _ = served
    a, b = _chat(base), _chat(base)
    assert _feedback(base, [(a, True), (b, False)]) [0] == 200
    assert router.outcomes == [True, False]
    status, text = _feedback(base, [(a, True)])
    assert status == 409 and "already taken" in text
    status, text = _feedback(base, [("chatcmpl-made-up", True)])
    assert status == 404 and "not a request this server routed" in text
    c = _chat(base)
    status, text = _feedback(base, [(c, True), (c, True)])  # twice in one post: none taken
    assert status == 409 and "already taken" in text
    assert router.outcomes == [True, False]


@pytest.mark.parametrize("served", [{"feedback_window_s": 0.3}], indirect=True)
def test_a_late_outcome_is_refused(served):
    base, router, _ = served
    rid = _chat(base)
    time.sleep(0.5)
    status, text = _feedback(base, [(rid, True)])
    assert status == 410 and "feedback window" in text
    assert router.outcomes == []


def test_a_flood_with_the_api_key_does_not_move_the_router(served):
    """Feedback takes the admin key alone; made-up ids with it are refused too."""
    base, router, _ = served
    rid = _chat(base)
    for _ in range(200):
        status, text = _feedback(base, [(rid, True)] * 10, key=KEY)
        assert status == 401 and "admin key" in text
    for i in range(200):
        assert _feedback(base, [(f"chatcmpl-{i}", True)])[0] == 404
    assert router.outcomes == []


def test_unauthenticated_feedback_is_refused_before_its_body_is_read(served):
    base, router, port = served
    (s,) = _slow_bodies(port, 1, 1, path="/admin/feedback", key=KEY)
    s.settimeout(2.0)
    assert s.recv(4096).startswith(b"HTTP/1.1 401")
    assert _closed_within(s, 2.0) is not None
    s.close()
    status, _, text = http("POST", base + "/admin/feedback", "not an object")
    assert status == 401, text


@pytest.mark.parametrize("served", [{"admin_key": None}], indirect=True)
def test_feedback_is_off_without_an_admin_key(served):
    base, router, _ = served
    rid = _chat(base)
    status, text = _feedback(base, [(rid, True)], key=KEY)
    assert status == 403 and "--admin-key" in text
    assert router.outcomes == []


def test_the_ledger_refuses_outcomes_for_a_replaced_router_and_forgets_old_ids():
    from modeswitch.engine.serving.feedback import FeedbackLedger, Refused

    now = [0.0]
    ledger = FeedbackLedger(window_s=10.0, capacity=2, clock=lambda: now[0])
    old, new = object(), object()
    ledger.issue("a", old)
    with pytest.raises(Refused, match="since been replaced") as info:
        ledger.take(["a"], new)
    assert info.value.status == 409
    ledger.issue("b", new)
    ledger.issue("c", new)  # over the capacity: "a" is forgotten
    with pytest.raises(Refused, match="not a request"):
        ledger.take(["a"], new)
    now[0] = 25.0  # beyond twice the window: forgotten, not late
    with pytest.raises(Refused, match="not a request"):
        ledger.take(["b"], new)

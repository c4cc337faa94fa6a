"""The server's routing step on its own: what it records, and how a failed decision falls back."""

from __future__ import annotations

import dataclasses
import gc
import pickle
from types import SimpleNamespace

import numpy as np
import pytest

from modeswitch.dataset.features import request_features
from modeswitch.dataset.requests import SERVING_FIELDS, Request, serving_request
from modeswitch.engine.serving.metrics import Metrics
from modeswitch.engine.serving.routing import route
from modeswitch.engine.serving.state import freeze_heap


def _state(**config):
    cfg = SimpleNamespace(reference="fp16", route_budget_us=1e9, **config)
    return SimpleNamespace(config=cfg, metrics=Metrics(), modes={"fp16", "int8"}, memory_pressure=0.25)


class _Router:
    def __init__(self, answer):
        self.answer, self.seen = answer, []

    def route(self, request):
        self.seen.append(request)
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def _sum(state, stage):
    return state.metrics.registry.get_sample_value("modeswitch_stage_seconds_sum", {"stage": stage})


def test_route_builds_the_request_and_records_its_stages():
    state, router = _state(), _Router(np.str_("int8"))
    request, decision = route(state, router, "cmpl-1", 30, 16, 8, 3)
    built = Request(id="cmpl-1", prompt_tokens=30, expected_output_tokens=16, shared_prefix_tokens=8,
                    concurrent_requests=3, memory_pressure=0.25)
    # route() builds it inline, as serving_request does: the same fields written, and a
    # frozen Request that compares, hashes, prints, pickles and features as Request(...)'s
    assert vars(request) == vars(serving_request("cmpl-1", 30, 16, 8, 3, 0.25))
    assert tuple(vars(request)) == SERVING_FIELDS
    assert request == built == serving_request("cmpl-1", 30, 16, 8, 3, 0.25)
    assert repr(request) == repr(built) and hash(request) == hash(built) and request.to_dict() == built.to_dict()
    assert pickle.loads(pickle.dumps(request)) == built and request_features(request, "B") == request_features(built, "B")
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.prompt_tokens = 31
    assert router.seen == [request]
    assert decision.mode == "int8" and type(decision.mode) is str and decision.fallback is None
    # one window, split by the timer between the two: serving_route is features + route
    assert _sum(state, "serving_route") == pytest.approx(_sum(state, "features") + _sum(state, "route"), rel=1e-9)
    assert _sum(state, "route") == pytest.approx(decision.route_us / 1e6)


@pytest.mark.parametrize("answer, reason", [(RuntimeError("boom"), "error"), ("nosuch", "unknown_mode")])
def test_a_failed_decision_is_the_references(answer, reason):
    state = _state()
    _, decision = route(state, _Router(answer), "cmpl-2", 5, 5, 0, 1)
    assert (decision.mode, decision.fallback) == ("fp16", reason)
    assert state.metrics.registry.get_sample_value("modeswitch_fallbacks_total", {"reason": reason}) == 1.0


def test_over_budget_falls_back():
    state = _state()
    state.config.route_budget_us = -1.0  # any decision takes longer than that
    _, decision = route(state, _Router("int8"), "cmpl-3", 5, 5, 0, 1)
    assert (decision.mode, decision.fallback) == ("fp16", "over_budget")


def test_freeze_heap_moves_the_live_heap_out_of_collection():
    alive = [object() for _ in range(3)]  # tracked containers: a list of objects
    try:
        freeze_heap()
        assert gc.get_freeze_count() > 0
        assert not any(o is alive for o in gc.get_objects())  # frozen objects are not listed
    finally:
        gc.unfreeze()
    assert any(o is alive for o in gc.get_objects())


class _BadAnswer:
    def __str__(self):
        raise ValueError("no name")


def test_an_answer_that_is_not_a_mode_name_falls_back():
    state = _state()
    _, decision = route(state, _Router(_BadAnswer()), "cmpl-4", 5, 5, 0, 1)
    assert (decision.mode, decision.fallback) == ("fp16", "error")


def test_memory_pressure_is_sampled_off_the_serving_path(monkeypatch):
    """On CUDA a task keeps the state's figure current; requests read it (no GPU here: the
    reading is faked, the loop is the server's)."""
    import asyncio
    import itertools

    from modeswitch.engine.serving import routing

    readings = itertools.count(1)
    monkeypatch.setattr(routing, "memory_pressure", lambda device: next(readings) / 1000)
    state = _state(device="cuda")

    async def run():
        task = asyncio.create_task(routing.track_memory_pressure(state, every_s=0.001))
        seen = set()

        async def watch():
            while len(seen) < 3:
                await asyncio.sleep(0.0005)
                seen.add(state.memory_pressure)
        try:
            await asyncio.wait_for(watch(), 5)
        finally:
            task.cancel()
        return seen

    seen = asyncio.run(run())
    assert len(seen) >= 3 and all(0 < v < 0.1 for v in seen)  # each a new reading, none from a request


def test_a_failed_reading_keeps_the_last_value_and_the_task(monkeypatch):
    import asyncio

    from modeswitch.engine.serving import routing

    readings = iter([0.5])

    def read(device):
        try:
            return next(readings)
        except StopIteration:
            raise RuntimeError("CUDA error: device lost") from None

    monkeypatch.setattr(routing, "memory_pressure", read)
    state = _state(device="cuda")

    async def run():
        task = asyncio.create_task(routing.track_memory_pressure(state, every_s=0.001))
        await asyncio.sleep(0.05)  # many failed readings
        alive = not task.done()
        task.cancel()
        return alive

    assert asyncio.run(run()) and state.memory_pressure == 0.5


def test_a_failing_device_is_logged_once_by_the_first_reading_and_the_tracker(monkeypatch, caplog):
    """The server's start-up (``start_memory_tracking``, called by the app's lifespan)
    reads once and hands the tracker the same ``failed`` set."""
    import asyncio
    import logging

    from modeswitch.engine.serving import routing

    def read(device):
        raise RuntimeError("CUDA error: device lost")

    monkeypatch.setattr(routing, "memory_pressure", read)
    state = _state(device="cuda")

    async def run():
        task = routing.start_memory_tracking(state)
        await asyncio.sleep(0.3)  # the tracker's first readings (every 0.1 s) fail too
        task.cancel()
        return routing.start_memory_tracking(_state(device="cpu"))

    calls = []
    monkeypatch.setattr(routing, "read_memory_pressure",
                        lambda st, failed, read=routing.read_memory_pressure: (calls.append(failed), read(st, failed)))
    with caplog.at_level(logging.WARNING, logger=routing.log.name):
        on_cpu = asyncio.run(run())
    assert on_cpu is None and len(calls) >= 3 and all(f is calls[0] for f in calls)
    assert [r.getMessage() for r in caplog.records].count(
        "memory pressure not read (RuntimeError: CUDA error: device lost); keeping 0.25") == 1


def test_memory_pressure_is_zero_on_cpu():
    from modeswitch.engine.serving.routing import memory_pressure

    assert memory_pressure("cpu") == 0.0


def test_a_loaded_engine_is_frozen_and_an_unloaded_one_collected():
    """What the pool loads while an app runs leaves the collector's reach (a full
    collection no longer walks it); once unloaded and closed, its cycles are collected
    all the same. With no app running, a load freezes nothing."""
    import weakref

    from modeswitch.engine.serving import app as app_module
    from modeswitch.engine.serving.pool import EnginePool

    class Engine:
        weights_mb = 10.0

        def __init__(self, mode):
            self.mode, self.me = mode, self  # a cycle: only the collector frees it

        def close(self):
            pass

    heap = app_module._FrozenHeap()
    pool = EnginePool(Engine, budget_mb=15, on_load=heap.engine_loaded, on_unload=heap.engine_unloaded)
    gc.collect()
    pool.acquire("idle")  # no app running: nothing frozen
    assert gc.get_freeze_count() == 0
    pool.release("idle")
    heap.started()
    try:
        eng = pool.acquire("a")  # over the budget: the idle engine goes first
        ref = weakref.ref(eng)
        assert pool.loaded() == ["a"] and not any(o is eng for o in gc.get_objects())  # frozen
        del eng
        pool.release("a")
        gc.collect()
        assert ref() is not None  # frozen: its cycle outlives a collection
        pool.acquire("b")  # "a" unloaded and closed: the heap thawed, collected, frozen again
        assert ref() is None and pool.loaded() == ["b"] and gc.get_freeze_count() > 0
    finally:
        heap.stopped()
    assert gc.get_freeze_count() == 0


def test_the_heap_stays_frozen_while_any_app_runs(monkeypatch):
    """Frozen once, by the first app; unfrozen once, by the last. (Counting the calls, not
    comparing freeze counts: a frozen object that dies leaves the count, so two readings
    can differ by a few objects freed in between while the heap stays frozen.)"""
    from modeswitch.engine.serving import app as app_module

    calls = []
    real_freeze, real_unfreeze = app_module.freeze_heap, gc.unfreeze
    monkeypatch.setattr(app_module, "freeze_heap", lambda: (calls.append("freeze"), real_freeze()))
    monkeypatch.setattr(app_module.gc, "unfreeze", lambda: (calls.append("unfreeze"), real_unfreeze()))
    heap = app_module._FrozenHeap()
    try:
        heap.started()
        heap.started()  # a second app in the same process
        assert calls == ["freeze"] and gc.get_freeze_count() > 0
        heap.stopped()
        assert calls == ["freeze"] and gc.get_freeze_count() > 0  # the other app still runs
        heap.stopped()
        assert calls == ["freeze", "unfreeze"] and gc.get_freeze_count() == 0
    finally:
        real_unfreeze()

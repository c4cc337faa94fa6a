"""The OpenAI-compatible server (FastAPI): route every request, run it on its mode's engine.

Endpoints: ``/v1/completions`` and ``/v1/chat/completions`` (with ``stream: true``
as server-sent events), ``/v1/models``, ``/health``, Prometheus ``/metrics``, and
``POST /admin/reload`` (swap in a freshly loaded router; requests in flight keep
the router they started with).

Per request: features from the request itself (prompt token count, ``max_tokens``
as the expected output, the prefix shared with recent prompts, requests in
flight, accelerator memory pressure; 0 on CPU, as in the profiler), one routing
decision, then the chosen mode's engine. A router that raises, answers a mode the
engine lacks, or exceeds ``route_budget_us`` sends the request to the reference
mode; that is counted (``modeswitch_fallbacks_total``) and logged. The chosen mode
and routing time go back in ``x-modeswitch-mode`` / ``x-modeswitch-route-us``
headers and a ``modeswitch`` field in the body.

Engines serve one request at a time, except batching engines (``concurrent_runs``:
continuous batching): concurrent requests routed there join the engine's running
batch (``batch_across_requests``, on by default; off serves them one at a time too,
for comparison).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from contextlib import asynccontextmanager, nullcontext
from dataclasses import dataclass

from fastapi import Depends, FastAPI, HTTPException
from fastapi import Request as HttpRequest
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, Field

from dataset.requests import Request
from engine.serving.pool import EnginePool, PrefixTracker

log = logging.getLogger("modeswitch.serve")


@dataclass
class ServerConfig:
    model_path: str
    draft_path: str | None = None
    backend: str = "transformers"
    device: str = "cpu"
    api_key: str | None = None
    route_budget_us: float = 5_000.0
    memory_budget_mb: float = 4_096.0
    max_tokens_limit: int = 1_024
    served_name: str = "modeswitch"
    reference: str = "fp16_baseline"
    batch_across_requests: bool = True


# ------------------------------------------------------------------ schemas
class CompletionBody(BaseModel):
    model: str | None = None
    prompt: str | list[str]
    max_tokens: int = Field(16, ge=1)
    stream: bool = False
    temperature: float | None = None
    user: str | None = None


class Message(BaseModel):
    role: str
    content: str


class ChatBody(BaseModel):
    model: str | None = None
    messages: list[Message] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    stream: bool = False
    temperature: float | None = None
    user: str | None = None


def _error(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status_code=status)


class Metrics:
    """Prometheus metrics in the app's own registry (several apps may share a process)."""

    def __init__(self):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        self.requests = Counter("modeswitch_requests_total", "Requests served, by chosen mode",
                                ["mode", "endpoint"], registry=self.registry)
        self.routing = Histogram(
            "modeswitch_routing_seconds", "Routing decision time (features + predict)",
            buckets=(1e-7, 2.5e-7, 5e-7, 1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 1e-3, 1e-2, 0.1),
            registry=self.registry)
        self.latency = Histogram("modeswitch_request_seconds", "End-to-end request latency",
                                 ["mode"], registry=self.registry,
                                 buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120))
        self.fallbacks = Counter("modeswitch_fallbacks_total", "Requests sent to the reference mode "
                                 "because the router failed", ["reason"], registry=self.registry)
        self.errors = Counter("modeswitch_errors_total", "Failed requests", ["kind"], registry=self.registry)
        self.in_flight = Gauge("modeswitch_in_flight", "Requests in flight", registry=self.registry)
        self.reloads = Counter("modeswitch_router_reloads_total", "Router reloads", registry=self.registry)


def _supported_modes(cfg: ServerConfig) -> list[str]:
    from engine.modes import get_mode

    if cfg.backend == "vllm":
        from engine.backends.vllm_backend import capabilities as vllm_caps

        caps = vllm_caps(cfg.device, draft=bool(cfg.draft_path))
    else:
        from engine.backends.transformers_backend import capabilities

        caps = capabilities(cfg.device)
    out = []
    for m in caps.supported_modes():
        spec = get_mode(m).speculative
        if spec is not None and spec.method == "draft_model" and not cfg.draft_path and not spec.draft_model:
            continue
        out.append(m)
    return out


def _default_factory(cfg: ServerConfig):
    def make(mode: str):
        if cfg.backend == "vllm":
            from engine.backends.vllm_backend import VllmEngine

            eng = VllmEngine(mode, cfg.model_path, cfg.draft_path, cfg.device).load()
        else:
            from engine.backends.transformers_backend import TransformersEngine

            eng = TransformersEngine(mode, cfg.model_path, cfg.draft_path, cfg.device).load()
        eng.warmup()
        return eng

    return make


def _memory_pressure(device: str) -> float:
    if device.startswith("cuda"):
        import torch

        free, total = torch.cuda.mem_get_info()
        return 1.0 - free / total
    return 0.0  # as in the profiler: no accelerator memory to be short of on CPU


def create_app(router_loader, cfg: ServerConfig, engine_factory=None, tokenizer=None,
               supported_modes=None) -> FastAPI:
    """The server. ``router_loader()`` returns an object with ``route(request) -> mode``;
    it is called at start-up and on every ``POST /admin/reload``."""
    state = {}

    @asynccontextmanager
    async def lifespan(app):
        if tokenizer is None:
            from transformers import AutoTokenizer

            state["tok"] = AutoTokenizer.from_pretrained(cfg.model_path)
        else:
            state["tok"] = tokenizer
        state["modes"] = list(supported_modes) if supported_modes is not None else _supported_modes(cfg)
        state["router"] = await run_in_threadpool(router_loader)
        state["pool"] = EnginePool(engine_factory or _default_factory(cfg), cfg.memory_budget_mb)
        state["prefix"] = PrefixTracker()
        state["in_flight"] = 0
        log.info("serving %s with router %s", cfg.model_path, type(state["router"]).__name__)
        yield
        await run_in_threadpool(state["pool"].close)

    app = FastAPI(title="ModeSwitch", lifespan=lifespan)
    metrics = Metrics()
    app.state.metrics = metrics
    app.state.serving = state

    @app.exception_handler(RequestValidationError)
    async def bad_request(request, exc: RequestValidationError):
        metrics.errors.labels("bad_request").inc()
        parts = []
        for e in exc.errors():
            loc = ".".join(str(x) for x in e.get("loc", ()) if x != "body")
            parts.append(f"{loc or 'body'}: {e.get('msg')}")
        return _error(400, "invalid request: " + "; ".join(parts))

    @app.exception_handler(HTTPException)
    async def http_error(request, exc: HTTPException):
        return _error(exc.status_code, str(exc.detail),
                      "authentication_error" if exc.status_code == 401 else "invalid_request_error")

    async def auth(request: HttpRequest):
        if cfg.api_key is None:
            return
        header = request.headers.get("authorization", "")
        if header != f"Bearer {cfg.api_key}":
            raise HTTPException(401, "missing or wrong API key (Authorization: Bearer <key>)")

    # ------------------------------------------------------------ decisions
    def route(router, req: Request) -> tuple[str, float, str | None]:
        t0 = time.perf_counter_ns()
        reason = None
        try:
            mode = str(router.route(req))
        except Exception as exc:  # noqa: BLE001 - any router failure sends the request to the reference
            mode, reason = cfg.reference, "error"
            log.warning("router raised %s: %s; using %s", type(exc).__name__, exc, cfg.reference)
        us = (time.perf_counter_ns() - t0) / 1e3
        if reason is None and us > cfg.route_budget_us:
            log.warning("router took %.0f us (budget %.0f us); using %s", us, cfg.route_budget_us, cfg.reference)
            mode, reason = cfg.reference, "over_budget"
        if reason is None and mode not in state["modes"]:
            log.warning("router chose %s, which this engine does not offer; using %s", mode, cfg.reference)
            mode, reason = cfg.reference, "unknown_mode"
        metrics.routing.observe(us / 1e6)
        if reason:
            metrics.fallbacks.labels(reason).inc()
        return mode, us, reason

    def _ids_for_chat(messages: list[Message]) -> list[int]:
        tok = state["tok"]
        msgs = [m.model_dump() for m in messages]
        if getattr(tok, "chat_template", None):
            out = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
            return list(out["input_ids"] if isinstance(out, dict) else out)
        text = "\n".join(f"{m['role']}: {m['content']}" for m in msgs) + "\nassistant:"
        return tok(text, add_special_tokens=True)["input_ids"]

    async def serve(endpoint: str, ids: list[int], max_tokens: int, stream: bool, chat: bool):
        if not ids:
            raise HTTPException(400, "the prompt is empty")
        if max_tokens > cfg.max_tokens_limit:
            raise HTTPException(400, f"max_tokens {max_tokens} exceeds this server's limit {cfg.max_tokens_limit}")
        state["in_flight"] += 1
        metrics.in_flight.inc()
        router = state["router"]  # a reload during this request does not change it
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        req = Request(id=rid, prompt_tokens=len(ids), expected_output_tokens=max_tokens,
                      shared_prefix_tokens=state["prefix"].observe(ids),
                      concurrent_requests=state["in_flight"],
                      memory_pressure=_memory_pressure(cfg.device))
        mode, route_us, fallback = route(router, req)
        started = time.perf_counter()
        pool: EnginePool = state["pool"]
        headers = {"x-modeswitch-mode": mode, "x-modeswitch-route-us": f"{route_us:.2f}"}
        info = {"mode": mode, "route_us": round(route_us, 3), "fallback": fallback}
        try:
            engine = await run_in_threadpool(pool.acquire, mode)
        except Exception:
            state["in_flight"] -= 1
            metrics.in_flight.dec()
            metrics.errors.labels("engine_load").inc()
            raise

        # a batching engine takes concurrent requests into one batch; others one at a time
        shared = cfg.batch_across_requests and getattr(engine, "concurrent_runs", False)
        gate = nullcontext() if shared else pool.lock(mode)

        def done():
            pool.release(mode)
            state["in_flight"] -= 1
            metrics.in_flight.dec()
            metrics.requests.labels(mode, endpoint).inc()
            metrics.latency.labels(mode).observe(time.perf_counter() - started)

        if not stream:
            try:
                async with gate:
                    gens = await run_in_threadpool(engine.run, [(req, ids)], False)
            except Exception as exc:
                metrics.errors.labels("generation").inc()
                log.exception("generation failed on %s", mode)
                raise HTTPException(500, f"generation failed on mode {mode}: {exc}") from exc
            finally:
                done()
            g = gens[0]
            finish = "length" if g.output_tokens >= max_tokens else "stop"
            usage = {"prompt_tokens": len(ids), "completion_tokens": g.output_tokens,
                     "total_tokens": len(ids) + g.output_tokens}
            if chat:
                choice = {"index": 0, "message": {"role": "assistant", "content": g.text},
                          "finish_reason": finish}
            else:
                choice = {"index": 0, "text": g.text, "finish_reason": finish, "logprobs": None}
            body = {"id": rid, "object": "chat.completion" if chat else "text_completion",
                    "created": int(time.time()), "model": cfg.served_name, "choices": [choice],
                    "usage": usage, "modeswitch": {**info, "latency_ms": round(g.latency_ms, 2)}}
            return JSONResponse(body, headers=headers)

        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()

        def on_token(_rid, new_ids):
            loop.call_soon_threadsafe(queue.put_nowait, list(new_ids))

        async def produce():
            try:
                async with gate:
                    await run_in_threadpool(engine.run, [(req, ids)], False, on_token)
                queue.put_nowait(None)
            except Exception as exc:  # noqa: BLE001 - reported in the stream
                metrics.errors.labels("generation").inc()
                queue.put_nowait(exc)

        task = asyncio.create_task(produce())

        async def events():
            import json

            tok = state["tok"]
            out_ids: list[int] = []
            sent = ""
            created = int(time.time())
            obj = "chat.completion.chunk" if chat else "text_completion"

            def chunk(delta: str | None, finish=None, first=False):
                if chat:
                    d = {"role": "assistant"} if first else {}
                    if delta:
                        d["content"] = delta
                    choice = {"index": 0, "delta": d, "finish_reason": finish}
                else:
                    choice = {"index": 0, "text": delta or "", "finish_reason": finish, "logprobs": None}
                body = {"id": rid, "object": obj, "created": created, "model": cfg.served_name,
                        "choices": [choice]}
                if first:
                    body["modeswitch"] = info
                return f"data: {json.dumps(body)}\n\n"

            try:
                yield chunk("", first=True)
                while True:
                    item = await queue.get()
                    if item is None:
                        break
                    if isinstance(item, Exception):
                        err = {"error": {"message": f"generation failed on mode {mode}: {item}",
                                         "type": "server_error"}}
                        yield f"data: {json.dumps(err)}\n\n"
                        return
                    out_ids.extend(item)
                    text = tok.decode(out_ids, skip_special_tokens=True)
                    if len(text) > len(sent) and text.startswith(sent):
                        delta, sent = text[len(sent):], text
                        yield chunk(delta)
                finish = "length" if len(out_ids) >= max_tokens else "stop"
                yield chunk(None, finish=finish)
                yield "data: [DONE]\n\n"
            finally:
                await task
                done()

        return StreamingResponse(events(), media_type="text/event-stream", headers=headers)

    # ------------------------------------------------------------ endpoints
    @app.post("/v1/completions", dependencies=[Depends(auth)])
    async def completions(body: CompletionBody):
        if isinstance(body.prompt, list):
            if len(body.prompt) != 1:
                raise HTTPException(400, "prompt: this server takes one prompt per request")
            prompt = body.prompt[0]
        else:
            prompt = body.prompt
        ids = state["tok"](prompt, add_special_tokens=True)["input_ids"] if prompt else []
        return await serve("completions", ids, body.max_tokens, body.stream, chat=False)

    @app.post("/v1/chat/completions", dependencies=[Depends(auth)])
    async def chat(body: ChatBody):
        max_tokens = body.max_completion_tokens or body.max_tokens or 64
        return await serve("chat", _ids_for_chat(body.messages), max_tokens, body.stream, chat=True)

    @app.get("/v1/models", dependencies=[Depends(auth)])
    async def models():
        return {"object": "list", "data": [{"id": cfg.served_name, "object": "model", "owned_by": "modeswitch",
                                            "modes": state["modes"]}]}

    @app.get("/health")
    async def health():
        return {"status": "ok", "router": type(state["router"]).__name__,
                "router_path": getattr(state["router"], "path_", None),
                "engines_loaded": state["pool"].loaded(), "in_flight": state["in_flight"]}

    @app.get("/metrics")
    async def prometheus():
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.post("/admin/reload", dependencies=[Depends(auth)])
    async def reload():
        try:
            new = await run_in_threadpool(router_loader)
        except Exception as exc:  # noqa: BLE001 - the old router stays in place
            metrics.errors.labels("reload").inc()
            raise HTTPException(500, f"reload failed, the previous router stays: {exc}") from exc
        state["router"] = new
        metrics.reloads.inc()
        return {"status": "reloaded", "router": type(new).__name__}

    return app

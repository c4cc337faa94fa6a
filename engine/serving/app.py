"""The OpenAI-compatible server (FastAPI): route every request, run it on its mode's engine.

Endpoints: ``/v1/completions`` and ``/v1/chat/completions`` (with ``stream: true``
as server-sent events), ``/v1/models``, ``/health``, Prometheus ``/metrics``, and
``POST /admin/reload`` (swap in a freshly loaded router; requests in flight keep
the router they started with), and ``POST /admin/feedback`` (the outcomes of served
picks, each naming its request's id, for a router that adapts its threshold online:
``modeswitch.routers.adaptive``; behind its own admin key, :mod:`~modeswitch.engine.serving.feedback`).

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

Layout: this module wires the endpoints; :mod:`~modeswitch.engine.serving.state` holds what
they share, :mod:`~modeswitch.engine.serving.routing` decides, :mod:`~modeswitch.engine.serving.jobs`
does the per-request bookkeeping and :mod:`~modeswitch.engine.serving.generate` builds the
responses.
"""

from __future__ import annotations

import asyncio
import gc
import hmac
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Annotated

from fastapi import APIRouter, Depends, FastAPI, HTTPException
from fastapi import Request as HttpRequest
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from modeswitch.engine.serving.config import EngineFactory, ServerConfig, supported_modes
from modeswitch.engine.serving.feedback import Refused
from modeswitch.engine.serving.generate import serve
from modeswitch.engine.serving.jobs import check_capacity
from modeswitch.engine.serving.metrics import Metrics
from modeswitch.engine.serving.routing import start_memory_tracking
from modeswitch.engine.serving.schemas import (
    ChatBody,
    CompletionBody,
    FeedbackBody,
    body_schema,
    error_response,
    parse_body,
)
from modeswitch.engine.serving.state import (
    RouterLoader,
    State,
    freeze_heap,
    process_rss_mb,
    server_state,
    start_state,
)
from modeswitch.engine.serving.tokens import body_bytes_bound, chat_chars, chat_ids, completion_ids

log = logging.getLogger("modeswitch.serve")


class _FrozenHeap:
    """The heap is frozen when the first app in this process starts and unfrozen when the
    last one stops (``gc.freeze`` acts on the whole process; the tests and
    ``bench/serve_batching.py`` run several apps in one), so one app's start-up never
    freezes the engines another has loaded, and one app's shutdown never unfreezes
    another's start-up heap.

    Engines load after start-up, on their mode's first request, and are frozen too once
    loaded (:meth:`engine_loaded`), as ``vllm serve`` freezes its heap after building its
    engine: a vLLM engine left in the collector's reach (its ``AsyncLLM``, config and
    tokenizer: hundreds of thousands of tracked objects even with the tiny model) is
    walked by every full collection, each a pause of the event loop of tens to hundreds of
    milliseconds. Full collections are rare while serving, so this bounds the pauses a
    long-running server meets rather than saving time in a short bench. An engine the
    pool unloads is frozen with the rest, so its cycles are collected by thawing the heap
    once it is closed (:meth:`engine_unloaded`)."""

    def __init__(self):
        self.running = 0
        #: the hooks run in the pool's loading and closing threads, start and stop on the
        #: event loop: a hook must not freeze the heap again after the last app thawed it
        self._lock = threading.Lock()

    def started(self) -> None:
        with self._lock:
            self.running += 1
            if self.running == 1:
                freeze_heap()

    def stopped(self) -> None:
        with self._lock:
            self.running -= 1
            if self.running == 0:
                gc.unfreeze()

    def engine_loaded(self) -> None:
        """A newly loaded engine out of the collector's reach (while any app runs)."""
        with self._lock:
            if self.running:
                freeze_heap()

    def engine_unloaded(self) -> None:
        """After an unloaded engine is closed: the heap thawed, its garbage (the engine's
        cycles among it) collected, and what lives frozen again (while any app runs)."""
        with self._lock:
            if self.running:
                gc.unfreeze()
                freeze_heap()


_heap = _FrozenHeap()

__all__ = ["ServerConfig", "create_app", "supported_modes"]


def create_app(router_loader: RouterLoader, cfg: ServerConfig, engine_factory: EngineFactory | None = None,
               tokenizer=None, supported_modes: list[str] | None = None) -> FastAPI:
    """The server. ``router_loader()`` returns a router (anything with ``route(request) ->
    mode``), or a :class:`~modeswitch.engine.serving.state.LoadedRouter` to report how it decides; it
    is called at start-up and on every ``POST /admin/reload``. ``engine_factory``,
    ``tokenizer`` and ``supported_modes`` default to the configured backend's."""
    metrics = Metrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        state = await start_state(cfg, metrics, router_loader, engine_factory, tokenizer, supported_modes,
                                  on_load=_heap.engine_loaded, on_unload=_heap.engine_unloaded)
        app.state.serving = state
        tracker = start_memory_tracking(state)
        _heap.started()
        log.info("serving %s with router %s", cfg.model_path, type(state.router).__name__)
        try:
            yield
        finally:
            try:
                if tracker is not None:
                    tracker.cancel()
                    await asyncio.gather(tracker, return_exceptions=True)
            finally:
                _heap.stopped()
                await run_in_threadpool(state.pool.close)

    # the API's docs are routes like any other: behind the key when one is set
    app = FastAPI(title="ModeSwitch", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.metrics = metrics
    app.add_exception_handler(RequestValidationError, bad_request)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(Exception, server_error)
    app.include_router(keyed)
    app.include_router(public)
    app.add_middleware(BodyLimit, max_bytes=cfg.max_body_bytes)
    # outermost: the key is checked from the headers before anything reads a body
    app.add_middleware(KeyCheck, key=cfg.api_key, admin_key=cfg.admin_key,
                       public=frozenset(r.path for r in public.routes))
    return app


# ------------------------------------------------------------------ errors and auth
async def bad_request(request: HttpRequest, exc: RequestValidationError):
    """400 naming every field at fault (FastAPI's default is a 422 clients do not expect)."""
    server_state(request).metrics.errors.labels("bad_request").inc()
    parts = []
    for e in exc.errors():
        loc = ".".join(str(x) for x in e.get("loc", ()) if x != "body")
        parts.append(f"{loc or 'body'}: {e.get('msg')}")
    return error_response(400, "invalid request: " + "; ".join(parts))


#: OpenAI's error types: 401 authentication, 429 rate limit, any 5xx server_error, else invalid request
_KINDS = {401: "authentication_error", 429: "rate_limit_error"}


async def http_error(request: HttpRequest, exc: StarletteHTTPException):
    """Every HTTP error in OpenAI's shape: ours, and the framework's own 404 / 405."""
    detail = exc.detail
    if exc.status_code == 404 and detail == "Not Found":
        detail = f"no endpoint {request.method} {request.url.path} (see /v1/completions, /v1/chat/completions)"
    elif exc.status_code == 405:
        detail = f"{request.method} is not allowed on {request.url.path}"
    kind = "server_error" if exc.status_code >= 500 else _KINDS.get(exc.status_code, "invalid_request_error")
    return error_response(exc.status_code, str(detail), kind, code=getattr(exc, "code", None),
                          headers=getattr(exc, "headers", None))


async def server_error(request: HttpRequest, exc: Exception):
    """Anything unexpected: logged with its traceback, answered 500 in OpenAI's shape."""
    log.exception("unexpected error on %s %s", request.method, request.url.path)
    server_state(request).metrics.errors.labels("internal").inc()
    return error_response(500, f"internal error ({type(exc).__name__}); the server log has the details",
                          "server_error")


class BodyLimit:
    """Refuse a request body over ``max_bytes`` (413) by its Content-Length, or while it
    arrives when it has none, before anything parses it. The limit is also the largest
    body a request that fits the model's context could need (:func:`body_bytes_bound`),
    so a body of 270,000 empty messages is refused by its length, unread."""

    def __init__(self, app, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    def limit(self, scope) -> tuple[int, int | None]:
        """(this request's limit in bytes, the context it comes from, or None)."""
        state = getattr(scope["app"].state, "serving", None) if "app" in scope else None
        context = getattr(state, "context_tokens", None)
        if context is None or body_bytes_bound(context) >= self.max_bytes:
            return self.max_bytes, None
        return body_bytes_bound(context), context

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        scope["modeswitch.arrived"] = time.perf_counter()
        limit, context = self.limit(scope)
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            return await error_response(413, _TooBig(limit, context).detail)(scope, receive, send)
        seen = 0

        async def counted():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise _TooBig(limit, context)  # an HTTP error: FastAPI's body reader passes it on
            return message

        await self.app(scope, counted, send)


class _TooBig(HTTPException):
    def __init__(self, limit: int, context: int | None = None):
        why = f" (no request that fits the model's context of {context} tokens needs more)" if context else ""
        super().__init__(413, f"the request body exceeds this server's limit of {limit:,} bytes{why}")


class KeyCheck:
    """Every endpoint but the public probes behind the API key (when one is set), checked
    from the request's headers before anything reads its body: a dependency runs only
    after FastAPI has read and parsed a declared body, so a client without the key could
    hold a connection with a slow body, or have a malformed one parsed and answered 400.
    The 401 closes the connection, so a body still arriving is not waited for.

    Feedback (:data:`ADMIN_PATHS`) steers an adapting router, so it takes the admin key
    alone, never the API key; without an admin key it is off (403)."""

    def __init__(self, app, key: str | None, admin_key: str | None, public: frozenset[str]):
        self.app, self.public = app, public
        self.expected = None if key is None else f"Bearer {key}".encode()
        self.admin = None if admin_key is None else f"Bearer {admin_key}".encode()

    def refusal(self, scope) -> tuple[int, str] | None:
        """(status, message) for a request its headers do not entitle, else None."""
        path = scope["path"]
        if path in ADMIN_PATHS:
            if self.admin is None:
                return 403, "feedback is off: the server was started without an admin key (--admin-key)"
            return None if _bearer_is(scope, self.admin) else (401, "missing or wrong admin key "
                                                                     "(Authorization: Bearer <admin key>)")
        if self.expected is None or path in self.public or _bearer_is(scope, self.expected):
            return None
        return 401, "missing or wrong API key (Authorization: Bearer <key>)"

    async def __call__(self, scope, receive, send):
        refused = self.refusal(scope) if scope["type"] == "http" else None
        if refused is None:
            return await self.app(scope, receive, send)
        state = getattr(scope["app"].state, "serving", None) if "app" in scope else None
        if state is not None:
            state.metrics.errors.labels("unauthorized").inc()
        status, message = refused
        kind = "authentication_error" if status == 401 else "permission_error"
        return await error_response(status, message, kind, headers={"Connection": "close"})(scope, receive, send)


#: endpoints that take the admin key instead of the API key
ADMIN_PATHS = frozenset({"/admin/feedback"})


def _bearer_is(scope, expected: bytes) -> bool:
    """Whether the request's Authorization header is ``expected`` (in constant time)."""
    given = next((v for k, v in scope.get("headers") or [] if k == b"authorization"), b"")
    return hmac.compare_digest(given, expected)


#: endpoints behind the API key when one is set (:class:`KeyCheck`); liveness and metrics
#: stay open to probes
keyed = APIRouter()
public = APIRouter()


# ------------------------------------------------------------------ endpoints
def _check_model(state, body) -> None:
    """OpenAI answers an unknown model 404; this server serves one name."""
    if body.model is not None and body.model != state.config.served_name:
        exc = HTTPException(404, f"model {body.model!r} is not served here; this server serves "
                                 f"{state.config.served_name!r} (GET /v1/models)")
        exc.code = "model_not_found"  # OpenAI's code for it
        raise exc


def _arrived(state, http: HttpRequest) -> None:
    """Time from the request's first byte (stamped by BodyLimit) to its handler."""
    t0 = http.scope.get("modeswitch.arrived")
    if t0 is not None:
        state.metrics.stages["arrive"].observe(time.perf_counter() - t0)


#: prompts longer than this many characters are tokenised in a small pool of their own,
#: not on the event loop: tokenising takes time in proportion to the text (about a
#: millisecond at this length), and the body limit admits texts a hundred times longer. A
#: chat request counts its roles and each message's template markup too (:func:`chat_chars`)
INLINE_TOKENIZE_CHARS = 4096
#: request bodies up to this many bytes are parsed and validated on the event loop,
#: larger ones in the tokenizer pool: parsing and validation cost grows with the body
#: (most with many small messages), and at this size it stays near a millisecond
INLINE_PARSE_BYTES = 8 * 1024
#: threads for those: sized for the tokeniser's work, not for the requests in flight
TOKENIZE_THREADS = 2
_tokenize_pool: ThreadPoolExecutor | None = None


async def _off_loop(fn, *args):
    """``fn(*args)`` in the tokenizer pool, away from the event loop."""
    global _tokenize_pool
    if _tokenize_pool is None:
        _tokenize_pool = ThreadPoolExecutor(TOKENIZE_THREADS, thread_name_prefix="tokenize")
    return await asyncio.get_running_loop().run_in_executor(_tokenize_pool, lambda: fn(*args))


async def _tokenized(state, chars: int, fn, *args):
    t0 = time.perf_counter()
    ids = fn(*args) if chars <= INLINE_TOKENIZE_CHARS else await _off_loop(fn, *args)
    state.metrics.stages["tokenize"].observe(time.perf_counter() - t0)
    return ids


async def _body(http: HttpRequest, state: State, model):
    """The request body as ``model``: read, then parsed and validated on the loop when it
    is small, in the pool when it is not (:data:`INLINE_PARSE_BYTES`)."""
    try:
        raw = await http.body()
    except ClientDisconnect:  # gone, or closed by the body-read timeout: nobody to answer
        raise HTTPException(408, "the request body did not arrive") from None
    if len(raw) <= INLINE_PARSE_BYTES:
        return parse_body(raw, model, state.context_tokens)
    return await _off_loop(parse_body, raw, model, state.context_tokens)


async def completion_body(http: HttpRequest, state: State) -> CompletionBody:
    return await _body(http, state, CompletionBody)


async def chat_body(http: HttpRequest, state: State) -> ChatBody:
    return await _body(http, state, ChatBody)


@keyed.post("/v1/completions", openapi_extra=body_schema(CompletionBody))
async def completions(state: State, http: HttpRequest, body: Annotated[CompletionBody, Depends(completion_body)]):
    _arrived(state, http)
    _check_model(state, body)
    check_capacity(state)
    chars = sum(map(len, body.prompt)) if isinstance(body.prompt, list) else len(body.prompt)
    ids = await _tokenized(state, chars, completion_ids, state.tokenizer, body, state.context_tokens,
                           state.config.raw_completions)
    return await serve(state, "completions", ids, body.max_tokens, stream=body.stream, chat=False, http=http,
                       output=body.output)


@keyed.post("/v1/chat/completions", openapi_extra=body_schema(ChatBody))
async def chat(state: State, http: HttpRequest, body: Annotated[ChatBody, Depends(chat_body)]):
    _arrived(state, http)
    _check_model(state, body)
    check_capacity(state)
    ids = await _tokenized(state, chat_chars(body.messages), chat_ids, state.tokenizer, body.messages,
                           state.context_tokens)
    return await serve(state, "chat", ids, body.output_tokens, stream=body.stream, chat=True, http=http,
                       output=body.output)


@keyed.get("/openapi.json", include_in_schema=False)
async def openapi_schema(http: HttpRequest):
    return http.app.openapi()


@keyed.get("/docs", include_in_schema=False)
async def docs():
    return get_swagger_ui_html(openapi_url="/openapi.json", title="ModeSwitch API")


@keyed.get("/v1/models")
async def models(state: State):
    cfg = state.config
    return {"object": "list", "data": [{"id": cfg.served_name, "object": "model", "owned_by": "modeswitch",
                                        "modes": state.modes}]}


@keyed.post("/admin/reload")
async def reload(state: State):
    """Load a router afresh and serve new requests with it; on failure the old one stays."""
    try:
        loaded = await run_in_threadpool(state.load_router)
    except Exception as exc:  # noqa: BLE001 - the old router stays in place
        state.metrics.errors.labels("reload").inc()
        raise HTTPException(500, f"reload failed, the previous router stays: {exc}") from exc
    state.install(loaded)
    state.metrics.reloads.inc()
    return {"status": "reloaded", "router": type(state.router).__name__}


async def feedback_body(http: HttpRequest, state: State) -> FeedbackBody:
    return await _body(http, state, FeedbackBody)


@keyed.post("/admin/feedback", openapi_extra=body_schema(FeedbackBody))
async def feedback(state: State, body: Annotated[FeedbackBody, Depends(feedback_body)]):
    """Outcomes of served picks (did each break a limit), each naming the request it is
    about: a router that adapts online (``observe(outcomes)``, as
    ``modeswitch.routers.adaptive.AdaptiveThresholdRouter``) moves its threshold and answers where it
    stands (``state()``); any other is answered 409. The ledger takes one outcome per
    request it routed, within the feedback window (:mod:`modeswitch.engine.serving.feedback`), or
    none of a post's. Called on the event loop, so posts are applied one after another (a
    post is at most 1,000 outcomes: microseconds each)."""
    router = state.router
    observe = getattr(router, "observe", None)
    if not callable(observe):
        raise HTTPException(409, f"the router {type(router).__name__} does not adapt online (it has no observe)")
    try:
        state.ledger.take([o.id for o in body.outcomes], router)
    except Refused as exc:
        state.metrics.errors.labels("feedback_refused").inc()
        raise HTTPException(exc.status, exc.reason) from None
    observe([o.violated for o in body.outcomes])
    where = getattr(router, "state", None)
    return {"status": "observed", "outcomes": len(body.outcomes), **(where() if callable(where) else {})}


@public.get("/health")
async def health(state: State):
    return {"status": "ok", "router": type(state.router).__name__, "router_path": state.router_path,
            "engines_loaded": state.pool.loaded(), "in_flight": state.in_flight,
            # what the memory budget counts: the server's own share and each engine's
            "memory_budget_mb": state.pool.budget_mb, "server_base_mb": round(state.pool.base_mb, 1),
            "engine_memory_mb": state.pool.memory_mb(), "unloads": state.pool.unloads,
            # measured, for comparison: the counts above are estimates (activations,
            # allocator slack and requests' own state come on top: ~10 % under load here)
            "rss_mb": round(process_rss_mb(), 1)}


@public.get("/metrics")
async def prometheus(state: State):
    body, content_type = state.metrics.exposition()
    return Response(body, media_type=content_type)

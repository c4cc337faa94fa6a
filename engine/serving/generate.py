"""Serving one request: admitted, routed, run on its mode's engine, answered in OpenAI's
shape, whole (``text_completion`` / ``chat.completion``) or streamed as server-sent
events while the engine generates (``stream: true``)."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from contextlib import AbstractAsyncContextManager, nullcontext
from typing import TYPE_CHECKING

import anyio
from fastapi import HTTPException
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response, StreamingResponse

from modeswitch.engine.results import Generation
from modeswitch.engine.serving.jobs import (
    Job,
    acquire_engine,
    admit,
    check_limits,
    finish,
    run_gate,
)
from modeswitch.engine.serving.output import PLAIN, OutputOptions, StopText, cut_at_stop
from modeswitch.engine.serving.state import ServerState

if TYPE_CHECKING:
    from modeswitch.engine.backends.base import Engine

log = logging.getLogger("modeswitch.serve")


class Cancelled(Exception):
    """The client went away: raised from the engine's token callback, so generation stops
    at its next token instead of running to ``max_tokens`` for nobody."""


class Stopped(Exception):
    """The text reached a stop sequence: raised from the engine's token callback of a
    whole response, so generation ends there as it would at the end of text."""


class _Life:
    """One admitted request's end, exactly once: generation told to stop (when it still
    runs), awaited, then the job finished (engine lease, slot and in-flight count given
    back). Every path ends here, whole or streamed, served, failed or abandoned."""

    def __init__(self, state: ServerState, job: Job):
        self.state, self.job = state, job
        self.cancelled = False
        #: the task running the gated generation (:func:`_gated`)
        self.producer: asyncio.Task | None = None
        #: generation has started in the engine's thread (it then stops only at a token)
        self.running = False
        #: a stream read from the engine in the response's own task (:class:`_EngineFeed`),
        #: closed at the end (which stops the request in the engine if it still runs)
        self.feed: _EngineFeed | None = None
        self._done = False

    def on_token(self, _rid=None, _ids=None) -> None:
        """Called by the engine (in its thread) for every new token."""
        if self.cancelled:
            raise Cancelled(self.job.id)

    def cancel(self) -> None:
        """Stop: a producer still waiting for its engine's lock is cancelled outright (it
        gives its slot back now, not once the engine is free); a running one stops at its
        next token."""
        self.cancelled = True
        if self.producer is not None and not self.running and not self.producer.done():
            self.producer.cancel()

    async def close(self) -> None:
        if self._done:
            return
        self._done = True
        # shielded: the client's disconnect cancels the response's task, and the engine
        # must be given back all the same
        with anyio.CancelScope(shield=True):
            try:
                if self.producer is not None and not self.producer.done():
                    self.cancel()
                    await asyncio.gather(self.producer, return_exceptions=True)
                if self.feed is not None:
                    await self.feed.aclose()
            finally:
                finish(self.state, self.job)


async def _gated(engine: Engine, job: Job, gate: AbstractAsyncContextManager, life: _Life, on_token):
    """The job's generation under its engine's gate; cancellable until it starts."""
    t0 = time.perf_counter()
    async with gate:
        if life.cancelled:
            raise Cancelled(job.id)
        life.running = True
        stage = life.state.metrics.stages
        stage["wait"].observe(time.perf_counter() - t0)  # the engine's lock
        t1 = time.perf_counter()
        try:
            group = [(job.request, job.ids)]
            arun = getattr(engine, "arun", None)
            if arun is not None:  # the engine's own loop or batch: no thread held per request
                return await arun(group, False, on_token)
            return await run_in_threadpool(engine.run, group, False, on_token)
        finally:
            stage["generate"].observe(time.perf_counter() - t1)


async def serve(state: ServerState, endpoint: str, ids: list[int], max_tokens: int, *,
                stream: bool, chat: bool, http=None, output: OutputOptions = PLAIN):
    """The response to one completion or chat request (``chat`` picks the body's shape).
    ``http``: the client's connection, watched so an abandoned request stops generating;
    ``output``: its stop sequences and whether a stream ends with the usage."""
    check_limits(state.config, ids, max_tokens, state.context_tokens)
    job = admit(state, endpoint, ids, max_tokens, chat)
    engine = await acquire_engine(state, job)  # a failed load counts the job out itself
    life = _Life(state, job)
    try:
        gate = run_gate(state, job, engine)
        if stream:
            return stream_response(state, job, engine, gate, life, output)
    except BaseException:
        await life.close()
        raise
    return await whole_response(state, job, engine, gate, life, http, output.stop)


async def _watch(http, life: _Life, every_s: float = 0.2) -> None:
    """Cancel the job when its client disconnects (a whole response is only sent at the end)."""
    while not life.cancelled:
        if await http.is_disconnected():
            life.state.metrics.errors.labels("client_gone").inc()
            life.cancel()
            return
        await asyncio.sleep(every_s)


# ------------------------------------------------------------------ whole
class _StopWatch:
    """A whole response's text decoded as the engine generates it, so generation ends at
    the first stop sequence (:class:`Stopped` from the token callback) rather than at
    ``max_tokens``; then the text before it and the tokens generated make the response."""

    def __init__(self, life: _Life, tokenizer, stop: tuple[str, ...]):
        self.life = life
        self.text = _Detokenizer(tokenizer)
        self.cut = StopText(stop)
        self.ids: list[int] = []
        self._pieces: list[str] = []
        self._t0 = time.perf_counter()

    def on_token(self, rid=None, new_ids=None) -> None:
        self.life.on_token(rid, new_ids)
        self.ids.extend(new_ids)
        self._pieces.append(self.cut.add(self.text.add(list(new_ids))))
        if self.cut.stopped:
            raise Stopped(self.life.job.id)

    def generation(self) -> Generation:
        """What was generated up to the stop sequence, as the engine would have answered it
        (its latency counted from the request's hand-over to its engine)."""
        return Generation(self.life.job.id, self.ids, "".join(self._pieces),
                          (time.perf_counter() - self._t0) * 1000)


async def whole_response(state: ServerState, job: Job, engine: Engine,
                         gate: AbstractAsyncContextManager, life: _Life, http=None, stop: tuple[str, ...] = ()):
    watch = _StopWatch(life, state.tokenizer, stop) if stop else None
    life.producer = asyncio.create_task(_gated(engine, job, gate, life, (watch or life).on_token))
    watcher = asyncio.create_task(_watch(http, life)) if http is not None else None
    stopped = False
    try:
        gen = (await asyncio.shield(life.producer))[0]  # our own cancellation is the watcher's
    except Stopped:
        gen, stopped = watch.generation(), True
    except (Cancelled, asyncio.CancelledError):
        if not life.cancelled:
            raise  # the handler itself was cancelled (shutdown): not a client gone
        return Response(status_code=499)  # nobody is there to read it
    except Exception as exc:
        state.metrics.errors.labels("generation").inc()
        log.exception("generation failed on %s", job.mode)
        raise HTTPException(500, f"generation failed on mode {job.mode}: {exc}") from exc
    finally:
        if watcher is not None:
            watcher.cancel()
        await life.close()
    # not stopped while generating: a sequence the last token completed (its text held in
    # the decode until the end) is cut from the engine's text here
    text, stopped = (gen.text, True) if stopped else cut_at_stop(gen.text, stop)
    return JSONResponse(completion_body(job, state.config.served_name, gen, text, stopped), headers=job.headers)


def completion_body(job: Job, model: str, gen: Generation, text: str | None = None, stopped: bool = False) -> dict:
    """The whole response: ``text`` (the engine's when None), which ``stopped`` at a stop
    sequence or not."""
    text = gen.text if text is None else text
    finish_reason = "length" if gen.output_tokens >= job.max_tokens and not stopped else "stop"
    if job.chat:
        choice = {"index": 0, "message": {"role": "assistant", "content": text},
                  "finish_reason": finish_reason}
    else:
        choice = {"index": 0, "text": text, "finish_reason": finish_reason, "logprobs": None}
    prompt = len(job.ids)
    return {"id": job.id, "object": "chat.completion" if job.chat else "text_completion",
            "created": int(time.time()), "model": model, "choices": [choice],
            "usage": {"prompt_tokens": prompt, "completion_tokens": gen.output_tokens,
                      "total_tokens": prompt + gen.output_tokens},
            "modeswitch": {**job.info, "latency_ms": round(gen.latency_ms, 2)}}


# ------------------------------------------------------------------ streamed
class _Stream(StreamingResponse):
    """A streamed response whose request ends (:class:`_Life`) however the response does,
    even when the client is gone before the first event (a body generator that never
    started runs no ``finally``)."""

    def __init__(self, life: _Life, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.life = life

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.life.close()


def stream_response(state: ServerState, job: Job, engine: Engine,
                    gate: AbstractAsyncContextManager, life: _Life, output: OutputOptions = PLAIN) -> StreamingResponse:
    """Events as the engine generates, each token sent as soon as it exists. A batching
    engine that streams on this loop (``astream``: vLLM) is read by the response's own
    task, as vLLM's server reads it; otherwise generation runs in a task feeding a queue
    that the response drains."""
    astream = getattr(engine, "astream", None) if isinstance(gate, nullcontext) else None
    tokens = astream(job.request, job.ids) if astream is not None else None
    if tokens is not None:
        life.running = True
        life.feed = feed = _EngineFeed(tokens, state)
        state.metrics.stages["wait"].observe(0.0)  # no gate to wait for
        return _Stream(life, _events(state, job, feed, life, output), media_type="text/event-stream", headers=job.headers)
    feed = _TokenFeed(life)
    life.producer = asyncio.create_task(_generate(state, job, engine, gate, feed, life))
    # _generate's own work is the gated generation; cancel() may cancel it while it waits
    return _Stream(life, _events(state, job, feed, life, output), media_type="text/event-stream", headers=job.headers)


class _TokenFeed:
    """New token ids from the engine's thread to the event loop, in order, then ``None``
    (done) or the exception generation failed with."""

    def __init__(self, life: _Life):
        self._life = life
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._queue: asyncio.Queue = asyncio.Queue()

    def on_token(self, rid, new_ids) -> None:
        """The engine's callback, in its thread or (``arun``) on the loop itself; raises once
        the client is gone."""
        self._life.on_token(rid, new_ids)
        if threading.get_ident() == self._loop_thread:  # no wake-up write needed on the loop
            self._queue.put_nowait(list(new_ids))
        else:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, list(new_ids))

    def end(self, failure: Exception | None = None) -> None:
        # through the loop's callbacks too, after every token scheduled before it (an engine
        # with ``arun`` calls on_token on the loop itself: a direct put would overtake them)
        self._loop.call_soon(self._queue.put_nowait, failure)

    async def next(self) -> list[int] | Exception | None:
        return await self._queue.get()


class _EngineFeed:
    """New token ids straight from the engine's stream, read in the response's own task:
    with a producer task and a queue in between, every token woke two tasks instead of
    one (the producer's chain of frames, then the response's). Then ``None`` (done) or
    the exception generation failed with, as :class:`_TokenFeed` gives them."""

    def __init__(self, tokens, state: ServerState):
        self._tokens = tokens
        self._next = tokens.__anext__
        self._state = state
        self._t0 = time.perf_counter()
        self._ended = False

    async def next(self) -> list[int] | Exception | None:
        try:
            return await self._next()
        except StopAsyncIteration:
            self._end()
            return None
        except Exception as exc:  # noqa: BLE001 - reported in the stream
            self._state.metrics.errors.labels("generation").inc()
            self._end()
            return exc

    def _end(self) -> None:
        if not self._ended:
            self._ended = True
            self._state.metrics.stages["generate"].observe(time.perf_counter() - self._t0)

    async def aclose(self) -> None:
        """Stop the engine's stream (a request still generating is aborted there)."""
        self._end()
        await self._tokens.aclose()


async def _generate(state: ServerState, job: Job, engine: Engine,
                    gate: AbstractAsyncContextManager, feed: _TokenFeed, life: _Life) -> None:
    try:
        await _gated(engine, job, gate, life, feed.on_token)
        feed.end()
    except (Cancelled, asyncio.CancelledError):
        feed.end()
    except Exception as exc:  # noqa: BLE001 - reported in the stream
        state.metrics.errors.labels("generation").inc()
        feed.end(exc)


async def _events(state: ServerState, job: Job, feed: _TokenFeed | _EngineFeed, life: _Life,
                  output: OutputOptions = PLAIN):
    """The events of one stream; the request ends (:class:`_Life`) when the stream does:
    completed, at a stop sequence, failed, or closed by a client gone (generation told to
    stop first). Text that may begin a stop sequence is held back until a later token
    shows it does not (:class:`~modeswitch.engine.serving.output.StopText`)."""
    chunks = _Chunks(job, state.config.served_name, output.include_usage)
    text = _Detokenizer(state.tokenizer)
    cut = StopText(output.stop)
    try:
        if job.chat:  # the role first, as OpenAI and vLLM send it
            yield chunks.first()
        finished = False
        while not cut.stopped and (item := await feed.next()) is not None:
            if isinstance(item, Exception):
                yield chunks.error(item)
                return
            delta = cut.add(text.add(item))
            if cut.stopped:
                finished = True
                yield chunks.last("stop", delta)
                # generation stopped and the request counted out before the stream's end,
                # as a whole response is: a client that read [DONE] has no request running
                await life.close()
            elif delta:
                # at max_tokens the engine stops: the finish rides on this chunk, as vLLM's
                # does, rather than an event of its own for every client to parse
                finished = text.tokens >= job.max_tokens and not cut.holding
                yield chunks.delta(delta, "length" if finished else None)
        if not finished:  # the text held back at the end (if any) goes with the finish
            rest = cut.add(text.rest())
            rest += cut.rest()
            yield chunks.last("length" if text.tokens >= job.max_tokens and not cut.stopped else "stop", rest)
        if output.include_usage:
            yield chunks.usage(len(job.ids), text.tokens)
        yield "data: [DONE]\n\n"
    finally:
        await life.close()


class _Detokenizer:
    """The text of the tokens so far, handed out as deltas that are never taken back.

    A fast tokenizer (a ``tokenizers.Tokenizer`` behind it) that does not clean up
    spaces decodes incrementally in Rust (``tokenizers.decoders.DecodeStream``, which
    vLLM's fast detokenizer also uses, there seeded with the prompt; here not, so the
    text is the whole response's decode): one call per token, which holds back a token
    that ends inside a character until the next completes it (a step that fails, as
    tokenizers' "Invalid prefix encountered" can, sends the rest of the stream to an
    exact whole decode per token): several times cheaper than the window below
    (``bench/stream_detokenize.py`` compares the two), and detokenising is a visible
    share of the server's CPU per request when many streams are in flight.

    Otherwise it decodes a short window (vLLM's incremental scheme): the text of
    ``ids[prefix:]`` minus that of ``ids[prefix:read]``. Decoding from a token a few
    back keeps what a tokenizer does at word starts (a leading space), and a window
    ending inside a character (byte-level BPE: U+FFFD) waits for the next token.
    Decoding every token from the start each time cost O(n^2) per stream."""

    def __init__(self, tokenizer):
        self._tok = tokenizer
        self._ids: list[int] = []
        self._prefix = self._read = 0
        self._stream = _decode_stream(tokenizer)
        #: the stream's deltas so far, and whether its last token was held back
        self._sent: list[str] = []
        self._held = False
        #: after a failed Rust step: the whole text decoded at each token (:meth:`_to_whole`)
        self._whole = False

    @property
    def tokens(self) -> int:
        return len(self._ids)

    def add(self, new_ids: list[int]) -> str:
        self._ids.extend(new_ids)
        if self._whole:
            return self._past_sent(final=False)
        if self._stream is not None:
            raw, ds = self._stream
            out = ""
            try:
                for i in new_ids:
                    piece = ds.step(raw, i)
                    self._held = piece is None
                    if piece:
                        out += piece
            except Exception:  # noqa: BLE001 - e.g. "Invalid prefix encountered" (vLLM works around it too)
                return self._to_whole()
            if out:
                self._sent.append(out)
            return out
        dec = self._tok.decode
        before = dec(self._ids[self._prefix:self._read], skip_special_tokens=True)
        text = dec(self._ids[self._prefix:], skip_special_tokens=True)
        if len(text) > len(before) and not text.endswith("\ufffd"):
            self._prefix, self._read = self._read, len(self._ids)
            return text[len(before):]
        return ""

    def _to_whole(self) -> str:
        """After the Rust decoder failed on a token (rare): from here on, the whole text so
        far is decoded at each token and what it adds past the text sent is handed out
        (quadratic, but exact whatever was held back)."""
        self._stream, self._held, self._whole = None, False, True
        return self._past_sent(final=False)

    def _past_sent(self, final: bool) -> str:
        sent = "".join(self._sent)
        whole = self._tok.decode(self._ids, skip_special_tokens=True)
        if not whole.startswith(sent) or len(whole) <= len(sent) or (not final and whole.endswith("\ufffd")):
            return ""
        self._sent.append(whole[len(sent):])
        return self._sent[-1]

    def rest(self) -> str:
        """At the end: the text still held back (a last token that ended inside a
        character, or a window that could not grow), as the whole response's decode
        would give it."""
        dec = self._tok.decode
        if self._whole:
            return self._past_sent(final=True)
        if self._stream is not None:
            if not self._held:
                return ""
            self._held = False
            return self._past_sent(final=True)
        before = dec(self._ids[self._prefix:self._read], skip_special_tokens=True)
        text = dec(self._ids[self._prefix:], skip_special_tokens=True)
        self._prefix = self._read = len(self._ids)
        return text[len(before):] if len(text) > len(before) else ""


def _decode_stream(tokenizer):
    """``(the tokenizers.Tokenizer, a DecodeStream)`` when ``tokenizer`` is a fast one whose
    ``decode`` is the Rust decoder's alone (no clean-up of spaces, which transformers
    applies in Python over the whole text); else None (the window decoding)."""
    raw = getattr(tokenizer, "_tokenizer", None)
    if raw is None or getattr(tokenizer, "clean_up_tokenization_spaces", False):
        return None
    try:
        from tokenizers import Tokenizer  # lazy: comes with transformers; optional fast path
        from tokenizers.decoders import DecodeStream  # lazy: tokenizers 0.21 and later
    except ImportError:  # tokenizers before 0.21
        return None
    if not isinstance(raw, Tokenizer):
        return None
    return raw, DecodeStream(skip_special_tokens=True)


class _Chunks:
    """A stream's events in OpenAI's chunk shape. The first event carries the
    ``modeswitch`` routing field (clients read it from there; the ``x-modeswitch-mode``
    header has it before any event); in chat the first is the role's (:meth:`first`), in
    a completion the first text. No event is sent that carries nothing: each costs every
    client a parse, and on a machine the client shares that is throughput."""

    def __init__(self, job: Job, model: str, include_usage: bool = False):
        self.job, self.model, self.created = job, model, int(time.time())
        self._routed = False  # the routing field sent
        #: every event carries ``usage`` (null until the last), as OpenAI sends it when asked
        self.include_usage = include_usage

    def first(self) -> str:
        return self._event(self._choice("", None, first=True))

    def delta(self, text: str, finish_reason: str | None = None) -> str:
        return self._event(self._choice(text, finish_reason))

    def last(self, finish_reason: str, text: str = "") -> str:
        return self._event(self._choice(text or None, finish_reason))

    def usage(self, prompt_tokens: int, completion_tokens: int) -> str:
        """The last event before ``[DONE]`` when the client asked for it
        (``stream_options.include_usage``): no choices, the request's token counts."""
        return _sse({**self._head(), "choices": [],
                     "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                               "total_tokens": prompt_tokens + completion_tokens}})

    def error(self, exc: Exception) -> str:
        body = {"error": {"message": f"generation failed on mode {self.job.mode}: {exc}", "type": "server_error"}}
        if not self._routed:  # a stream that fails before its first text still says how it was routed
            body["modeswitch"] = self.job.info
            self._routed = True
        return _sse(body)

    def _choice(self, delta: str | None, finish_reason: str | None, first: bool = False) -> dict:
        if not self.job.chat:
            return {"index": 0, "text": delta or "", "finish_reason": finish_reason, "logprobs": None}
        d = {"role": "assistant"} if first else {}
        if delta:
            d["content"] = delta
        return {"index": 0, "delta": d, "finish_reason": finish_reason}

    def _head(self) -> dict:
        return {"id": self.job.id, "object": "chat.completion.chunk" if self.job.chat else "text_completion",
                "created": self.created, "model": self.model}

    def _event(self, choice: dict) -> str:
        body = {**self._head(), "choices": [choice]}
        if self.include_usage:
            body["usage"] = None
        if not self._routed:
            body["modeswitch"] = self.job.info
            self._routed = True
        return _sse(body)


def _sse(body: dict) -> str:
    return f"data: {json.dumps(body)}\n\n"

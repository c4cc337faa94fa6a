"""Request bodies of the OpenAI API as far as this server implements it, and its error shape.

Validation happens here (pydantic), so a bad request is answered 400 with the
field at fault before it is routed or counted as served. Parameters are checked
as OpenAI checks them (``max_tokens`` an integer >= 1, ``temperature`` in [0, 2],
``top_p`` in (0, 1], ``n`` must be 1 here, roles OpenAI knows); ``temperature``,
``top_p``, ``seed``, ``user`` and the penalties are accepted and ignored: every
mode decodes greedily, as the profiler measured it (docs/serving.md). Fields that
change what a client reads are honoured or refused, never ignored: ``stop`` (at
most :data:`MAX_STOP_SEQUENCES`, each at most :data:`MAX_STOP_CHARS` characters)
and ``stream_options.include_usage`` are honoured (:mod:`~modeswitch.engine.serving.output`);
``logprobs`` and ``top_logprobs`` are refused, as no engine returns log-probabilities.
Any other field is ignored, as OpenAI's own server ignores fields it does not know.
Text must be valid Unicode (a lone surrogate such as ``"\\ud800"`` is refused).
"""

from __future__ import annotations

import json
import sys
from typing import Literal

from fastapi import HTTPException
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from modeswitch.engine.serving.output import OutputOptions

ROLES = ("system", "developer", "user", "assistant", "tool")


def _unicode(v):
    """A string the tokenizer can encode: no lone surrogates."""
    for s in ([v] if isinstance(v, str) else v if isinstance(v, list) else []):
        try:
            s.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError(f"not valid Unicode text (a lone surrogate at position {exc.start})") from None
    return v


#: stop sequences one request may give: OpenAI's API takes 4; more than a few cost every
#: token a search each (:class:`~modeswitch.engine.serving.output.StopText`), for no use a client has
MAX_STOP_SEQUENCES = 16
#: characters in one stop sequence: a stream holds back the text that may begin one, and
#: finding where that begins costs up to the square of this length per token
MAX_STOP_CHARS = 256
#: why log-probabilities are refused (``logprobs``, ``top_logprobs``)
NO_LOGPROBS = ("log-probabilities are not available from this server: its engines return the generated "
               "tokens, not their probabilities")


def _stop(v):
    """At most :data:`MAX_STOP_SEQUENCES` sequences of at most :data:`MAX_STOP_CHARS` characters."""
    seqs = [v] if isinstance(v, str) else v or []
    if len(seqs) > MAX_STOP_SEQUENCES:
        raise ValueError(f"at most {MAX_STOP_SEQUENCES} stop sequences are accepted, not {len(seqs):,}")
    long = next((s for s in seqs if len(s) > MAX_STOP_CHARS), None)
    if long is not None:
        raise ValueError(f"a stop sequence may have at most {MAX_STOP_CHARS} characters, not {len(long):,}")
    return v


def _refused(v, refuse):
    """``v`` unless ``refuse(v)``: then the field is refused (:data:`NO_LOGPROBS`)."""
    if refuse(v):
        raise ValueError(NO_LOGPROBS)
    return v


class StreamOptions(BaseModel):
    """``stream_options``: ``include_usage`` ends the stream with an event of the token
    counts. Other options are refused by name rather than ignored."""

    model_config = ConfigDict(extra="forbid")

    include_usage: StrictBool | None = None


class _Sampling(BaseModel):
    """The fields both endpoints share."""

    model: str | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    n: StrictInt = Field(1, ge=1, le=1, description="one choice per request (n > 1 is refused)")
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    seed: StrictInt | None = None
    stop: str | list[str] | None = None
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    user: str | None = None

    _check_stop = field_validator("stop")(classmethod(lambda cls, v: _stop(v)))

    @field_validator("stream_options")
    @classmethod
    def _only_streamed(cls, v, info: ValidationInfo):
        """As OpenAI and vLLM answer it: options of a stream need a stream."""
        if v is not None and not info.data.get("stream"):
            raise ValueError("only allowed when stream is true")
        return v

    @property
    def output(self) -> OutputOptions:
        """What the request asks of its output: its stop sequences (empty ones dropped:
        they would end every text before it began) and whether a stream ends with usage."""
        stop = [self.stop] if isinstance(self.stop, str) else self.stop or []
        usage = bool(self.stream_options and self.stream_options.include_usage)
        return OutputOptions(stop=tuple(s for s in stop if s), include_usage=usage)


class CompletionBody(_Sampling):
    prompt: str | list[str]
    max_tokens: StrictInt = Field(16, ge=1)
    #: OpenAI's completions take 0-5: the log-probabilities of that many likeliest tokens
    logprobs: StrictInt | None = Field(None, ge=0, le=5)

    _check_prompt = field_validator("prompt")(classmethod(lambda cls, v: _unicode(v)))
    _check_logprobs = field_validator("logprobs")(classmethod(lambda cls, v: _refused(v, lambda x: x is not None)))


class Outcome(BaseModel):
    """One served pick's outcome: the request's id (the response's ``id``) and whether it
    broke a limit (a shadow run of the reference says)."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1, max_length=64)
    violated: StrictBool


class FeedbackBody(BaseModel):
    """``POST /admin/feedback``: the outcomes of served picks, for a router that adapts its
    threshold online; one per request, each naming the request it is about."""

    model_config = ConfigDict(extra="forbid")

    outcomes: list[Outcome] = Field(min_length=1, max_length=1000)


class Message(BaseModel):
    role: Literal[ROLES]
    content: str

    _check_content = field_validator("content")(classmethod(lambda cls, v: _unicode(v)))


class ChatBody(_Sampling):
    messages: list[Message] = Field(min_length=1)
    max_tokens: StrictInt | None = Field(None, ge=1)
    max_completion_tokens: StrictInt | None = Field(None, ge=1)
    logprobs: StrictBool | None = None
    #: OpenAI's chat takes 0-20, with logprobs true
    top_logprobs: StrictInt | None = Field(None, ge=0, le=20)

    _check_logprobs = field_validator("logprobs")(classmethod(lambda cls, v: _refused(v, bool)))
    _check_top = field_validator("top_logprobs")(classmethod(lambda cls, v: _refused(v, lambda x: x is not None)))

    @property
    def output_tokens(self) -> int:
        """The output budget: the newer field first, as OpenAI reads them; 64 when neither is given."""
        return self.max_completion_tokens or self.max_tokens or 64


def error_response(status: int, message: str, kind: str = "invalid_request_error", code=None,
                   headers: dict | None = None) -> JSONResponse:
    """An error in OpenAI's shape, so clients raise their usual exception types with our message."""
    return JSONResponse({"error": {"message": message, "type": kind, "param": None,
                                   "code": code if code is not None else status}},
                        status_code=status, headers=headers)


def _int(text: str) -> int:
    """A JSON integer, refused by its length before Python converts it (a number longer
    than Python's limit on integer digits would otherwise fail with advice to raise it)."""
    limit = sys.get_int_max_str_digits()
    if limit and len(text.lstrip("-")) > limit:
        raise ValueError(f"a number of {len(text.lstrip('-')):,} digits, more than the {limit:,} accepted")
    return int(text)


def parse_json(raw: bytes):
    """A request body's JSON, or the 400 saying why it is none: not text in a JSON
    encoding, not JSON, a number too long to convert, or arrays and objects nested deeper
    than the parser can follow (``json`` raises RecursionError there, not ValueError)."""
    try:
        return json.loads(raw, parse_int=_int)
    except UnicodeDecodeError as exc:
        why = f"not {exc.encoding} text ({exc.reason} at byte {exc.start:,})"
    except RecursionError:
        why = "arrays or objects nested too deeply to parse"
    except ValueError as exc:  # not JSON, or an integer too long (_int)
        why = f"not valid JSON ({exc})"
    raise RequestValidationError([{"loc": ("body",), "msg": why, "type": "json_invalid"}])


def parse_body(raw: bytes, model: type[BaseModel], context: int | None = None) -> BaseModel:
    """A request body as ``model``, or the 400 naming what is wrong. A conversation with
    more messages than the context has tokens is refused before its messages are
    validated (validating hundreds of thousands takes seconds): every message costs its role's markup, at
    least one token, so it could never fit. Runs off the event loop for large bodies."""
    data = parse_json(raw)
    messages = data.get("messages") if isinstance(data, dict) else None
    if context is not None and isinstance(messages, list) and len(messages) > context:
        raise HTTPException(400, f"{len(messages):,} messages cannot fit the model's context of {context} "
                                 "tokens (each message's role takes at least one)")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise RequestValidationError(exc.errors(include_url=False)) from None


def body_schema(model: type[BaseModel]) -> dict:
    """The OpenAPI request body of an endpoint that parses its body itself (``/docs``),
    with the model's sub-schemas written in place of their references."""
    schema = model.model_json_schema()
    defs = schema.pop("$defs", {})

    def inline(node):
        if isinstance(node, dict):
            ref = node.get("$ref", "")
            if ref.startswith("#/$defs/"):
                return inline(defs[ref.removeprefix("#/$defs/")])
            return {k: inline(v) for k, v in node.items()}
        return [inline(v) for v in node] if isinstance(node, list) else node

    return {"requestBody": {"required": True, "content": {"application/json": {"schema": inline(schema)}}}}

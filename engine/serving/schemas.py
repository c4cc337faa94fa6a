"""Request bodies of the OpenAI API as far as this server implements it, and its error shape.

Validation happens here (pydantic), so a bad request is answered 400 with the
field at fault before it is routed or counted as served. Parameters are checked
as OpenAI checks them (``max_tokens`` an integer >= 1, ``temperature`` in [0, 2],
``top_p`` in (0, 1], ``n`` must be 1 here, roles OpenAI knows); ``temperature``,
``top_p``, ``seed``, ``stop``, ``user`` and the penalties are accepted and ignored:
every mode decodes greedily, as the profiler measured it (README "Serving"). Any
other field is ignored, as OpenAI's own server ignores fields it does not know.
Text must be valid Unicode (a lone surrogate such as ``"\\ud800"`` is refused).
"""

from __future__ import annotations

from typing import Literal

from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field, StrictBool, StrictInt, field_validator

ROLES = ("system", "developer", "user", "assistant", "tool")


def _unicode(v):
    """A string the tokenizer can encode: no lone surrogates."""
    for s in ([v] if isinstance(v, str) else v if isinstance(v, list) else []):
        try:
            s.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError(f"not valid Unicode text (a lone surrogate at position {exc.start})") from None
    return v


class _Sampling(BaseModel):
    """The fields both endpoints share."""

    model: str | None = None
    stream: StrictBool = False
    n: StrictInt = Field(1, ge=1, le=1, description="one choice per request (n > 1 is refused)")
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    seed: StrictInt | None = None
    stop: str | list[str] | None = None
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    user: str | None = None


class CompletionBody(_Sampling):
    prompt: str | list[str]
    max_tokens: StrictInt = Field(16, ge=1)

    _check_prompt = field_validator("prompt")(classmethod(lambda cls, v: _unicode(v)))


class Message(BaseModel):
    role: Literal[ROLES]
    content: str

    _check_content = field_validator("content")(classmethod(lambda cls, v: _unicode(v)))


class ChatBody(_Sampling):
    messages: list[Message] = Field(min_length=1)
    max_tokens: StrictInt | None = Field(None, ge=1)
    max_completion_tokens: StrictInt | None = Field(None, ge=1)

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

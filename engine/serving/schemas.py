"""Request bodies of the OpenAI API as far as this server implements it, and its error shape.

Validation happens here (pydantic), so a bad request is answered 400 with the
field at fault before it is routed or counted as served.
"""

from __future__ import annotations

from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field


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

    @property
    def output_tokens(self) -> int:
        """The output budget: the newer field first, as OpenAI reads them; 64 when neither is given."""
        return self.max_completion_tokens or self.max_tokens or 64


def error_response(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    """An error in OpenAI's shape, so clients raise their usual exception types with our message."""
    return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status_code=status)

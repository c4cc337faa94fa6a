"""Request bodies to prompt token ids, with the served model's own tokenizer."""

from __future__ import annotations

from fastapi import HTTPException

from engine.serving.schemas import CompletionBody, Message


def completion_ids(tok, body: CompletionBody) -> list[int]:
    """The prompt's ids (empty for an empty prompt: ``serve`` answers that 400)."""
    prompt = body.prompt
    if isinstance(prompt, list):
        if len(prompt) != 1:
            raise HTTPException(400, "prompt: this server takes one prompt per request")
        prompt = prompt[0]
    return tok(prompt, add_special_tokens=True)["input_ids"] if prompt else []


def chat_ids(tok, messages: list[Message]) -> list[int]:
    """The conversation as the model was trained to read it (its chat template), or as
    ``role: content`` lines for a model without one (the tiny test models)."""
    msgs = [m.model_dump() for m in messages]
    if tok.chat_template:
        out = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
        return list(out["input_ids"] if isinstance(out, dict) else out)
    text = "\n".join(f"{m['role']}: {m['content']}" for m in msgs) + "\nassistant:"
    return tok(text, add_special_tokens=True)["input_ids"]

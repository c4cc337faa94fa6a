"""Request bodies to prompt token ids, with the served model's own tokenizer."""

from __future__ import annotations

from fastapi import HTTPException

from modeswitch.engine.serving.schemas import CompletionBody, Message

#: text longer than this many characters per context token is refused before tokenising
#: (tokenising 20 MB took 19 s): no tokenizer packs more characters than this into a token
#: of text that could still fit the context
CHARS_PER_TOKEN_BOUND = 32


#: JSON body bytes one context token can account for: its text (at most
#: CHARS_PER_TOKEN_BOUND characters, each at most 12 bytes as JSON escapes, two \uXXXX
#: for a character outside the BMP) and 256 bytes of keys, punctuation and whitespace
#: (a message per token at most); a body larger than this for the whole context, plus
#: BODY_SLACK_BYTES for the other fields, is refused by its length before it is read
BODY_BYTES_PER_TOKEN = CHARS_PER_TOKEN_BOUND * 12 + 256
BODY_SLACK_BYTES = 64 * 1024


def body_bytes_bound(context: int) -> int:
    """The largest request body that could hold a request fitting ``context`` tokens."""
    return context * BODY_BYTES_PER_TOKEN + BODY_SLACK_BYTES


def _bounded(text_chars: int, context: int | None) -> None:
    if context is not None and text_chars > CHARS_PER_TOKEN_BOUND * context:
        raise HTTPException(400, f"the prompt ({text_chars:,} characters) cannot fit the model's context of "
                                 f"{context} tokens")


def completion_ids(tok, body: CompletionBody, context: int | None = None, raw: bool = False) -> list[int]:
    """The prompt's ids (empty for an empty prompt: ``serve`` answers that 400). A model
    with a chat template reads the prompt as one user turn in it, unless ``raw``
    (``--raw-completions``): an instruct model given bare text continues it instead of
    answering, and the profile measured it templated."""
    prompt = body.prompt
    if isinstance(prompt, list):
        if len(prompt) != 1:
            raise HTTPException(400, "prompt: this server takes one prompt per request")
        prompt = prompt[0]
    _bounded(len(prompt) + (0 if raw else CHARS_PER_TOKEN_BOUND), context)
    if not prompt:
        return []
    if tok.chat_template and not raw:
        out = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                      tokenize=True, return_dict=True)
        return list(out["input_ids"])
    return tok(prompt, add_special_tokens=True)["input_ids"]


def chat_chars(messages: list[Message]) -> int:
    """What a conversation costs the tokenizer, in characters: its contents and roles, and
    for each message :data:`CHARS_PER_TOKEN_BOUND` more, standing for the template markup
    around it (at least one token). So 100,000 empty messages count as what they are to
    tokenise (3.2 M characters), not as 0, and a conversation with more messages than the
    context has tokens is over the bound below."""
    return sum(len(m.content) + len(m.role) + CHARS_PER_TOKEN_BOUND for m in messages)


def chat_ids(tok, messages: list[Message], context: int | None = None) -> list[int]:
    """The conversation as the model was trained to read it (its chat template), or as
    ``role: content`` lines for a model without one (the tiny test models)."""
    _bounded(chat_chars(messages), context)
    msgs = [m.model_dump() for m in messages]
    if tok.chat_template:
        # a BatchEncoding (a Mapping, not a dict): listing it gave its keys, not the ids
        out = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=True)
        return list(out["input_ids"])
    text = "\n".join(f"{m['role']}: {m['content']}" for m in msgs) + "\nassistant:"
    return tok(text, add_special_tokens=True)["input_ids"]

"""A stream's events on their own (``engine.serving.generate._events``), on a scripted
token feed and a byte-level toy tokenizer: what each event carries, and that none
carries nothing."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest

from modeswitch.engine.serving.generate import _events
from modeswitch.engine.serving.output import PLAIN, OutputOptions, StopText, cut_at_stop

#: id -> bytes, as a byte-level BPE: 0 is EOS (special: decodes to nothing), 1-26 letters,
#: 100 and 101 the two bytes of "é" (one alone decodes to U+FFFD)
_BYTES = {0: b"", **{i: bytes([96 + i]) for i in range(1, 27)}, 100: b"\xc3", 101: b"\xa9"}


class _Tokenizer:
    def decode(self, ids, skip_special_tokens=True):
        return b"".join(_BYTES[i] for i in ids).decode("utf-8", errors="replace")


class _Feed:
    def __init__(self, items):
        self._items = list(items) + [None]

    async def next(self):
        return self._items.pop(0)


def _stream(items, max_tokens, chat=False, output=PLAIN, feed=None):
    """The events of one stream as parsed bodies (``[DONE]`` as the string)."""
    closed = []

    async def close():  # as _Life.close: once, however often it is called
        if not closed:
            closed.append(True)

    state = SimpleNamespace(config=SimpleNamespace(served_name="m"), tokenizer=_Tokenizer())
    job = SimpleNamespace(id="cmpl-1", chat=chat, max_tokens=max_tokens, mode="fp16", info={"mode": "fp16"},
                          ids=[7, 8, 9])

    async def run():
        return [e async for e in _events(state, job, feed or _Feed(items), SimpleNamespace(close=close), output)]

    raw = asyncio.run(run())
    assert closed == [True]  # the request ends however the stream does
    assert all(e.startswith("data: ") and e.endswith("\n\n") for e in raw)
    return [e[6:-2] if e == "data: [DONE]\n\n" else json.loads(e[6:-2]) for e in raw]


def _text(ev, chat=False):
    c = ev["choices"][0]
    return c["delta"].get("content", "") if chat else c["text"]


def _routed(events):
    return [isinstance(e, dict) and "modeswitch" in e for e in events]


def test_at_max_tokens_the_finish_rides_on_the_last_text():
    ev = _stream([[1], [2], [3]], max_tokens=3)
    assert ev[-1] == "[DONE]" and len(ev) == 4
    assert [_text(e) for e in ev[:-1]] == ["a", "b", "c"]
    assert [e["choices"][0]["finish_reason"] for e in ev[:-1]] == [None, None, "length"]
    assert _routed(ev) == [True, False, False, False]


@pytest.mark.parametrize("max_tokens, finish", [(5, "stop"), (2, "length")])
def test_an_end_without_text_gets_a_finish_of_its_own(max_tokens, finish):
    """EOS before max_tokens (stop), or as the max_tokens-th token (length, as the whole
    response says): the last token decodes to nothing, so the finish has its own event."""
    ev = _stream([[1], [0]], max_tokens=max_tokens)
    assert [_text(e) for e in ev[:-1]] == ["a", ""]
    assert [e["choices"][0]["finish_reason"] for e in ev[:-1]] == [None, finish]


def test_text_held_back_at_the_end_goes_with_the_finish():
    """A stream that ends inside a character: the held-back text is not lost; the stream
    says what the whole response's decode says."""
    ev = _stream([[1], [100]], max_tokens=2)
    assert "".join(_text(e) for e in ev[:-1]) == _Tokenizer().decode([1, 100]) == "a\ufffd"
    assert ev[-2]["choices"][0]["finish_reason"] == "length"
    # and a character completed by the next token comes out whole, once
    ev = _stream([[1], [100], [101]], max_tokens=3)
    assert [_text(e) for e in ev[:-1]] == ["a", "é"] and ev[-2]["choices"][0]["finish_reason"] == "length"


def test_a_stream_failing_before_any_text_still_says_how_it_was_routed():
    ev = _stream([RuntimeError("boom")], max_tokens=4)
    assert len(ev) == 1 and "boom" in ev[0]["error"]["message"] and ev[0]["modeswitch"] == {"mode": "fp16"}
    ev = _stream([[1], RuntimeError("boom")], max_tokens=4)  # after text: routed on the first event only
    assert _routed(ev) == [True, False] and "error" in ev[1]


def test_a_chat_stream_sends_the_role_first_and_no_empty_event_after():
    ev = _stream([[1], [2]], max_tokens=2, chat=True)
    assert ev[0]["choices"][0]["delta"] == {"role": "assistant"}
    assert _routed(ev) == [True, False, False, False]
    assert [_text(e, chat=True) for e in ev[1:-1]] == ["a", "b"]
    assert [e["choices"][0]["finish_reason"] for e in ev[1:-1]] == [None, "length"]


def _finishes(ev):
    return [e["choices"][0]["finish_reason"] for e in ev if isinstance(e, dict) and e["choices"]]


def test_a_stop_sequence_across_tokens_ends_the_stream_before_it():
    """"cd" arrives as two tokens: "c" is held back (it may begin the sequence), "d"
    completes it, and the stream ends there with no more tokens read."""
    feed = _Feed([[1], [2], [3], [4], [5], [6]])
    ev = _stream(None, max_tokens=10, output=OutputOptions(stop=("cd",)), feed=feed)
    assert [_text(e) for e in ev[:-1]] == ["a", "b", ""] and _finishes(ev) == [None, None, "stop"]
    assert feed._items == [[5], [6], None]  # generation is not read past the stop


def test_text_held_back_for_a_stop_sequence_is_sent_when_it_is_not_one():
    ev = _stream([[1], [3], [4], [5]], max_tokens=4, output=OutputOptions(stop=("cx",)))
    assert [_text(e) for e in ev[:-1]] == ["a", "cd", "e"] and _finishes(ev) == [None, None, "length"]
    # at max_tokens while holding: the held text goes with the finish
    ev = _stream([[1], [2], [3]], max_tokens=3, output=OutputOptions(stop=("cd",)))
    assert [_text(e) for e in ev[:-1]] == ["a", "b", "c"] and _finishes(ev) == [None, None, "length"]


def test_a_stop_sequence_completed_by_a_character_s_last_byte():
    ev = _stream([[1], [100], [101], [2]], max_tokens=5, output=OutputOptions(stop=("\u00e9",)))
    assert "".join(_text(e) for e in ev[:-1]) == "a" and _finishes(ev)[-1] == "stop"


@pytest.mark.parametrize("chat", [False, True])
def test_include_usage_ends_the_stream_with_the_token_counts(chat):
    """As OpenAI sends it: every event carries ``usage: null``, then one with no choices
    and the counts, then ``[DONE]``; without the option, no event carries ``usage``."""
    ev = _stream([[1], [2]], max_tokens=2, chat=chat, output=OutputOptions(include_usage=True))
    assert ev[-1] == "[DONE]"
    assert ev[-2]["choices"] == [] and ev[-2]["usage"] == {"prompt_tokens": 3, "completion_tokens": 2,
                                                           "total_tokens": 5}
    assert ev[-2]["id"] == "cmpl-1" and ev[-2]["object"] == ("chat.completion.chunk" if chat else "text_completion")
    assert all("usage" in e and e["usage"] is None for e in ev[:-2])
    assert all("usage" not in e for e in _stream([[1], [2]], max_tokens=2, chat=chat)[:-1])
    # cut at a stop sequence: the tokens generated up to it are counted
    ev = _stream([[1], [2], [3]], max_tokens=5, output=OutputOptions(stop=("b",), include_usage=True))
    assert ev[-2]["usage"]["completion_tokens"] == 2


def _first_completed(text: str, stop: tuple[str, ...]) -> tuple[str, bool]:
    """The text before the stop sequence that is completed first (the longest of those
    completed by the same character), as a stream read a character at a time finds it."""
    for end in range(1, len(text) + 1):
        done = [s for s in stop if text[:end].endswith(s)]
        if done:
            return text[:end - max(map(len, done))], True
    return text, False


def test_stop_text_in_any_pieces_gives_the_text_before_a_stop_sequence():
    """However the text is split, StopText hands out (with what it held at the end) a
    prefix of the text containing no stop sequence, followed in the text by one when it
    stopped, the whole text when not; a character at a time, exactly the text before the
    first sequence completed; in one piece, the text before the earliest one."""
    import random

    rng = random.Random(0)
    for _ in range(2000):
        text = "".join(rng.choice("abc\n") for _ in range(rng.randrange(0, 30)))
        stop = tuple("".join(rng.choice("abc\n") for _ in range(rng.randrange(1, 4)))
                     for _ in range(rng.randrange(1, 4)))
        cuts = sorted(rng.sample(range(len(text) + 1), k=min(len(text) + 1, rng.randrange(1, 6))))
        splits = {"random": [text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)])],
                  "characters": list(text), "whole": [text]}
        for how, pieces in splits.items():
            st = StopText(stop)
            out = "".join(st.add(p) for p in pieces)
            out += "" if st.stopped else st.rest()
            assert text.startswith(out) and not any(s in out for s in stop), (text, stop, how)
            assert st.stopped == any(text[len(out):].startswith(s) for s in stop), (text, stop, how)
            assert st.stopped or out == text
            if how != "random":
                want = _first_completed(text, stop) if how == "characters" else cut_at_stop(text, stop)
                assert (out, st.stopped) == want, (text, stop, how)


@pytest.mark.parametrize("fast", [True, False], ids=["DecodeStream", "window"])
def test_a_stream_s_deltas_add_up_to_the_whole_decode(tiny_models, fast):
    """On the project's real tokenizer, both ways of detokenizing (the Rust incremental
    decoder of a fast tokenizer, the window decode otherwise) hand out deltas that add up
    to the whole response's text, for prompts with characters of several bytes and for
    random ids (tokens that end inside a character)."""
    import random

    from transformers import AutoTokenizer

    from modeswitch.engine.serving.generate import _decode_stream, _Detokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_models.target))
    assert _decode_stream(tok) is not None  # the tiny model's tokenizer is a fast one
    seen = tok if fast else SimpleNamespace(decode=tok.decode)  # no Rust core: the window
    rng = random.Random(0)
    seqs = [tok(t)["input_ids"] for t in ("h\u00e9llo w\u00f6rld \u2014 \u65e5\u672c \U0001f600 def f(x):\n    return x",
                                          "\u00e9", "\U0001f600\U0001f600")]
    seqs += [[rng.randrange(len(tok)) for _ in range(rng.randrange(1, 40))] for _ in range(100)]
    for ids in seqs:
        d = _Detokenizer(seen)
        deltas = [d.add([i]) for i in ids]
        assert "".join(deltas) + d.rest() == tok.decode(ids, skip_special_tokens=True)
        assert d.tokens == len(ids)


def test_a_failing_rust_step_hands_the_stream_to_an_exact_decode(tiny_models, monkeypatch):
    """tokenizers' ``DecodeStream.step`` can raise ("Invalid prefix encountered"); the
    stream then goes on decoding the whole text, and still adds up to the whole decode,
    a character held back at the failure included."""
    from tokenizers.decoders import DecodeStream
    from transformers import AutoTokenizer

    from modeswitch.engine.serving import generate

    tok = AutoTokenizer.from_pretrained(str(tiny_models.target))

    class Failing:
        def __init__(self, at):
            self.inner, self.n, self.at = DecodeStream(skip_special_tokens=True), 0, at

        def step(self, raw, i):
            self.n += 1
            if self.n == self.at:
                raise Exception("Invalid prefix encountered")
            return self.inner.step(raw, i)

    ids = tok("h\u00e9llo w\u00f6rld \U0001f600 def f(x): return x")["input_ids"]
    whole = tok.decode(ids, skip_special_tokens=True)
    for at in range(1, len(ids) + 1):
        monkeypatch.setattr(generate, "_decode_stream", lambda t, at=at: (t._tokenizer, Failing(at)))
        d = generate._Detokenizer(tok)
        deltas = [d.add([i]) for i in ids]
        assert "".join(deltas) + d.rest() == whole, at

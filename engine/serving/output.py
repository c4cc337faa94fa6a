"""What a request asks of its output beyond the tokens: stop sequences (the text cut before
the first one, generation stopped there) and, streamed, a last event with the usage.

Stop sequences are matched in the decoded text, as OpenAI and vLLM match them: a
sequence may span tokens, and the text returned ends before it (never including it).
A stream holds back only the text that could still be the start of a sequence, so it
sends no text that a later token could show to belong to one.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class OutputOptions:
    """``stop``: the stop sequences (none: generate to ``max_tokens`` or the end of text);
    ``include_usage``: a streamed response ends with an event of the token counts."""

    stop: tuple[str, ...] = ()
    include_usage: bool = False


#: a request that asks nothing of its output beyond its tokens
PLAIN = OutputOptions()


def cut_at_stop(text: str, stop: tuple[str, ...]) -> tuple[str, bool]:
    """(``text`` up to the earliest stop sequence in it, whether one was found)."""
    found = [i for i in (text.find(s) for s in stop if s) if i >= 0]
    return (text[:min(found)], True) if found else (text, False)


class StopText:
    """A response's text as it is decoded, handed out in pieces that never include a stop
    sequence nor any part of one: :meth:`add` takes each new piece of decoded text and
    gives what can be sent now; once a sequence is found it gives the text before it and
    :attr:`stopped` turns true. Each piece is searched from just before it (the longest
    sequence's length), not from the start, so a long response costs no more per token
    than a short one."""

    def __init__(self, stop: tuple[str, ...] = ()):
        self.stop = tuple(s for s in stop if s)  # an empty one would end every text at once
        self._longest = max(map(len, self.stop), default=0)
        self._firsts = {s[0] for s in self.stop}
        #: decoded text not handed out yet: the tail that may begin a stop sequence
        self._pending = ""
        self.stopped = False

    @property
    def holding(self) -> bool:
        """Text is held back (it may be the start of a stop sequence)."""
        return bool(self._pending)

    def add(self, piece: str) -> str:
        """The text that can be sent now, ``piece`` and what was held back before it."""
        if not self.stop or self.stopped:
            return "" if self.stopped else piece
        text = self._pending + piece
        start = max(0, len(self._pending) - self._longest + 1)
        found = [i for i in (text.find(s, start) for s in self.stop) if i >= 0]
        if found:
            self.stopped, self._pending = True, ""
            return text[:min(found)]
        keep = self._start_of_a_stop(text)
        self._pending = text[len(text) - keep:] if keep else ""
        return text[:len(text) - keep]

    def _start_of_a_stop(self, text: str) -> int:
        """The length of the longest end of ``text`` that begins some stop sequence (the
        ends tried from the longest a sequence allows, only where a sequence's first
        character stands)."""
        for i in range(max(0, len(text) - self._longest + 1), len(text)):
            if text[i] in self._firsts and any(s.startswith(text[i:]) for s in self.stop):
                return len(text) - i
        return 0

    def rest(self) -> str:
        """At the end of generation: the text held back, which no sequence completed."""
        out, self._pending = self._pending, ""
        return out

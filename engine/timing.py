"""Per-token timestamps from transformers' streamer hook."""

from __future__ import annotations

import time

from transformers.generation.streamers import BaseStreamer


class TokenTimer(BaseStreamer):
    """Records when each generated token arrives.

    ``generate`` calls ``put`` first with the prompt, then with each new token
    (or several at once after a speculative step); every arrival gets a time in
    ms relative to ``start``.
    """

    def __init__(self, start: float | None = None, on_token=None):
        self.start = time.perf_counter() if start is None else start
        #: called with each batch of new token ids as it arrives (serving streams them)
        self.on_token = on_token
        self.times_ms: list[float] = []
        self.tokens: list[int] = []
        self._prompt_seen = False

    def put(self, value):
        now = (time.perf_counter() - self.start) * 1000
        if not self._prompt_seen:
            self._prompt_seen = True
            return
        ids = value.reshape(-1).tolist()
        self.tokens.extend(ids)
        self.times_ms.extend([now] * len(ids))
        if self.on_token is not None:
            self.on_token(ids)

    def end(self):
        pass

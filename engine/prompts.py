"""Turn requests into token ids for a tokenizer.

A request that carries token ids is used as is; one with prompt text is
tokenised (its ``prompt_tokens`` becomes the real count); a synthetic request
(shape only) gets real text from the stdlib corpus: its shared prefix from one
fixed offset per family (so requests of a family share it token for token), the
rest from an offset drawn from the request id. Deterministic for a given
tokenizer and corpus.
"""

from __future__ import annotations

import dataclasses
import hashlib

from dataset.corpus import stdlib_text
from dataset.requests import Request


def _offset(key: str, n: int) -> int:
    return int(hashlib.sha256(key.encode()).hexdigest()[:12], 16) % max(n, 1)


class PromptBuilder:
    def __init__(self, tokenizer, corpus_bytes: int = 1_500_000):
        self.tokenizer = tokenizer
        text = stdlib_text(corpus_bytes)
        self.stream = tokenizer(text, add_special_tokens=False)["input_ids"]

    def _slice(self, key: str, n: int) -> list[int]:
        start = _offset(key, len(self.stream) - n - 1)
        return list(self.stream[start:start + n])

    def prepare(self, req: Request) -> tuple[Request, list[int]]:
        if req.prompt_token_ids:
            ids = list(req.prompt_token_ids)
        elif req.prompt:
            ids = self.tokenizer(req.prompt, add_special_tokens=True)["input_ids"]
        else:
            p, s = req.prompt_tokens, min(req.shared_prefix_tokens, req.prompt_tokens)
            prefix = self._slice(f"prefix:{req.family or req.workload}:{s}", s) if s else []
            ids = prefix + self._slice(f"suffix:{req.id}", p - s)
        req = dataclasses.replace(req, prompt_tokens=len(ids),
                                  shared_prefix_tokens=min(req.shared_prefix_tokens, len(ids)))
        return req, ids

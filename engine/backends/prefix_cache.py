"""A memory-bounded store of KV caches keyed by the prompt-prefix tokens.

Requests that share a prefix (a system prompt, a long document) reuse the KV
cache computed for it: the store finds the longest cached prefix of a
request's tokens, hands out a private copy (generation appends to the cache),
and evicts least-recently-used entries beyond its byte budget.
"""

from __future__ import annotations

import copy
from collections import OrderedDict

import torch


def cache_nbytes(cache) -> int:
    total = 0
    for layer in getattr(cache, "layers", []):
        for name in ("keys", "values"):
            t = getattr(layer, name, None)
            if isinstance(t, torch.Tensor):
                total += t.numel() * t.element_size()
    return total


class PrefixKVStore:
    def __init__(self, max_bytes: int = 256 * 2**20):
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[int, ...], tuple[object, int]] = OrderedDict()
        self.hits = self.misses = self.evictions = 0

    @property
    def nbytes(self) -> int:
        return sum(n for _, n in self._entries.values())

    def __len__(self):
        return len(self._entries)

    def lookup(self, token_ids: list[int]):
        """Longest cached prefix of ``token_ids`` (strictly shorter than it):
        (prefix length, private copy of its cache), or (0, None)."""
        best = None
        for key in self._entries:
            n = len(key)
            if n < len(token_ids) and (best is None or n > len(best)) and tuple(token_ids[:n]) == key:
                best = key
        if best is None:
            self.misses += 1
            return 0, None
        self.hits += 1
        self._entries.move_to_end(best)
        return len(best), copy.deepcopy(self._entries[best][0])

    def clear(self) -> None:
        """Drop every entry (counters kept): a timed unit starts from a known state."""
        self._entries.clear()

    def store(self, prefix_ids: list[int], cache) -> bool:
        """Keep a copy of ``cache`` (holding exactly ``prefix_ids``); False if too big."""
        key = tuple(prefix_ids)
        size = cache_nbytes(cache)
        if size > self.max_bytes:
            return False
        self._entries[key] = (copy.deepcopy(cache), size)
        self._entries.move_to_end(key)
        while self.nbytes > self.max_bytes:
            self._entries.popitem(last=False)
            self.evictions += 1
        return True

"""Engines loaded lazily within a memory budget, least recently used unloaded first."""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.backends.base import Engine


class EnginePool:
    """One engine per mode, created by ``factory(mode)`` on first use.

    ``lock(mode)`` serialises requests on one engine (transformers generation is
    not re-entrant; the server skips it for batching engines, whose running batch
    takes concurrent requests); requests for different modes run in parallel
    threads. When the loaded engines' weights exceed ``budget_mb``, idle engines are
    unloaded, least recently used first; an engine in use is never unloaded.
    """

    def __init__(self, factory: Callable[[str], Engine], budget_mb: float = 4096.0):
        self.factory = factory
        self.budget_mb = budget_mb
        self._engines: OrderedDict[str, Engine] = OrderedDict()
        self._locks: dict[str, asyncio.Lock] = {}
        self._busy: dict[str, int] = {}
        self._load_lock = threading.Lock()
        self.loads = 0
        self.unloads = 0

    def lock(self, mode: str) -> asyncio.Lock:
        if mode not in self._locks:
            self._locks[mode] = asyncio.Lock()
        return self._locks[mode]

    def acquire(self, mode: str) -> Engine:
        """The engine for ``mode`` (loading it if needed); call ``release`` when done.

        A load that fails leaves the mode idle: it raises with nothing to release, and
        the engine a later load makes can still be unloaded.
        """
        with self._load_lock:
            eng = self._engines.get(mode)
            if eng is None:
                eng = self.factory(mode)
                self._engines[mode] = eng
                self.loads += 1
            self._busy[mode] = self._busy.get(mode, 0) + 1
            self._engines.move_to_end(mode)
            self._evict()
            return eng

    def release(self, mode: str):
        with self._load_lock:
            self._busy[mode] -= 1

    def _weights_mb(self, eng: Engine) -> float:
        """An engine's share of the budget: weights and the KV cache it reserves where the
        engine says (``memory_mb``), else its weights."""
        return float(getattr(eng, "memory_mb", eng.weights_mb))

    def _evict(self):
        total = sum(self._weights_mb(e) for e in self._engines.values())
        for mode in list(self._engines):
            if total <= self.budget_mb:
                break
            if self._busy.get(mode, 0) > 0:
                continue
            eng = self._engines.pop(mode)
            total -= self._weights_mb(eng)
            eng.close()
            self.unloads += 1

    def loaded(self) -> list[str]:
        return list(self._engines)

    def close(self):
        with self._load_lock:
            for eng in self._engines.values():
                eng.close()
            self._engines.clear()


class PrefixTracker:
    """Longest prompt prefix shared with a recent prompt (the router's shared-prefix feature)."""

    def __init__(self, max_prompts: int = 128, min_tokens: int = 16):
        import numpy as np

        self._np = np
        self.recent: list = []
        self.max_prompts = max_prompts
        self.min_tokens = min_tokens
        self._lock = threading.Lock()

    def observe(self, ids: list[int]) -> int:
        np = self._np
        a = np.asarray(ids, dtype=np.int64)
        best = 0
        with self._lock:
            for b in self.recent:
                n = min(len(a), len(b))
                if n <= best:
                    continue
                diff = np.flatnonzero(a[:n] != b[:n])
                best = max(best, int(diff[0]) if len(diff) else n)
            self.recent.append(a)
            if len(self.recent) > self.max_prompts:
                self.recent.pop(0)
        return best if best >= self.min_tokens else 0


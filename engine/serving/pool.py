"""Engines loaded lazily within a memory budget, least recently used unloaded first."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from modeswitch.engine.backends.base import Engine

log = logging.getLogger("modeswitch.serve")


class EnginePool:
    """One engine per mode, created by ``factory(mode)`` on first use.

    ``lock(mode)`` serialises requests on one engine (transformers generation is
    not re-entrant; the server skips it for batching engines, whose running batch
    takes concurrent requests); requests for different modes run in parallel
    threads. When ``base_mb`` and the loaded engines' memory (weights and the caches they
    reserve) exceed ``budget_mb``, idle engines are unloaded, least recently used first;
    an engine in use is never unloaded (a warning says when that leaves the budget
    exceeded, and idle engines then go as their requests finish).

    ``on_load()`` runs after each engine is loaded, ``on_unload()`` after unloaded engines
    are closed, both in the loading or closing thread, under the load lock (the server
    freezes a loaded engine's objects out of the garbage collector's reach, and collects
    an unloaded one's).
    """

    def __init__(self, factory: Callable[[str], Engine], budget_mb: float = 4096.0, base_mb: float = 0.0,
                 on_load: Callable[[], None] | None = None, on_unload: Callable[[], None] | None = None):
        self.factory = factory
        self.on_load, self.on_unload = on_load, on_unload
        self.budget_mb = budget_mb
        #: what the process holds before any engine (the server's Python, torch, tokenizer
        #: and router: ~460 MB on CPU here), counted against the budget so that it bounds
        #: the server's memory, not only its engines'
        self.base_mb = base_mb
        self._engines: OrderedDict[str, Engine] = OrderedDict()
        #: each loaded engine's share of the budget, read once at its load (fixed while it
        #: stays loaded), so the check on every ``release`` is a sum over a few floats
        self._counted: dict[str, float] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._busy: dict[str, int] = {}
        #: one load (or unload) at a time; held across ``factory`` and ``close``
        self._load_lock = threading.Lock()
        #: the table and the lease counts; held only for dictionary work, never across a
        #: load or a close, so the event loop (``release``, ``try_acquire``) never waits on
        #: a load, and a load that needs the loop (a vLLM engine serving on it warms up
        #: there) cannot deadlock with it
        self._state = threading.Lock()
        self.loads = 0
        self.unloads = 0

    def lock(self, mode: str) -> asyncio.Lock:
        if mode not in self._locks:
            self._locks[mode] = asyncio.Lock()
        return self._locks[mode]

    def _lease(self, mode: str) -> Engine | None:
        """Under ``_state``: ``mode``'s engine with one more lease, or None."""
        eng = self._engines.get(mode)
        if eng is not None:
            self._busy[mode] = self._busy.get(mode, 0) + 1
            self._engines.move_to_end(mode)
        return eng

    def acquire(self, mode: str) -> Engine:
        """The engine for ``mode`` (loading it if needed); call ``release`` when done.

        A load that fails leaves the mode idle: it raises with nothing to release, and
        the engine a later load makes can still be unloaded.
        """
        with self._state:
            eng = self._lease(mode)
        if eng is not None:
            return eng
        with self._load_lock:
            with self._state:  # loaded by the load this one waited for
                eng = self._lease(mode)
            if eng is not None:
                return eng
            eng = self.factory(mode)
            counted = self._counted_mb(eng)
            with self._state:
                self._engines[mode] = eng
                self._counted[mode] = counted
                self.loads += 1
                self._lease(mode)
                victims, over = self._victims()
                names = list(self._engines)
            if over:
                self._warn_over(over, names)
            unloaded = bool(victims)
            while victims:  # closed outside _state (a close may need the event loop), no reference kept
                self._close(victims.pop(0))
            self._hook(self.on_unload if unloaded else None)
            self._hook(self.on_load)
            return eng

    def try_acquire(self, mode: str) -> Engine | None:
        """``mode``'s engine if it is loaded, else None (then :meth:`acquire`, in a thread).
        Never waits on a load: the server calls it on its event loop for every request, so
        a loaded engine costs no thread."""
        with self._state:
            return self._lease(mode)

    def release(self, mode: str):
        """Hand a lease back. When engines that were in use at a load had left the pool
        over its budget, the idle ones now go (least recently used first), closed in a
        thread: ``release`` runs on the server's event loop, and closing an engine may
        need that loop (a vLLM engine serving on it) or take seconds."""
        with self._state:
            self._busy[mode] -= 1
            victims = self._victims()[0] if self._over_budget() else []
        if victims:
            threading.Thread(target=self._close_all, args=(victims,), daemon=True,
                             name="modeswitch-unload").start()

    def _close_all(self, engines: list[Engine]):
        with self._load_lock:  # one load or unload at a time
            while engines:  # no reference kept once closed: the hook collects what they held
                self._close(engines.pop(0))
            self._hook(self.on_unload)

    @staticmethod
    def _close(eng: Engine) -> None:
        """An unloaded engine closed; one that fails to close is logged (it is gone from the
        pool anyway), never fails the load or release that unloaded it."""
        try:
            eng.close()
        except Exception as exc:  # noqa: BLE001
            log.warning("closing an unloaded engine failed: %s: %s", type(exc).__name__, exc)

    @staticmethod
    def _hook(fn: Callable[[], None] | None) -> None:
        """A load or unload hook; one that fails is logged, never fails the load."""
        if fn is None:
            return
        try:
            fn()
        except Exception as exc:  # noqa: BLE001
            log.warning("engine pool hook %s failed: %s: %s", getattr(fn, "__name__", fn), type(exc).__name__, exc)

    def _over_budget(self) -> bool:
        return self.base_mb + sum(self._counted.values()) > self.budget_mb

    def _warn_over(self, total: float, names: list[str]):
        log.warning("engines in use (%s) and the server's own %.0f MB hold %.0f MB, over the memory budget "
                    "of %.0f MB: idle ones are unloaded as their requests finish; raise --memory-budget-mb "
                    "or serve fewer modes at once", ", ".join(names), self.base_mb, total, self.budget_mb)

    def _counted_mb(self, eng: Engine) -> float:
        """An engine's share of the budget: weights and the KV cache it reserves where the
        engine says (``memory_mb``), else its weights."""
        return float(getattr(eng, "memory_mb", eng.weights_mb))

    def _victims(self) -> tuple[list[Engine], float]:
        """Under ``_state``: idle engines taken out of the table, least recently used first,
        until the rest fit the budget (the caller closes them), and the memory still held
        when engines in use keep it over the budget (else 0; the caller warns, outside the
        lock)."""
        total = self.base_mb + sum(self._counted.values())
        out = []
        for mode in list(self._engines):
            if total <= self.budget_mb:
                break
            if self._busy.get(mode, 0) > 0:
                continue
            eng = self._engines.pop(mode)
            total -= self._counted.pop(mode)
            out.append(eng)
            self.unloads += 1
        return out, (total if total > self.budget_mb else 0.0)

    def loaded(self) -> list[str]:
        return list(self._engines)

    def memory_mb(self) -> dict[str, float]:
        """Each loaded engine's share of the budget, in MiB (as the budget counts it)."""
        with self._state:
            return {m: round(mb, 1) for m, mb in self._counted.items()}

    def close(self):
        with self._load_lock:
            with self._state:
                engines, self._engines = list(self._engines.values()), OrderedDict()
                self._counted = {}
            for eng in engines:
                eng.close()


class PrefixTracker:
    """Longest prompt prefix shared with a recent prompt (the router's shared-prefix feature).

    Why not compare with every recent prompt: that is one numpy comparison per recent
    prompt and request, far dearer than the routing decision itself. Prompts are indexed by
    chained hashes of their ``min_tokens``-token blocks (the key of block k covers tokens
    0 .. k*B); a new prompt probes its own keys until one is missing, then is compared
    once, token by token, with the latest prompt holding the last key found. The answer
    is exact for that prompt, and never more than ``min_tokens - 1`` short of the longest
    prefix any recent prompt shares (one that diverges inside the next block); prefixes
    shorter than ``min_tokens`` count as 0."""

    def __init__(self, max_prompts: int = 128, min_tokens: int = 16):
        self.max_prompts = max_prompts
        self.min_tokens = min_tokens
        self._index: dict[int, list[int]] = {}  # block-chain key -> latest prompt with it
        self._recent: list[tuple[list[int], list[int]]] = []  # (prompt, its keys), oldest first
        self._lock = threading.Lock()

    def _keys(self, ids: list[int]) -> list[int]:
        b, keys, h = self.min_tokens, [], 0
        for k in range(len(ids) // b):
            h = hash((h, tuple(ids[k * b:(k + 1) * b])))
            keys.append(h)
        return keys

    @staticmethod
    def _shared(a: list[int], cand: list[int], blocks: int, b: int) -> int:
        """Tokens ``a`` shares with ``cand`` from the start: the ``blocks`` whole blocks their
        keys say match (checked, as one C-level list comparison: a hash collision must not
        count), then token by token inside the next block, where they differ."""
        n = min(len(a), len(cand))
        known = min(blocks * b, n)
        if a[:known] != cand[:known]:  # a collision: compare from the start
            known = 0
        i = known
        while i < n and a[i] == cand[i]:
            i += 1
        return i

    def observe(self, ids: list[int]) -> int:
        keys = self._keys(ids)
        a = ids  # kept as given: the server never changes a request's ids
        best = 0
        with self._lock:
            cand, blocks = None, 0
            for key in keys:
                hit = self._index.get(key)
                if hit is None:
                    break
                cand, blocks = hit, blocks + 1
            if cand is not None:
                best = self._shared(a, cand, blocks, self.min_tokens)
            for key in keys:
                self._index[key] = a
            self._recent.append((a, keys))
            if len(self._recent) > self.max_prompts:
                old, old_keys = self._recent.pop(0)
                for key in old_keys:
                    if self._index.get(key) is old:
                        del self._index[key]
        return best if best >= self.min_tokens else 0

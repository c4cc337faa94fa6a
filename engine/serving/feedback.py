"""Feedback tied to served requests: one outcome per request the server routed.

A router that adapts online (``observe(outcomes)``, as ``modeswitch.routers.adaptive``) moves its
threshold by every outcome it is told. Taken as any list of booleans, a client with the
key could push it to either end at will (10,000 posts of ``[true]`` did). Here each
request routed by such a router is issued its own id (the response's ``id`` and the
``x-modeswitch-request-id`` header); ``POST /admin/feedback`` names those ids, and the
ledger takes at most one outcome per id, only within ``feedback_window_s`` of its
request, and only while the router that routed it is still the one serving. So the
tracker moves by at most one step per request served within the window: the served
rate bounds how fast anyone can steer it.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass


@dataclass
class _Issued:
    at: float
    router: object
    spent: bool = False


class Refused(Exception):
    """An outcome the ledger does not take: ``status`` (4xx) and ``reason``."""

    def __init__(self, status: int, reason: str):
        super().__init__(reason)
        self.status, self.reason = status, reason


class FeedbackLedger:
    """The ids issued to requests routed by an adapting router, and which have had their
    outcome. Entries are kept twice the window (so a late id is told it is late, not
    unknown) and at most ``capacity`` of them (the oldest go first)."""

    def __init__(self, window_s: float, capacity: int = 100_000, clock=time.monotonic):
        self.window_s, self.capacity, self.clock = window_s, capacity, clock
        self._ids: OrderedDict[str, _Issued] = OrderedDict()

    def issue(self, rid: str, router: object) -> None:
        """``rid`` was routed by ``router``: one outcome may come for it."""
        self._prune()
        self._ids[rid] = _Issued(self.clock(), router)
        while len(self._ids) > self.capacity:
            self._ids.popitem(last=False)

    def take(self, rids: list[str], router: object) -> None:
        """Mark every id in ``rids`` as having its outcome, for ``router`` (the one serving
        now), or none of them: :class:`Refused` names each id it does not take."""
        self._prune()
        now, seen, reasons, status = self.clock(), set(), [], None
        for rid in rids:
            why = self._refusal(rid, now, router, seen)
            seen.add(rid)
            if why is not None:
                status = status or why[0]
                reasons.append(f"{rid!r}: {why[1]}")
        if reasons:
            shown = "; ".join(reasons[:5]) + (f"; and {len(reasons) - 5} more" if len(reasons) > 5 else "")
            raise Refused(status, f"no outcome was taken: {shown}")
        for rid in rids:
            self._ids[rid].spent = True

    def _refusal(self, rid: str, now: float, router: object, seen: set) -> tuple[int, str] | None:
        entry = self._ids.get(rid)
        if entry is None:
            return 404, "not a request this server routed with an adapting router (or long forgotten)"
        if entry.spent or rid in seen:
            return 409, "its outcome was already taken (one per request)"
        if now - entry.at > self.window_s:
            return 410, f"served more than {self.window_s:g} s ago (the feedback window)"
        if entry.router is not router:
            return 409, "routed by a router that has since been replaced"
        return None

    def _prune(self) -> None:
        """Forget ids issued more than twice the window ago."""
        horizon = self.clock() - 2 * self.window_s
        while self._ids and next(iter(self._ids.values())).at < horizon:
            self._ids.popitem(last=False)

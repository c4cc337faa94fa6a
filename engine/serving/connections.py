"""Connection-level limits: slow or silent clients cannot hold the slots real requests need.

uvicorn bounds neither the time before a request's headers arrive nor the time its
body takes, and its ``limit_concurrency`` counts open sockets, so 300 connections
that never send a byte (or trickle header bytes) got every later request, ``/health``
included, a 503. This module is a small subclass of uvicorn's own h11 protocol,
passed to it as ``http=``, which adds:

* a **header-read timeout**: a connection must deliver a request's complete headers
  within ``header_timeout_s`` of opening, or of its previous response (trickled bytes
  do not extend it);
* a **body-read timeout**: once the headers are in, the whole body must arrive within
  ``body_timeout_s`` (the handler then sees the client gone and answers nothing);
* a **per-peer cap**: one address holds at most ``max_connections_per_peer``
  connections; a connection beyond it closes that address's oldest connection that
  has no request in progress (a silent one first), and is itself closed only when
  every other connection of that address is busy with a request;
* **admission by requests**: the 503 that protects the server counts requests being
  handled, never idle sockets.

Why a protocol subclass rather than an ASGI middleware or a documented front: a
middleware sees a connection only once its headers are complete, which is exactly
what a silent or trickling client never gets to, and a front (nginx, a load balancer)
is one more thing a user must set up before the server is safe to expose. The
subclass reuses uvicorn's parser and response path unchanged, and hooks only where
the connection's state changes (``handle_events``, ``on_response_complete``). Timed
out connections are closed without a response: before the headers there is no
request to answer, and mid-body the handler's response is already under way.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field

import h11
from modeswitch.engine.serving.config import ServerConfig
from uvicorn.protocols.http.flow_control import service_unavailable
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.utils import get_remote_addr

log = logging.getLogger("modeswitch.serve")

#: requests on top of ``max_in_flight`` that the server still takes in (``/health``,
#: ``/metrics`` and the 503s of the admission check itself)
PROBE_ROOM = 32


@dataclass
class ConnectionLimits:
    """One server's connection limits and what they have closed so far."""

    header_timeout_s: float
    body_timeout_s: float
    max_connections_per_peer: int
    #: requests handled at once (all endpoints) before uvicorn answers 503
    max_requests: int
    #: peer address -> its open connections, oldest first
    peers: dict[str, list[GuardedH11Protocol]] = field(default_factory=dict)
    #: closed connections by reason ("headers", "body", "peer_cap")
    closed: Counter = field(default_factory=Counter)

    @classmethod
    def of(cls, cfg: ServerConfig) -> ConnectionLimits:
        return cls(cfg.header_timeout_s, cfg.body_timeout_s, cfg.max_connections_per_peer,
                   cfg.max_in_flight + PROBE_ROOM)

    def protocol(self) -> type[GuardedH11Protocol]:
        """The protocol class to hand uvicorn (``http=``), bound to these limits."""
        return type("BoundGuardedH11Protocol", (GuardedH11Protocol,), {"limits": self})


def uvicorn_options(cfg: ServerConfig) -> dict:
    """Keyword arguments for ``uvicorn.run`` / ``uvicorn.Config`` that apply ``cfg``'s
    connection limits (idle keep-alive connections close after 5 s; headers over 64 KiB
    are refused by h11)."""
    return {"http": ConnectionLimits.of(cfg).protocol(), "timeout_keep_alive": 5,
            "h11_max_incomplete_event_size": 64 * 1024, "limit_concurrency": None}


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with the limits above (``limits`` is set by
    :meth:`ConnectionLimits.protocol`)."""

    limits: ConnectionLimits

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # uvicorn's own check counts sockets; ours counts requests (see _Admission)
        self.limit_concurrency = None
        self.app = _Admission(self.app, self.tasks, self.limits.max_requests)
        self._phase: str | None = None
        self._timer = None
        self._peer: str | None = None

    # ------------------------------------------------------------- lifecycle hooks
    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        remote = get_remote_addr(transport)
        self._peer = remote[0] if remote else "unknown"
        mine = self.limits.peers.setdefault(self._peer, [])
        mine.append(self)
        self._sync()
        if len(mine) > self.limits.max_connections_per_peer:
            victim = next((c for c in mine if c._phase == "headers" and c is not self), self)
            self.limits.closed["peer_cap"] += 1
            log.debug("peer %s over %d connections: closing one", self._peer, self.limits.max_connections_per_peer)
            victim._close()

    def connection_lost(self, exc) -> None:
        self._forget()
        super().connection_lost(exc)

    def handle_events(self) -> None:
        super().handle_events()
        self._sync()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._sync()

    # ------------------------------------------------------------------ the timers
    def _sync(self) -> None:
        """(Re)arm the timer of the phase the client is in: sending headers, sending a
        body, or neither (its request is being handled, or the connection is done)."""
        if self.transport is None or self.transport.is_closing():
            return
        state = self.conn.their_state
        phase = "headers" if state is h11.IDLE else "body" if state is h11.SEND_BODY else None
        if phase == self._phase:
            return
        self._phase = phase
        self._cancel_timer()
        if phase is not None:
            timeout = self.limits.header_timeout_s if phase == "headers" else self.limits.body_timeout_s
            self._timer = self.loop.call_later(timeout, self._expired, phase)

    def _expired(self, phase: str) -> None:
        self._timer = None
        if not self.transport.is_closing():
            self.limits.closed[phase] += 1
            log.debug("closing %s: its request %s did not arrive in time", self._peer, phase)
            self._close()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _close(self) -> None:
        self._forget()
        self.transport.close()

    def _forget(self) -> None:
        self._cancel_timer()
        self._phase = None
        mine = self.limits.peers.get(self._peer)
        if mine is not None and self in mine:
            mine.remove(self)
            if not mine:
                del self.limits.peers[self._peer]


class _Admission:
    """uvicorn's 503 for a request over ``limit``, counting requests being handled (the
    tasks uvicorn runs them in, this one included), not connections."""

    def __init__(self, app, tasks, limit: int):
        self.app, self.tasks, self.limit = app, tasks, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and len(self.tasks) > self.limit:
            log.warning("over %d requests at once: 503", self.limit)
            return await service_unavailable(scope, receive, send)
        return await self.app(scope, receive, send)

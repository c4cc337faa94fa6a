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
  handled, never idle sockets, and a request only once its body is complete: a
  connection still sending a body holds no request slot (300 of them, trickling their
  bodies from many addresses, took every slot and got everyone else, ``/health``
  included, a 503 until the body timeout);
* a **global cap on bodies in transit**: at most ``max_receiving_bodies`` connections
  may be sending a body at once; one more closes the connection that has been sending
  its body longest (a client sending nothing wrong delivers its body in one go, so it
  is the slow ones that go), as nginx bounds a body by ``client_body_timeout``.

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
from starlette.exceptions import HTTPException
from uvicorn.protocols.http.flow_control import service_unavailable
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.utils import get_remote_addr

from modeswitch.engine.serving.config import ServerConfig

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
    #: connections sending a request body at once; one more closes the longest sending
    max_receiving: int = 1024
    #: peer address -> its open connections, oldest first
    peers: dict[str, list[GuardedH11Protocol]] = field(default_factory=dict)
    #: connections sending a request body, longest sending first (a dict: ordered, O(1) removal)
    receiving: dict[GuardedH11Protocol, None] = field(default_factory=dict)
    #: closed connections by reason ("headers", "body", "peer_cap", "receiving_cap")
    closed: Counter = field(default_factory=Counter)

    @classmethod
    def of(cls, cfg: ServerConfig) -> ConnectionLimits:
        return cls(cfg.header_timeout_s, cfg.body_timeout_s, cfg.max_connections_per_peer,
                   cfg.max_in_flight + PROBE_ROOM, cfg.max_receiving_bodies)

    def busy(self, tasks) -> int:
        """Requests being handled whose body is complete: uvicorn's tasks less those whose
        connection is still sending the body (each such connection runs one task)."""
        return len(tasks) - sum(1 for c in self.receiving if c.handling())

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
        self.app = _Admission(self.app, self)
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

    def receiving_body(self) -> bool:
        """Whether the client is still sending its request's body."""
        return self._phase == "body"

    def handling(self) -> bool:
        """Whether a request of this connection is being handled (its response not done)."""
        return self.cycle is not None and not self.cycle.response_complete

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
        self._leave_phase()
        self._phase = phase
        if phase is not None:
            timeout = self.limits.header_timeout_s if phase == "headers" else self.limits.body_timeout_s
            self._timer = self.loop.call_later(timeout, self._expired, phase)
        if phase == "body":
            self._start_receiving()

    def _start_receiving(self) -> None:
        """Count this connection among those sending a body; over the cap, close the one
        that has been sending longest (never this one: it has only begun)."""
        receiving = self.limits.receiving
        receiving[self] = None
        if len(receiving) > self.limits.max_receiving:
            victim = next(c for c in receiving if c is not self)
            self.limits.closed["receiving_cap"] += 1
            log.debug("over %d bodies in transit: closing %s's", self.limits.max_receiving, victim._peer)
            victim._close()

    def _leave_phase(self) -> None:
        """Stop the current phase's timer and bookkeeping."""
        self._cancel_timer()
        self.limits.receiving.pop(self, None)

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
        self._leave_phase()
        self._phase = None
        mine = self.limits.peers.get(self._peer)
        if mine is not None and self in mine:
            mine.remove(self)
            if not mine:
                del self.limits.peers[self._peer]


class _Admission:
    """uvicorn's 503 for a request over ``limits.max_requests``, counting requests being
    handled (the tasks uvicorn runs them in, this one included), not connections, and
    only those whose body is complete: a request whose body is still arriving passes now
    and is checked when its last byte is read (``receive``), so slow bodies hold no slot."""

    def __init__(self, app, connection: GuardedH11Protocol):
        self.app, self.connection = app, connection

    def over(self) -> bool:
        limits = self.connection.limits
        if limits.busy(self.connection.tasks) <= limits.max_requests:
            return False
        log.warning("over %d requests at once: 503", limits.max_requests)
        return True

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if not self.connection.receiving_body():
            if self.over():
                return await service_unavailable(scope, receive, send)
            return await self.app(scope, receive, send)

        async def admitted():
            message = await receive()
            if message["type"] == "http.request" and not message.get("more_body", False) and self.over():
                raise _Busy(self.connection.limits.max_requests)  # FastAPI's body reader passes it on
            return message

        return await self.app(scope, admitted, send)


class _Busy(HTTPException):
    """Every request slot is taken when a body completes: 503 with Retry-After."""

    def __init__(self, limit: int):
        super().__init__(503, f"the server is at its limit of {limit} requests at once; retry shortly",
                         headers={"Retry-After": "1"})

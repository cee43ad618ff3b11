"""One lookupd as lmqd's registration sees it: a sans-IO state machine (nsqd's ``lookupPeer``).

Theory of operation
-------------------
A peer is WAITING (not connected; it wants a connection at ``connect_at``), CONNECTING (the I/O
task is dialling) or CONNECTED::

    WAITING --start_connect--> CONNECTING --connected--> CONNECTED
       ^                           |                         |
       +------connect_failed-------+-------disconnected------+

``connected`` queues the whole handshake at once, as nsqd's connect callback writes it: the
magic, IDENTIFY, then the node's registrations (``REGISTER t`` for a topic without channels,
``REGISTER t c`` for each channel otherwise). From then on every topic and channel event is one
more command (``send``), and a PING goes out every ``ping_interval`` (nsqd's 15 s ticker), so the
lookupd keeps the node active. Events while the peer is not connected are dropped: the next
connection registers the node's state as it is then, which is what they would have built.

Answers are matched to commands in order by ``LookupClientConnection``. The IDENTIFY answer is
kept as ``info`` (the lookupd's own address and ports). Any error answer (every V1 error is
fatal: the lookupd closes after it), a malformed answer, EOF, or a command left unanswered for
``response_timeout`` raises ``PeerFailed``; the I/O task closes the connection and reports
``disconnected``.

Reconnection (nsqd only redials on its next PING or event, 15-30 s after a loss): a peer waits
``backoff(failures)`` -- 1 s after the first failure, doubling to at most ``max_backoff`` (the
PING interval, so never slower than nsqd) -- and the count of failures is reset by a completed
IDENTIFY. No jitter: a lookupd serves few nodes, and a node's one reconnect per second at most
costs it nothing.

The I/O task (``lmqd.registration.service``) only moves bytes: it sleeps until
``next_deadline()`` or until it is woken because ``send`` queued bytes, calls ``timer(now)``,
writes ``data_to_send()``, and feeds what it reads to ``receive_data``. Time is always passed in
as ``now`` (``trio.current_time()``), so the schedule is tested on trio's autojump clock.
"""

from __future__ import annotations

import enum
import logging
import math
from collections import deque
from collections.abc import Iterable

from lmqd.lookup import (
    Command,
    ConnectionClosed,
    Error,
    Identify,
    IdentifyResponse,
    LookupClientConnection,
    LookupProtocolError,
    Ping,
)

__all__ = [
    "MAX_BACKOFF",
    "MIN_BACKOFF",
    "PING_INTERVAL",
    "RESPONSE_TIMEOUT",
    "LookupdPeer",
    "PeerFailed",
    "PeerStatus",
]

log = logging.getLogger("lmqd.registration")

PING_INTERVAL = 15.0
"""nsqd's lookup ticker (not configurable in nsqd); a lookupd hides a node it has not heard from
for ``--inactive-producer-timeout`` (300 s), twenty intervals."""

RESPONSE_TIMEOUT = 5.0
"""How long an answer may take before the connection is considered dead. nsqd allows 1 s per
read; lmqlookupd is a Python process that may share a busy machine, and a lookupd that answers
within 5 s is alive. A false alarm only costs a reconnect and a re-registration."""

MIN_BACKOFF = 1.0
"""Wait before the first reconnect: a lookupd restart is answered within a second."""

MAX_BACKOFF = PING_INTERVAL
"""Longest wait between connection attempts: nsqd redials at its next PING, every 15 s."""


class PeerStatus(enum.Enum):
    """Where a peer's connection is (see the module docstring's diagram)."""

    WAITING = "waiting"
    CONNECTING = "connecting"
    CONNECTED = "connected"


class PeerFailed(Exception):
    """The connection to the lookupd is unusable; the message says why."""


class LookupdPeer:
    """The registration state of one ``--lookupd-tcp-address``."""

    def __init__(
        self,
        address: str,
        *,
        ping_interval: float = PING_INTERVAL,
        response_timeout: float = RESPONSE_TIMEOUT,
        min_backoff: float = MIN_BACKOFF,
        max_backoff: float = MAX_BACKOFF,
    ) -> None:
        self.address = address
        self.ping_interval = ping_interval
        self.response_timeout = response_timeout
        self.min_backoff = min_backoff
        self.max_backoff = max_backoff
        self.status = PeerStatus.WAITING
        self.connect_at = -math.inf
        """When the next connection attempt is due (WAITING only); the first is at once."""
        self.failures = 0
        """Connection attempts and connections lost since the last completed IDENTIFY."""
        self.info: IdentifyResponse | None = None
        """The lookupd's answer to the last IDENTIFY (kept after a disconnect, as nsqd does)."""
        self.connections = 0
        """Connections that completed IDENTIFY, in this peer's life."""
        self._codec = LookupClientConnection()
        self._outgoing: list[bytes] = []
        self._sent_at: deque[float] = deque()
        """When each unanswered command was queued, oldest first."""
        self._ping_at = math.inf

    def __repr__(self) -> str:
        return f"<LookupdPeer {self.address} {self.status.value}>"

    # -- connection lifecycle --------------------------------------------------------------------

    def backoff(self) -> float:
        """Seconds to wait before the next attempt, given ``failures`` so far."""
        if self.failures <= 0:
            return 0.0
        return min(self.max_backoff, self.min_backoff * 2.0 ** min(self.failures - 1, 64))

    def start_connect(self, now: float) -> None:
        """The I/O task starts dialling (``connect_at`` has come)."""
        if self.status is not PeerStatus.WAITING:
            raise RuntimeError(f"{self!r}: start_connect while {self.status.value}")
        self.status = PeerStatus.CONNECTING

    def connect_failed(self, now: float, reason: str) -> None:
        """The dial failed: try again after the backoff."""
        self._lost(now)
        log.error("LOOKUPD(%s): cannot connect - %s; retrying in %.0fs",
                  self.address, reason, self.connect_at - now)

    def connected(self, now: float, identify: Identify, registrations: Iterable[Command]) -> None:
        """The socket is open: queue the magic, IDENTIFY and every registration."""
        if self.status is not PeerStatus.CONNECTING:
            raise RuntimeError(f"{self!r}: connected while {self.status.value}")
        self.status = PeerStatus.CONNECTED
        self._codec = LookupClientConnection()
        self._outgoing = [self._codec.initial_bytes()]
        self._sent_at.clear()
        self._queue(identify, now)
        count = 0
        for command in registrations:
            self._queue(command, now)
            count += 1
        self._ping_at = now + self.ping_interval
        log.info("LOOKUPD(%s): connected; identifying and registering %d topic/channel(s)",
                 self.address, count)

    def disconnected(self, now: float, reason: str) -> None:
        """The connection ended (``reason`` says why): reconnect after the backoff."""
        if self.status is PeerStatus.WAITING:
            return
        self._lost(now)
        log.warning("LOOKUPD(%s): connection lost - %s; reconnecting in %.0fs",
                    self.address, reason, self.connect_at - now)

    def close(self) -> None:
        """The node stops using this lookupd (shutdown, or its address was removed)."""
        connected = self.status is PeerStatus.CONNECTED
        self._lost(math.inf)
        if connected:
            log.info("LOOKUPD(%s): disconnected", self.address)

    def _lost(self, now: float) -> None:
        self.status = PeerStatus.WAITING
        self.failures += 1
        self.connect_at = now + self.backoff()
        self._outgoing.clear()
        self._sent_at.clear()
        self._ping_at = math.inf

    # -- commands --------------------------------------------------------------------------------

    def send(self, command: Command, now: float) -> bool:
        """Queue ``command`` if connected; False (dropped) otherwise, see the module docstring."""
        if self.status is not PeerStatus.CONNECTED:
            return False
        self._queue(command, now)
        return True

    def _queue(self, command: Command, now: float) -> None:
        self._outgoing.append(self._codec.send(command))
        self._sent_at.append(now)

    def data_to_send(self) -> bytes:
        """Everything queued since the last call (b"" if nothing)."""
        if not self._outgoing:
            return b""
        data = b"".join(self._outgoing)
        self._outgoing.clear()
        return data

    @property
    def pending(self) -> int:
        """Commands sent and not answered yet."""
        return len(self._sent_at)

    # -- time --------------------------------------------------------------------------------------

    def next_deadline(self) -> float:
        """When ``timer`` has something to do: connect, PING, or give up on an answer."""
        if self.status is PeerStatus.WAITING:
            return self.connect_at
        if self.status is PeerStatus.CONNECTING:
            return math.inf
        answer_due = self._sent_at[0] + self.response_timeout if self._sent_at else math.inf
        return min(self._ping_at, answer_due)

    def timer(self, now: float) -> None:
        """Send the PING if due; ``PeerFailed`` if an answer is overdue. Connected only."""
        if self.status is not PeerStatus.CONNECTED:
            return
        if self._sent_at and now >= self._sent_at[0] + self.response_timeout:
            raise PeerFailed(f"no answer within {self.response_timeout:g}s")
        if now >= self._ping_at:
            self._queue(Ping(), now)
            self._ping_at = now + self.ping_interval

    # -- answers -----------------------------------------------------------------------------------

    def receive_data(self, data: bytes, now: float) -> None:
        """Bytes from the lookupd (b"" at EOF); ``PeerFailed`` if the connection must end."""
        self._codec.receive_data(data)
        while True:
            try:
                event = self._codec.next_event()
            except LookupProtocolError as exc:
                raise PeerFailed(f"invalid answer ({exc})") from None
            if event is None:
                return
            if isinstance(event, ConnectionClosed):
                raise PeerFailed("closed by the lookupd")
            self._sent_at.popleft()
            if isinstance(event, Error):
                raise PeerFailed(f"error {event.code} {event.text}".rstrip())
            if isinstance(event, IdentifyResponse):
                self.info = event
                self.failures = 0
                self.connections += 1
                if not event.broadcast_address:
                    # nsqd logs the same: it could not query this lookupd's HTTP API.
                    log.error("LOOKUPD(%s): no broadcast_address in its IDENTIFY answer",
                              self.address)
                log.info("LOOKUPD(%s): peer info %s:%d (tcp %d, version %s)", self.address,
                         event.broadcast_address, event.http_port, event.tcp_port, event.version)

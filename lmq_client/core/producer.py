"""The producer, sans I/O: one core for the async and the blocking producers.

Theory of operation
-------------------
A producer publishes over one connection at a time. ``candidates()`` says which daemons to try,
in order, starting from the one that worked last (failover: the first that accepts a connection
is used); the driver connects and hands the handshake's result to ``connected``, which returns
the connection's ``Link``.

``publish`` queues a command and returns its ``Reply``. Any number may be in flight: the daemon
answers in order, so the link matches each answer to its command (pipelining). An ``OK`` means
the daemon stored the messages (with ``--durable``, fsynced). The core keeps the publishes in
flight in order and counts how each ended (``statistics``):

* **published**: answered ``OK``;
* **failed**: answered with an error, or sent after a command that failed fatally (the daemon
  stores nothing after a fatal error and closes);
* **in doubt**: the connection was lost before the answer came: the daemon may or may not have
  stored them, and publishing them again gives at-least-once delivery.

A publish that needs lmq's message extension is refused (``LmqClientError``) by a daemon that
did not accept it in IDENTIFY, before anything is sent. Plain ``def``, ``now`` passed in.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from lmq_client.core.link import Link, Reply
from lmq_client.core.options import ProducerOptions
from lmq_client.errors import ConnectionFailed, LmqClientError, NSQError
from lmq_client.extension import require_extension
from lmqd.protocol import FrameEvent

__all__ = ["ProducerCore", "ProducerStats"]


@attrs.frozen
class ProducerStats:
    """Messages by how their publish ended, since the producer was made."""

    published: int
    failed: int
    in_doubt: int
    in_flight: int


class ProducerCore:
    """Failover and the publishes in flight of one producer (see the module docstring)."""

    def __init__(self, addresses: Sequence[str], options: ProducerOptions) -> None:
        self.addresses = list(addresses)
        self.options = options
        self.link: Link | None = None
        self._next = 0
        self._in_flight: deque[tuple[Reply, int, Link]] = deque()
        self.published = self.failed = self.in_doubt = 0

    @property
    def connected_link(self) -> Link | None:
        """The link in use, if it is open."""
        link = self.link
        return link if link is not None and link.open else None

    def candidates(self) -> list[str]:
        """The addresses to try, in order, from the one that worked last."""
        n = len(self.addresses)
        return [self.addresses[(self._next + i) % n] for i in range(n)]

    def connected(self, address: str, settings: Mapping[str, Any], now: float) -> Link:
        """The handshake with ``address`` is done: publish through it from now on."""
        self._next = self.addresses.index(address)
        self.link = Link(address, heartbeat_interval=self.options.heartbeat_interval, now=now,
                         settings=settings)  # fmt: skip
        return self.link

    def publish(
        self, command: bytes, *, messages: int, extension: bool = False, reply: Reply | None = None
    ) -> Reply:
        """Queue ``command`` (publishing ``messages`` messages) on the link in use."""
        link = self.link
        if link is None or not link.open:
            raise link.not_open() if link is not None else ConnectionFailed(
                ", ".join(self.addresses), "not connected")  # fmt: skip
        if extension:
            require_extension(link.settings, link.address)
        reply = link.command(command, reply)
        self._in_flight.append((reply, messages, link))
        return reply

    def receive(self, link: Link, events: list[FrameEvent], now: float) -> None:
        """Decoded frames from ``link``'s connection."""
        link.receive(events, now)  # message frames are not a producer's business
        self._settle()

    def ended(self, link: Link, error: LmqClientError) -> None:
        """``link``'s connection ended: what waits for an answer on it fails."""
        link.lost(error)
        self._settle()

    def statistics(self) -> ProducerStats:
        return ProducerStats(
            published=self.published, failed=self.failed, in_doubt=self.in_doubt,
            in_flight=sum(n for _, n, _ in self._in_flight),
        )  # fmt: skip

    def _settle(self) -> None:
        in_flight = self._in_flight
        while in_flight and in_flight[0][0].done:
            reply, messages, link = in_flight.popleft()
            if reply.error is None:
                self.published += messages
            elif isinstance(reply.error, NSQError) or isinstance(link.error, NSQError):
                self.failed += messages
            else:
                self.in_doubt += messages

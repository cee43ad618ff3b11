"""The blocking Producer: ``ProducerCore`` driven by one blocking socket at a time.

It sends one command and waits for its answer, answering any heartbeat that arrives meanwhile
with NOP. Before each command it also handles whatever arrived while it was idle: heartbeats get
their NOP, and a connection the daemon closed (for instance after heartbeats went unanswered for
a long idle spell) is noticed there and replaced before anything is sent, so an idle producer
never loses a publish to a stale socket. Failover and the bookkeeping of answers are the core's
(``lmq_client.core.producer``).
"""

from __future__ import annotations

import functools
import logging
import struct
import time
from collections.abc import Sequence
from types import TracebackType
from typing import Any, Unpack

from lmq_client._util import address_list, check_name
from lmq_client.core.options import (
    ProducerOptions,
    ProducerSettings,
    dpub_delay_ms,
    from_settings,
)
from lmq_client.core.producer import ProducerCore, ProducerStats
from lmq_client.errors import ConnectionFailed, all_addresses_failed
from lmq_client.extension import Fields, publish_command
from lmq_client.sync.connection import SocketConnection
from lmqd.message_ext import ExtError
from lmqd.protocol.extension import XpubMessage, encode_xpub

__all__ = ["Producer"]

_COUNTED = struct.Struct(">II")
"""An MPUB's body size, then its message count."""

log = logging.getLogger("lmq_client.sync")


class Producer:
    """A blocking publisher to the daemon(s) at ``address``.

    Connects on first use. With several addresses it uses the first that accepts a connection
    and fails over to the next when connecting fails. A command that fails after it was sent is
    not retried here: the daemon may have stored it, and the caller decides (at-least-once).
    Raises ``NSQError`` subclasses (``.code``, e.g. ``E_MPUB_FAILED``) for the daemon's errors and
    ``ConnectionFailed`` (a ``ConnectionError`` naming the address) for network failures and
    answers that take longer than ``response_timeout``. Settings are
    ``lmq_client.core.ProducerOptions``'. Picklable (Spark ships it to executors): the socket
    is not part of its state.
    """

    def __init__(self, address: str | Sequence[str], **settings: Unpack[ProducerSettings]) -> None:
        self.options = from_settings(ProducerOptions, dict(settings))
        self.addresses = address_list(address)
        self._core = ProducerCore(self.addresses, self.options)
        self._conn: SocketConnection | None = None

    def __enter__(self) -> Producer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_conn"] = None
        state["_core"] = ProducerCore(self.addresses, self.options)
        return state

    @property
    def address(self) -> str | None:
        """The daemon connected to, if any."""
        conn = self._conn
        return conn.address if conn is not None and conn.is_open else None

    def statistics(self) -> ProducerStats:
        """Messages published, failed and in doubt (lost with a connection) so far."""
        return self._core.statistics()

    def connect(self) -> None:
        """Connect now (otherwise the first publish does)."""
        self._connection()

    def close(self) -> None:
        """Close the connection (the next publish would open a new one)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
            self._core.ended(conn.link, ConnectionFailed(conn.address, "closed"))

    def poll(self) -> None:
        """Handle what arrived since the last call without waiting: heartbeats get their NOP, a
        connection the daemon closed is let go (the next publish reconnects)."""
        conn = self._conn
        if conn is None:
            return
        try:
            self._core.receive(conn.link, conn.poll(), time.monotonic())
            conn.flush()
        except ConnectionFailed as exc:
            self._core.ended(conn.link, exc)
        if not conn.is_open:
            self.close()

    def publish(
        self,
        topic: str,
        body: bytes,
        *,
        dedup_id: str | bytes | None = None,
        **fields: Unpack[Fields],
    ) -> None:
        """PUB one message; returns when the daemon answered OK. With lmq's per-message fields
        (``headers``, ``priority`` 0-9, ``ttl`` in seconds, ``dedup_id``; ``lmq_client.extension``)
        it is an XPUB, which only lmqd takes."""
        check_name("topic", topic)
        ids = None if dedup_id is None else [dedup_id]
        command, ext = publish_command(topic, [body], single=True, dedup_ids=ids, **fields)
        self._command(command, 1, extension=ext)

    def mpub(
        self,
        topic: str,
        bodies: Sequence[bytes],
        *,
        dedup_ids: Sequence[str | bytes] | None = None,
        **fields: Unpack[Fields],
    ) -> None:
        """MPUB: several messages, stored atomically (all or none); lmq's fields apply to every
        message, ``dedup_ids`` gives each its own (an XPUB, as ``publish``)."""
        check_name("topic", topic)
        if not bodies:
            raise ValueError("mpub needs at least one message")
        command, ext = publish_command(topic, bodies, single=False, dedup_ids=dedup_ids, **fields)
        self._command(command, len(bodies), extension=ext)

    def dpub(
        self,
        topic: str,
        delay: float | None = None,
        body: bytes | None = None,
        *,
        delay_ms: int | None = None,
        dedup_id: str | bytes | None = None,
        **fields: Unpack[Fields],
    ) -> None:
        """DPUB: one message delivered ``delay`` seconds from now, as with the async Producer
        (lmq's fields as ``publish``). Milliseconds, the old unit here, work for this release
        with a ``DeprecationWarning``: ``delay_ms=``, or an ``int`` ``delay`` other than 0 (it
        is read as milliseconds until the next release: pass seconds as a float)."""
        check_name("topic", topic)
        if body is None:
            raise TypeError("dpub() needs the message body")
        defer_ms = dpub_delay_ms(delay, delay_ms=delay_ms, int_is_ms=True)
        ids = None if dedup_id is None else [dedup_id]
        command, ext = publish_command(
            topic, [body], single=True, defer_ms=defer_ms, dedup_ids=ids, **fields
        )
        self._command(command, 1, extension=ext)

    def xpub(
        self, topic: str, messages: Sequence[XpubMessage], *, defer_ms: int | None = None
    ) -> None:
        """XPUB: several messages, each with its own extension (headers, priority, TTL, dedup
        id), stored atomically, deferred by ``defer_ms`` if given; only lmqd takes it. For
        callers whose messages differ in more than their dedup ids (the Spark sink's columns).
        ``ValueError`` for an extension out of bounds."""
        check_name("topic", topic)
        if not messages:
            raise ValueError("xpub needs at least one message")
        try:
            command = encode_xpub(topic, list(messages), defer_ms)
        except ExtError as exc:
            raise ValueError(str(exc)) from None
        self._command(command, len(messages), extension=True)

    def publish_items(
        self,
        topic: str,
        count: int,
        items: Sequence[bytes | memoryview],
        *,
        extension: bool = False,
    ) -> None:
        """MPUB (with ``extension``, lmq's XPUB) of ``count`` messages the caller encoded: the
        body after its message count, in parts, as docs/protocol.md lays it out (each message's
        4-byte size and body; XPUB: its 2-byte extension length and block first). For callers
        that encode messages in bulk (the Spark sink builds them from Arrow buffers); the daemon
        checks them as any MPUB or XPUB, and answers ``E_BAD_BODY`` if they do not add up."""
        check_name("topic", topic)
        if count < 1:
            raise ValueError("publish_items needs at least one message")
        size = 4 + sum(map(len, items))
        verb = b"XPUB" if extension else b"MPUB"
        line = b"%s %s\n%s" % (verb, topic.encode(), _COUNTED.pack(size, count))
        self._command(b"".join([line, *items]), count, extension=extension)

    def _connection(self) -> SocketConnection:
        self.poll()
        if self._conn is not None:
            return self._conn
        core = self._core
        failures: list[ConnectionFailed] = []
        for address in core.candidates():
            try:
                conn = SocketConnection(
                    address, connect_timeout=self.options.connect_timeout,
                    heartbeat_interval=self.options.heartbeat_interval,
                    transport=self.options.transport,
                    make_link=functools.partial(core.connected, address),
                )  # fmt: skip
            except ConnectionFailed as exc:
                log.info("producer: %s", exc)
                failures.append(exc)
                continue
            self._conn = conn
            return conn
        raise all_addresses_failed(failures)

    def _command(self, data: bytes, messages: int, *, extension: bool = False) -> bytes:
        conn = self._connection()
        core = self._core
        reply = core.publish(data, messages=messages, extension=extension)
        timeout = self.options.response_timeout
        try:
            conn.flush()
            deadline = time.monotonic() + timeout
            while not reply.done:
                events = conn.receive(max(0.0, deadline - time.monotonic()))
                if events is None:
                    raise ConnectionFailed(conn.address, f"no answer within {timeout:g}s (timeout)")
                core.receive(conn.link, events, time.monotonic())
                conn.flush()
        except ConnectionFailed as exc:
            core.ended(conn.link, exc)
        if not conn.is_open:
            self.close()
        return reply.result()

"""The async Producer: a thin anyio driver (asyncio and trio) around ``ProducerCore``.

Any number of tasks may publish at once through one Producer: their commands go out on one
connection back to back (written in one send when they arrive together) and each task is woken by
its own answer, which the daemon sends in order. When the connection is lost, the publishes
waiting for an answer fail with ``ConnectionFailed`` (the daemon may or may not have stored
them) and the next publish connects again, trying the addresses in order from the one that worked
last (failover, as when one of several daemons is down). Those rules live in the sans-IO core
(``lmq_client.core.producer``); this module connects, and waits.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from types import TracebackType
from typing import Any, Unpack

import anyio
from anyio.abc import TaskGroup, TaskStatus

from lmq_client._tasks import owned_task_group
from lmq_client._util import address_list, check_name
from lmq_client.connection import (
    Connection,
    OneShotEvent,
    Reply,
    StreamOpener,
    event_type,
    open_tcp_stream,
)
from lmq_client.core.link import Link
from lmq_client.core.options import (
    ProducerOptions,
    ProducerSettings,
    dpub_delay_ms,
    from_settings,
)
from lmq_client.core.producer import ProducerCore, ProducerStats
from lmq_client.errors import ConnectionFailed, LmqClientError, all_addresses_failed
from lmq_client.extension import Fields, publish_command
from lmqd.protocol import FrameEvent

__all__ = ["Producer"]

log = logging.getLogger("lmq_client.producer")


class Producer:
    """Publishes to the daemon(s) at ``address``; use as ``async with Producer(...) as p:``.

    Settings are ``lmq_client.core.ProducerOptions``' (``connect_timeout``,
    ``heartbeat_interval``, ``transport``); ``identify`` adds IDENTIFY keys. Errors from the
    daemon are raised as ``lmq_client.errors.NSQError`` subclasses carrying the NSQ ``code``; a
    daemon that cannot be reached raises ``ConnectionFailed``.
    """

    def __init__(
        self,
        address: str | Sequence[str],
        *,
        identify: dict[str, Any] | None = None,
        open_stream: StreamOpener = open_tcp_stream,
        **settings: Unpack[ProducerSettings],
    ) -> None:
        self.options = from_settings(ProducerOptions, dict(settings))
        self.addresses = address_list(address)
        self._core = ProducerCore(self.addresses, self.options)
        self._identify = identify
        self._open_stream = open_stream
        self._conn: Connection | None = None
        self._connect_lock: anyio.Lock | None = None
        self._tasks: TaskGroup | None = None
        self._session: contextlib.AbstractAsyncContextManager[Producer] | None = None
        self._closed = False
        self._event_type: Callable[[], OneShotEvent] = anyio.Event

    # -- lifecycle -------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _run(self) -> AsyncIterator[Producer]:
        async with owned_task_group() as tasks:
            self._tasks = tasks
            self._event_type = event_type()
            try:
                await self.connect()
                yield self
            finally:
                self._tasks = None
                await self.aclose()

    async def __aenter__(self) -> Producer:
        if self._session is not None:
            raise RuntimeError("a Producer is entered once")
        self._session = self._run()
        return await self._session.__aenter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._session is not None
        await self._session.__aexit__(exc_type, exc, tb)

    async def aclose(self) -> None:
        """Close the connection; publishes still waiting for an answer fail."""
        self._closed = True
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.aclose()

    @property
    def address(self) -> str | None:
        """The address of the daemon currently connected, if any."""
        link = self._core.connected_link
        return link.address if link is not None else None

    def statistics(self) -> ProducerStats:
        """Messages published, failed and in doubt (lost with a connection) so far."""
        return self._core.statistics()

    async def connect(self) -> Connection:
        """The open connection, connecting first if needed (tasks share one attempt)."""
        conn = self._conn
        if conn is not None and conn.is_open:
            return conn
        if self._closed:
            raise LmqClientError("producer is closed")
        if self._tasks is None:
            raise LmqClientError("use the Producer as `async with Producer(...)`")
        if self._connect_lock is None:
            self._connect_lock = anyio.Lock()
        async with self._connect_lock:
            conn = self._conn
            if conn is not None and conn.is_open:
                return conn
            failures = []
            for address in self._core.candidates():
                conn = self._connection(address)
                try:
                    await self._tasks.start(self._serve, conn)
                except ConnectionFailed as exc:
                    failures.append(exc)
                    log.info("producer: %s", exc)
                    continue
                self._conn = conn
                return conn
            raise all_addresses_failed(failures)

    def _connection(self, address: str) -> Connection:
        core = self._core

        def receive(link: Link, events: list[FrameEvent], now: float) -> None:
            core.receive(link, events, now)

        return Connection(
            address, heartbeat_interval=self.options.heartbeat_interval,
            connect_timeout=self.options.connect_timeout, identify=self._identify,
            open_stream=self._open_stream, transport=self.options.transport,
            make_link=lambda settings, now: core.connected(address, settings, now),
            receive=receive, receive_in_callback=True,
        )  # fmt: skip

    async def _serve(
        self, conn: Connection, *, task_status: TaskStatus[Connection]
    ) -> None:
        try:
            await conn.run(task_status=task_status)
        finally:
            if conn.link is not None:
                self._core.ended(conn.link, conn.error or ConnectionFailed(conn.address, "closed"))

    # -- publishing ------------------------------------------------------------------------------

    async def publish(
        self,
        topic: str,
        body: bytes,
        *,
        dedup_id: str | bytes | None = None,
        **fields: Unpack[Fields],
    ) -> None:
        """PUB one message; returns once the daemon answered ``OK``. With lmq's per-message
        fields (``headers``, ``priority`` 0-9, ``ttl`` in seconds, ``dedup_id``;
        ``lmq_client.extension``) it is an XPUB, which only lmqd takes."""
        check_name("topic", topic)
        ids = None if dedup_id is None else [dedup_id]
        command, ext = publish_command(topic, [body], single=True, dedup_ids=ids, **fields)
        await self._send(command, 1, extension=ext)

    async def mpub(
        self,
        topic: str,
        bodies: Sequence[bytes],
        *,
        dedup_ids: Sequence[str | bytes] | None = None,
        **fields: Unpack[Fields],
    ) -> None:
        """MPUB: publish several messages atomically (all stored, or none); lmq's fields apply
        to every message, ``dedup_ids`` gives each its own (an XPUB, as ``publish``)."""
        check_name("topic", topic)
        if not bodies:
            raise ValueError("mpub needs at least one message")
        command, ext = publish_command(topic, bodies, single=False, dedup_ids=dedup_ids, **fields)
        await self._send(command, len(bodies), extension=ext)

    async def dpub(
        self,
        topic: str,
        delay: float,
        body: bytes,
        *,
        dedup_id: str | bytes | None = None,
        **fields: Unpack[Fields],
    ) -> None:
        """DPUB: publish one message that is delivered ``delay`` seconds from now (lmq's fields
        as ``publish``)."""
        check_name("topic", topic)
        ids = None if dedup_id is None else [dedup_id]
        command, ext = publish_command(
            topic, [body], single=True, defer_ms=dpub_delay_ms(delay), dedup_ids=ids, **fields
        )
        await self._send(command, 1, extension=ext)

    async def _send(self, command: bytes, messages: int, *, extension: bool = False) -> None:
        conn = self._conn
        if conn is None or not conn.is_open:
            conn = await self.connect()
        reply = Reply(self._event_type())
        conn.quiet = True  # queued quietly: sent from this task by send_now
        try:
            self._core.publish(command, messages=messages, extension=extension, reply=reply)
        except ConnectionFailed:
            # Lost between connect() and now: nothing was sent, so one retry is safe.
            conn.quiet = False
            conn = await self.connect()
            conn.quiet = True
            self._core.publish(command, messages=messages, extension=extension, reply=reply)
        finally:
            conn.quiet = False
        await conn.send_now()
        await reply.wait()

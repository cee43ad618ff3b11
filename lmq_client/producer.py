"""The async Producer: PUB, MPUB and DPUB over one pipelined connection, reconnecting on demand.

It runs under asyncio and trio alike (anyio, as ``lmq_client.connection``).

Any number of tasks may publish at once through one Producer: their commands go out on one
connection back to back (written in one send when they arrive together) and each task is woken by
its own answer, which the daemon sends in order. When the connection is lost, the publishes
waiting for an answer fail with ``ConnectionFailed`` (the daemon may or may not have stored
them) and the next publish connects again, trying the addresses in order from the one that worked
last (failover, as when one of several daemons is down).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from types import TracebackType
from typing import Any, Unpack

import anyio
from anyio.abc import TaskGroup

from lmq_client._util import address_list, check_name
from lmq_client.connection import Connection, StreamOpener, open_tcp_stream
from lmq_client.errors import ConnectionFailed, LmqClientError, all_addresses_failed
from lmq_client.extension import Fields, publish_command, require_extension
from lmq_client.transport import PLAIN, TransportOptions

__all__ = ["Producer"]

log = logging.getLogger("lmq_client.producer")


class Producer:
    """Publishes to the daemon(s) at ``address``; use as ``async with Producer(...) as p:``.

    Errors from the daemon are raised as ``lmq_client.errors.NSQError`` subclasses carrying the
    NSQ ``code``; a daemon that cannot be reached raises ``ConnectionFailed``. ``transport``
    asks for TLS and compression and carries the AUTH secret.
    """

    def __init__(
        self,
        address: str | Sequence[str],
        *,
        heartbeat_interval: float = 30.0,
        connect_timeout: float = 5.0,
        identify: dict[str, Any] | None = None,
        open_stream: StreamOpener = open_tcp_stream,
        transport: TransportOptions = PLAIN,
    ) -> None:
        self.addresses = address_list(address)
        self.transport = transport
        self.heartbeat_interval = heartbeat_interval
        self.connect_timeout = connect_timeout
        self._identify = identify
        self._open_stream = open_stream
        self._conn: Connection | None = None
        self._next = 0
        self._connect_lock = anyio.Lock()
        self._tasks: TaskGroup | None = None
        self._tasks_cm: Any = None
        self._closed = False

    # -- lifecycle -------------------------------------------------------------------------------

    async def __aenter__(self) -> Producer:
        self._tasks_cm = anyio.create_task_group()
        self._tasks = await self._tasks_cm.__aenter__()
        try:
            await self.connect()
        except BaseException:
            await self._exit_tasks()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            await self.aclose()
        finally:
            await self._exit_tasks()

    async def _exit_tasks(self) -> None:
        # The task group only holds the connection's tasks: cancel them and leave it without the
        # body's exception, so that exception reaches the caller as it is (not in a group).
        cm, tasks, self._tasks_cm, self._tasks = self._tasks_cm, self._tasks, None, None
        if cm is not None and tasks is not None:
            tasks.cancel_scope.cancel()
            await cm.__aexit__(None, None, None)

    async def aclose(self) -> None:
        """Close the connection; publishes still waiting for an answer fail."""
        self._closed = True
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.aclose()

    @property
    def address(self) -> str | None:
        """The address of the daemon currently connected, if any."""
        conn = self._conn
        return conn.address if conn is not None and conn.is_open else None

    async def connect(self) -> Connection:
        """The open connection, connecting first if needed (tasks share one attempt)."""
        conn = self._conn
        if conn is not None and conn.is_open:
            return conn
        if self._closed:
            raise LmqClientError("producer is closed")
        if self._tasks is None:
            raise LmqClientError("use the Producer as `async with Producer(...)`")
        async with self._connect_lock:
            conn = self._conn
            if conn is not None and conn.is_open:
                return conn
            failures = []
            for i in range(len(self.addresses)):
                index = (self._next + i) % len(self.addresses)
                address = self.addresses[index]
                conn = Connection(
                    address,
                    heartbeat_interval=self.heartbeat_interval,
                    connect_timeout=self.connect_timeout,
                    identify=self._identify,
                    open_stream=self._open_stream,
                    transport=self.transport,
                )
                try:
                    await self._tasks.start(conn.run)
                except ConnectionFailed as exc:
                    failures.append(exc)
                    log.info("producer: %s", exc)
                    continue
                self._next = index
                self._conn = conn
                return conn
            raise all_addresses_failed(failures)

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
        await self._send(command, extension=ext)

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
        await self._send(command, extension=ext)

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
            topic, [body], single=True, defer_ms=round(delay * 1000), dedup_ids=ids, **fields
        )
        await self._send(command, extension=ext)

    async def _send(self, command: bytes, *, extension: bool = False) -> None:
        conn = await self.connect()
        if extension:
            require_extension(conn.server_settings, conn.address)
        try:
            reply = conn.command(command)
        except ConnectionFailed:
            # Lost between connect() and now: nothing was sent, so one retry is safe.
            conn = await self.connect()
            reply = conn.command(command)
        await reply.wait()

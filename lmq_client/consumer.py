"""The async Consumer: a thin anyio driver (asyncio and trio) around ``ConsumerCore``.

Every decision (which daemons, RDY, backoff, max attempts, redials, lookupd polls, close) is
the sans-IO core's (``lmq_client.core.consumer``); this module runs its actions and waits:

* one task per connection (``Connection``: handshake, then a reader that hands each read's
  frames to the core, and a writer that sends what the core queued on the link);
* one timer task that sleeps until the core's ``deadline`` and runs ``timers(now)``;
* one task per lookupd round (the queries are blocking HTTP: a worker thread each);
* with a ``handler``, ``concurrency`` workers that take messages and answer them.

``async with Consumer(...)`` (or ``await task_group.start(consumer.run)``) owns its task group:
it returns once every daemon was tried once, and leaving it closes the consumer (``close()``:
CLS, what was not handed out is requeued, handlers get ``close_timeout`` to answer, then the
connections close); when the body raises, the consumer closes at once.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import math
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from types import TracebackType
from typing import Any, Unpack

import anyio
import anyio.to_thread
from anyio.abc import TaskGroup, TaskStatus

from lmq_client._front import ConsumerFront
from lmq_client._tasks import owned_task_group
from lmq_client.connection import Connection, StreamOpener, open_tcp_stream
from lmq_client.core.consumer import ConsumerCore, ConsumerLink
from lmq_client.core.options import ConsumerSettings
from lmq_client.core.schedule import Connect, Disconnect
from lmq_client.errors import ConnectionFailed, LmqClientError, NSQError
from lmq_client.lookupd import lookup_producers
from lmq_client.message import Message
from lmq_client.stats import ConsumerStats

__all__ = ["Consumer", "ConsumerStats", "LookupdQuery"]

log = logging.getLogger("lmq_client.consumer")

Handler = Callable[[Message], Awaitable[None]]
GiveUpHook = Callable[[Message], Awaitable[None] | None]
LookupdQuery = Callable[[str, str], Awaitable[list[str]]]
"""``query(lookupd_address, topic)`` -> the TCP addresses of the topic's producers; raises
``LmqClientError`` when that lookupd cannot answer."""


async def _threaded_lookup(lookupd: str, topic: str, *, request_timeout: float) -> list[str]:
    # urllib blocks: a worker thread per query, once a minute per consumer. Abandoned if the
    # consumer closes meanwhile (the thread then ends within ``request_timeout`` on its own).
    return await anyio.to_thread.run_sync(
        functools.partial(lookup_producers, lookupd, topic, timeout=request_timeout),
        abandon_on_cancel=True,
    )


class Consumer(ConsumerFront):
    """Consume ``topic``/``channel`` from the daemon(s) at ``address`` and/or the daemons that
    the lookupds at ``lookupd_http_addresses`` list for the topic (``host:port`` or URLs;
    ``lookupd_query`` replaces the HTTP query itself, e.g. with a scripted lookupd in tests).

    Either pass ``handler`` (an async function: returning finishes the message, raising requeues
    it with backoff; ``concurrency`` handlers run at once, default ``max_in_flight``) or iterate
    with ``async for message in consumer`` and answer each message yourself. Settings are
    ``lmq_client.core.ConsumerOptions``' (``max_in_flight``, ``max_attempts``, ``backoff``...).
    """

    def __init__(
        self,
        topic: str,
        channel: str,
        address: str | Sequence[str] = (),
        *,
        lookupd_http_addresses: str | Sequence[str] = (),
        handler: Handler | None = None,
        concurrency: int | None = None,
        on_give_up: GiveUpHook | None = None,
        lookupd_query: LookupdQuery | None = None,
        open_stream: StreamOpener = open_tcp_stream,
        rng: random.Random | None = None,
        **settings: Unpack[ConsumerSettings],
    ) -> None:
        super().__init__(topic, channel, address, lookupd_http_addresses, dict(settings))
        self.handler = handler
        self.concurrency = concurrency or self.options.max_in_flight
        self.on_give_up = on_give_up
        self._lookupd_query = lookupd_query or functools.partial(
            _threaded_lookup, request_timeout=self.options.lookupd_timeout
        )
        self._open_stream = open_stream
        self._rng = rng or random.Random()
        self._tasks: TaskGroup | None = None
        self._session: contextlib.AbstractAsyncContextManager[Consumer] | None = None
        self._scopes: dict[str, anyio.CancelScope] = {}
        self._connections: dict[str, Connection] = {}
        self._changed = anyio.Event()
        """Set (and replaced) whenever the core may have something new for a waiter."""
        self._timers_changed = anyio.Event()
        self._sleeping_until = -math.inf
        """The deadline the timer task sleeps until (it is woken for an earlier one)."""
        self._stopped = anyio.Event()

    @property
    def core(self) -> ConsumerCore:
        if self._core is None:
            raise RuntimeError("the consumer is not running: use `async with Consumer(...)`")
        return self._core

    async def wait_connections(self, count: int) -> None:
        """Wait until the consumer is subscribed on exactly ``count`` daemons."""
        while len(self.connected_addresses) != count:
            await self._changed.wait()

    # -- lifecycle -------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _run(self) -> AsyncIterator[Consumer]:
        async with owned_task_group() as tasks:
            try:
                self._start(tasks)
                while not self.core.started:
                    await self._changed.wait()
                yield self
                await self._drain()  # not when the body raised: the daemons redeliver
            finally:
                self._stop()

    async def __aenter__(self) -> Consumer:
        if self._session is not None:
            raise RuntimeError("a Consumer runs once")
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

    async def run(self, *, task_status: TaskStatus[Consumer] = anyio.TASK_STATUS_IGNORED) -> None:
        """Consume until ``close()``; started once every daemon was tried once."""
        async with self:
            task_status.started(self)
            await self._stopped.wait()

    async def close(self) -> None:
        """Stop consuming; let handlers answer what they hold (up to ``close_timeout``).

        Don't call it from a handler (it would wait for that handler's own message).
        """
        if self._tasks is None:
            return
        await self._drain()
        self._stop()

    async def _drain(self) -> None:
        core = self.core
        core.close(anyio.current_time())
        self._after()
        while not core.drained:
            await self._changed.wait()
        # The answers and CLS written meanwhile go out before the connections close.
        for conn in list(self._connections.values()):
            await conn.flush()

    def _stop(self) -> None:
        tasks, self._tasks = self._tasks, None
        if tasks is not None:
            tasks.cancel_scope.cancel()
        self._stopped.set()
        self._wake()

    def _start(self, tasks: TaskGroup) -> None:
        if self._core is not None:
            raise RuntimeError("a Consumer runs once")
        self._tasks = tasks
        now = anyio.current_time()
        core = self._new_core(self._rng, anyio.current_time, now)
        core.notify = self._notified
        core.start(now)
        tasks.start_soon(self._timers)
        if self.handler is not None:
            for _ in range(self.concurrency):
                tasks.start_soon(self._worker, self.handler)
        self._after()

    # -- driving the core ------------------------------------------------------------------------

    def _after(self) -> None:
        """Carry out what the core decided, and wake whoever waits on it."""
        core = self.core
        tasks = self._tasks
        for action in core.take_actions():
            if isinstance(action, Connect):
                if tasks is not None:
                    scope = self._scopes[action.address] = anyio.CancelScope()
                    tasks.start_soon(self._connection, action.address, scope)
            elif isinstance(action, Disconnect):
                dropped = self._scopes.pop(action.address, None)
                if dropped is not None:
                    dropped.cancel()
            elif tasks is not None:
                tasks.start_soon(self._query_lookupds)
        if core.deadline < self._sleeping_until:
            self._timers_changed.set()
        self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    def _notified(self) -> None:
        self._timers_changed.set()
        self._wake()

    async def _timers(self) -> None:
        core = self.core
        while True:
            self._sleeping_until = core.deadline
            with anyio.CancelScope(deadline=self._sleeping_until):
                await self._timers_changed.wait()
            self._timers_changed = anyio.Event()
            self._sleeping_until = -math.inf
            now = anyio.current_time()
            if now >= core.deadline:
                core.timers(now)
                self._after()

    async def _connection(self, address: str, scope: anyio.CancelScope) -> None:
        core = self.core
        conn = Connection(
            address, heartbeat_interval=self.options.heartbeat_interval,
            connect_timeout=self.options.connect_timeout, identify=self._identify,
            open_stream=self._open_stream, transport=self.options.transport,
            make_link=lambda settings, now: core.connected(address, settings, now),
            receive=self._receive,
        )  # fmt: skip
        self._connections[address] = conn
        try:
            with scope:
                try:
                    await conn.run()
                except (ConnectionFailed, NSQError) as exc:
                    log.warning("consumer %s/%s: %s", self.topic, self.channel, exc)
        finally:
            if self._scopes.get(address) is scope:
                del self._scopes[address]
            if self._connections.get(address) is conn:
                del self._connections[address]
            now = anyio.current_time()
            link = conn.link
            if link is None:
                core.connect_failed(address, now)
            else:
                assert isinstance(link, ConsumerLink)
                core.ended(link, now, link.error)
            self._after()

    def _receive(self, link: ConsumerLink, events: list[Any], now: float) -> None:
        self.core.receive(link, events, now)
        self._after()

    async def _query_lookupds(self) -> None:
        """One round: the union of what every lookupd that answered lists (None if none)."""
        found: set[str] | None = None
        for lookupd in self.lookupd_addresses:
            try:
                producers = await self._lookupd_query(lookupd, self.topic)
            except LmqClientError as exc:
                log.warning("consumer %s/%s: lookupd %s: %s", self.topic, self.channel,
                            lookupd, exc)  # fmt: skip
                continue
            found = (found or set()) | set(producers)
        self.core.answered(anyio.current_time(), found)
        self._after()

    # -- messages --------------------------------------------------------------------------------

    def __aiter__(self) -> Consumer:
        return self

    async def __anext__(self) -> Message:
        message = await self._get()
        if message is None:
            raise StopAsyncIteration
        return message

    async def _get(self) -> Message | None:
        """The next message to handle; None once the consumer closes."""
        core = self.core
        while True:
            item = core.next_message()
            if item is None:
                if core.closing:
                    return None
                await self._changed.wait()
                continue
            message, give_up = item
            if not give_up:
                return message
            if self.on_give_up is not None:
                try:
                    result = self.on_give_up(message)
                    if inspect.isawaitable(result):
                        await result
                except Exception:
                    log.exception("consumer %s/%s: give-up hook failed", self.topic, self.channel)
            core.gave_up(message)

    async def _worker(self, handler: Handler) -> None:
        while (message := await self._get()) is not None:
            try:
                await handler(message)
            except Exception:
                self._handled(message, failed=True)
            else:
                self._handled(message, failed=False)

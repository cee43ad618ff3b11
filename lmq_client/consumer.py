"""The async Consumer: one topic/channel, from one or several daemons, listed or discovered.

It runs under asyncio and trio alike: every wait, task and timer goes through anyio (task groups,
events, cancel scopes, ``anyio.current_time``), as in ``lmq_client.connection``.

Theory of operation
-------------------
One supervisor task per daemon address given connects, IDENTIFYs, SUBs, and after a loss
reconnects with exponential backoff and jitter. With lookupd addresses, a discovery task asks
the lookupds which daemons have the topic, on go-nsq's schedule (at once, then every
``lookupd_poll_interval`` after a random ``lookupd_poll_jitter`` share of it), and opens one
connection to each new one; the rules of ``lmq_client.lookupd.Discovery`` decide when a
discovered daemon is dropped (no longer listed) and when one whose connection ended is
connected again (only if the lookupds still list it, after its reconnect backoff).

Message frames arrive in batches from the connections' readers (``_on_messages``, a plain
function) and go into one local queue; handler workers (or ``async for``) take them from it.
Answers (``Message.finish``/``requeue``/``touch``) are plain calls that queue the command on
the message's connection.

Flow control is RDY, which nsqd treats as a window (it sends while ``in_flight < rdy``), so the
consumer only decides one number per connection and sends it when it changes: ``max_in_flight``
split evenly over the live connections, or, with fewer slots than connections, ``RDY 1`` on a
rotating subset (``lmq_client.rdy``).

Backoff follows go-nsq. A failure (handler raised, or ``requeue()`` with backoff) raises the
backoff level and stops the flow: ``RDY 0`` everywhere for ``backoff.delay(level)`` seconds. Then
one connection gets ``RDY 1`` (a probe). A success at a positive level lowers it by one: at level
0 the normal RDY comes back, otherwise another (shorter) backoff follows; a failure raises it and
backs off longer. Outcomes that arrive while the backoff timer runs (messages already in flight
when it started) are not counted, so one burst of failures counts once.

A message delivered more than ``max_attempts`` times is not handed to the handler: the give-up
hook sees it and it is finished (max-attempts is client-side in NSQ).

``close()`` sends CLS (the daemon stops delivering), requeues what is still queued locally,
waits up to ``close_timeout`` for handlers to answer the messages they hold, then disconnects.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import math
import random
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from types import TracebackType
from typing import Any

import anyio
import anyio.to_thread
from anyio.abc import TaskGroup, TaskStatus

from lmq_client._util import address_list, check_name
from lmq_client.backoff import Backoff, BackoffState
from lmq_client.connection import Connection, StreamOpener, open_tcp_stream
from lmq_client.errors import ConnectionFailed, LmqClientError, NSQError
from lmq_client.lookupd import (
    DEFAULT_POLL_INTERVAL,
    DEFAULT_POLL_JITTER,
    DEFAULT_TIMEOUT,
    Discovery,
    check_schedule,
    lookup_producers,
    lookupd_addresses,
)
from lmq_client.message import Message
from lmq_client.rdy import choose_active, rdy_targets
from lmq_client.stats import ConsumerStats
from lmq_client.transport import PLAIN, TransportOptions
from lmqd.protocol import Cls, MessageFrame, Rdy, Sub

__all__ = ["Consumer", "ConsumerStats", "LookupdQuery"]

log = logging.getLogger("lmq_client.consumer")

Handler = Callable[[Message], Awaitable[None]]
GiveUpHook = Callable[[Message], Awaitable[None] | None]
LookupdQuery = Callable[[str, str], Awaitable[list[str]]]
"""``query(lookupd_address, topic)`` -> the TCP addresses of the topic's producers; raises
``LmqClientError`` when that lookupd cannot answer."""

# The first round of connection attempts includes the first lookupd query.
_LOOKUPD_ROUND = "<lookupd>"


async def _threaded_lookup(lookupd: str, topic: str, *, request_timeout: float) -> list[str]:
    # urllib blocks: a worker thread per query, once a minute per consumer. Abandoned if the
    # consumer closes meanwhile (the thread then ends within ``request_timeout`` on its own).
    return await anyio.to_thread.run_sync(
        functools.partial(lookup_producers, lookupd, topic, timeout=request_timeout),
        abandon_on_cancel=True,
    )


class _ConnState:
    __slots__ = ("conn", "got_message", "in_flight", "rdy")

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.rdy = 0
        self.in_flight = 0
        self.got_message = False


class _Closed(Exception):
    pass


class Consumer:
    """Consume ``topic``/``channel`` from the daemon(s) at ``address`` and/or the daemons that
    the lookupds at ``lookupd_http_addresses`` list for the topic (``host:port`` or URLs;
    ``lookupd_query`` replaces the HTTP query itself, e.g. with a scripted lookupd in tests).

    Either pass ``handler`` (an async function: returning finishes the message, raising requeues
    it with backoff; ``concurrency`` handlers run at once, default ``max_in_flight``) or iterate
    with ``async for message in consumer`` and answer each message yourself. Use as
    ``async with Consumer(...) as consumer:`` or ``await task_group.start(consumer.run)`` (an
    anyio task group or a trio nursery).
    """

    def __init__(
        self,
        topic: str,
        channel: str,
        address: str | Sequence[str] = (),
        *,
        lookupd_http_addresses: str | Sequence[str] = (),
        lookupd_poll_interval: float = DEFAULT_POLL_INTERVAL,
        lookupd_poll_jitter: float = DEFAULT_POLL_JITTER,
        lookupd_timeout: float = DEFAULT_TIMEOUT,
        lookupd_query: LookupdQuery | None = None,
        handler: Handler | None = None,
        max_in_flight: int = 1,
        concurrency: int | None = None,
        max_attempts: int = 5,
        on_give_up: GiveUpHook | None = None,
        requeue_delay: float = 90.0,
        max_requeue_delay: float = 900.0,
        backoff: Backoff | None = None,
        reconnect_backoff: Backoff | None = None,
        heartbeat_interval: float = 30.0,
        msg_timeout: float | None = None,
        connect_timeout: float = 5.0,
        rdy_redistribute_interval: float = 5.0,
        close_timeout: float = 30.0,
        open_stream: StreamOpener = open_tcp_stream,
        rng: random.Random | None = None,
        transport: TransportOptions = PLAIN,
    ) -> None:
        check_name("topic", topic)
        check_name("channel", channel)
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be >= 1")
        self.topic = topic
        self.channel = channel
        self.lookupd_addresses = lookupd_addresses(lookupd_http_addresses)
        given = [address] if isinstance(address, str) else list(address)
        if not given and not self.lookupd_addresses:
            raise ValueError("give daemon addresses, lookupd_http_addresses, or both")
        self.addresses = address_list(given) if given else []
        check_schedule(lookupd_poll_interval, lookupd_poll_jitter)
        self.lookupd_poll_interval = lookupd_poll_interval
        self.lookupd_poll_jitter = lookupd_poll_jitter
        self._lookupd_query = lookupd_query or functools.partial(
            _threaded_lookup, request_timeout=lookupd_timeout
        )
        self.handler = handler
        self.max_in_flight = max_in_flight
        self.concurrency = concurrency or max_in_flight
        self.max_attempts = max_attempts
        self.on_give_up = on_give_up
        self.requeue_delay = requeue_delay
        self.max_requeue_delay = max_requeue_delay
        self.backoff = backoff or Backoff(base=1.0, max_delay=120.0)
        self.reconnect_backoff = reconnect_backoff or Backoff(base=1.0, max_delay=60.0)
        self.heartbeat_interval = heartbeat_interval
        self.msg_timeout = msg_timeout
        self.connect_timeout = connect_timeout
        self.rdy_redistribute_interval = rdy_redistribute_interval
        self.close_timeout = close_timeout
        self._open_stream = open_stream
        self.transport = transport
        self._rng = rng or random.Random()

        self._states: dict[Connection, _ConnState] = {}
        self._conns_changed = anyio.Event()
        self._active: set[Connection] = set()
        self._queue: deque[Message] = deque()
        self._queue_ready = anyio.Event()
        self._unanswered = 0
        self._all_answered = anyio.Event()
        self._all_answered.set()
        self._flow = BackoffState(self.backoff)
        self._probe: Connection | None = None
        self._next_redistribute = math.inf
        self._timers_changed = anyio.Event()
        self._first_round: set[str] = set(self.addresses)
        if self.lookupd_addresses:
            self._first_round.add(_LOOKUPD_ROUND)
        self._first_round_done = anyio.Event()
        self._discovery: Discovery | None = None
        self._discovered: dict[str, anyio.CancelScope] = {}
        self._discovery_wake = anyio.Event()
        self._closing = False
        self._closed = anyio.Event()
        self._tasks: TaskGroup | None = None
        self._tasks_cm: Any = None
        self._received = self._finished = self._requeued = self._given_up = 0

    # -- public ----------------------------------------------------------------------------------

    @property
    def connected_addresses(self) -> list[str]:
        """Daemons this consumer is subscribed on right now."""
        return [c.address for c in self._states]

    @property
    def discovered_addresses(self) -> list[str]:
        """Daemons the lookupds listed in their last answer (sorted)."""
        return sorted(self._discovery.producers) if self._discovery is not None else []

    def statistics(self) -> ConsumerStats:
        """Counters and state, for logs and tests."""
        return ConsumerStats(
            received=self._received,
            finished=self._finished,
            requeued=self._requeued,
            given_up=self._given_up,
            connections=len(self._states),
            backoff_level=self._flow.level,
        )

    async def wait_connections(self, count: int) -> None:
        """Wait until the consumer is subscribed on exactly ``count`` daemons."""
        while len(self._states) != count:
            await self._conns_changed.wait()

    def _connections_changed(self) -> None:
        self._conns_changed.set()
        self._conns_changed = anyio.Event()

    def rdy_counts(self) -> dict[str, int]:
        """The RDY last sent on each live connection, by daemon address."""
        return {c.address: s.rdy for c, s in self._states.items()}

    async def __aenter__(self) -> Consumer:
        self._tasks_cm = anyio.create_task_group()
        tasks = await self._tasks_cm.__aenter__()
        try:
            self._start(tasks)
            await self._first_round_done.wait()
        except BaseException:
            cm, self._tasks_cm = self._tasks_cm, None
            self._stop()
            await cm.__aexit__(None, None, None)
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        cm, self._tasks_cm = self._tasks_cm, None
        try:
            if exc_type is None:
                await self._drain()
        finally:
            self._stop()
            # Leave the task group without the body's exception, so that it reaches the caller as
            # it is rather than wrapped in an exception group.
            await cm.__aexit__(None, None, None)
        return None

    async def run(
        self, *, task_status: TaskStatus[Consumer] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Consume until ``close()``; started once every daemon was tried once."""
        async with anyio.create_task_group() as tasks:
            self._start(tasks)
            await self._first_round_done.wait()
            task_status.started(self)
            await self._closed.wait()

    async def close(self) -> None:
        """Stop consuming; let handlers answer what they hold (up to ``close_timeout``).

        Don't call it from a handler (it would wait for that handler's own message).
        """
        if self._tasks is None:
            return
        if self._closing:
            await self._closed.wait()
            return
        await self._drain()
        self._stop()

    async def _drain(self) -> None:
        if self._closing:
            return
        self._closing = True
        self._queue_ready.set()
        goodbyes = []
        for state in list(self._states.values()):
            with contextlib.suppress(ConnectionFailed):
                goodbyes.append((state.conn, state.conn.command(Cls().encode())))
        # Queued but not started: back to the daemon now, for other consumers.
        while self._queue:
            message = self._queue.popleft()
            if not message.responded:
                message.requeue(0, backoff=False)
        with anyio.move_on_after(self.close_timeout) as scope:
            await self._all_answered.wait()
            # CLOSE_WAIT, and the answers written since, sent before the sockets close.
            for conn, reply in goodbyes:
                try:
                    await reply.wait()
                except (ConnectionFailed, NSQError):
                    continue
                await conn.flush()
        if scope.cancelled_caught:
            log.warning(
                "consumer %s/%s: closed with %d messages unanswered",
                self.topic, self.channel, self._unanswered,
            )

    def _stop(self) -> None:
        self._closing = True
        self._queue_ready.set()
        tasks, self._tasks = self._tasks, None
        if tasks is not None:
            tasks.cancel_scope.cancel()
        self._closed.set()

    def __aiter__(self) -> Consumer:
        return self

    async def __anext__(self) -> Message:
        try:
            return await self._get()
        except _Closed:
            raise StopAsyncIteration from None

    # -- start-up and connections ----------------------------------------------------------------

    def _start(self, tasks: TaskGroup) -> None:
        if self._tasks is not None or self._closing:
            raise RuntimeError("a Consumer runs once")
        self._tasks = tasks
        for address in self.addresses:
            tasks.start_soon(self._supervise, address)
        if self.lookupd_addresses:
            self._discovery = Discovery(
                interval=self.lookupd_poll_interval,
                jitter=self.lookupd_poll_jitter,
                reconnect_backoff=self.reconnect_backoff,
                rng=self._rng,
                start=anyio.current_time(),
            )
            tasks.start_soon(self._discover, self._discovery)
        tasks.start_soon(self._timers)
        if self.handler is not None:
            for _ in range(self.concurrency):
                tasks.start_soon(self._worker, self.handler)

    def _first_attempt_done(self, address: str) -> None:
        self._first_round.discard(address)
        if not self._first_round and not self._first_round_done.is_set():
            self._first_round_done.set()
            self._update_rdy()

    async def _supervise(self, address: str) -> None:
        """A daemon given by address: connected to, and reconnected after a loss, until close."""
        failures = 0
        while not self._closing:
            if await self._connect(address):
                failures = 0
            if self._closing:
                return
            failures += 1
            delay = self.reconnect_backoff.delay(failures)
            log.info("consumer: reconnecting to %s in %.1fs", address, delay)
            await anyio.sleep(delay)

    async def _connect(self, address: str) -> bool:
        """One connection: connect, SUB, consume until it ends. True if it subscribed."""
        identify: dict[str, Any] = {}
        if self.msg_timeout is not None:
            identify["msg_timeout"] = round(self.msg_timeout * 1000)
        conn = Connection(
            address,
            heartbeat_interval=self.heartbeat_interval,
            connect_timeout=self.connect_timeout,
            identify=identify,
            on_messages=self._on_messages,
            open_stream=self._open_stream,
            transport=self.transport,
        )
        subscribed = False
        try:
            async with anyio.create_task_group() as tasks:
                try:
                    await tasks.start(conn.run)
                    await conn.request(Sub(topic=self.topic, channel=self.channel).encode())
                except (ConnectionFailed, NSQError) as exc:
                    # Caught here, inside the task group, so it isn't wrapped in a group.
                    log.warning("consumer %s/%s: %s", self.topic, self.channel, exc)
                    tasks.cancel_scope.cancel()
                else:
                    subscribed = True
                    if self._discovery is not None:
                        self._discovery.connected(address)
                    self._add_conn(conn)
                    self._first_attempt_done(address)
                    await conn.wait_closed()
                    if conn.error is not None and not self._closing:
                        log.warning("consumer %s/%s: %s", self.topic, self.channel, conn.error)
        finally:
            self._remove_conn(conn)
            self._first_attempt_done(address)
        return subscribed

    # -- discovery -------------------------------------------------------------------------------

    async def _discover(self, discovery: Discovery) -> None:
        assert self._tasks is not None
        tasks = self._tasks
        explicit = set(self.addresses)
        while True:
            if anyio.current_time() < discovery.next_poll_at:
                self._discovery_wake = anyio.Event()
                with anyio.CancelScope(deadline=discovery.next_poll_at):
                    await self._discovery_wake.wait()
                continue
            discovery.polled(anyio.current_time())
            found = await self._query_lookupds()
            if found is not None:
                found -= explicit  # already supervised
            connect, drop = discovery.answered(anyio.current_time(), found)
            for address in drop:
                log.info("consumer %s/%s: %s is no longer listed by the lookupds; dropping it",
                         self.topic, self.channel, address)
                scope = self._discovered.pop(address, None)
                if scope is not None:
                    scope.cancel()
                discovery.connection_ended(address, anyio.current_time(), dropped=True)
            for address in connect:
                log.info("consumer %s/%s: found %s through the lookupds",
                         self.topic, self.channel, address)
                scope = self._discovered[address] = anyio.CancelScope()
                if not self._first_round_done.is_set():
                    self._first_round.add(address)
                tasks.start_soon(self._run_discovered, discovery, address, scope)
            self._first_attempt_done(_LOOKUPD_ROUND)

    async def _query_lookupds(self) -> set[str] | None:
        """The union of what every lookupd that answered lists; None if none answered."""
        found: set[str] | None = None
        for lookupd in self.lookupd_addresses:
            try:
                producers = await self._lookupd_query(lookupd, self.topic)
            except LmqClientError as exc:
                log.warning("consumer %s/%s: lookupd %s: %s", self.topic, self.channel,
                            lookupd, exc)
                continue
            found = (found or set()) | set(producers)
        return found

    async def _run_discovered(
        self, discovery: Discovery, address: str, scope: anyio.CancelScope
    ) -> None:
        """One connection to a discovered daemon; when it ends, discovery decides what next."""
        try:
            with scope:
                await self._connect(address)
        finally:
            if self._discovered.get(address) is scope:
                del self._discovered[address]
            if not scope.cancel_called and not self._closing:
                discovery.connection_ended(address, anyio.current_time())
                self._discovery_wake.set()

    def _add_conn(self, conn: Connection) -> None:
        self._states[conn] = _ConnState(conn)
        self._connections_changed()
        if len(self._states) > self.max_in_flight:
            self._active = choose_active(
                list(self._states), self._active, (), self.max_in_flight, self._rng
            )
            if self._next_redistribute == math.inf:
                self._next_redistribute = anyio.current_time() + self.rdy_redistribute_interval
                self._timers_changed.set()
        self._update_rdy()

    def _remove_conn(self, conn: Connection) -> None:
        state = self._states.pop(conn, None)
        if state is None:
            return
        self._connections_changed()
        self._active.discard(conn)
        if self._probe is conn:
            self._probe = None
            if self._flow.probing and self._states:
                self._probe = self._rng.choice(list(self._states))
        if len(self._states) > self.max_in_flight:
            self._active = choose_active(
                list(self._states), self._active, (), self.max_in_flight, self._rng
            )
        self._update_rdy()

    # -- RDY -------------------------------------------------------------------------------------

    def _update_rdy(self) -> None:
        """Send RDY wherever the wanted value differs from the last one sent."""
        if self._closing or not self._first_round_done.is_set():
            # Until every daemon was tried once the split is unknown: a first connection given
            # all of max_in_flight could fill it before the others are even up.
            return
        conns = list(self._states)
        if self._flow.paused_until is not None:
            wanted = dict.fromkeys(conns, 0)
        elif self._flow.probing:
            wanted = {c: (1 if c is self._probe else 0) for c in conns}
        else:
            caps = {c: c.max_rdy_count for c in conns}
            wanted = rdy_targets(self.max_in_flight, conns, caps, self._active)
        for conn, count in wanted.items():
            state = self._states[conn]
            if state.rdy != count and conn.is_open:
                state.rdy = count
                conn.write(Rdy(count=count).encode())

    def _redistribute(self) -> None:
        conns = list(self._states)
        if len(conns) <= self.max_in_flight:
            self._next_redistribute = math.inf
            return
        idle = [c for c in conns if not self._states[c].got_message]
        for state in self._states.values():
            state.got_message = False
        self._active = choose_active(conns, self._active, idle, self.max_in_flight, self._rng)
        self._update_rdy()
        self._next_redistribute = anyio.current_time() + self.rdy_redistribute_interval

    # -- backoff ---------------------------------------------------------------------------------

    def _on_outcome(self, *, failure: bool) -> None:
        flow = self._flow
        if not flow.outcome(anyio.current_time(), failure=failure):
            return
        self._probe = None
        if flow.paused_until is not None:
            log.info(
                "consumer %s/%s: backing off for %.3fs (level %d)",
                self.topic, self.channel, flow.paused_until - anyio.current_time(), flow.level,
            )
            self._timers_changed.set()
        else:
            log.info("consumer %s/%s: backoff over", self.topic, self.channel)
        self._update_rdy()

    async def _timers(self) -> None:
        while True:
            flow = self._flow
            deadline = min(
                flow.paused_until if flow.paused_until is not None else math.inf,
                self._next_redistribute,
            )
            with anyio.CancelScope(deadline=deadline):
                await self._timers_changed.wait()
            self._timers_changed = anyio.Event()
            now = anyio.current_time()
            if flow.pause_over(now):
                conns = list(self._states)
                self._probe = self._rng.choice(conns) if conns else None
                self._update_rdy()
            if now >= self._next_redistribute:
                if flow.level == 0:
                    self._redistribute()
                else:
                    self._next_redistribute = now + self.rdy_redistribute_interval

    # -- messages --------------------------------------------------------------------------------

    def _on_messages(self, conn: Connection, frames: list[MessageFrame]) -> None:
        state = self._states.get(conn)
        consumer = self
        messages = [
            Message(f.id, f.body, f.timestamp, f.attempts, conn, consumer, f.ext) for f in frames
        ]
        self._received += len(messages)
        self._unanswered += len(messages)
        if self._all_answered.is_set():
            self._all_answered = anyio.Event()
        if state is not None:
            state.in_flight += len(messages)
            state.got_message = True
        if self._closing:
            for message in messages:
                message.requeue(0, backoff=False)
            return
        self._queue.extend(messages)
        self._queue_ready.set()

    def _message_done(self, message: Message, *, success: bool, backoff: bool) -> None:
        """Called by ``Message`` when it is answered."""
        if success:
            self._finished += 1
        else:
            self._requeued += 1
        state = self._states.get(message._conn)  # type: ignore[call-overload]
        if state is not None:
            state.in_flight -= 1
        self._unanswered -= 1
        if self._unanswered == 0:
            self._all_answered.set()
        if success:
            self._on_outcome(failure=False)
        elif backoff:
            self._on_outcome(failure=True)

    async def _get(self) -> Message:
        while True:
            while not self._queue:
                if self._closing:
                    raise _Closed
                if self._queue_ready.is_set():
                    self._queue_ready = anyio.Event()
                await self._queue_ready.wait()
            message = self._queue.popleft()
            if not message._conn.is_open:
                # Its connection is gone: the daemon redelivers it; answering is impossible.
                message.responded = True
                self._message_done(message, success=False, backoff=False)
                self._requeued -= 1
                continue
            if self.max_attempts and message.attempts > self.max_attempts:
                await self._give_up(message)
                continue
            return message

    async def _give_up(self, message: Message) -> None:
        log.warning(
            "consumer %s/%s: giving up on %r after %d attempts",
            self.topic, self.channel, message, message.attempts,
        )
        self._given_up += 1
        if self.on_give_up is not None:
            try:
                result = self.on_give_up(message)
                if inspect.isawaitable(result):
                    await result
            except Exception:
                log.exception("consumer %s/%s: give-up hook failed", self.topic, self.channel)
        if not message.responded:
            message.finish()

    def requeue_delay_for(self, message: Message) -> float:
        """The delay of an automatic requeue: ``requeue_delay * attempts``, capped (go-nsq)."""
        return min(self.requeue_delay * message.attempts, self.max_requeue_delay)

    async def _worker(self, handler: Handler) -> None:
        while True:
            try:
                message = await self._get()
            except _Closed:
                return
            try:
                await handler(message)
            except Exception:
                log.warning(
                    "consumer %s/%s: handler failed on %r", self.topic, self.channel, message,
                    exc_info=True,
                )
                if not message.responded:
                    message.requeue(self.requeue_delay_for(message))
            else:
                if not message.responded:
                    message.finish()

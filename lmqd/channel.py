"""Channel: a topic's copy of the stream, shared out among its subscribed clients.

Theory of operation
-------------------
Ready messages live in a bounded memory deque (``--mem-queue-size``) with the overflow in the
channel's ``BackendQueue``. **FIFO rule**: while the backend holds anything, new messages go to
the backend too, so everything in memory is older than everything in the backend and reading
"memory first, then backend" keeps publish order.

Every mutation (``put_many``, ``finish``, ``requeue``, ``touch``, ``client_ready``,
``add_client``, ``remove_client``, ``unpause``) is a plain ``def`` that only changes state; none
of them delivers. The caller calls ``deliver(now)`` once after a batch of mutations (the TCP
server once per received buffer, the topic pump once per batch, the channel's own timer once per
wakeup), so a buffer of a thousand FINs costs one delivery round, not a thousand.

``deliver`` hands messages to the clients with room in their RDY window (``in_flight_count <
ready_count``; RDY is a window, never decremented). A round takes as many messages as the total
free room, then spreads them over the ready clients in random order (random selection, as nsqd's
racing goroutines give): evenly, each up to its free room, the odd ones to random clients. Every
client gets at most one ``write_messages`` call per round, so its writer wakes once.

Delivered messages sit in the ``InFlightQueue`` until FIN, REQ, TOUCH or their deadline;
deferred ones (REQ with a delay, DPUB) in the ``DeferredQueue``. One timer task per channel
(``run``) sleeps in a ``trio.CancelScope`` whose deadline is the earliest of both queues; pushing
an earlier deadline lowers that scope's deadline directly (no per-message Event or task), and on
wakeup everything due is processed at once, then ``deliver`` runs once.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections import deque
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING

import trio

from lmqd.backend import BackendError, BackendQueue
from lmqd.deferred import DeferredQueue
from lmqd.e2e import E2eLatencyStream, new_stream
from lmqd.inflight import ChannelError, InFlightQueue, NotInFlight, NotOwner
from lmqd.message import Message
from lmqd.options import Options
from lmqd.protocol.names import is_ephemeral
from lmqd.stats import NO_E2E_LATENCY, ChannelStats, E2eLatency
from lmqd.storage import DiskQueue, StoredMessage, run_sync_jobs
from lmqd.subscriber import Subscriber

if TYPE_CHECKING:
    from lmqd.syncer import Syncer

__all__ = [
    "Channel",
    "ChannelError",
    "NotInFlight",
    "NotOwner",
    "TooManyConsumers",
    "TopicExiting",
    "is_ephemeral",
]

log = logging.getLogger("lmqd.channel")


class TopicExiting(Exception):
    """The topic or channel is being deleted or closed: no publishing or subscribing on it."""


class TooManyConsumers(Exception):
    """``--max-channel-consumers`` reached; ``str()`` is nsqd's text for E_SUB_FAILED."""


class Channel:
    """One channel of a topic: ready queue, subscribed clients, in-flight and deferred messages.

    Counters follow nsqd: ``message_count`` counts messages put into the channel by its topic
    (deferred ones included, requeues not); ``requeue_count`` counts REQs **and** the messages
    requeued because their client disconnected (lmq requeues those at once, where nsqd lets them
    time out and counts them in ``timeout_count``); ``timeout_count`` counts in-flight timeouts.
    """

    def __init__(
        self,
        topic_name: str,
        name: str,
        options: Options,
        *,
        backend: BackendQueue,
        on_last_client_removed: Callable[[Channel], None] | None = None,
        rng: random.Random | None = None,
        syncer: Syncer | None = None,
        on_health: Callable[[str | None], None] | None = None,
        deferred_store: Callable[[bool], BackendQueue | None] | None = None,
    ) -> None:
        self.topic_name = topic_name
        self.name = name
        self.options = options
        self.backend = backend
        self.ephemeral = is_ephemeral(name)
        self.paused = False
        self.exiting = False
        self.clients: dict[int, Subscriber] = {}
        self.message_count = 0
        self.requeue_count = 0
        self.timeout_count = 0
        self.last_backend_error: BackendError | None = None
        """The last error a backend write raised (None once a write succeeds again)."""
        self._on_last_client_removed = on_last_client_removed
        self._on_health = on_health
        self._rng = rng if rng is not None else random.Random()
        disk = backend if isinstance(backend, DiskQueue) else None
        self._disk = disk if disk is not None and disk.ack_mode else None
        """The queue to acknowledge FIN'd messages in (durable channels only)."""
        self._dirty: Callable[[], None] | None = (
            partial(syncer.note_dirty, disk) if syncer is not None and disk is not None else None
        )
        self._syncer = syncer
        self._deferred_store_factory = deferred_store
        self._dq: BackendQueue | None = None
        """The deferred store, once opened (``deferred_store(create)`` opens it)."""
        self._dq_messages: dict[int, Message] = {}
        """Durable: messages whose token belongs to the deferred store, by ``id()``."""
        self._superseded: dict[int, Message] = {}
        """Durable: originals to acknowledge once their deferred-store copy is fsynced."""
        self._memory: deque[Message] = deque()
        # nsqd gives ephemeral channels a memory queue even with --mem-queue-size 0 (an
        # unbuffered Go channel: a put succeeds only while a ready consumer is waiting).
        # ``_memory_limit`` reproduces that with the clients' free RDY room.
        self._mem_size = options.mem_queue_size
        self._unbuffered = self.ephemeral and self._mem_size == 0
        self._in_flight = InFlightQueue()
        self._deferred = DeferredQueue()
        self.e2e_stream: E2eLatencyStream | None = (
            new_stream(options, trio.current_time())
            if options.e2e_processing_latency_percentiles
            else None
        )
        """FIN latencies over nsqd's rolling window; None without configured percentiles."""
        self._run_scope = trio.CancelScope()
        self._sleep_scope: trio.CancelScope | None = None
        if deferred_store is not None:
            self._dq = deferred_store(False)  # an existing store: restore what it holds
            if self._dq is not None and self._dq.depth:
                self._load_deferred()

    def __repr__(self) -> str:
        return f"<Channel {self.topic_name}:{self.name}>"

    # -- sizes -------------------------------------------------------------------------------

    @property
    def depth(self) -> int:
        """Ready messages: memory + backend (in-flight and deferred excluded, as nsqd)."""
        return len(self._memory) + self.backend.depth

    @property
    def backend_depth(self) -> int:
        return self.backend.depth

    @property
    def durable(self) -> bool:
        """Whether every message is on disk until FIN (``--durable``, not ephemeral)."""
        return self._disk is not None

    @property
    def durable_queues(self) -> tuple[DiskQueue, ...]:
        """A durable channel's queues (main, and the deferred store once open): the topic waits
        for their syncs before it acknowledges what it copied here."""
        if self._disk is None:
            return ()
        if isinstance(self._dq, DiskQueue):
            return (self._disk, self._dq)
        return (self._disk,)

    @property
    def disk_queues(self) -> tuple[DiskQueue, ...]:
        """Every queue of this channel stored on disk (its backend, and its deferred store once
        open), durable or not: what it costs on disk."""
        return tuple(q for q in (self.backend, self._dq) if isinstance(q, DiskQueue))

    @property
    def in_flight_count(self) -> int:
        return len(self._in_flight)

    @property
    def deferred_count(self) -> int:
        return len(self._deferred)

    @property
    def in_flight(self) -> InFlightQueue:
        """The in-flight queue (read-only use: storage snapshots, tests)."""
        return self._in_flight

    @property
    def deferred(self) -> DeferredQueue:
        """The deferred queue (read-only use: storage snapshots, tests)."""
        return self._deferred

    # -- the ready queue ---------------------------------------------------------------------

    def put_many(self, messages: Sequence[Message], now: float) -> None:
        """Take messages from the topic: deferred ones (``deliver_at > now``) into the deferred
        queue, the rest onto the ready queue. Does not deliver (call ``deliver``).

        A durable channel writes all of them (deferred ones too, with their time) to its queue
        and raises ``BackendError`` having stored none of them.
        """
        if self.exiting:
            return
        if self._disk is not None:
            self._put_durable(messages, now)
            self.message_count += len(messages)
            return
        self.message_count += len(messages)
        ready: Sequence[Message] = messages
        for m in messages:
            if m.deliver_at > now:
                # Rare (DPUB): split only when some message is actually deferred.
                ready = [m for m in messages if m.deliver_at <= now]
                for d in messages:
                    if d.deliver_at > now:
                        self._deferred.push(d)
                self._wake_at(self._deferred.next_deadline())
                break
        if ready:
            self._enqueue(ready)

    def _put_durable(self, messages: Sequence[Message], now: float) -> None:
        assert self._disk is not None
        deferred = [m for m in messages if m.deliver_at > now]
        ready = [m for m in messages if m.deliver_at <= now] if deferred else messages
        if deferred:
            # First, so that a failure here stores nothing (a failure of the main write below
            # leaves these stored: the topic's retry duplicates them, never loses them).
            self._store_deferred(deferred)
        if ready:
            self._disk.put_many(ready)
            if self._dirty is not None:
                self._dirty()

    # -- the deferred store --------------------------------------------------------------------

    def _open_deferred_store(self) -> BackendQueue | None:
        """The deferred store, opened if needed; None if this channel has none (not stored on
        disk). Raises ``BackendError`` if it cannot be opened."""
        if self._dq is None and self._deferred_store_factory is not None:
            self._dq = self._deferred_store_factory(True)
        return self._dq

    def _store_deferred(self, messages: Sequence[Message]) -> None:
        """Write deferred messages to the deferred store and hold what it reads back.

        Raises ``BackendError`` having stored none of them.
        """
        dq = self._open_deferred_store()
        if dq is None:
            raise BackendError(f"CHANNEL({self.topic_name}:{self.name}): no deferred store")
        dq.put_many(messages)
        self._load_deferred()

    def _load_deferred(self) -> None:
        """Read the whole deferred store into the deferred heap (it is always read to its end)."""
        dq = self._dq
        assert dq is not None
        durable = self._disk is not None
        while dq.depth:
            got = dq.read_many(dq.depth)
            if not got:
                break  # unreadable bytes were set aside or reading paused: see the storage log
            for m in got:
                if durable:
                    self._dq_messages[id(m)] = m
                self._deferred.push(m)
        if self._syncer is not None and isinstance(dq, DiskQueue):
            self._syncer.note_dirty(dq)
        self._wake_at(self._deferred.next_deadline())

    def _ack_once_durable(self, original: Message) -> None:
        """Acknowledge a message superseded by its copy in the deferred store, once that copy
        is fsynced (acknowledging first could lose it to a power failure in between)."""
        dq = self._dq
        if self._syncer is None or not isinstance(dq, DiskQueue):
            self._ack((original,))
            return
        self._superseded[id(original)] = original
        self._syncer.when_durable(dq, partial(self._copy_durable, original), urgent=False)

    def _copy_durable(self, original: Message, error: OSError | None) -> None:
        # Syncer callback for _ack_once_durable. After a failed sync the original stays
        # unacknowledged: read again after a restart (a duplicate, never a loss).
        if self._superseded.pop(id(original), None) is not None and error is None:
            self._ack((original,))

    def _ack(self, messages: Sequence[Message]) -> None:
        """Durable: acknowledge finished (or superseded) messages in the queue of their token."""
        disk = self._disk
        if disk is None:
            return
        side = self._dq_messages
        if side:
            main: list[int] = []
            other: list[int] = []
            for m in messages:
                if isinstance(m, StoredMessage):
                    (other if side.pop(id(m), None) is not None else main).append(m.token)
            if other and isinstance(self._dq, DiskQueue):
                self._dq.ack_many(other)
                if self._syncer is not None:
                    self._syncer.note_dirty(self._dq)
        else:
            main = [m.token for m in messages if isinstance(m, StoredMessage)]
        if main:
            disk.ack_many(main)
            if self._dirty is not None:
                self._dirty()

    def _memory_limit(self) -> int:
        if not self._unbuffered:
            return self._mem_size
        if self.paused:
            return 0
        return sum(max(0, c.ready_count - c.in_flight_count) for c in self.clients.values())

    def _enqueue(self, messages: Sequence[Message]) -> None:
        """Append to the ready queue: memory while it has room and the backend is empty."""
        memory = self._memory
        if self._disk is not None:
            # Requeued, timed-out or due messages of a durable channel: still unacknowledged
            # on disk, so memory holds them without risk (at most what was in flight/deferred).
            memory.extend(messages)
            return
        backend = self.backend
        if backend.depth == 0:
            room = self._memory_limit() - len(memory)
            if room >= len(messages):
                memory.extend(messages)
                return
            if room > 0:
                memory.extend(messages[:room])
                messages = messages[room:]
        try:
            backend.put_many(messages)
        except BackendError as exc:
            # Keep the messages rather than lose them (they may be requeued in-flight messages):
            # memory grows past its bound and order versus the backend's contents is not kept.
            log.error(
                "CHANNEL(%s:%s): backend write of %d messages failed, kept in memory - %s",
                self.topic_name,
                self.name,
                len(messages),
                exc,
            )
            if self.last_backend_error is None and self._on_health is not None:
                self._on_health(str(exc))
            self.last_backend_error = exc
            memory.extend(messages)
        else:
            if self.last_backend_error is not None and self._on_health is not None:
                self._on_health(None)
            self.last_backend_error = None
            if self._dirty is not None:
                self._dirty()

    def _take(self, count: int, now: float) -> list[Message]:
        """Remove up to ``count`` ready messages, memory first, then the backend."""
        memory = self._memory
        if len(memory) >= count:
            if len(memory) == count:
                out = list(memory)
                memory.clear()
                return out
            popleft = memory.popleft
            return [popleft() for _ in range(count)]
        out = list(memory)
        memory.clear()
        backend = self.backend
        in_flight = self._in_flight
        seen: set[bytes] | None = None
        while len(out) < count and backend.depth > 0:
            got = backend.read_many(count - len(out))
            if not got:
                break
            if seen is None:
                seen = {m.id for m in out}
            # Messages written to disk while deferred (shutdown flush, restart) keep their time.
            for m in got:
                msg_id = m.id
                if msg_id in in_flight or msg_id in seen:
                    # A second copy (stored again after a crash: at-least-once) while the first
                    # is in flight: one id can be in flight only once, and this copy is redundant.
                    self._drop_duplicate(m)
                elif m.deliver_at > now:
                    self._deferred.push(m)
                else:
                    seen.add(msg_id)
                    out.append(m)
        if self._dirty is not None:
            self._dirty()
        if self._deferred:
            self._wake_at(self._deferred.next_deadline())
        return out

    def _drop_duplicate(self, m: Message) -> None:
        log.debug(
            "CHANNEL(%s:%s): dropping a duplicate of %s read from disk while it is in flight",
            self.topic_name,
            self.name,
            m.id.decode("ascii", "replace"),
        )
        self._ack((m,))

    # -- clients -----------------------------------------------------------------------------

    def add_client(self, client: Subscriber) -> None:
        """Subscribe ``client`` (it starts with its own RDY, normally 0). Does not deliver."""
        if self.exiting:
            raise TopicExiting(f"channel {self.topic_name}:{self.name} is exiting")
        if client.id in self.clients:
            return
        limit = self.options.max_channel_consumers
        if limit and len(self.clients) >= limit:
            raise TooManyConsumers(
                f"consumers for {self.topic_name}:{self.name} exceeds limit of {limit}"
            )
        self.clients[client.id] = client

    def remove_client(self, client: Subscriber, now: float) -> None:
        """Unsubscribe ``client`` and requeue its in-flight messages at once (nsqd waits for
        their timeout). An ephemeral channel left without clients asks to be deleted. Does not
        deliver."""
        if self.clients.pop(client.id, None) is None:
            return
        if self.exiting:
            return
        cid = client.id
        mine = [m for m in self._in_flight if m.client_id == cid]
        if mine:
            for m in mine:
                self._in_flight.remove(m.id)
            client.in_flight_count -= len(mine)
            self.requeue_count += len(mine)
            self._enqueue(mine)
            log.debug(
                "CHANNEL(%s:%s): client %d left, requeued %d in-flight",
                self.topic_name,
                self.name,
                cid,
                len(mine),
            )
        if self.ephemeral and not self.clients and self._on_last_client_removed is not None:
            self._on_last_client_removed(self)

    def client_ready(self, client: Subscriber) -> None:
        """``client``'s ``ready_count`` changed. Does not deliver (call ``deliver``).

        Delivery reads every client's window directly, so there is nothing to update today;
        the server calls this so the channel may keep a ready set later without an API change.
        """

    # -- in-flight operations -----------------------------------------------------------------

    def _owned(self, client: Subscriber, msg_id: bytes) -> Message:
        msg = self._in_flight.get(msg_id)
        if msg is None:
            raise NotInFlight()
        if msg.client_id != client.id:
            raise NotOwner()
        return msg

    def finish(self, client: Subscriber, msg_id: bytes, now: float) -> None:
        """FIN: the message is done. Raises ``NotInFlight`` / ``NotOwner``."""
        msg = self._in_flight.remove_owned(msg_id, client.id)
        client.in_flight_count -= 1
        client.finish_count += 1
        if self._disk is not None:
            self._ack((msg,))
        if self.e2e_stream is not None:
            self.e2e_stream.record(now, time.time_ns() - msg.timestamp)

    def finish_many(
        self, client: Subscriber, msg_ids: Sequence[bytes], now: float
    ) -> list[tuple[bytes, ChannelError]]:
        """FIN several messages of one client (a buffer's worth); same effect as calling
        ``finish`` for each in order, at less cost per message. Returns the failures as
        ``(msg_id, error)`` in order instead of raising."""
        done, failed = self._in_flight.remove_many_owned(msg_ids, client.id)
        client.in_flight_count -= len(done)
        client.finish_count += len(done)
        if self._disk is not None and done:
            self._ack(done)
        e2e = self.e2e_stream
        if e2e is not None:
            wall = time.time_ns()
            for m in done:
                e2e.record(now, wall - m.timestamp)
        return failed

    def requeue(self, client: Subscriber, msg_id: bytes, delay: float, now: float) -> None:
        """REQ: back to the queue (``delay`` 0) or deferred for ``delay`` seconds (already
        clamped by the caller). Attempts are kept. Raises ``NotInFlight`` / ``NotOwner``."""
        msg = self._in_flight.remove_owned(msg_id, client.id)
        client.in_flight_count -= 1
        client.requeue_count += 1
        self.requeue_count += 1
        if delay > 0:
            msg.deliver_at = now + delay
            if self._disk is not None:
                # Durable: into the deferred store (so a long delay does not hold the main
                # queue's read position back), and the original acknowledged.
                try:
                    self._store_deferred((msg,))
                except BackendError as exc:
                    log.warning(
                        "CHANNEL(%s:%s): cannot store a deferred message (kept unacknowledged "
                        "in memory): %s",
                        self.topic_name,
                        self.name,
                        exc,
                    )
                else:
                    self._ack_once_durable(msg)
                    return
            self._deferred.push(msg)
            self._wake_at(msg.deliver_at)
        else:
            self._enqueue((msg,))

    def touch(self, client: Subscriber, msg_id: bytes, now: float) -> None:
        """TOUCH: reset the deadline to ``now + msg_timeout``, capped at delivery time +
        ``--max-msg-timeout``. Raises ``NotInFlight`` / ``NotOwner``."""
        msg = self._owned(client, msg_id)
        deadline = min(now + client.msg_timeout, msg.delivered_at + self.options.max_msg_timeout)
        self._in_flight.set_deadline(msg, deadline)
        self._wake_at(deadline)

    # -- delivery ----------------------------------------------------------------------------

    def deliver(self, now: float) -> None:
        """Hand ready messages to clients with room in their RDY window (see module doc)."""
        if self.paused or self.exiting or not self.clients:
            return
        if not self._memory and self.backend.depth == 0:
            return
        rng = self._rng
        in_flight = self._in_flight
        batches: dict[int, list[Message]] = {}
        earliest = math.inf
        while True:
            ready = [
                (c, c.ready_count - c.in_flight_count)
                for c in self.clients.values()
                if c.in_flight_count < c.ready_count
            ]
            if not ready:
                break
            room = sum(r for _, r in ready)
            msgs = self._take(room, now)
            if not msgs:
                break
            n = len(msgs)
            dropped = False
            start = 0
            for client, take in self._shares(ready, n, room):
                chunk = msgs if take == n else msgs[start : start + take]
                start += take
                rate = client.sample_rate
                if rate > 0:
                    # nsqd: skip (and so drop for this channel) when randrange(100) > rate.
                    randrange = rng.randrange
                    kept = [m for m in chunk if randrange(100) <= rate]
                    if len(kept) < len(chunk):
                        dropped = True
                        if self._disk is not None:  # sampled out = done, for this channel
                            keep = set(map(id, kept))
                            self._ack([m for m in chunk if id(m) not in keep])
                        chunk = kept
                    if not chunk:
                        continue
                deadline = now + client.msg_timeout
                cid = client.id
                in_flight.start_many(chunk, cid, now, deadline)
                k = len(chunk)
                client.in_flight_count += k
                client.message_count += k
                if deadline < earliest:
                    earliest = deadline
                batch = batches.get(cid)
                if batch is None:
                    batches[cid] = chunk
                else:
                    batch.extend(chunk)
            # Another round only if sampling left room unused and messages may remain.
            if not dropped or n < room:
                break
        if earliest < math.inf:
            self._wake_at(earliest)
        clients = self.clients
        for cid, batch in batches.items():
            clients[cid].write_messages(batch)

    def _shares(
        self, ready: list[tuple[Subscriber, int]], n: int, room: int
    ) -> list[tuple[Subscriber, int]]:
        """Split ``n`` messages over ready ``(client, free room)`` pairs, in random order.

        With enough messages every client fills its window. Otherwise water-filling: find the
        highest level ``b`` with ``sum(min(free, b)) <= n``, give each client ``min(free, b)``
        and the few left over (fewer than the clients above the level) one each to clients
        picked at random among those with room above ``b``. A single message thus goes to a
        uniformly random ready client, and a batch is spread evenly.
        """
        if len(ready) == 1:
            return [(ready[0][0], n)]
        rng = self._rng
        rng.shuffle(ready)
        if n >= room:
            return ready
        frees = sorted(free for _, free in ready)
        k = len(frees)
        prefix = 0
        level = 0
        for i, free in enumerate(frees):
            rest = k - i
            if prefix + free * rest > n:
                level = (n - prefix) // rest
                break
            prefix += free
        shares = [(client, min(free, level)) for client, free in ready]
        left = n - sum(take for _, take in shares)
        if left:
            above = [i for i, (_, free) in enumerate(ready) if free > level]
            for i in rng.sample(above, left):
                client, take = shares[i]
                shares[i] = (client, take + 1)
        return [(client, take) for client, take in shares if take]

    # -- timers ------------------------------------------------------------------------------

    def _wake_at(self, deadline: float) -> None:
        scope = self._sleep_scope
        if scope is not None and deadline < scope.deadline:
            scope.deadline = deadline

    def process_due(self, now: float) -> None:
        """Time out in-flight messages and release deferred ones that are due at ``now``.

        Timed-out messages go back on the queue like ``REQ 0`` (attempts kept,
        ``timeout_count`` += 1). Does not deliver (``run`` calls ``deliver`` right after).
        """
        expired = self._in_flight.pop_due(now)
        if expired:
            self.timeout_count += len(expired)
            clients = self.clients
            for m in expired:
                client = clients.get(m.client_id)
                if client is not None:
                    client.in_flight_count -= 1
            self._enqueue(expired)
        due = self._deferred.pop_due(now)
        if due:
            self._enqueue(due)

    def next_deadline(self) -> float:
        """The earliest in-flight timeout or deferred release time (``math.inf`` if none)."""
        return min(self._in_flight.next_deadline(), self._deferred.next_deadline())

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The channel's timer task: sleep until the earliest deadline, process everything
        due, deliver; returns when the channel is closed or deleted. Call once."""
        with self._run_scope:
            task_status.started()
            while not self.exiting:
                with trio.CancelScope(deadline=self.next_deadline()) as sleep:
                    self._sleep_scope = sleep
                    try:
                        await trio.sleep_forever()
                    finally:
                        self._sleep_scope = None
                now = trio.current_time()
                self.process_due(now)
                self.deliver(now)

    # -- admin -------------------------------------------------------------------------------

    def pause(self) -> None:
        """Stop delivering (messages queue up here)."""
        self.paused = True

    def unpause(self) -> None:
        """Resume delivering; the caller calls ``deliver``."""
        self.paused = False

    def empty(self) -> None:
        """Drop every ready, in-flight and deferred message and zero the clients' in-flight
        counts (nsqd ``Channel.Empty``)."""
        self._memory.clear()
        self.backend.empty()
        if self._dq is not None:
            self._dq.empty()
        self._dq_messages.clear()
        self._superseded.clear()
        self._in_flight.clear()
        self._deferred.clear()
        for client in self.clients.values():
            client.in_flight_count = 0

    def close(self) -> bool:
        """Shut down: stop the timer and write memory, in-flight and deferred messages (with
        their ``deliver_at`` and attempts) to the backend, then close it. Idempotent.

        A durable channel writes them again and acknowledges the originals (no duplicate after a
        restart). Returns False if something could not be written or synced (logged): a durable
        topic then keeps its own copies of the messages unacknowledged.
        """
        if self.exiting:
            return True
        self.exiting = True
        self._run_scope.cancel()
        # After the backend's contents, as nsqd's flush: order across a restart is not kept.
        ready = list(self._memory)
        ready += self._in_flight.clear()
        deferred = self._deferred.clear()
        self._memory.clear()
        ok = self._flush(ready, deferred)
        if self._superseded:  # their copies are made durable by the sync below
            self._ack(list(self._superseded.values()))
            self._superseded.clear()
        # One group of jobs: every queue's data is fsynced before any positions file is written,
        # so an acknowledgement in one queue never becomes durable before the copy in the other.
        jobs = [
            job
            for queue in (self.backend, self._dq)
            if isinstance(queue, DiskQueue) and (job := queue.prepare_sync()) is not None
        ]
        for job, error in zip(jobs, run_sync_jobs(jobs), strict=True):
            if error is not None:
                ok = False
                log.error(
                    "CHANNEL(%s:%s): final sync of %s failed: %s",
                    self.topic_name,
                    self.name,
                    job.name,
                    error,
                )
        self.backend.close()
        if self._dq is not None:
            self._dq.close()
        log.info("CHANNEL(%s:%s): closed", self.topic_name, self.name)
        return ok

    def _flush(self, ready: list[Message], deferred: list[Message]) -> bool:
        """``close``: ready and in-flight messages to the main queue, deferred ones (with their
        deadlines) to the deferred store; a durable channel acknowledges the originals."""
        ok = True
        dq: BackendQueue | None = None
        if deferred:
            try:
                dq = self._open_deferred_store()
            except BackendError as exc:
                log.warning("CHANNEL(%s:%s): %s", self.topic_name, self.name, exc)
            if dq is None:
                ready += deferred  # nsqd's way: with the others (due at once after a restart)
                deferred = []
        if deferred:
            assert dq is not None
            try:
                dq.put_many(deferred)
            except BackendError as exc:
                # Kept, if not on time: with the others in the main queue (nsqd's way).
                log.warning(
                    "CHANNEL(%s:%s): deferred store unavailable, deferred messages go to the "
                    "main queue: %s",
                    self.topic_name,
                    self.name,
                    exc,
                )
                ready += deferred
            else:
                self._ack(deferred)
        if ready:
            try:
                self.backend.put_many(ready)
            except BackendError:
                ok = False
                log.error(
                    "CHANNEL(%s:%s): failed to flush %d messages to the backend at close",
                    self.topic_name,
                    self.name,
                    len(ready),
                    exc_info=True,
                )
            else:
                self._ack(ready)
        return ok

    def delete(self) -> None:
        """Delete: stop the timer, drop every message and the backend's storage, and close the
        subscribed clients' connections (nsqd does). Idempotent."""
        if self.exiting:
            return
        self.exiting = True
        self._run_scope.cancel()
        for client in list(self.clients.values()):
            client.close()
        self._memory.clear()
        self._in_flight.clear()
        self._deferred.clear()
        self._dq_messages.clear()
        self._superseded.clear()
        self.backend.delete()
        if self._dq is not None:
            self._dq.delete()
        log.info("CHANNEL(%s:%s): deleted", self.topic_name, self.name)

    # -- statistics --------------------------------------------------------------------------

    def e2e_latency(self) -> E2eLatency:
        """The E2E processing latency percentiles over the window (nsqd's shape)."""
        stream = self.e2e_stream
        return NO_E2E_LATENCY if stream is None else stream.result(trio.current_time())

    def statistics(self, *, include_clients: bool = True) -> ChannelStats:
        """A frozen snapshot for /stats; client snapshots come from ``client.statistics()``."""
        return ChannelStats(
            channel_name=self.name,
            depth=self.depth,
            backend_depth=self.backend.depth,
            in_flight_count=len(self._in_flight),
            deferred_count=len(self._deferred),
            message_count=self.message_count,
            requeue_count=self.requeue_count,
            timeout_count=self.timeout_count,
            client_count=len(self.clients),
            clients=(
                tuple(c.statistics() for c in self.clients.values()) if include_clients else None
            ),
            paused=self.paused,
            e2e_processing_latency=self.e2e_latency(),
        )

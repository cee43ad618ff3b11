"""Channel: a cursor over its topic's stream, shared out among its subscribed consumers.

Theory of operation
-------------------
A channel reads its topic's messages through its ``ChannelCursor`` (``cursor.py``: a read
position in the topic's memory tail and log, where each message is stored once for every
channel) and keeps only its own state: in-flight messages, deferred ones, and its **own store**
of ready messages that are not new (a ``SpillQueue``: memory up to ``--mem-queue-size``, the
overflow in its backend queue): REQ 0, timeouts and disconnects put messages there, and
delivery takes from it first. Channels of ephemeral topics, and ephemeral channels, have no
cursor: their topic's pump puts copies of its messages into their own store (nsqd's model, in
memory).

Every mutation (``put_many``, ``finish_many``, ``requeue``, ``touch``, ``add_consumer``,
``remove_consumer``, ``consumer_ready``, ``unpause``) is a plain ``def`` that changes state and,
when it may let messages flow, *asks* for a delivery round (``_want_delivery``): the channel's
own task (``run``) wakes and delivers once for everything asked since it last ran. So a buffer of
a thousand FINs costs one delivery round, not a thousand, and no caller has to remember to
deliver. ``deliver(now)`` may also be called directly (the topic's pump does, once per batch).

``deliver`` hands messages to the consumers with room in their RDY window (``in_flight_count <
ready_count``; RDY is a window, never decremented). A round takes as many messages as the total
free room (own store first, then the cursor), then splits them over the ready consumers
(``lmqd.engine.delivery.split_batch``: random order, evenly). Every consumer gets at most one
``write_messages`` call per round, so its writer wakes once.

Delivered messages sit in the ``InFlightQueue`` until FIN, REQ, TOUCH or their deadline;
deferred ones (REQ with a delay, DPUB) in the ``DeferredQueue``. The channel's task sleeps in a
``trio.CancelScope`` whose deadline is the earliest of both queues (or now, when a delivery was
asked for); pushing an earlier deadline lowers that scope's deadline directly (no per-message
Event or task), and on wakeup everything due is processed at once, then ``deliver`` runs once.

With ``--durable`` every message not FIN'd keeps a copy on disk: in the topic's log (the cursor
leaves it unsettled) or in one of the channel's stores. ``DurableAcks`` records which, and
acknowledges there. A requeued message is written to the own store so that it stops holding the
log; so is (in the deferred store, due at its deadline) a message held in flight while the log
has moved on to a newer segment (``_release_log``).
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import trio

from lmqd.engine.backend import BackendError, BackendQueue, StoredQueue, storage_damage
from lmqd.engine.cursor import ChannelCursor
from lmqd.engine.deferred import DeferredQueue
from lmqd.engine.delivery import split_batch
from lmqd.engine.durable import DurableAcks
from lmqd.engine.e2e import E2eLatencyStream, new_stream
from lmqd.engine.inflight import ChannelError, InFlightQueue, NotInFlight, NotOwner
from lmqd.engine.spill import SpillQueue
from lmqd.engine.subscription import Consumer, Subscription
from lmqd.message import Message
from lmqd.names import is_ephemeral
from lmqd.options import Options
from lmqd.stats import NO_E2E_LATENCY, ChannelStats, E2eLatency
from lmqd.storage import run_sync_jobs

if TYPE_CHECKING:
    from lmqd.engine.syncer import Syncer

__all__ = [
    "Channel",
    "ChannelError",
    "NotInFlight",
    "NotOwner",
    "TooManyConsumers",
    "TopicExiting",
]

log = logging.getLogger("lmqd.channel")


RELEASE_CHECK_S = 1.0
"""``--durable``: how often a channel with unsettled messages checks whether one held in flight
keeps an older log segment than the one being written (``Channel._release_log``): a comparison
of two offsets, so once a second costs nothing; a segment (100 MiB by default) takes longer
than that to fill."""


class TopicExiting(Exception):
    """The topic or channel is being deleted or closed: no publishing or subscribing on it."""


class TooManyConsumers(Exception):
    """``--max-channel-consumers`` reached; ``str()`` is nsqd's text for E_SUB_FAILED."""


class Channel:
    """One channel of a topic: ready queue, subscriptions, in-flight and deferred messages.

    Counters follow nsqd: ``message_count`` counts messages put into the channel by its topic
    (deferred ones included, requeues not); ``requeue_count`` counts REQs **and** the messages
    requeued because their consumer disconnected (lmq requeues those at once, where nsqd lets
    them time out and counts them in ``timeout_count``); ``timeout_count`` counts in-flight
    timeouts.
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
        cursor: ChannelCursor | None = None,
        durable: bool | None = None,
        on_paused_changed: Callable[[], None] | None = None,
    ) -> None:
        self.topic_name = topic_name
        self.name = name
        self.options = options
        self.backend = backend
        """The own store's disk (or memory) part: requeues past the memory bound, what a
        shutdown wrote, a backlog from before topic logs."""
        self.cursor = cursor
        """Where the channel reads its topic's stream (None: the pump puts messages here)."""
        self.ephemeral = is_ephemeral(name)
        self._on_paused_changed = on_paused_changed
        self._paused = False
        self.exiting = False
        self.clients: dict[int, Subscription] = {}
        self.message_count = 0
        self.requeue_count = 0
        self.timeout_count = 0
        self.last_backend_error: BackendError | None = None
        """The last error a backend write raised (None once a write succeeds again)."""
        self._on_last_client_removed = on_last_client_removed
        self._on_health = on_health
        self._rng = rng if rng is not None else random.Random()
        disk = backend.stored
        if durable is None:
            durable = disk is not None and disk.ack_mode
        self._syncer = syncer
        self._deferred_store_factory = deferred_store
        self._dq: BackendQueue | None = None
        """The deferred store, once opened (``deferred_store(create)`` opens it)."""
        self._acks: DurableAcks | None = (
            DurableAcks(self._stored_main, self._stored_deferred, syncer, cursor)
            if durable
            else None
        )
        """Durable channels only: where FIN'd messages are acknowledged."""
        # nsqd gives ephemeral channels a memory queue even with --mem-queue-size 0 (an
        # unbuffered Go channel: a put succeeds only while a ready consumer is waiting).
        # ``_memory_limit`` reproduces that with the consumers' free RDY room. A durable channel
        # writes what must be stored straight to disk (limit 0) and holds in memory only what
        # is unacknowledged on disk anyway.
        self._mem_size = 0 if self._acks is not None else options.mem_queue_size
        self._unbuffered = self.ephemeral and self._mem_size == 0
        self._queue = SpillQueue(backend, self._mem_size, self._backend_changed)
        self._release_check = math.inf
        """``--durable``: when to look for in-flight messages holding an old log segment."""
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
        self._want_delivery = False
        if deferred_store is not None:
            self._dq = deferred_store(False)  # an existing store: restore what it holds
            if self._dq is not None and self._dq.depth:
                self._load_deferred()

    def __repr__(self) -> str:
        return f"<Channel {self.topic_name}:{self.name}>"

    # -- sizes -------------------------------------------------------------------------------

    @property
    def depth(self) -> int:
        """Ready messages: the own store and what the cursor has not read yet (in-flight and
        deferred excluded, as nsqd)."""
        cursor = self.cursor
        return len(self._queue) + (cursor.unread if cursor is not None else 0)

    @property
    def backend_depth(self) -> int:
        """Of ``depth``, the messages on disk (own store and the topic's log)."""
        cursor = self.cursor
        return self.backend.depth + (cursor.unread_on_disk if cursor is not None else 0)

    @property
    def durable(self) -> bool:
        """Whether every message is on disk until FIN (``--durable``, not ephemeral)."""
        return self._acks is not None

    @property
    def paused(self) -> bool:
        """Whether delivery is paused (persisted in the metadata file)."""
        return self._paused

    @paused.setter
    def paused(self, value: bool) -> None:
        if value != self._paused:
            self._paused = value
            if self._on_paused_changed is not None:
                self._on_paused_changed()

    @property
    def disk_queues(self) -> tuple[StoredQueue, ...]:
        """Every queue of this channel stored on disk (its own store and its deferred store,
        once open), durable or not: what it costs on disk beside its topic's log."""
        queues = (self.backend, self._dq)
        return tuple(s for q in queues if q is not None and (s := q.stored) is not None)

    @property
    def deferred_store(self) -> StoredQueue | None:
        """The deferred store on disk, once open."""
        return self._stored_deferred()

    def hold_deferred(self, messages: Sequence[Message]) -> None:
        """Deferred messages held in memory only (their store could not take them)."""
        for m in messages:
            self._deferred.push(m)
        self._wake_at(self._deferred.next_deadline())

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
        queue, the rest onto the ready queue. Does not deliver (the topic's pump calls
        ``deliver`` once per batch).

        A durable channel writes all of them (deferred ones too, with their time) to its queues
        and raises ``BackendError`` having stored none of them.
        """
        if self.exiting:
            return
        if self._acks is not None:
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

    def push_deferred(self, messages: Sequence[Message], now: float) -> None:
        """The topic's pump hands over deferred messages (DPUB) from its stream, which the
        cursor steps over: into the deferred queue (or, due already, the own store). Not
        counted in ``message_count`` (the pump counts every message it hands on).

        A durable channel writes them to its deferred store and raises ``BackendError``
        having stored none of them.
        """
        if self.exiting or not messages:
            return
        if self._acks is not None:
            self._store_deferred(messages)
            return
        due = [m for m in messages if m.deliver_at <= now]
        for m in messages:
            if m.deliver_at > now:
                self._deferred.push(m)
        self._wake_at(self._deferred.next_deadline())
        if due:
            self._enqueue(due)
            self._request_delivery()

    def _put_durable(self, messages: Sequence[Message], now: float) -> None:
        deferred = [m for m in messages if m.deliver_at > now]
        ready = [m for m in messages if m.deliver_at <= now] if deferred else messages
        if deferred:
            # First, so that a failure here stores nothing (a failure of the main write below
            # leaves these stored: the topic's retry duplicates them, never loses them).
            self._store_deferred(deferred)
        if ready:
            self._queue.put_many(ready)  # limit 0: straight to disk, all or none

    # -- the deferred store --------------------------------------------------------------------

    def _stored_deferred(self) -> StoredQueue | None:
        return self._dq.stored if self._dq is not None else None

    def _stored_main(self) -> StoredQueue | None:
        return self.backend.stored

    def _backend_changed(self) -> None:
        # After each own-store write or read: the syncer counts them (``--sync-every``).
        stored = self.backend.stored
        if self._syncer is not None and stored is not None:
            self._syncer.note_dirty(stored)

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

    def _load_deferred(self, in_flight: dict[bytes, Message] | None = None) -> None:
        """Read the whole deferred store into the deferred heap (it is always read to its end).

        ``in_flight``: messages just copied there while they are in flight (``_release_log``),
        by id: their copies are not deferred, they stand for them on disk.
        """
        dq = self._dq
        assert dq is not None
        acks = self._acks
        while dq.depth:
            got = dq.read_many(dq.depth)
            if not got:
                break  # unreadable bytes were set aside or reading paused: see the storage log
            for m in got:
                held = in_flight.pop(m.id, None) if in_flight else None
                if held is not None and acks is not None:
                    acks.alias(held, m)
                    continue
                if acks is not None:
                    acks.from_store((m,))
                self._deferred.push(m)
        stored = dq.stored
        if self._syncer is not None and stored is not None:
            self._syncer.note_dirty(stored)
        self._wake_at(self._deferred.next_deadline())

    def _memory_limit(self) -> int:
        if not self._unbuffered:
            return self._mem_size
        if self.paused:
            return 0
        return sum(max(0, s.free) for s in self.clients.values())

    def _enqueue(self, messages: Sequence[Message]) -> None:
        """Messages the channel already owns (from its topic, requeued, timed out, due) onto
        the ready queue; a failed backend write holds them in memory (``SpillQueue``)."""
        queue = self._queue
        if self._acks is not None:
            self._enqueue_durable(messages)
            return
        if self._unbuffered:
            queue.limit = self._memory_limit()
        error = queue.put_many_or_hold(messages)
        if error is not None:
            log.error(
                "CHANNEL(%s:%s): backend write of %d messages failed, kept in memory - %s",
                self.topic_name,
                self.name,
                len(messages),
                error,
            )
            if self.last_backend_error is None and self._on_health is not None:
                self._on_health(str(error))
            self.last_backend_error = error
        elif self.last_backend_error is not None and queue.wrote_backend:
            if self._on_health is not None:
                self._on_health(None)
            self.last_backend_error = None

    def _enqueue_durable(self, messages: Sequence[Message]) -> None:
        """Requeued, timed-out or due messages of a durable channel. Those still holding the
        log are written to the own store (the log's low-water mark must not wait for them),
        their offsets settled once that copy is fsynced; the others are unacknowledged in a
        store already, so memory holds them without risk (at most what was in flight or
        deferred)."""
        queue = self._queue
        pinning = [m for m in messages if m.offset >= 0]
        if pinning:
            try:
                queue.put_many(pinning)  # limit 0: straight to the own store's disk
            except BackendError as exc:
                log.error(
                    "CHANNEL(%s:%s): cannot store %d requeued messages (kept in memory, "
                    "unsettled in the log) - %s",
                    self.topic_name,
                    self.name,
                    len(pinning),
                    exc,
                )
                if self._on_health is not None:
                    self._on_health(str(exc))  # the syncer's next good round clears it
                queue.hold(pinning)
            else:
                acks = self._acks
                assert acks is not None
                acks.ack_when_copied(pinning, self.backend.stored)
            if len(pinning) == len(messages):
                return
            messages = [m for m in messages if m.offset < 0]
        queue.hold(messages)

    def _take(self, count: int, now: float) -> list[Message]:
        """Remove up to ``count`` ready messages: the own store (memory, then its backend),
        then the cursor."""
        queue = self._queue
        out = queue.take_memory(count)
        in_flight = self._in_flight
        seen: set[bytes] | None = None
        if self._acks is not None and out:
            # Durable: after a crash, a message can be here twice (the topic pumped it again,
            # or it was read again from a store): one id is in flight only once.
            out, seen = self._unique(out, count)
        if len(out) == count:
            return out
        while len(out) < count and self.backend.depth > 0:
            got = queue.read_backend(count - len(out))
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
        cursor = self.cursor
        if cursor is not None and len(out) < count and cursor.has_unread:
            self._take_cursor(cursor, count, now, out)
        if self._deferred:
            self._wake_at(self._deferred.next_deadline())
        return out

    def _unique(self, taken: list[Message], count: int) -> tuple[list[Message], set[bytes]]:
        """``taken`` from memory without duplicates (of each other or of what is in flight),
        topped up from memory up to ``count``."""
        in_flight = self._in_flight
        seen: set[bytes] = set()
        out: list[Message] = []
        while taken:
            for m in taken:
                if m.id in in_flight or m.id in seen:
                    self._drop_duplicate(m)
                else:
                    seen.add(m.id)
                    out.append(m)
            taken = self._queue.take_memory(count - len(out)) if len(out) < count else []
        return out, seen

    def _take_cursor(
        self, cursor: ChannelCursor, count: int, now: float, out: list[Message]
    ) -> None:
        """Read from the cursor into ``out`` up to ``count`` messages."""
        got = cursor.read(count - len(out))
        if not got:
            return
        if self._acks is None and not cursor.replay_until:
            out += got
            return
        # Durable (a restart may read again what the own store also had) or a replay (which
        # reads deferred messages): look at each one.
        in_flight = self._in_flight
        seen = {m.id for m in out}
        for m in got:
            msg_id = m.id
            if msg_id in in_flight or msg_id in seen:
                self._drop_duplicate(m)
            elif m.deliver_at > now:
                self._defer_read(m)
            else:
                seen.add(msg_id)
                out.append(m)

    def _defer_read(self, m: Message) -> None:
        """A deferred message read from the cursor (a replay): held until it is due."""
        if self._acks is not None:
            try:
                self._store_deferred((m,))
            except BackendError as exc:
                log.warning(
                    "CHANNEL(%s:%s): cannot store a deferred message (kept in memory, "
                    "unsettled in the log): %s",
                    self.topic_name,
                    self.name,
                    exc,
                )
            else:
                self._acks.ack_when_copied((m,), self._stored_deferred())
                return
        self._deferred.push(m)

    def _drop_duplicate(self, m: Message) -> None:
        log.debug(
            "CHANNEL(%s:%s): dropping a duplicate of %s read from disk while it is in flight",
            self.topic_name,
            self.name,
            m.id.decode("ascii", "replace"),
        )
        if self._acks is not None:
            self._acks.ack((m,))

    # -- consumers -----------------------------------------------------------------------------

    def add_consumer(self, consumer: Consumer) -> Subscription:
        """Subscribe ``consumer`` (it starts with its own RDY, normally 0)."""
        if self.exiting:
            raise TopicExiting(f"channel {self.topic_name}:{self.name} is exiting")
        subscription = self.clients.get(consumer.id)
        if subscription is not None:
            return subscription
        limit = self.options.max_channel_consumers
        if limit and len(self.clients) >= limit:
            raise TooManyConsumers(
                f"consumers for {self.topic_name}:{self.name} exceeds limit of {limit}"
            )
        subscription = self.clients[consumer.id] = Subscription(consumer)
        self._request_delivery()
        return subscription

    def remove_consumer(self, subscription: Subscription) -> None:
        """Unsubscribe and requeue its in-flight messages at once (nsqd waits for their
        timeout). An ephemeral channel left without consumers asks to be deleted."""
        if self.clients.pop(subscription.id, None) is None:
            return
        if self.exiting:
            return
        cid = subscription.id
        mine = [m for m in self._in_flight if m.client_id == cid]
        if mine:
            for m in mine:
                self._in_flight.remove(m.id)
            subscription.in_flight_count -= len(mine)
            self.requeue_count += len(mine)
            self._enqueue(mine)
            log.debug(
                "CHANNEL(%s:%s): client %d left, requeued %d in-flight",
                self.topic_name,
                self.name,
                cid,
                len(mine),
            )
            self._request_delivery()
        if self.ephemeral and not self.clients and self._on_last_client_removed is not None:
            self._on_last_client_removed(self)

    def consumer_ready(self) -> None:
        """A consumer's RDY window may have opened (RDY, its output drained)."""
        self._request_delivery()

    # -- in-flight operations -----------------------------------------------------------------

    def _owned(self, subscription: Subscription, msg_id: bytes) -> Message:
        msg = self._in_flight.get(msg_id)
        if msg is None:
            raise NotInFlight()
        if msg.client_id != subscription.id:
            raise NotOwner()
        return msg

    def finish(self, subscription: Subscription, msg_id: bytes, now: float) -> None:
        """FIN: the message is done. Raises ``NotInFlight`` / ``NotOwner``."""
        msg = self._in_flight.remove_owned(msg_id, subscription.id)
        subscription.in_flight_count -= 1
        subscription.finish_count += 1
        if self._acks is not None:
            self._acks.ack((msg,))
        if self.e2e_stream is not None:
            self.e2e_stream.record(now, time.time_ns() - msg.timestamp)
        self._request_delivery()

    def finish_many(
        self, subscription: Subscription, msg_ids: Sequence[bytes], now: float
    ) -> list[tuple[bytes, ChannelError]]:
        """FIN several messages of one consumer (a buffer's worth), in order. Returns the
        failures as ``(msg_id, error)`` in order instead of raising."""
        done, failed = self._in_flight.remove_many_owned(msg_ids, subscription.id)
        if done:
            subscription.in_flight_count -= len(done)
            subscription.finish_count += len(done)
            if self._acks is not None:
                self._acks.ack(done)
            e2e = self.e2e_stream
            if e2e is not None:
                wall = time.time_ns()
                for m in done:
                    e2e.record(now, wall - m.timestamp)
            self._request_delivery()
        return failed

    def requeue(self, subscription: Subscription, msg_id: bytes, delay: float, now: float) -> None:
        """REQ: back to the queue (``delay`` 0) or deferred for ``delay`` seconds (already
        clamped by the caller). Attempts are kept. Raises ``NotInFlight`` / ``NotOwner``."""
        msg = self._in_flight.remove_owned(msg_id, subscription.id)
        subscription.in_flight_count -= 1
        subscription.requeue_count += 1
        self.requeue_count += 1
        if delay > 0:
            msg.deliver_at = now + delay
            if self._acks is not None:
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
                    self._acks.ack_when_copied((msg,), self._stored_deferred())
                    self._request_delivery()  # its RDY slot is free again
                    return
            self._deferred.push(msg)
            self._wake_at(msg.deliver_at)
        else:
            self._enqueue((msg,))
        self._request_delivery()

    def touch(self, subscription: Subscription, msg_id: bytes, now: float) -> None:
        """TOUCH: reset the deadline to ``now + msg_timeout``, capped at delivery time +
        ``--max-msg-timeout``. Raises ``NotInFlight`` / ``NotOwner``."""
        msg = self._owned(subscription, msg_id)
        deadline = min(
            now + subscription.consumer.msg_timeout,
            msg.delivered_at + self.options.max_msg_timeout,
        )
        self._in_flight.set_deadline(msg, deadline)
        self._wake_at(deadline)

    # -- delivery ----------------------------------------------------------------------------

    def deliver(self, now: float) -> None:
        """Hand ready messages to consumers with room in their RDY window (see module doc)."""
        self._want_delivery = False
        if self.paused or self.exiting or not self.clients:
            return
        if not self._has_ready():
            return
        rng = self._rng
        in_flight = self._in_flight
        batches: dict[int, list[Message]] = {}
        earliest = math.inf
        while True:
            ready = [(s, free) for s in self.clients.values() if (free := s.free) > 0]
            if not ready:
                break
            room = sum(r for _, r in ready)
            msgs = self._take(room, now)
            if not msgs:
                break
            n = len(msgs)
            dropped = False
            start = 0
            for sub, take in split_batch(ready, n, room, rng):
                chunk = msgs if take == n else msgs[start : start + take]
                start += take
                consumer = sub.consumer
                rate = consumer.sample_rate
                if rate > 0:
                    # nsqd: skip (and so drop for this channel) when randrange(100) > rate.
                    randrange = rng.randrange
                    kept = [m for m in chunk if randrange(100) <= rate]
                    if len(kept) < len(chunk):
                        dropped = True
                        if self._acks is not None:  # sampled out = done, for this channel
                            keep = set(map(id, kept))
                            self._acks.ack([m for m in chunk if id(m) not in keep])
                        chunk = kept
                    if not chunk:
                        continue
                deadline = now + consumer.msg_timeout
                cid = sub.id
                in_flight.start_many(chunk, cid, now, deadline)
                k = len(chunk)
                sub.in_flight_count += k
                sub.message_count += k
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
            if self._acks is not None and self._release_check == math.inf:
                self._release_check = now + RELEASE_CHECK_S
        clients = self.clients
        for cid, batch in batches.items():
            clients[cid].consumer.write_messages(batch)

    # -- timers ------------------------------------------------------------------------------

    def _wake_at(self, deadline: float) -> None:
        scope = self._sleep_scope
        if scope is not None and deadline < scope.deadline:
            scope.deadline = deadline

    def _has_ready(self) -> bool:
        cursor = self.cursor
        return bool(
            self._queue.memory_count
            or self.backend.depth
            or (cursor is not None and cursor.has_unread)
        )

    def _request_delivery(self) -> None:
        """Ask the channel's task for a delivery round (one per wakeup, however many asks);
        nothing to ask while no message is ready (the topic's pump delivers what it brings)."""
        if not self._want_delivery and self._has_ready():
            self._want_delivery = True
            self._wake_at(-math.inf)

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
                sub = clients.get(m.client_id)
                if sub is not None:
                    sub.in_flight_count -= 1
            self._enqueue(expired)
        due = self._deferred.pop_due(now)
        if due:
            self._enqueue(due)
        if now >= self._release_check:
            self._release_log(now)

    def next_deadline(self) -> float:
        """The earliest in-flight timeout or deferred release time (``math.inf`` if none)."""
        return min(
            self._in_flight.next_deadline(), self._deferred.next_deadline(), self._release_check
        )

    def _release_log(self, now: float) -> None:
        """``--durable``: in-flight messages that hold the log's low-water mark in a segment
        older than the one being written are copied to the deferred store, due at their
        deadline (where a crash would bring them back), and their offsets settled once that
        copy is fsynced: a message held long keeps neither old segments on disk nor a crash
        replaying everything after it."""
        cursor = self.cursor
        acks = self._acks
        self._release_check = math.inf
        if cursor is None or acks is None or not cursor.unsettled_count:
            return
        self._release_check = now + RELEASE_CHECK_S
        log_ = cursor.stream.log
        if log_ is None:
            return
        base = log_.write_segment_base
        if cursor.low >= base:
            return
        held = [m for m in self._in_flight if 0 <= m.offset < base]
        if not held:
            return  # held by requeues whose copies are being synced: they settle soon
        copies = [
            Message(m.id, m.body, m.timestamp, m.attempts, max(m.deadline, now)) for m in held
        ]
        try:
            dq = self._open_deferred_store()
            if dq is None:
                return
            dq.put_many(copies)
        except BackendError as exc:
            log.warning(
                "CHANNEL(%s:%s): cannot copy %d long-held messages to the deferred store "
                "(they keep holding the log): %s",
                self.topic_name,
                self.name,
                len(held),
                exc,
            )
            return
        by_id = {m.id: m for m in held}
        offsets = [m.offset for m in held]
        for m in held:
            m.offset = -1  # its copy in the deferred store stands for it from now on
        self._load_deferred(by_id)
        acks.settle_when_copied(offsets, dq.stored)
        log.debug(
            "CHANNEL(%s:%s): %d long-held messages copied to the deferred store",
            self.topic_name,
            self.name,
            len(held),
        )

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The channel's task: sleep until the earliest deadline or a delivery request, process
        everything due, deliver; returns when the channel is closed or deleted. Call once."""
        with self._run_scope:
            task_status.started()
            while not self.exiting:
                deadline = -math.inf if self._want_delivery else self.next_deadline()
                with trio.CancelScope(deadline=deadline) as sleep:
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
        """Resume delivering."""
        self.paused = False
        self._request_delivery()

    def empty(self) -> None:
        """Drop every ready, in-flight and deferred message and zero the consumers' in-flight
        counts (nsqd ``Channel.Empty``)."""
        self._queue.empty()
        if self._dq is not None:
            self._dq.empty()
        if self._acks is not None:
            self._acks.clear()
        self._in_flight.clear()
        self._deferred.clear()
        for sub in self.clients.values():
            sub.in_flight_count = 0
        if self.cursor is not None:
            # What the topic has handed on is this channel's queue: it now reads from the end.
            self.cursor.seek(self.cursor.stream.pumped)

    def seek(self, offset: int) -> int:
        """Read the topic's stream from ``offset`` on (clamped to what is stored): a replay, or
        a jump ahead. In-flight, requeued and deferred messages stay and settle as usual.
        Returns the new position. Raises ``ValueError`` for a channel without a cursor
        (ephemeral: nothing of it is stored)."""
        if self.cursor is None:
            raise ValueError(f"channel {self.topic_name}:{self.name} has no stored stream")
        position = self.cursor.seek(offset)
        self._request_delivery()
        return position

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
        ready = self._queue.memory()
        ready += self._in_flight.clear()
        deferred = self._deferred.clear()
        self._queue.clear_memory()
        ok, copied = self._flush(ready, deferred)
        # One group of jobs: every queue's data is fsynced before any positions file is written,
        # so an acknowledgement in one queue never becomes durable before the copy in the other.
        jobs = [job for q in self.disk_queues if (job := q.prepare_sync()) is not None]
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
        if self._acks is not None and ok:
            # The copies are durable: the originals are done where they were (the queues'
            # positions are persisted as they close, the log's cursor as the topic closes).
            self._acks.ack(copied)
            self._acks.ack_superseded()
        self.backend.close()
        if self._dq is not None:
            self._dq.close()
        log.info("CHANNEL(%s:%s): closed", self.topic_name, self.name)
        return ok

    def _flush(
        self, ready: list[Message], deferred: list[Message]
    ) -> tuple[bool, list[Message]]:
        """``close``: ready and in-flight messages to the own store, deferred ones (with their
        deadlines) to the deferred store. Returns (all written, the messages written: a durable
        channel acknowledges those originals once the copies are synced)."""
        ok = True
        copied: list[Message] = []
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
                copied += deferred
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
                copied += ready
        return ok, copied

    def delete(self) -> None:
        """Delete: stop the timer, drop every message and the backend's storage, and close the
        subscribed consumers' connections (nsqd does). Idempotent."""
        if self.exiting:
            return
        self.exiting = True
        self._run_scope.cancel()
        for sub in list(self.clients.values()):
            sub.consumer.close()
        self._queue.clear_memory()
        self._in_flight.clear()
        self._deferred.clear()
        if self._acks is not None:
            self._acks.clear()
        if self.cursor is not None:
            self.cursor.delete()
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
        """A frozen snapshot for /stats; consumer snapshots come from the consumers."""
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
                tuple(s.consumer.statistics() for s in self.clients.values())
                if include_clients
                else None
            ),
            paused=self.paused,
            e2e_processing_latency=self.e2e_latency(),
            storage_damage=storage_damage(q.damage for q in self.disk_queues),
        )

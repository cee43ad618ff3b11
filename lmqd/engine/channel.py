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
ready_count``; RDY is a window, never decremented) and in their output (``Consumer.byte_room``).
A round takes as many messages as the total free room (own store first, then the cursor), but no
more than the byte rooms hold at the last round's mean body size, then splits them over the
ready consumers (``lmqd.engine.delivery.split_batch``: random order, evenly); when the round's
bodies add up to more than the smallest byte room, each share is cut to its consumer's room
(``fit_bytes``, one message at least) and the rest goes back to the own store, not in flight,
for the consumers still with room. The bodies are summed only when the round may come near a
room: what the round read from the cursor is bounded by its topic stream's byte marks
(``bytemarks.py``: no look at the messages), so a round of small messages costs no sum. Every
consumer gets at most one ``write_messages`` call per round, so its writer wakes once.

Delivered messages sit in the ``InFlightQueue`` until FIN, REQ, TOUCH or their deadline;
deferred ones (REQ with a delay, DPUB) in the ``DeferredQueue``. Messages with an lmq priority
wait in the channel's ``PriorityLanes`` (``lanes.py``), which delivery empties first, highest
level first: the topic's pump pushes them there, as it pushes deferred messages to the deferred
queue, and requeues, timeouts and due deferred messages with a priority go back there. The
channel's task sleeps in a ``trio.CancelScope`` whose deadline is the earliest of both queues
(or now, when a delivery was asked for); pushing an earlier deadline lowers that scope's
deadline directly (no per-message Event or task), and on wakeup everything due is processed at
once, then ``deliver`` runs once. The task exists only while it has something to wait for: the
first deadline or delivery request starts it in the nursery the topic attached (``attach``), and
it ends once nothing is in flight, deferred or asked for and nothing was delivered for
``TASK_IDLE_S``, so an idle channel holds no task.

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
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING

import trio

from lmqd.engine.backend import (
    BackendError,
    BackendQueue,
    MemoryBackend,
    StoredQueue,
    Syncable,
    storage_damage,
)
from lmqd.engine.channel_policy import ChannelPolicy, PolicyError, PolicyValue
from lmqd.engine.cursor import ChannelCursor
from lmqd.engine.deferred import DeferredQueue
from lmqd.engine.delivery import body_bytes, fit_bytes, split_batch
from lmqd.engine.durable import DurableAcks
from lmqd.engine.e2e import E2eLatencyStream, new_stream
from lmqd.engine.inflight import ChannelError, InFlightQueue, NotInFlight, NotOwner
from lmqd.engine.lanes import LANE_SUFFIX, PriorityLanes, by_level, priority_of
from lmqd.engine.policy import shared_default
from lmqd.engine.salvage import Salvage
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
    "DEAD_LETTER_RETRY_S",
    "SCREEN_BUDGET",
    "SCREEN_CHUNK",
    "TASK_IDLE_S",
    "Channel",
    "ChannelError",
    "DeadLetterSink",
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


TASK_IDLE_S = 10.0
"""A channel's task with nothing in flight, deferred or asked for waits this long before it
ends (``_serve``): a channel whose messages come more often than that keeps one task (a
delivery only moves its deadline) instead of starting one per message (tens of microseconds
each); a channel idle longer holds no task."""


SCREEN_BUDGET = 2048
"""Channel policies: about the most messages one delivery round takes and gives up (expired,
or out of attempts) before it yields (it stops at the first chunk past it); the next round goes
on at once. Given up in chunks, a message costs ~2.5 us (``SCREEN_CHUNK``), so a round stays
near 5 ms however long the queue of expired messages is, and delivery of the live ones behind
it is not held back for longer than that (the topic's pump batch, ``PUMP_BATCH``, is of the same
size for the same reason)."""

SCREEN_CHUNK = 256
"""Under a policy, once a round found messages to give up, the fewest it takes at a time however
little room the consumers have: an expired backlog is then given up (one dead-letter publish)
256 at a time, not one by one behind a consumer with RDY 1 (tests/engine, a recording sink:
~18 us a message one by one, ~2.5 us in chunks). The unexpired surplus goes back to the front
of the channel's memory."""

DEAD_LETTER_RETRY_S = 1.0
"""When the dead-letter topic could not take a message (its disk failed, it is being deleted),
the message waits this long in the channel's deferred queue and is tried again: a retry a
second costs nothing, and a disk that failed rarely recovers faster."""

REASON_EXPIRED = "expired"
REASON_MAX_ATTEMPTS = "max_attempts"

DeadLetterSink = Callable[["Channel", Sequence[Message], str], Syncable | None]
"""``sink(channel, messages, reason)``: publish ``messages`` to ``channel.policy``'s dead-letter
topic (the broker's); returns what to wait for before they are durable there (None: nothing),
raises ``BackendError`` or ``TopicExiting`` having published none of them."""


_SHARED_RNG = random.Random()
"""The channels' random source unless they are given one (tests give a seeded one): delivery's
shuffles and the backoff's jitter need no stream per channel, and a ``Random`` is 2.5 KB."""


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

    # Slots: no per-instance dict (a channel is one of tens of thousands, idle, in a big
    # daemon: ~1 KB and a GC-tracked object less each).
    __slots__ = (
        "_acks", "_body_estimate", "_busy_at", "_dead_letter_sink", "_deferred",
        "_deferred_store_factory", "_dq", "_expired_seen", "_in_flight", "_lane_backend", "_lanes",
        "_mem_size", "_message_ttls", "_nursery", "_on_health", "_on_last_client_removed",
        "_on_paused_changed", "_paused", "_queue", "_release_check", "_rng", "_screening",
        "_sleep_scope", "_syncer", "_task_running", "_unbuffered", "_wall_clock", "_want_delivery",
        "backend", "clients", "cursor", "dead_letter_count", "e2e_stream", "ephemeral", "exiting",
        "expired_count", "last_backend_error", "max_attempts_dropped_count", "message_count",
        "name", "options", "policy", "policy_settings", "requeue_count", "timeout_count",
        "topic_name", "ttl_ns",
    )

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
        deferred_store: Callable[[str, str, bool], BackendQueue | None] | None = None,
        cursor: ChannelCursor | None = None,
        durable: bool | None = None,
        dead_letter: DeadLetterSink | None = None,
        wall_clock: Callable[[], int] = time.time_ns,
        on_paused_changed: Callable[[], None] | None = None,
        lane_backend: Callable[[str, str, int], BackendQueue] | None = None,
        stored_lanes: Sequence[int] = (),
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
        self.policy_settings: dict[str, PolicyValue] = {}
        """The channel's own policy keys (``channel_policy.py``), persisted with the metadata."""
        self.policy = shared_default(
            ChannelPolicy, options, lambda: ChannelPolicy.effective(options, {})
        )
        """The effective policy: the daemon's defaults, then ``policy_settings``."""
        self.ttl_ns = 0
        """The topic's ``ttl_ms`` in ns (0: none); the topic sets it."""
        self.dead_letter_count = 0
        """Messages published to the dead-letter topic (expired or out of attempts)."""
        self.expired_count = 0
        """Messages given up because the topic's TTL ran out (dead-lettered or dropped)."""
        self.max_attempts_dropped_count = 0
        """Messages out of attempts dropped for want of a dead-letter topic."""
        self._dead_letter_sink = dead_letter
        self._wall_clock = wall_clock
        self._screening = False
        self._message_ttls = False
        """Some message of the topic has its own TTL (lmq's extension): screened too."""
        """Whether delivery looks at each message taken (a TTL or ``max_attempts`` is set)."""
        self._expired_seen = False
        """A message taken had expired: the next take skips the expired backlog in the log."""
        self._on_last_client_removed = on_last_client_removed
        self._on_health = on_health
        self._rng = rng if rng is not None else _SHARED_RNG
        disk = backend.stored
        if durable is None:
            durable = disk is not None and disk.ack_mode
        self._syncer = syncer
        self._deferred_store_factory = deferred_store
        self._dq: BackendQueue | None = None
        """The deferred store, once opened (``deferred_store(topic, channel, create)`` opens
        it: the topic's factory, shared by its channels)."""
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
        self._mem_size = 0 if self._acks is not None else options.mem_queue_limit
        self._unbuffered = self.ephemeral and self._mem_size == 0
        self._queue = SpillQueue(
            backend, self._mem_size, syncer.backend_changed if syncer is not None else None
        )
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
        self._nursery: trio.Nursery | None = None
        """Where the channel's task runs while it has something to wait for (``attach``)."""
        self._task_running = False
        """The channel's task is started (and not yet ended)."""
        self._busy_at = -math.inf
        """When the last delivery round handed messages on (or the task started): the task
        ends ``TASK_IDLE_S`` after it, once it has nothing else to wait for."""
        self._sleep_scope: trio.CancelScope | None = None
        self._want_delivery = False
        self._body_estimate = max(options.max_msg_size, 1)
        """The mean body size of the last delivery round (before the first: the largest
        allowed): ``deliver`` takes no more messages than the consumers' byte rooms hold at
        that size, so big messages are not read from the log only to be put back."""
        self._lane_backend = lane_backend
        self._lanes: PriorityLanes | None = None
        """The priority lanes, once a message with a priority came (or stored ones exist)."""
        if stored_lanes:
            self._ensure_lanes(stored_lanes)
        if deferred_store is not None:
            # An existing store: restore what it holds.
            self._dq = deferred_store(topic_name, name, False)
            if self._dq is not None and self._dq.depth:
                self._load_deferred()
        if any(
            q is not None and q.stored_message_ttls
            for q in (backend.stored, self._stored_deferred())
        ):
            self.note_message_ttls()  # an earlier run stored messages with their own TTL

    def __repr__(self) -> str:
        return f"<Channel {self.topic_name}:{self.name}>"

    # -- sizes -------------------------------------------------------------------------------

    @property
    def depth(self) -> int:
        """Ready messages: the own store and what the cursor has not read yet (in-flight and
        deferred excluded, as nsqd)."""
        cursor = self.cursor
        lanes = self._lanes
        return (
            len(self._queue)
            + (cursor.unread if cursor is not None else 0)
            + (len(lanes) if lanes is not None else 0)
        )

    @property
    def backend_depth(self) -> int:
        """Of ``depth``, the messages on disk (own store and the topic's log)."""
        cursor = self.cursor
        lanes = self._lanes
        return (
            self.backend.depth
            + (cursor.unread_on_disk if cursor is not None else 0)
            + (lanes.backend_depth if lanes is not None else 0)
        )

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
        """Every queue of this channel stored on disk (its own store, its deferred store and
        its priority lanes' stores, once open), durable or not: what it costs on disk beside its
        topic's log."""
        queues = (self.backend, self._dq)
        stored = tuple(s for q in queues if q is not None and (s := q.stored) is not None)
        return stored + self._lanes.stored if self._lanes is not None else stored

    @property
    def priority_depths(self) -> dict[int, int]:
        """Ready messages waiting in the priority lanes, by level (lmq's extension)."""
        return self._lanes.depths() if self._lanes is not None else {}

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
        for m in messages:
            if m.deliver_at > now or m.ext is not None:
                # Rare (DPUB, lmq's extension): look at each only when one is of those.
                self.push(messages, now)
                return
        self._enqueue(messages)

    def push(self, messages: Sequence[Message], now: float) -> list[tuple[StoredQueue, list[int]]]:
        """The topic's pump hands over the pushed messages of its stream (deferred ones and
        those with a priority), which the cursor steps over: into the deferred queue, or the
        priority lanes, or (due already, no priority) the own store. Not counted in
        ``message_count`` (the pump counts every message it hands on).

        A durable channel writes them to its deferred store (the deferred ones) and its
        lanes' stores, and returns each store written with the offsets of the messages it took
        (durable once it is synced). If a store fails, the messages it did not take are held
        in memory (their offsets cleared) and ``BackendError`` is raised.
        """
        if self.exiting or not messages:
            return []
        if self._lanes is None and any(map(priority_of, messages)):
            self._ensure_lanes()
        if self._acks is not None:
            return self._push_durable(messages)
        due = [m for m in messages if m.deliver_at <= now]
        if len(due) < len(messages):
            for m in messages:
                if m.deliver_at > now:
                    self._deferred.push(m)
            self._wake_at(self._deferred.next_deadline())
        if due:
            self._enqueue(due)
            self._request_delivery()
        return []

    def _push_durable(self, messages: Sequence[Message]) -> list[tuple[StoredQueue, list[int]]]:
        written: list[tuple[StoredQueue, list[int]]] = []
        deferred = [m for m in messages if m.deliver_at > 0]
        lanes = self._lanes
        ranked = [m for m in messages if not m.deliver_at] if deferred else messages
        try:
            if deferred:
                self._store_deferred(deferred)
                store = self._stored_deferred()
                if store is not None:
                    written.append((store, [m.offset for m in deferred]))
                deferred = []
            if lanes is not None and ranked:
                for level, lane in lanes.put_many(ranked).items():
                    store = lane.backend.stored
                    if store is not None:
                        written.append(
                            (store, [m.offset for m in ranked if priority_of(m) == level])
                        )
                ranked = []
        except BackendError:
            done = {offset for _, offsets in written for offset in offsets}
            held = [m for m in (*deferred, *ranked) if m.offset not in done]
            for m in held:
                m.offset = -1  # the pin stays: a restart pumps them again
            self._hold_pushed(held)
            raise
        return written

    def _hold_pushed(self, messages: Sequence[Message]) -> None:
        """Pushed messages held in memory only (their store could not take them)."""
        deferred = [m for m in messages if m.deliver_at]
        if deferred:
            self.hold_deferred(deferred)
        ranked = [m for m in messages if not m.deliver_at]
        if ranked and self._lanes is not None:
            self._lanes.hold(ranked)
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

    def _open_deferred_store(self) -> BackendQueue | None:
        """The deferred store, opened if needed; None if this channel has none (not stored on
        disk). Raises ``BackendError`` if it cannot be opened."""
        if self._dq is None and self._deferred_store_factory is not None:
            self._dq = self._deferred_store_factory(self.topic_name, self.name, True)
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

    def _ensure_lanes(self, stored: Sequence[int] = ()) -> PriorityLanes:
        """The priority lanes, made when the first message with a priority comes."""
        lanes = self._lanes
        if lanes is None:
            factory = self._lane_backend
            open_backend = (
                _memory_lane if factory is None else partial(factory, self.topic_name, self.name)
            )
            lanes = self._lanes = PriorityLanes(
                open_backend,
                self._mem_size,
                self._syncer.backend_changed if self._syncer is not None else None,
                stored,
            )
        return lanes

    def _lane_read(self, backend: BackendQueue, messages: list[Message]) -> None:
        # Messages read back from a lane's store: a durable channel acknowledges them there.
        stored = backend.stored
        if self._acks is not None and stored is not None:
            self._acks.from_lane(stored, messages)

    def _enqueue(self, messages: Sequence[Message]) -> None:
        """Messages the channel already owns (from its topic, requeued, timed out, due) onto
        the ready queue, those with a priority into their lanes; a failed backend write holds
        them in memory (``SpillQueue``)."""
        queue = self._queue
        if self._lanes is not None:
            messages = self._enqueue_ranked(messages)
            if not messages:
                return
        if self._acks is not None:
            self._enqueue_durable(messages)
            return
        if self._unbuffered:
            queue.limit = self._memory_limit()
        error = queue.put_many_or_hold(messages)
        self._note_write(error, queue.wrote_backend, count=len(messages))

    def _enqueue_ranked(self, messages: Sequence[Message]) -> Sequence[Message]:
        """Of ``messages``, those with a priority into their lanes; returns the others."""
        groups = by_level(messages)
        if not groups:
            return messages
        lanes = self._lanes
        assert lanes is not None
        ranked = [m for group in groups.values() for m in group]
        if self._acks is None:
            self._note_write(*lanes.put_many_or_hold(ranked), count=len(ranked))
        else:
            # As ``_enqueue_durable``: those still holding the log get a copy in their lane's
            # store, the others are safe in a store already.
            pinning = [m for m in ranked if m.offset >= 0]
            lanes.hold([m for m in ranked if m.offset < 0])
            for level, group in by_level(pinning).items():
                try:
                    lane = lanes.put_many(group)[level]
                except BackendError as exc:
                    self._note_write(exc, False, count=len(group))
                    lanes.hold(group)
                else:
                    assert self._acks is not None
                    self._acks.ack_when_copied(group, lane.backend.stored)
        if len(ranked) == len(messages):
            return ()
        return [m for m in messages if not priority_of(m)]

    def _note_write(self, error: BackendError | None, wrote: bool, *, count: int) -> None:
        """Health after a write of messages the channel owns: bad while a backend refuses."""
        if error is not None:
            log.error(
                "CHANNEL(%s:%s): backend write of %d messages failed, kept in memory - %s",
                self.topic_name,
                self.name,
                count,
                error,
            )
            if self.last_backend_error is None and self._on_health is not None:
                self._on_health(str(error))
            self.last_backend_error = error
        elif self.last_backend_error is not None and wrote:
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

    def _take(self, count: int, now: float, *, ranked: bool = True) -> list[Message]:
        """Remove up to ``count`` ready messages: the own store (memory, then its backend),
        then the cursor; the priority lanes before all of them (unless not ``ranked``)."""
        return self._take_measured(count, now, ranked=ranked)[0]

    def _take_measured(
        self, count: int, now: float, *, ranked: bool = True
    ) -> tuple[list[Message], int, int | None]:
        """``_take``, and what is known of the bodies' size without summing them:
        ``(messages, k, bound)``, the last ``k`` messages (read from the cursor) having at
        most ``bound`` bytes of bodies (None: unknown)."""
        queue = self._queue
        lanes = self._lanes
        if ranked and lanes is not None and lanes:
            out = lanes.take(count, self._lane_read)
            if len(out) < count:
                out += queue.take_memory(count - len(out))
        else:
            out = queue.take_memory(count)
        in_flight = self._in_flight
        seen: set[bytes] | None = None
        if self._acks is not None and out:
            # Durable: after a crash, a message can be here twice (the topic pumped it again,
            # or it was read again from a store): one id is in flight only once.
            out, seen = self._unique(out, count)
        if len(out) == count:
            return out, 0, 0
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
        own = len(out)
        bound: int | None = 0
        if cursor is not None and len(out) < count and cursor.has_unread:
            if self._expired_seen:
                self._skip_expired(cursor)
            bound = self._take_cursor(cursor, count, now, out)
        if self._deferred:
            self._wake_at(self._deferred.next_deadline())
        return out, len(out) - own, bound

    def peek_queued(self, count: int) -> list[tuple[int, Message]]:
        """Up to ``count`` ready messages in the order ``_take`` would take them (the own
        store's, then the cursor's; the priority lanes' first), as (offset or -1, message),
        changing nothing."""
        lanes = self._lanes
        out = [(-1, m) for m in lanes.peek(count)] if lanes is not None else []
        out += [(-1, m) for m in self._queue.peek(count - len(out))] if len(out) < count else []
        if len(out) < count and self.cursor is not None:
            out += self.cursor.peek(count - len(out))
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
    ) -> int | None:
        """Read from the cursor into ``out`` up to ``count`` messages. Returns at least their
        bodies' bytes, from the stream's marks (None: not known without summing them)."""
        marks = cursor.stream.byte_marks
        start = cursor.position
        before = marks.bytes_before(start)
        got = cursor.read(count - len(out))
        if not got:
            return 0
        # The range read: what it holds is at least what is kept of it below.
        bound = marks.bound(start, before, cursor.position)
        if self._acks is None and not cursor.replay_until:
            out += got
            return bound
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
        return bound

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
            if self._screening:
                mine = self._give_up_exhausted(mine, trio.current_time())
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
        if self._screening or self.policy.backs_off:
            self._retry((msg,), now, delay)
        elif delay > 0:
            msg.deliver_at = now + delay
            self._defer_owned((msg,))
        else:
            self._enqueue((msg,))
        self._request_delivery()

    def _defer_owned(self, messages: Sequence[Message]) -> None:
        """Messages the channel owns, their ``deliver_at`` set, into the deferred queue. A
        durable channel writes them to its deferred store (so a long delay does not hold the
        main queue's read position back) and acknowledges the originals once that is synced."""
        if self._acks is not None:
            try:
                self._store_deferred(messages)
            except BackendError as exc:
                log.warning(
                    "CHANNEL(%s:%s): cannot store %d deferred messages (kept unacknowledged "
                    "in memory): %s",
                    self.topic_name,
                    self.name,
                    len(messages),
                    exc,
                )
            else:
                self._acks.ack_when_copied(messages, self._stored_deferred())
                return
        for m in messages:
            self._deferred.push(m)
        self._wake_at(self._deferred.next_deadline())

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
        byte_rooms: dict[int, int] = {}
        earliest = math.inf
        screened = 0
        giving_up = False
        while True:
            ready: list[tuple[Subscription, int]] = []
            for s in self.clients.values():
                free = s.free
                if free > 0:
                    byte_room = byte_rooms.get(s.id)
                    if byte_room is None:
                        byte_room = byte_rooms[s.id] = s.consumer.byte_room()
                    if byte_room > 0:
                        ready.append((s, free))
            if not ready:
                break
            room = sum(r for _, r in ready)
            budget = sum(byte_rooms[s.id] for s, _ in ready)
            # Take no more than the rooms hold at the last round's message size (all the count
            # room for small messages): big messages are not read only to be put back.
            asked = min(room, max(len(ready), budget // self._body_estimate))
            # Once a take had messages to give up, take at least SCREEN_CHUNK: an expired
            # backlog is given up in batches however small the consumers' room (what is left
            # over goes back in front); until then, exactly what is asked (no cost without one).
            want = max(asked, SCREEN_CHUNK) if giving_up else asked
            taken, unsummed, bound = self._take_measured(want, now)
            msgs = taken
            if not msgs:
                break
            dropped = False
            if self._screening:
                screened += len(taken)
                msgs = self._screen(taken, now)
                giving_up = giving_up or len(msgs) < len(taken)
                if len(msgs) > asked:
                    self._requeue_front(msgs[asked:])
                    msgs = msgs[:asked]
                dropped = len(msgs) < asked
                if not msgs:
                    if len(taken) < want:
                        break  # nothing else is ready
                    if screened >= SCREEN_BUDGET:
                        self._want_more()
                        break
                    continue
            n = len(msgs)
            least = min(byte_rooms[s.id] for s, _ in ready)
            # What the stream's marks bound (the messages read from the cursor), plus the sum
            # of the others (requeued, stored, pushed: few, unless the channel has no cursor),
            # is at least the round's bytes (the policy may have given some up): below every
            # room, the round is not tight and its bodies need no sum.
            upper = None
            if bound is not None and unsummed:  # else one exact sum below, not two
                others = len(taken) - unsummed
                upper = bound + body_bytes(taken[:others]) if others else bound
            nbytes: int | None = None  # the exact sum, once made
            if upper is not None and upper < least:
                tight = False
                total = upper
                if upper // n < self._body_estimate:
                    self._body_estimate = max(upper // n, 1)  # the mean is no bigger
            else:
                nbytes = total = body_bytes(msgs)
                self._body_estimate = max(nbytes // n, 1)
                tight = nbytes > least
            leftovers: list[Message] = []
            start = 0
            for sub, take in split_batch(ready, n, room, rng):
                chunk = msgs if take == n else msgs[start : start + take]
                start += take
                # The chunk's bytes for the in-flight heap's compaction rule: the round's
                # (exact, or its upper bound when not summed: the heap then rebuilds early,
                # never late) when it is the whole round (or cut to fit below), else its share
                # of the round (a heuristic's input: no second pass over the bodies).
                size: int | None = total if take == n else total * take // n
                if tight:
                    # This consumer's share may be more than its byte room: it keeps a prefix
                    # that fits (one message at least); the rest goes back to the queue.
                    fit, size = fit_bytes(chunk, byte_rooms[sub.id])
                    byte_rooms[sub.id] -= size
                    if fit < len(chunk):
                        leftovers += chunk[fit:]
                        chunk = chunk[:fit]
                consumer = sub.consumer
                rate = consumer.sample_rate
                if rate > 0:
                    # nsqd: skip (and so drop for this channel) when randrange(100) > rate.
                    randrange = rng.randrange
                    kept = [m for m in chunk if randrange(100) <= rate]
                    if len(kept) < len(chunk):
                        dropped = True
                        size = None
                        if self._acks is not None:  # sampled out = done, for this channel
                            keep = set(map(id, kept))
                            self._acks.ack([m for m in chunk if id(m) not in keep])
                        chunk = kept
                    if not chunk:
                        continue
                deadline = now + consumer.msg_timeout
                cid = sub.id
                in_flight.start_many(chunk, cid, now, deadline, size)
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
            if leftovers:
                # Messages not sent are not in flight: they go back to the own store, for the
                # consumers still with room (those cut short have none left) or a later round.
                self._put_back(leftovers)
                continue
            # Another round if the size estimate kept the take short (the rooms may hold
            # more), or if sampling (or the policy) left room unused and messages may remain.
            if not (n == asked < room and len(taken) == want):
                if not dropped or len(taken) < want:
                    break
                if screened >= SCREEN_BUDGET:
                    self._want_more()
                    break
            if not tight:
                # None gets more than the whole round: its bytes, exact, come off every room
                # before the next one (summed now if the bound let this round skip it).
                if nbytes is None:
                    nbytes = body_bytes(msgs)
                    self._body_estimate = max(nbytes // n, 1)
                for s, _ in ready:
                    byte_rooms[s.id] -= nbytes
        if earliest < math.inf:
            self._busy_at = now
            self._wake_at(earliest)
            if self._acks is not None and self._release_check == math.inf:
                self._release_check = now + RELEASE_CHECK_S
        clients = self.clients
        for cid, batch in batches.items():
            clients[cid].consumer.write_messages(batch)

    def _put_back(self, messages: list[Message]) -> None:
        """Messages a round took but no consumer had byte room for. They are queued like
        requeues (memory up to ``--mem-queue-size``, the rest to the own store's disk queue: a
        size estimate that was far off costs disk, not memory); an ephemeral channel, whose
        overflow would be dropped, keeps them at the head of its memory queue."""
        if self.ephemeral:
            self._requeue_front(messages)
        else:
            self._enqueue(messages)

    def _requeue_front(self, messages: list[Message]) -> None:
        """Messages taken but not delivered back at the head of their queues, in order."""
        lanes = self._lanes
        if lanes is not None and any(map(priority_of, messages)):
            lanes.requeue_front(messages)
            messages = [m for m in messages if not priority_of(m)]
        self._queue.requeue_front(messages)

    # -- policies (channel_policy.py; the topic's ttl_ms) ---------------------------------------

    def set_policy(self, changes: Mapping[str, PolicyValue]) -> ChannelPolicy:
        """Set policy keys (validated by ``channel_policy.parse_update``); returns the effective
        policy. Raises ``PolicyError`` (nothing changed) for a dead-letter topic that is the
        channel's own topic (its messages would come back to it for ever)."""
        if changes.get("dead_letter_topic") == self.topic_name:
            raise PolicyError("dead_letter_topic must not be the channel's own topic")
        settings = {**self.policy_settings, **changes}
        self.policy = ChannelPolicy.effective(self.options, settings)
        self.policy_settings = settings
        if self._on_paused_changed is not None:
            self._on_paused_changed()  # the topic's metadata entry holds the policy too
        self._update_screening()
        self._request_delivery()  # a new rule may free messages (or give them up)
        return self.policy

    def set_ttl(self, ttl_ms: int) -> None:
        """The topic's ``ttl_ms`` (0: none)."""
        self.ttl_ns = ttl_ms * 1_000_000
        self._update_screening()

    def note_message_ttls(self) -> None:
        """The topic took a message with its own ``ttl_ms`` (lmq's extension): from now on the
        channel screens messages for it too (until then it costs nothing)."""
        if not self._message_ttls:
            self._message_ttls = True
            self._update_screening()

    def _update_screening(self) -> None:
        self._screening = bool(self.ttl_ns or self.policy.max_attempts or self._message_ttls)
        if not self.ttl_ns:
            self._expired_seen = False

    @property
    def dead_letter_topic(self) -> str:
        """Where given-up messages go (``""``: dropped): the policy's, unless that is the
        channel's own topic (a daemon-wide ``--dead-letter-topic`` reaches the dead-letter
        topic's own channels too: those drop)."""
        name = self.policy.dead_letter_topic
        return "" if name == self.topic_name else name

    def _retry(self, messages: Sequence[Message], now: float, delay: float) -> None:
        """REQ'd or timed-out messages under a policy: out of attempts, they are given up;
        the others wait ``delay`` (a client's REQ), or the policy's backoff, or nothing."""
        if self._screening:
            messages = self._give_up_exhausted(messages, now)
            if not messages:
                return
        policy = self.policy
        if delay <= 0 and policy.backs_off:
            rng = self._rng
            for m in messages:
                m.deliver_at = now + policy.backoff_s(m.attempts, rng)
            self._defer_owned(messages)
        elif delay > 0:
            for m in messages:
                m.deliver_at = now + delay
            self._defer_owned(messages)
        else:
            self._enqueue(messages)

    def _give_up_exhausted(self, messages: Sequence[Message], now: float) -> list[Message]:
        """Give up the messages delivered ``max_attempts`` times; returns the others."""
        limit = self.policy.max_attempts
        if not limit:
            return list(messages)
        kept = [m for m in messages if m.attempts < limit]
        if len(kept) < len(messages):
            self._give_up([m for m in messages if m.attempts >= limit], REASON_MAX_ATTEMPTS, now)
        return kept

    def _screen(self, messages: list[Message], now: float) -> list[Message]:
        """Of messages about to be delivered, give up the expired ones and those out of
        attempts; returns the rest. One comparison or two per message."""
        ttl = self.ttl_ns
        limit = self.policy.max_attempts
        if ttl:
            cutoff = self._wall_clock() - ttl
            expired = [m for m in messages if m.timestamp < cutoff]
            if expired:
                self._expired_seen = True
                self._give_up(expired, REASON_EXPIRED, now)
                messages = [m for m in messages if m.timestamp >= cutoff]
        if self._message_ttls:
            # A message's own TTL (lmq's extension) beside the topic's: the shorter wins.
            wall = self._wall_clock()
            expired = [
                m for m in messages
                if m.ext is not None and m.ext.ttl_ms
                and m.timestamp < wall - m.ext.ttl_ms * 1_000_000
            ]  # fmt: skip
            if expired:
                gone = set(map(id, expired))
                self._give_up(expired, REASON_EXPIRED, now)
                messages = [m for m in messages if id(m) not in gone]
        if limit:
            messages = self._give_up_exhausted(messages, now)
        return messages

    def _give_up(self, messages: Sequence[Message], reason: str, now: float) -> None:
        """Dead-letter ``messages`` (owned by the channel, not in flight) or drop them, and
        count them. If the dead-letter topic cannot take them, they wait in the deferred queue
        and are tried again (``DEAD_LETTER_RETRY_S``): never lost to a disk error."""
        n = len(messages)
        target = self.dead_letter_topic
        sink = self._dead_letter_sink
        if not target or sink is None:
            if reason == REASON_EXPIRED:
                self.expired_count += n
            else:
                self.max_attempts_dropped_count += n
            if self._acks is not None:
                self._acks.ack(messages)
            log.debug(
                "CHANNEL(%s:%s): dropped %d messages (%s)", self.topic_name, self.name, n, reason
            )
            return
        try:
            durable = sink(self, messages, reason)
        except (BackendError, TopicExiting) as exc:
            log.error(
                "CHANNEL(%s:%s): cannot dead-letter %d messages to %s (retried in %gs) - %s",
                self.topic_name,
                self.name,
                n,
                target,
                DEAD_LETTER_RETRY_S,
                exc,
            )
            for m in messages:
                m.deliver_at = now + DEAD_LETTER_RETRY_S
                self._deferred.push(m)
            self._wake_at(self._deferred.next_deadline())
            return
        if reason == REASON_EXPIRED:
            self.expired_count += n
        self.dead_letter_count += n
        if self._acks is not None:
            self._acks.ack_when_copied(messages, durable)
        log.debug(
            "CHANNEL(%s:%s): dead-lettered %d messages to %s (%s)",
            self.topic_name,
            self.name,
            n,
            target,
            reason,
        )

    def _skip_expired(self, cursor: ChannelCursor) -> None:
        """The expired backlog the channel would read from its topic's log, skipped by the
        log's time index without reading it (dropped and counted; a channel with a dead-letter
        topic reads them instead, to publish them)."""
        self._expired_seen = False
        if self.dead_letter_topic:
            return
        skipped = cursor.skip_older_than(self._wall_clock() - self.ttl_ns)
        if skipped:
            self.expired_count += skipped
            log.debug(
                "CHANNEL(%s:%s): skipped %d expired messages in the log",
                self.topic_name,
                self.name,
                skipped,
            )

    def _want_more(self) -> None:
        # The screening budget is spent: another round goes on after the other tasks ran.
        self._want_delivery = True
        self._wake_at(-math.inf)

    def take_for_redrive(self, count: int, now: float) -> list[Message]:
        """Remove up to ``count`` ready messages (a dead-letter topic's redrive channel);
        ``redriven`` must follow with where their copies went."""
        if self.exiting:
            return []
        return self._take(count, now)

    def redriven(self, messages: Sequence[Message], copies_in: Syncable | None) -> None:
        """``take_for_redrive``'s messages were put elsewhere (durable once ``copies_in`` is
        synced): done here."""
        if self._acks is not None and messages:
            self._acks.ack_when_copied(messages, copies_in)

    def put_back(self, messages: Sequence[Message]) -> None:
        """``take_for_redrive``'s messages could not be moved: ready here again."""
        self._enqueue(messages)
        self._request_delivery()

    def accept_redriven(self, messages: Sequence[Message], now: float) -> Syncable | None:
        """Messages redriven from a dead-letter topic, as fresh copies with attempts 0 (they
        get ``max_attempts`` tries again), onto the ready queue; returns the store whose sync
        makes them durable (None: not stored). Raises ``BackendError`` having taken none."""
        copies = [Message(m.id, m.body, m.timestamp, ext=m.ext) for m in messages]
        self.put_many(copies, now)
        self._request_delivery()
        return self.backend.stored if self._acks is not None else None

    # -- timers ------------------------------------------------------------------------------

    def _wake_at(self, deadline: float) -> None:
        scope = self._sleep_scope
        if scope is not None:
            if deadline < scope.deadline:
                scope.deadline = deadline
        elif deadline < math.inf and not self._task_running:
            self._start_task()

    def _has_ready(self) -> bool:
        cursor = self.cursor
        return bool(
            self._queue.memory_count
            or self.backend.depth
            or (cursor is not None and cursor.has_unread)
            or (self._lanes is not None and self._lanes)
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
        ``timeout_count`` += 1; the channel's policy may delay them or give them up). Does not
        deliver (``run`` calls ``deliver`` right after).
        """
        expired = self._in_flight.pop_due(now)
        if expired:
            self.timeout_count += len(expired)
            clients = self.clients
            for m in expired:
                sub = clients.get(m.client_id)
                if sub is not None:
                    sub.in_flight_count -= 1
            if self._screening or self.policy.backs_off:
                self._retry(expired, now, 0.0)
            else:
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
            Message(m.id, m.body, m.timestamp, m.attempts, max(m.deadline, now), ext=m.ext)
            for m in held
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

    def attach(self, nursery: trio.Nursery | None) -> None:
        """Run the channel's task in ``nursery`` whenever it has something to wait for (see
        ``_serve``); None: no task any more (the service is stopping). The topic calls it."""
        self._nursery = nursery
        if nursery is not None and (self._want_delivery or self.next_deadline() < math.inf):
            self._start_task()

    def _start_task(self) -> None:
        nursery = self._nursery
        if nursery is not None and not self._task_running and not self.exiting:
            self._task_running = True
            nursery.start_soon(self._serve, False, name=f"channel {self.topic_name}:{self.name}")

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The channel's task, kept here until the channel is closed or deleted, idle or not
        (tests and tools that drive a channel without a topic; a topic starts the task only
        while it has work, ``attach``). Call once, instead of ``attach``."""
        if self._task_running:
            raise RuntimeError(f"channel {self.topic_name}:{self.name}: its task already runs")
        self._task_running = True
        task_status.started()
        await self._serve(True)

    async def _serve(self, keep: bool) -> None:
        """The channel's task: sleep until the earliest deadline or a delivery request, process
        everything due, deliver. Started by the first deadline or delivery request
        (``_wake_at``), it ends, unless ``keep``, once nothing is in flight, deferred or asked
        for and nothing was delivered (nor the task started) for ``TASK_IDLE_S`` (an idle
        channel holds no task: the task's coroutines, cancel scopes and trio's bookkeeping are
        ~20 objects the cyclic collector would traverse, per channel); and when the channel is
        closed or deleted. A busy channel keeps its task: while messages flow an in-flight
        deadline is ahead, and messages finished as fast as they come find it lingering."""
        self._busy_at = trio.current_time()
        try:
            while not self.exiting:
                deadline = -math.inf if self._want_delivery else self.next_deadline()
                if deadline == math.inf and not keep:
                    # Nothing to wait for: linger until TASK_IDLE_S after the last delivery (a
                    # delivery meanwhile sets a later deadline, which does not lower this one).
                    deadline = self._busy_at + TASK_IDLE_S
                    if trio.current_time() >= deadline:
                        return
                with trio.CancelScope(deadline=deadline) as sleep:
                    self._sleep_scope = sleep
                    try:
                        await trio.sleep_forever()
                    finally:
                        self._sleep_scope = None
                if self.exiting:
                    return
                now = trio.current_time()
                self.process_due(now)
                self.deliver(now)
        finally:
            self._task_running = False

    def _stop_task(self) -> None:
        """Closed or deleted (``exiting`` is set): the task, if it sleeps, ends now."""
        scope = self._sleep_scope
        if scope is not None:
            scope.cancel()

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
        if self._lanes is not None:
            self._lanes.empty()
        if self._acks is not None:
            self._acks.clear()
        self._in_flight.clear()
        self._deferred.clear()
        for sub in self.clients.values():
            sub.in_flight_count = 0
        if self.cursor is not None:
            # What the topic has handed on is this channel's queue: it now reads from the end.
            self.cursor.seek(self.cursor.end, keep_unsettled=False)

    def drop_oldest(self, count: int, now: float) -> int:
        """Drop up to ``count`` of the messages delivery would take next (the oldest waiting:
        the own store, then the cursor), for a topic's ``overflow="drop_oldest"``; how many.
        Messages with a priority go last, the lowest level first. ``--durable``: they are
        acknowledged as a FIN would."""
        dropped = self._take(count, now, ranked=False)
        lanes = self._lanes
        if len(dropped) < count and lanes is not None and lanes:
            dropped += lanes.take(count - len(dropped), self._lane_read, lowest_first=True)
        if self._acks is not None and dropped:
            self._acks.ack(dropped)
        return len(dropped)

    def seek(self, offset: int) -> int:
        """Read the topic's stream from ``offset`` on (clamped to what is stored): a replay, or
        a jump ahead. In-flight, requeued and deferred messages stay and settle as usual (in
        ``--durable`` they keep the log's claim until then: a crash brings them back).
        Returns the new position. Raises ``ValueError`` for a channel without a cursor
        (ephemeral: nothing of it is stored)."""
        if self.cursor is None:
            raise ValueError(f"channel {self.topic_name}:{self.name} has no stored stream")
        position = self.cursor.seek(offset)
        self._request_delivery()
        return position

    def close(self, salvage: Salvage | None = None) -> bool:
        """Shut down: stop the timer and write memory, in-flight and deferred messages (with
        their ``deliver_at`` and attempts) to the backend, then close it. Idempotent.

        ``salvage`` writes as many as a full disk takes, in order, and counts the rest
        (``salvage.py``): lost in default mode; in ``--durable`` they are still unsettled or
        unacknowledged where they came from. A durable channel writes them again and
        acknowledges the originals (no duplicate after a restart). Returns False if something
        could not be written or synced (logged): a durable topic then keeps its own copies of
        the messages unacknowledged.
        """
        if self.exiting:
            return True
        self.exiting = True
        self._stop_task()
        if salvage is None:
            salvage = Salvage()
        # After the backend's contents, as nsqd's flush: order across a restart is not kept.
        ready = self._queue.memory()
        ready += self._in_flight.clear()
        deferred = self._deferred.clear()
        self._queue.clear_memory()
        ok, copied = self._flush(ready, deferred, salvage)
        if self._lanes is not None:
            lanes_ok, lanes_copied = self._flush_lanes(salvage)
            ok = ok and lanes_ok
            copied += lanes_copied
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
        if self._lanes is not None:
            self._lanes.close()
        log.info("CHANNEL(%s:%s): closed", self.topic_name, self.name)
        return ok

    def _flush(
        self, ready: list[Message], deferred: list[Message], salvage: Salvage
    ) -> tuple[bool, list[Message]]:
        """``close``: ready and in-flight messages to the own store, deferred ones (with their
        deadlines) to the deferred store, each as far as the disk takes them. Returns (all
        written, the messages written: a durable channel acknowledges those originals once the
        copies are synced)."""
        copied: list[Message] = []
        subject = f"CHANNEL({self.topic_name}:{self.name})"
        if deferred:
            dq: BackendQueue | None = None
            try:
                dq = self._open_deferred_store()
            except BackendError as exc:
                log.warning("%s: %s", subject, exc)
            if dq is not None:
                put_deferred = dq.put_many
                done, _ = salvage.write_prefix(
                    subject, lambda chunk, _index: put_deferred(chunk), deferred
                )
                copied += deferred[:done]
                deferred = deferred[done:]
                if deferred:
                    log.warning(
                        "%s: %d deferred messages go to the main store (due at once after a "
                        "restart)",
                        subject,
                        len(deferred),
                    )
            # Not stored on time: kept with the others (nsqd's way: due at once after a restart).
            ready += deferred
        lanes = self._lanes
        if lanes is not None and any(map(priority_of, ready)):
            # In flight with a priority: back to their lanes (written by ``_flush_lanes``).
            lanes.hold(ready)
            ready = [m for m in ready if not priority_of(m)]
        if not ready:
            return True, copied
        put = self.backend.put_many
        done = salvage.write(
            subject,
            f"{self.topic_name}:{self.name}",
            lambda chunk, _index: put(chunk),
            ready,
            kept_elsewhere=self._acks is not None,
        )
        copied += ready[:done]
        return done == len(ready), copied

    def _flush_lanes(self, salvage: Salvage) -> tuple[bool, list[Message]]:
        """``close``: each priority lane's memory to its store, as ``_flush`` does."""
        assert self._lanes is not None
        ok = True
        copied: list[Message] = []
        for level, backend, messages in self._lanes.memory():
            done = salvage.write(
                f"CHANNEL({self.topic_name}:{self.name})",
                f"{self.topic_name}:{self.name}{LANE_SUFFIX}{level}",
                partial(_write_chunk, backend),
                messages,
                kept_elsewhere=self._acks is not None,
            )
            copied += messages[:done]
            ok = ok and done == len(messages)
        self._lanes.clear_memory()
        return ok, copied

    def delete(self) -> None:
        """Delete: stop the timer, drop every message and the backend's storage, and close the
        subscribed consumers' connections (nsqd does). Idempotent."""
        if self.exiting:
            return
        self.exiting = True
        self._stop_task()
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
        if self._lanes is not None:
            self._lanes.clear_memory()
            self._lanes.delete()
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
            backend_depth=self.backend.depth
            + (self._lanes.backend_depth if self._lanes is not None else 0),
            in_flight_count=len(self._in_flight),
            deferred_count=len(self._deferred),
            message_count=self.message_count + (self.cursor.replayed if self.cursor else 0),
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
            dead_letter_count=self.dead_letter_count,
            expired_count=self.expired_count,
            max_attempts_dropped_count=self.max_attempts_dropped_count,
            storage_damage=storage_damage(q.damage for q in self.disk_queues),
            priority_depths=tuple(self.priority_depths.items()),
        )


def _memory_lane(level: int) -> BackendQueue:
    """A lane's backend for a channel made without stores (tests, tools): memory."""
    return MemoryBackend()


def _write_chunk(backend: BackendQueue, chunk: Sequence[Message], _index: int) -> None:
    backend.put_many(chunk)

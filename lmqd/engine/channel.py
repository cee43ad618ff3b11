"""Channel: one channel of a topic -- its consumers, their messages in flight, and its timer.

Theory of operation
-------------------
A channel hands each message of its topic to one of its subscribed consumers. Its parts, each
in a room of its own:

* ``sources.py`` (``ReadySources``): where the next messages come from -- the priority lanes,
  the own store (requeued messages), the cursor over the topic's stream -- with the one
  in-flight rule (an id is in flight once);
* ``keeping.py`` (``Keeping`` / ``DurableKeeping``, chosen once when the channel is made):
  where the messages the channel owns go and what a FIN, a requeue or a shutdown records:
  nsqd's memory first, or ``--durable``'s copies on disk with their acknowledgements;
* ``retry.py`` (``Retry``): the channel's policy at work -- TTL and ``max_attempts`` screening,
  retries with backoff, dead letters, redrive;
* ``delivery.py``: the delivery round's plan, a pure function of the ready consumers, their RDY
  windows and byte rooms, the messages and the rng;
* ``inflight.py`` and ``deferred.py``: the in-flight and deferred queues.

What stays here: the consumers (subscribe, RDY, leave), FIN/REQ/TOUCH, the delivery round's
loop, the timer task, admin (pause, empty, seek, drop, close, delete) and statistics.

Every mutation (``put_many``, ``finish_many``, ``requeue``, ``touch``, ``add_consumer``,
``remove_consumer``, ``consumer_ready``, ``unpause``) is a plain ``def`` that changes state and,
when it may let messages flow, *asks* for a delivery round (``request_delivery``): the channel's
own task wakes and delivers once for everything asked since it last ran. So a buffer of a
thousand FINs costs one delivery round, not a thousand. ``deliver(now)`` may also be called
directly (the topic's pump does, once per batch).

``deliver`` hands messages to the consumers with room in their RDY window (``in_flight_count <
ready_count``; RDY is a window, never decremented) and in their output (``Consumer.byte_room``).
A round takes as many messages as the total free room, but no more than the byte rooms hold at
the last round's mean body size (``delivery.round_size``), splits them over the ready consumers
(``delivery.plan_shares``: random order, evenly; cut to each consumer's byte room when the
round's bodies add up to more than the smallest room, ``delivery.round_bytes``), and what no
consumer had room for goes back to the own store, not in flight, for the consumers still with
room. Every consumer gets at most one ``write_messages`` call per round, so its writer wakes
once.

Delivered messages sit in the ``InFlightQueue`` until FIN, REQ, TOUCH or their deadline;
deferred ones (REQ with a delay, DPUB) in the ``DeferredQueue``. The channel's task sleeps in a
``trio.CancelScope`` whose deadline is the earliest of both queues (or now, when a delivery was
asked for); pushing an earlier deadline lowers that scope's deadline directly (no per-message
Event or task), and on wakeup everything due is processed at once, then ``deliver`` runs once.
The task exists only while it has something to wait for: the first deadline or delivery request
starts it in the nursery the topic attached (``attach``), and it ends once nothing is in flight,
deferred or asked for and nothing was delivered for ``TASK_IDLE_S``, so an idle channel holds no
task. It is the only code here that reads the clock; everything else takes ``now``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import Protocol

import trio

from lmqd.engine.backend import BackendError, StoredQueue, storage_damage
from lmqd.engine.channel_policy import ChannelPolicy, PolicyValue
from lmqd.engine.context import EngineContext
from lmqd.engine.cursor import ChannelCursor
from lmqd.engine.deferred import DeferredQueue
from lmqd.engine.e2e import E2eLatencyStream, empty_latency, new_stream
from lmqd.engine.errors import TooManyConsumers, TopicExiting
from lmqd.engine.inflight import ChannelError, InFlightQueue
from lmqd.engine.keeping import Keeping
from lmqd.engine.lanes import priority_of
from lmqd.engine.retry import Retry
from lmqd.engine.round import deliver
from lmqd.engine.salvage import Salvage
from lmqd.engine.sources import ReadySources
from lmqd.engine.subscription import Consumer, Subscription
from lmqd.message import Message
from lmqd.names import is_ephemeral
from lmqd.stats import ChannelStats, E2eLatency

__all__ = ["TASK_IDLE_S", "Channel", "ChannelOwner"]

log = logging.getLogger("lmqd.channel")


TASK_IDLE_S = 10.0
"""A channel's task with nothing in flight, deferred or asked for waits this long before it
ends (``_serve``): a channel whose messages come more often than that keeps one task (a
delivery only moves its deadline) instead of starting one per message (tens of microseconds
each); a channel idle longer holds no task."""


class ChannelOwner(Protocol):
    """What a channel tells its topic (``Topic`` implements it)."""

    def entry_changed(self) -> None:
        """Something the topic's metadata entry holds of the channel changed (its paused flag,
        its policy)."""
        ...

    def channel_unused(self, channel: Channel) -> None:
        """An ephemeral channel's last consumer left (nsqd deletes the channel then)."""
        ...


class _NoOwner:
    """The owner of a channel made on its own (tests and tools): told nothing."""

    def entry_changed(self) -> None:
        pass

    def channel_unused(self, channel: Channel) -> None:
        pass


_NO_OWNER = _NoOwner()


class Channel:
    """One channel of a topic: subscriptions, in-flight and deferred messages, the timer.

    Counters follow nsqd: ``message_count`` counts messages put into the channel by its topic
    (deferred ones included, requeues not); ``requeue_count`` counts REQs **and** the messages
    requeued because their consumer disconnected (lmq requeues those at once, where nsqd lets
    them time out and counts them in ``timeout_count``); ``timeout_count`` counts in-flight
    timeouts.
    """

    # Slots: no per-instance dict (a channel is one of tens of thousands, idle, in a big
    # daemon: ~1 KB and a GC-tracked object less each).
    __slots__ = (
        "_busy_at", "_nursery", "_paused", "_sleep_scope", "_task_running", "_want_delivery",
        "body_estimate", "clients", "ctx", "cursor", "deferred", "e2e_stream", "ephemeral",
        "exiting", "in_flight", "keeping", "last_backend_error", "message_count", "name",
        "options", "owner", "requeue_count", "retry", "sources", "timeout_count", "topic_name",
    )  # fmt: skip

    def __init__(
        self,
        ctx: EngineContext,
        topic_name: str,
        name: str,
        *,
        owner: ChannelOwner = _NO_OWNER,
        cursor: ChannelCursor | None = None,
        durable: bool = False,
    ) -> None:
        """A channel of topic ``topic_name`` reading ``cursor`` (None: the topic's pump puts
        its messages here); ``durable``: ``--durable``'s keeping (a stored channel)."""
        self.ctx = ctx
        self.topic_name = topic_name
        self.name = name
        self.owner = owner
        options = self.options = ctx.options
        self.ephemeral = is_ephemeral(name)
        self._paused = False
        self.exiting = False
        self.clients: dict[int, Subscription] = {}
        self.message_count = 0
        self.requeue_count = 0
        self.timeout_count = 0
        self.last_backend_error: BackendError | None = None
        """The last error a backend write raised (None once a write succeeds again)."""
        self.in_flight = InFlightQueue()
        self.deferred = DeferredQueue()
        self.e2e_stream: E2eLatencyStream | None = None
        """FIN latencies over nsqd's rolling window, from the first FIN (None: none yet, or no
        configured percentiles)."""
        self._nursery: trio.Nursery | None = None
        """Where the channel's task runs while it has something to wait for (``attach``)."""
        self._task_running = False
        self._busy_at = -math.inf
        """When the last delivery round handed messages on (or the task started): the task
        ends ``TASK_IDLE_S`` after it, once it has nothing else to wait for."""
        self._sleep_scope: trio.CancelScope | None = None
        self._want_delivery = False
        self.body_estimate = max(options.max_msg_size, 1)
        """The mean body size of the last delivery round (before the first: the largest
        allowed): a round takes no more messages than the consumers' byte rooms hold at that
        size, so big messages are not read from the log only to be put back (``round.py``)."""
        stores = ctx.stores
        kind = Keeping.kind(durable)
        self.sources = ReadySources(
            self,
            stores.channel_backend(topic_name, name),
            cursor,
            options.mem_queue_limit * kind.mem_factor,
            stores.stored_lanes(topic_name, name),
        )
        self.cursor = cursor
        """Where the channel reads its topic's stream (None: the pump puts messages here)."""
        self.keeping = kind(self)
        self.retry = Retry(self)
        self.keeping.restore()
        if any(
            q is not None and q.stored_message_ttls
            for q in (self.sources.backend.stored, self.keeping.deferred_store)
        ):
            self.retry.note_message_ttls()  # an earlier run stored messages with their own TTL

    def __repr__(self) -> str:
        return f"<Channel {self.topic_name}:{self.name}>"

    @property
    def subject(self) -> str:
        """How log lines name the channel."""
        return f"CHANNEL({self.topic_name}:{self.name})"

    # -- sizes -------------------------------------------------------------------------------

    @property
    def depth(self) -> int:
        """Ready messages: the own store and what the cursor has not read yet (in-flight and
        deferred excluded, as nsqd)."""
        return self.sources.depth

    @property
    def backend_depth(self) -> int:
        """Of ``depth``, the messages on disk (own store and the topic's log)."""
        return self.sources.backend_depth

    @property
    def durable(self) -> bool:
        """Whether every message is on disk until FIN (``--durable``, not ephemeral)."""
        return self.keeping.durable

    @property
    def paused(self) -> bool:
        """Whether delivery is paused (persisted in the metadata file)."""
        return self._paused

    @paused.setter
    def paused(self, value: bool) -> None:
        if value != self._paused:
            self._paused = value
            self.owner.entry_changed()

    @property
    def disk_queues(self) -> tuple[StoredQueue, ...]:
        """Every queue of this channel stored on disk (its own store, its deferred store and
        its priority lanes' stores, once open), durable or not: what it costs on disk beside its
        topic's log."""
        sources = self.sources
        queues = (sources.backend.stored, self.keeping.deferred_store)
        stored = tuple(q for q in queues if q is not None)
        return stored + sources.lanes.stored if sources.lanes is not None else stored

    @property
    def priority_depths(self) -> dict[int, int]:
        """Ready messages waiting in the priority lanes, by level (lmq's extension)."""
        lanes = self.sources.lanes
        return lanes.depths() if lanes is not None else {}

    @property
    def deferred_store(self) -> StoredQueue | None:
        """The deferred store on disk, once open."""
        return self.keeping.deferred_store

    @property
    def in_flight_count(self) -> int:
        return len(self.in_flight)

    @property
    def deferred_count(self) -> int:
        return len(self.deferred)

    # -- the policy (retry.py) ---------------------------------------------------------------

    @property
    def policy(self) -> ChannelPolicy:
        """The effective policy: the daemon's defaults, then ``policy_settings``."""
        return self.retry.policy

    @property
    def policy_settings(self) -> dict[str, PolicyValue]:
        """The channel's own policy keys, persisted with the metadata."""
        return self.retry.policy_settings

    def set_policy(self, changes: Mapping[str, PolicyValue]) -> ChannelPolicy:
        """Set policy keys; see ``Retry.set_policy``."""
        return self.retry.set_policy(changes)

    @property
    def dead_letter_topic(self) -> str:
        """Where given-up messages go (``""``: dropped); see ``Retry.dead_letter_topic``."""
        return self.retry.dead_letter_topic

    @property
    def dead_letter_count(self) -> int:
        return self.retry.dead_letter_count

    @property
    def expired_count(self) -> int:
        return self.retry.expired_count

    @property
    def max_attempts_dropped_count(self) -> int:
        return self.retry.max_attempts_dropped_count

    # -- messages from the topic -------------------------------------------------------------

    def put_many(self, messages: Sequence[Message], now: float) -> None:
        """Take messages from the topic: deferred ones (``deliver_at > now``) into the deferred
        queue, the rest onto the ready queue. Does not deliver (the topic's pump calls
        ``deliver`` once per batch). A durable channel writes all of them (deferred ones too,
        with their time) to its stores and raises ``BackendError`` having stored none."""
        if self.exiting:
            return
        self.keeping.put_many(messages, now)
        self.message_count += len(messages)

    def push(self, messages: Sequence[Message], now: float) -> list[tuple[StoredQueue, list[int]]]:
        """The topic's pump hands over the pushed messages of its stream (deferred ones and
        those with a priority), which the cursor steps over: into the deferred queue, or the
        priority lanes, or (due already, no priority) the own store. Not counted in
        ``message_count`` (the pump counts every message it hands on). A durable channel writes
        them to its stores and returns each store written with the offsets of the messages it
        took (``DurableKeeping.push``)."""
        if self.exiting or not messages:
            return []
        if self.sources.lanes is None and any(map(priority_of, messages)):
            self.sources.ensure_lanes()
        return self.keeping.push(messages, now)

    def hold_deferred(self, messages: Sequence[Message]) -> None:
        """Deferred messages held in memory only (their store could not take them)."""
        for m in messages:
            self.deferred.push(m)
        self.wake_at(self.deferred.next_deadline())

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
        self.request_delivery()
        return subscription

    def remove_consumer(self, subscription: Subscription, now: float) -> None:
        """Unsubscribe and requeue its in-flight messages at once (nsqd waits for their
        timeout). An ephemeral channel left without consumers asks to be deleted."""
        if self.clients.pop(subscription.id, None) is None:
            return
        if self.exiting:
            return
        cid = subscription.id
        mine = [m for m in self.in_flight if m.client_id == cid]
        if mine:
            for m in mine:
                self.in_flight.remove(m.id)
            subscription.in_flight_count -= len(mine)
            self.requeue_count += len(mine)
            if self.retry.screening:
                mine = self.retry.give_up_exhausted(mine, now)
            self.keeping.requeue(mine)
            log.debug("%s: client %d left, requeued %d in-flight", self.subject, cid, len(mine))
            self.request_delivery()
        if self.ephemeral and not self.clients:
            self.owner.channel_unused(self)

    def consumer_ready(self) -> None:
        """A consumer's RDY window may have opened (RDY, its output drained)."""
        self.request_delivery()

    # -- in-flight operations -----------------------------------------------------------------

    def finish(self, subscription: Subscription, msg_id: bytes, now: float) -> None:
        """FIN: the message is done. Raises ``NotInFlight`` / ``NotOwner``."""
        msg = self.in_flight.remove_owned(msg_id, subscription.id)
        subscription.in_flight_count -= 1
        subscription.finish_count += 1
        self.keeping.done((msg,))
        if self.options.e2e_processing_latency_percentiles:
            self._record_e2e((msg,), now)
        self.request_delivery()

    def finish_many(
        self, subscription: Subscription, msg_ids: Sequence[bytes], now: float
    ) -> list[tuple[bytes, ChannelError]]:
        """FIN several messages of one consumer (a buffer's worth), in order. Returns the
        failures as ``(msg_id, error)`` in order instead of raising."""
        done, failed = self.in_flight.remove_many_owned(msg_ids, subscription.id)
        if done:
            subscription.in_flight_count -= len(done)
            subscription.finish_count += len(done)
            self.keeping.done(done)
            if self.options.e2e_processing_latency_percentiles:
                self._record_e2e(done, now)
            self.request_delivery()
        return failed

    def _record_e2e(self, done: Sequence[Message], now: float) -> None:
        stream = self.e2e_stream
        if stream is None:
            stream = self.e2e_stream = new_stream(self.options, now)
            assert stream is not None
        wall = self.ctx.wall_clock()
        for m in done:
            stream.record(now, wall - m.timestamp)

    def requeue(self, subscription: Subscription, msg_id: bytes, delay: float, now: float) -> None:
        """REQ: back to the queue (``delay`` 0) or deferred for ``delay`` seconds (already
        clamped by the caller). Attempts are kept. Raises ``NotInFlight`` / ``NotOwner``."""
        msg = self.in_flight.remove_owned(msg_id, subscription.id)
        subscription.in_flight_count -= 1
        subscription.requeue_count += 1
        self.requeue_count += 1
        if self.retry.retries:
            self.retry.retry((msg,), now, delay)
        elif delay > 0:
            msg.deliver_at = now + delay
            self.keeping.defer_owned((msg,))
        else:
            self.keeping.requeue((msg,))
        self.request_delivery()

    def touch(self, subscription: Subscription, msg_id: bytes, now: float) -> None:
        """TOUCH: reset the deadline to ``now + msg_timeout``, capped at delivery time +
        ``--max-msg-timeout``. Raises ``NotInFlight`` / ``NotOwner``."""
        msg = self.in_flight.owned(msg_id, subscription.id)
        deadline = min(
            now + subscription.consumer.msg_timeout,
            msg.delivered_at + self.options.max_msg_timeout,
        )
        self.in_flight.set_deadline(msg, deadline)
        self.wake_at(deadline)

    # -- delivery (round.py) -----------------------------------------------------------------

    def deliver(self, now: float) -> None:
        """Hand ready messages to consumers with room in their RDY window (``round.py``)."""
        self._want_delivery = False
        if self.paused or self.exiting or not self.clients:
            return
        earliest = deliver(self, now)
        if earliest < math.inf:
            self._busy_at = now
            self.wake_at(earliest)
            self.keeping.delivered(now)

    # -- timers ------------------------------------------------------------------------------

    def wake_at(self, deadline: float) -> None:
        """Something is due at ``deadline``: the task wakes by then (started if needed)."""
        scope = self._sleep_scope
        if scope is not None:
            if deadline < scope.deadline:
                scope.deadline = deadline
        elif deadline < math.inf and not self._task_running:
            self._start_task()

    def request_delivery(self) -> None:
        """Ask the channel's task for a delivery round (one per wakeup, however many asks);
        nothing to ask while no message is ready (the topic's pump delivers what it brings)."""
        if not self._want_delivery and self.sources.has_ready():
            self._want_delivery = True
            self.wake_at(-math.inf)

    def deliver_again(self) -> None:
        """Another round once the other tasks ran (the last one stopped at its budget)."""
        self._want_delivery = True
        self.wake_at(-math.inf)

    def process_due(self, now: float) -> None:
        """Time out in-flight messages and release deferred ones that are due at ``now``.

        Timed-out messages go back on the queue like ``REQ 0`` (attempts kept,
        ``timeout_count`` += 1; the channel's policy may delay them or give them up). Does not
        deliver (the task calls ``deliver`` right after).
        """
        expired = self.in_flight.pop_due(now)
        if expired:
            self.timeout_count += len(expired)
            clients = self.clients
            for m in expired:
                sub = clients.get(m.client_id)
                if sub is not None:
                    sub.in_flight_count -= 1
            if self.retry.retries:
                self.retry.retry(expired, now, 0.0)
            else:
                self.keeping.requeue(expired)
        due = self.deferred.pop_due(now)
        if due:
            self.keeping.enqueue(due)
        self.keeping.check(now)

    def next_deadline(self) -> float:
        """The earliest in-flight timeout or deferred release time (``math.inf`` if none)."""
        return min(
            self.in_flight.next_deadline(), self.deferred.next_deadline(), self.keeping.next_check
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
        (``wake_at``), it ends, unless ``keep``, once nothing is in flight, deferred or asked
        for and nothing was delivered (nor the task started) for ``TASK_IDLE_S`` (an idle
        channel holds no task: the task's coroutines, cancel scopes and trio's bookkeeping are
        ~20 objects the cyclic collector would traverse, per channel); and when the channel is
        closed or deleted. A busy channel keeps its task: while messages flow an in-flight
        deadline is ahead, and messages finished as fast as they come find it lingering."""
        clock = self.ctx.clock
        self._busy_at = clock()
        try:
            while not self.exiting:
                deadline = -math.inf if self._want_delivery else self.next_deadline()
                if deadline == math.inf and not keep:
                    # Nothing to wait for: linger until TASK_IDLE_S after the last delivery (a
                    # delivery meanwhile sets a later deadline, which does not lower this one).
                    deadline = self._busy_at + TASK_IDLE_S
                    if clock() >= deadline:
                        return
                with trio.CancelScope(deadline=deadline) as sleep:
                    self._sleep_scope = sleep
                    try:
                        await trio.sleep_forever()
                    finally:
                        self._sleep_scope = None
                if self.exiting:
                    return
                now = clock()
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
        self.request_delivery()

    def empty(self) -> None:
        """Drop every ready, in-flight and deferred message and zero the consumers' in-flight
        counts (nsqd ``Channel.Empty``)."""
        self.sources.empty()
        self.keeping.empty()
        self.keeping.clear()
        self.in_flight.clear()
        self.deferred.clear()
        for sub in self.clients.values():
            sub.in_flight_count = 0
        cursor = self.sources.cursor
        if cursor is not None:
            # What the topic has handed on is this channel's queue: it now reads from the end.
            cursor.seek(cursor.end, keep_unsettled=False)

    def drop_oldest(self, count: int, now: float) -> int:
        """Drop up to ``count`` of the messages delivery would take next (the oldest waiting:
        the own store, then the cursor), for a topic's ``overflow="drop_oldest"``; how many.
        Messages with a priority go last, the lowest level first. ``--durable``: they are
        acknowledged as a FIN would."""
        sources = self.sources
        dropped = sources.take(count, now, ranked=False)
        lanes = sources.lanes
        if len(dropped) < count and lanes is not None and lanes:
            dropped += lanes.take(count - len(dropped), self.keeping.lane_read, lowest_first=True)
        if dropped:
            self.keeping.done(dropped)
        return len(dropped)

    def seek(self, offset: int) -> int:
        """Read the topic's stream from ``offset`` on (clamped to what is stored): a replay, or
        a jump ahead. In-flight, requeued and deferred messages stay and settle as usual (in
        ``--durable`` they keep the log's claim until then: a crash brings them back).
        Returns the new position. Raises ``ValueError`` for a channel without a cursor
        (ephemeral: nothing of it is stored)."""
        cursor = self.sources.cursor
        if cursor is None:
            raise ValueError(f"channel {self.topic_name}:{self.name} has no stored stream")
        position = cursor.seek(offset)
        self.request_delivery()
        return position

    # -- life cycle --------------------------------------------------------------------------

    def close(self, salvage: Salvage | None = None) -> bool:
        """Shut down: stop the timer and write memory, in-flight and deferred messages (with
        their ``deliver_at`` and attempts) to the stores, then close them. Idempotent.

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
        # After the backend's contents, as nsqd's flush: order across a restart is not kept.
        queue = self.sources.queue
        ready = queue.memory()
        ready += self.in_flight.clear()
        deferred = self.deferred.clear()
        queue.clear_memory()
        ok = self.keeping.flush(ready, deferred, salvage if salvage is not None else Salvage())
        self.sources.close()
        self.keeping.close()
        log.info("%s: closed", self.subject)
        return ok

    def delete(self) -> None:
        """Delete: stop the timer, drop every message and the stores, and close the subscribed
        consumers' connections (nsqd does). Idempotent."""
        if self.exiting:
            return
        self.exiting = True
        self._stop_task()
        for sub in list(self.clients.values()):
            sub.consumer.close()
        self.sources.queue.clear_memory()
        self.in_flight.clear()
        self.deferred.clear()
        self.keeping.clear()
        self.sources.delete()
        self.keeping.delete()
        log.info("%s: deleted", self.subject)

    # -- statistics --------------------------------------------------------------------------

    def e2e_latency(self, now: float) -> E2eLatency:
        """The E2E processing latency percentiles over the window (nsqd's shape)."""
        stream = self.e2e_stream
        if stream is None:
            return empty_latency(self.options)
        return stream.result(now)

    def statistics(self, now: float, *, include_clients: bool = True) -> ChannelStats:
        """A frozen snapshot for /stats; consumer snapshots come from the consumers."""
        retry = self.retry
        cursor = self.sources.cursor
        return ChannelStats(
            channel_name=self.name,
            depth=self.depth,
            backend_depth=self.sources.stored_depth,
            in_flight_count=len(self.in_flight),
            deferred_count=len(self.deferred),
            message_count=self.message_count + (cursor.replayed if cursor is not None else 0),
            requeue_count=self.requeue_count,
            timeout_count=self.timeout_count,
            client_count=len(self.clients),
            clients=(
                tuple(s.consumer.statistics() for s in self.clients.values())
                if include_clients
                else None
            ),
            paused=self.paused,
            e2e_processing_latency=self.e2e_latency(now),
            dead_letter_count=retry.dead_letter_count,
            expired_count=retry.expired_count,
            max_attempts_dropped_count=retry.max_attempts_dropped_count,
            storage_damage=storage_damage(q.damage for q in self.disk_queues),
            priority_depths=tuple(self.priority_depths.items()),
        )

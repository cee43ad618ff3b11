"""ReadySources: where a channel's next messages come from, in the order it delivers them.

Theory of operation
-------------------
A channel's ready messages are in three places, taken in this order by ``take``:

1. its **priority lanes** (``lanes.py``): messages with an lmq priority, highest level first,
   pushed there by the topic's pump whatever the backlog;
2. its **own store** (a ``SpillQueue``: memory up to ``--mem-queue-size``, then its disk queue
   ``topic:channel``): requeued and timed-out messages, what a shutdown wrote, what the pump
   copies to a channel without a cursor;
3. its **cursor** (``cursor.py``) over its topic's stream: everything else, stored once for
   every channel.

**One in-flight rule** (``admit``): a message id is in flight at most once per channel. Only a
durable channel after a crash can meet one message twice (the topic pumped it again, or it was
read again from a store) -- or any channel reading back, from its own store or a replay, a copy
of a message it has in flight -- so every read that may hold such a copy goes through ``admit``,
which drops the second copy (the keeping records it, ``keeping.py``), holds a deferred one in
the deferred queue, and keeps the rest. What the keeping does not need looked at (a default-mode
channel's memory and its cursor outside a replay) is taken as it is: no Python code per message.

``take_measured`` also returns what is known of the bytes it took without summing them: the
bodies read from the cursor are bounded by the topic stream's byte marks (``bytemarks.py``), so a
delivery round of small messages needs no sum.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Protocol

from lmqd.engine.backend import BackendQueue, StoredQueue
from lmqd.engine.context import EngineContext
from lmqd.engine.cursor import ChannelCursor
from lmqd.engine.deferred import DeferredQueue
from lmqd.engine.inflight import InFlightQueue
from lmqd.engine.lanes import PriorityLanes, priority_of
from lmqd.engine.spill import SpillQueue
from lmqd.engine.subscription import Subscription
from lmqd.message import Message

__all__ = ["ChannelBasics", "ReadySources", "SourcesOwner"]


class SourcesKeeping(Protocol):
    """What the sources need of their channel's keeping (``keeping.py``)."""

    def lane_read(self, backend: BackendQueue, messages: list[Message]) -> None: ...

    def unique_taken(
        self, taken: list[Message], count: int
    ) -> tuple[list[Message], set[bytes] | None]: ...

    def reads_each(self, replaying: bool) -> bool: ...

    def defer_read(self, m: Message) -> None: ...

    def duplicate(self, m: Message) -> None: ...

    def enqueue(self, messages: Sequence[Message]) -> None: ...


class ReadHook(Protocol):
    """What the sources ask of their channel's policy (``retry.py``) before a cursor read."""

    @property
    def expired_seen(self) -> bool:
        """A message taken had expired: the expired backlog may be skipped."""
        ...

    def skip_expired(self, cursor: ChannelCursor) -> None: ...


class ChannelBasics(Protocol):
    """What every part of a channel reads of it (``channel.Channel``); each part's own
    ``Protocol`` adds what else it needs (the parts import no channel: no import cycle)."""

    @property
    def ctx(self) -> EngineContext: ...

    @property
    def topic_name(self) -> str: ...

    @property
    def name(self) -> str: ...

    @property
    def in_flight(self) -> InFlightQueue: ...

    @property
    def deferred(self) -> DeferredQueue: ...

    def wake_at(self, deadline: float) -> None: ...


class SourcesOwner(ChannelBasics, Protocol):
    """The channel, as its sources see it."""

    @property
    def ephemeral(self) -> bool: ...

    @property
    def paused(self) -> bool: ...

    @property
    def clients(self) -> dict[int, Subscription]: ...

    @property
    def keeping(self) -> SourcesKeeping: ...

    @property
    def retry(self) -> ReadHook: ...


class ReadySources:
    """A channel's priority lanes, own store and cursor (see the module docstring)."""

    __slots__ = ("_channel", "_mem_size", "backend", "cursor", "lanes", "queue", "unbuffered")

    def __init__(
        self,
        channel: SourcesOwner,
        backend: BackendQueue,
        cursor: ChannelCursor | None,
        mem_size: int,
        stored_lanes: Sequence[int] = (),
    ) -> None:
        self._channel = channel
        self.cursor = cursor
        """Where the channel reads its topic's stream (None: the pump puts messages here)."""
        self._mem_size = mem_size
        self.queue = SpillQueue(backend, mem_size, channel.ctx.on_backend_change)
        """The own store: memory up to ``mem_size``, then ``backend``."""
        self.backend = backend
        """The own store's disk (or memory) part."""
        # nsqd gives ephemeral channels a memory queue even with --mem-queue-size 0 (an
        # unbuffered Go channel: a put succeeds only while a ready consumer is waiting).
        # ``memory_limit`` reproduces that with the consumers' free RDY room.
        self.unbuffered = channel.ephemeral and mem_size == 0
        self.lanes: PriorityLanes | None = None
        """The priority lanes, once a message with a priority came (or stored ones exist)."""
        if stored_lanes:
            self.ensure_lanes(stored_lanes)

    # -- sizes -------------------------------------------------------------------------------

    @property
    def depth(self) -> int:
        """Ready messages: the own store, the lanes and what the cursor has not read yet."""
        cursor = self.cursor
        lanes = self.lanes
        return (
            len(self.queue)
            + (cursor.unread if cursor is not None else 0)
            + (len(lanes) if lanes is not None else 0)
        )

    @property
    def backend_depth(self) -> int:
        """Of ``depth``, the messages on disk (own store, lanes, and the topic's log)."""
        cursor = self.cursor
        lanes = self.lanes
        return (
            self.backend.depth
            + (cursor.unread_on_disk if cursor is not None else 0)
            + (lanes.backend_depth if lanes is not None else 0)
        )

    @property
    def stored_depth(self) -> int:
        """Messages in the channel's own stores on disk (the own store and the lanes'): what
        nsqd's ``backend_depth`` of a channel counts, the topic's log aside."""
        lanes = self.lanes
        return self.backend.depth + (lanes.backend_depth if lanes is not None else 0)

    def has_ready(self) -> bool:
        """``depth > 0``, cheaply (asked at every delivery request: the cursor first, where a
        channel's messages usually are)."""
        cursor = self.cursor
        return bool(
            (cursor is not None and cursor.has_unread)
            or self.queue.memory_count
            or self.backend.depth
            or (self.lanes is not None and self.lanes)
        )

    @property
    def stored(self) -> tuple[StoredQueue, ...]:
        """The own store and the lanes' stores that are open on disk."""
        own = self.backend.stored
        stored = (own,) if own is not None else ()
        return stored + self.lanes.stored if self.lanes is not None else stored

    def memory_limit(self) -> int:
        """An unbuffered (ephemeral, ``--mem-queue-size=0``) channel's memory bound: the free
        RDY room of its consumers (none while paused)."""
        channel = self._channel
        if channel.paused:
            return 0
        return sum(max(0, s.free) for s in channel.clients.values())

    def ensure_lanes(self, stored: Sequence[int] = ()) -> PriorityLanes:
        """The priority lanes, made when the first message with a priority comes."""
        lanes = self.lanes
        if lanes is None:
            channel = self._channel
            stores = channel.ctx.stores
            open_backend = partial(stores.lane_backend, channel.topic_name, channel.name)
            lanes = self.lanes = PriorityLanes(
                open_backend, self._mem_size, channel.ctx.on_backend_change, stored
            )
        return lanes

    # -- taking ------------------------------------------------------------------------------

    def take(self, count: int, now: float, *, ranked: bool = True) -> list[Message]:
        """Remove up to ``count`` ready messages: the own store (memory, then its backend),
        then the cursor; the priority lanes before all of them (unless not ``ranked``)."""
        return self.take_measured(count, now, ranked=ranked)[0]

    def take_measured(
        self, count: int, now: float, *, ranked: bool = True
    ) -> tuple[list[Message], int, int | None]:
        """``take``, and what is known of the bodies' size without summing them:
        ``(messages, k, bound)``, the last ``k`` messages (read from the cursor) having at
        most ``bound`` bytes of bodies (None: unknown)."""
        queue = self.queue
        lanes = self.lanes
        keeping = self._channel.keeping
        if ranked and lanes is not None and lanes:
            out = lanes.take(count, keeping.lane_read)
            if len(out) < count:
                out += queue.take_memory(count - len(out))
        else:
            out = queue.take_memory(count)
        out, seen = keeping.unique_taken(out, count)
        if len(out) == count:
            return out, 0, 0
        while len(out) < count and self.backend.depth > 0:
            got = queue.read_backend(count - len(out))
            if not got:
                break
            if seen is None:
                seen = {m.id for m in out}
            # Messages written to disk while deferred (shutdown flush, restart) keep their time:
            # they wait in the deferred queue (their copy on disk stands for them).
            self.admit(got, now, out, seen, self._channel.deferred.push)
        cursor = self.cursor
        own = len(out)
        bound: int | None = 0
        if cursor is not None and len(out) < count and cursor.has_unread:
            retry = self._channel.retry
            if retry.expired_seen:
                retry.skip_expired(cursor)
            bound = self._take_cursor(cursor, count, now, out)
        deferred = self._channel.deferred
        if deferred:
            self._channel.wake_at(deferred.next_deadline())
        return out, len(out) - own, bound

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
        keeping = self._channel.keeping
        if keeping.reads_each(bool(cursor.replay_until)):
            # A replay (or a durable channel's read): deferred messages, copies in flight.
            self.admit(got, now, out, {m.id for m in out}, keeping.defer_read)
        else:
            out += got
        return bound

    def admit(
        self,
        got: Sequence[Message],
        now: float,
        out: list[Message],
        seen: set[bytes],
        defer: Callable[[Message], None] | None = None,
    ) -> None:
        """THE in-flight rule: of ``got``, append to ``out`` the messages neither in flight nor
        in ``seen`` (ids taken already; updated), give a not yet due one to ``defer``; a second
        copy is dropped (the keeping records it)."""
        channel = self._channel
        in_flight = channel.in_flight
        keeping = channel.keeping
        for m in got:
            msg_id = m.id
            if msg_id in in_flight or msg_id in seen:
                keeping.duplicate(m)
            elif defer is not None and m.deliver_at > now:
                defer(m)
            else:
                seen.add(msg_id)
                out.append(m)

    def peek_queued(self, count: int) -> list[tuple[int, Message]]:
        """Up to ``count`` ready messages in the order ``take`` would take them (the own
        store's, then the cursor's; the priority lanes' first), as (offset or -1, message),
        changing nothing."""
        lanes = self.lanes
        out = [(-1, m) for m in lanes.peek(count)] if lanes is not None else []
        out += [(-1, m) for m in self.queue.peek(count - len(out))] if len(out) < count else []
        if len(out) < count and self.cursor is not None:
            out += self.cursor.peek(count - len(out))
        return out

    # -- putting back ------------------------------------------------------------------------

    def requeue_front(self, messages: list[Message]) -> None:
        """Messages taken but not delivered back at the head of their queues, in order."""
        lanes = self.lanes
        if lanes is not None and any(map(priority_of, messages)):
            lanes.requeue_front(messages)
            messages = [m for m in messages if not priority_of(m)]
        self.queue.requeue_front(messages)

    def put_back(self, messages: list[Message]) -> None:
        """Messages a round took but no consumer had byte room for. They are queued like
        requeues (memory up to ``--mem-queue-size``, the rest to the own store's disk queue: a
        size estimate that was far off costs disk, not memory); an ephemeral channel, whose
        overflow would be dropped, keeps them at the head of its memory queue."""
        if self._channel.ephemeral:
            self.requeue_front(messages)
        else:
            self._channel.keeping.enqueue(messages)

    # -- life cycle --------------------------------------------------------------------------

    def clear_memory(self) -> None:
        self.queue.clear_memory()
        if self.lanes is not None:
            self.lanes.clear_memory()

    def empty(self) -> None:
        self.queue.empty()
        if self.lanes is not None:
            self.lanes.empty()

    def close(self) -> None:
        self.backend.close()
        if self.lanes is not None:
            self.lanes.close()

    def delete(self) -> None:
        if self.cursor is not None:
            self.cursor.delete()
        self.backend.delete()
        if self.lanes is not None:
            self.lanes.clear_memory()
            self.lanes.delete()

"""PriorityLanes: a channel's ready messages with an lmq priority, highest level first.

Theory of operation
-------------------
A message published with a priority (1..9, lmq's extension; 0 is none) is pushed to every
channel by its topic's pump as soon as the topic hands it on (``stream.py``), whatever the
channel's backlog in the topic's log, and waits here: one **lane** per level, each a FIFO
``SpillQueue`` (memory up to the channel's bound, then its own disk queue
``topic:channel#p<level>``, opened the first time it is written to). Delivery takes from the
highest level that has a message, and from level 0 (the channel's own store, then its cursor)
only when no lane has one: **strict priority**. So lower levels wait while higher ones have
messages ready: a consumer that keeps up with the higher levels gets to the lower ones, one that
does not starves them by design (as in RabbitMQ's and ActiveMQ's priority queues); a workload
that needs a share for every level uses a topic per level instead.

A requeued, timed-out or due deferred message with a priority comes back to its lane's end.
Levels are kept apart on disk too, so order holds across the whole backlog and across restarts:
at shutdown each lane's memory goes to its store, and a channel restored finds its lanes from
the stores that have files (``stores.py``).

A level's lane exists once it has been used (a dict of at most nine), so a channel that never
sees a priority has no lane and pays one ``if`` per delivery round.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from lmqd.engine.backend import BackendError, BackendQueue, StoredQueue
from lmqd.engine.spill import SpillQueue
from lmqd.message import Message

__all__ = ["LANE_SUFFIX", "PriorityLanes", "by_level", "priority_of"]

LANE_SUFFIX = "#p"
"""A lane's store is the disk queue ``topic:channel#p<level>`` (``#`` is in no valid name)."""


def priority_of(m: Message) -> int:
    """The message's lmq priority (0: none)."""
    ext = m.ext
    return ext.priority if ext is not None else 0


def by_level(messages: Sequence[Message]) -> dict[int, list[Message]]:
    """``messages`` with a priority, grouped by level in order (those without left out)."""
    groups: dict[int, list[Message]] = {}
    for m in messages:
        ext = m.ext
        if ext is not None and ext.priority:
            groups.setdefault(ext.priority, []).append(m)
    return groups


class PriorityLanes:
    """Levels 1..9 of one channel's ready messages, each a FIFO; see the module docstring."""

    __slots__ = ("_levels", "_limit", "_on_backend_change", "_open_backend", "lanes")

    def __init__(
        self,
        open_backend: Callable[[int], BackendQueue],
        limit: int,
        on_backend_change: Callable[[BackendQueue], None] | None = None,
        stored_levels: Iterable[int] = (),
    ) -> None:
        self._open_backend = open_backend
        """The backend of a level's lane (a lazily opened disk queue, or memory)."""
        self._limit = limit
        """Messages a lane keeps in memory before its backend takes the rest."""
        self._on_backend_change = on_backend_change
        self.lanes: dict[int, SpillQueue] = {}
        """The lanes used so far, by level."""
        self._levels: list[int] = []
        """``lanes``' levels, highest first."""
        for level in stored_levels:
            self._lane(level)

    def __len__(self) -> int:
        return sum(len(lane) for lane in self.lanes.values())

    def __bool__(self) -> bool:
        return any(len(lane) for lane in self.lanes.values())

    @property
    def backend_depth(self) -> int:
        """Messages in the lanes' backends (on disk)."""
        return sum(lane.backend.depth for lane in self.lanes.values())

    def depths(self) -> dict[int, int]:
        """Ready messages by level (the levels with any)."""
        return {level: n for level in self._levels if (n := len(self.lanes[level]))}

    @property
    def stored(self) -> tuple[StoredQueue, ...]:
        """The lanes' stores that are open on disk."""
        return tuple(s for lane in self.lanes.values() if (s := lane.backend.stored) is not None)

    def _lane(self, level: int) -> SpillQueue:
        lane = self.lanes.get(level)
        if lane is None:
            backend = self._open_backend(level)
            lane = self.lanes[level] = SpillQueue(backend, self._limit, self._on_backend_change)
            self._levels = sorted(self.lanes, reverse=True)
        return lane

    # -- putting -------------------------------------------------------------------------------

    def put_many(self, messages: Sequence[Message]) -> dict[int, SpillQueue]:
        """Append each message to its level's lane (all have a priority). All or none per lane:
        raises ``BackendError`` having kept the lanes written before the failing one (the
        caller holds the messages: ``put_many_or_hold`` for those it owns). Returns the lanes
        written, by level."""
        written: dict[int, SpillQueue] = {}
        for level, group in by_level(messages).items():
            lane = self._lane(level)
            lane.put_many(group)
            written[level] = lane
        return written

    def put_many_or_hold(self, messages: Sequence[Message]) -> tuple[BackendError | None, bool]:
        """Append, never refusing: what a lane's backend refuses it holds in memory past its
        bound. Returns the last backend error (or None) and whether a backend took some."""
        error: BackendError | None = None
        wrote = False
        for level, group in by_level(messages).items():
            lane = self._lane(level)
            error = lane.put_many_or_hold(group) or error
            wrote = wrote or lane.wrote_backend
        return error, wrote

    def hold(self, messages: Sequence[Message]) -> None:
        """Append to memory whatever the bound (messages safe elsewhere already)."""
        for level, group in by_level(messages).items():
            self._lane(level).hold(group)

    def requeue_front(self, messages: Sequence[Message]) -> None:
        """Put messages taken but not delivered back at the head of their lanes, in order."""
        for level, group in by_level(messages).items():
            self._lane(level).requeue_front(group)

    # -- taking --------------------------------------------------------------------------------

    def take(
        self,
        count: int,
        on_read: Callable[[BackendQueue, list[Message]], None],
        *,
        lowest_first: bool = False,
    ) -> list[Message]:
        """Remove up to ``count`` messages, highest level first (``lowest_first``: the other
        way, to drop what matters least), each lane's memory then its backend;
        ``on_read(backend, messages)`` is told of those read from a backend."""
        out: list[Message] = []
        lanes = self.lanes
        for level in reversed(self._levels) if lowest_first else self._levels:
            lane = lanes[level]
            if not len(lane):
                continue
            out += lane.take_memory(count - len(out))
            while len(out) < count and lane.backend.depth > 0:
                got = lane.read_backend(count - len(out))
                if not got:
                    break  # unreadable for now (see the storage log)
                on_read(lane.backend, got)
                out += got
            if len(out) >= count:
                break
        return out

    def peek(self, count: int) -> list[Message]:
        """Up to ``count`` of the messages ``take`` would return next, changing nothing."""
        out: list[Message] = []
        for level in self._levels:
            if len(out) >= count:
                break
            out += self.lanes[level].peek(count - len(out))
        return out

    # -- life cycle ----------------------------------------------------------------------------

    def memory(self) -> list[tuple[int, BackendQueue, list[Message]]]:
        """Each lane's level and backend with the messages its memory holds (shutdown writes
        them)."""
        return [
            (level, lane.backend, lane.memory())
            for level, lane in self.lanes.items()
            if lane.memory_count
        ]

    def clear_memory(self) -> None:
        for lane in self.lanes.values():
            lane.clear_memory()

    def empty(self) -> None:
        for lane in self.lanes.values():
            lane.empty()

    def close(self) -> None:
        for lane in self.lanes.values():
            lane.backend.close()

    def delete(self) -> None:
        for lane in self.lanes.values():
            lane.backend.delete()

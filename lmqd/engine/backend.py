"""The backend queue behind every topic's and channel's memory queue.

A topic or channel keeps at most ``--mem-queue-size`` messages in memory and hands the overflow to
its backend. Three implementations share this interface:

* ``MemoryBackend``: an unbounded in-memory FIFO (no persistence); used where no disk queue is
  configured, and never drops a message.
* ``DummyBackend``: ephemeral topics and channels (``#ephemeral``, ``#tmp``); drops what it is given
  and counts the drops, as nsqd's dummy backend does.
* ``lmqd.storage`` disk queue: segment files under ``--data-path``. It is also a ``StoredQueue``
  (``stored`` returns it): what the syncer, a durable channel's acknowledgements and the metrics
  need of a queue on disk. The engine never asks which class a backend is.

All methods are plain ``def`` and never await (trio-atomic); a disk backend does its fsyncs in a
worker thread, outside this interface.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence
from itertools import islice
from typing import Protocol

from lmqd.message import Message
from lmqd.stats import NO_DAMAGE, StorageDamage
from lmqd.storage import SyncJob
from lmqd.storage.errors import BackendError
from lmqd.storage.repair import Damage

__all__ = [
    "BackendError",
    "BackendQueue",
    "DummyBackend",
    "LazyBackend",
    "MemoryBackend",
    "StoredQueue",
    "Syncable",
]


class BackendQueue(Protocol):
    @property
    def stored(self) -> StoredQueue | None:
        """This queue, if it is stored on disk; None otherwise."""
        ...

    @property
    def depth(self) -> int:
        """Messages stored and not yet read."""
        ...

    def put_many(self, messages: Sequence[Message]) -> None:
        """Append messages in order; raises ``BackendError`` having stored none of them."""
        ...

    def read_many(self, max_count: int) -> list[Message]:
        """Remove and return up to ``max_count`` of the oldest messages."""
        ...

    def peek(self, max_count: int) -> list[Message]:
        """Up to ``max_count`` of the messages ``read_many`` would return next, changing
        nothing (``/peek``); raises ``OSError`` for a stored queue that cannot be read."""
        ...

    def empty(self) -> None:
        """Drop every stored message."""
        ...

    def delete(self) -> None:
        """Drop everything and release the storage (topic or channel deleted)."""
        ...

    def close(self) -> None:
        """Flush and release; the stored messages stay for the next start."""
        ...


class Syncable(Protocol):
    """What the syncer (``lmqd.engine.syncer``) needs of something stored on disk: a disk queue,
    or a topic's stream over its log (``lmqd.engine.stream``)."""

    @property
    def name(self) -> str: ...

    @property
    def closed(self) -> bool: ...

    @property
    def dirty_count(self) -> int:
        """Reads, writes and acknowledgements since the last ``prepare_sync``."""
        ...

    @property
    def bytes_on_disk(self) -> int: ...

    def prepare_sync(self) -> SyncJob | None:
        """What to fsync and persist now (event-loop thread); None if nothing."""
        ...


class StoredQueue(BackendQueue, Syncable, Protocol):
    """A backend queue on disk (``lmqd.storage.DiskQueue``)."""

    @property
    def logical_bytes(self) -> int:
        """``bytes_on_disk`` with every batch plain (compression at rest: the ratio)."""
        ...

    @property
    def ack_mode(self) -> bool:
        """``--durable``: the persisted read position stops at the oldest unacknowledged message."""
        ...

    def ack_messages(self, messages: Sequence[Message]) -> int:
        """Acknowledge messages read from this queue (others are ignored); how many were."""
        ...

    @property
    def damage(self) -> Damage:
        """What the queue found wrong with its files since it was opened."""
        ...

    @property
    def stored_message_ttls(self) -> bool:
        """Whether some message found on disk when the queue opened has its own TTL."""
        ...

    def stored_offsets(self, *, read_too: bool = False) -> tuple[dict[bytes, int], int]:
        """The topic offsets the messages still to read carry (a read of the files), by id
        (``read_too``: those already read too), and how many carry none; raises ``OSError``."""
        ...


def storage_damage(found: Iterable[Damage]) -> StorageDamage:
    """The damage counters of some logs and queues, summed, as ``/stats`` reports them."""
    total = NO_DAMAGE
    for d in found:
        total += StorageDamage(
            regions=d.corrupt_count,
            bytes=d.corrupt_bytes,
            lost_messages=d.lost_messages,
            missing_segments=d.missing_segments,
            rebuilt_positions=d.rebuilt_count,
        )
    return total


class MemoryBackend:
    """Unbounded in-memory FIFO: nothing is dropped, nothing survives a restart."""

    __slots__ = ("_queue",)

    stored = None

    def __init__(self) -> None:
        self._queue: deque[Message] = deque()

    @property
    def depth(self) -> int:
        return len(self._queue)

    def put_many(self, messages: Sequence[Message]) -> None:
        self._queue.extend(messages)

    def read_many(self, max_count: int) -> list[Message]:
        queue = self._queue
        count = min(max_count, len(queue))
        popleft = queue.popleft
        return [popleft() for _ in range(count)]

    def peek(self, max_count: int) -> list[Message]:
        return list(islice(self._queue, max_count))

    def empty(self) -> None:
        self._queue.clear()

    def delete(self) -> None:
        self._queue.clear()

    def close(self) -> None:
        pass


class DummyBackend:
    """Ephemeral queues: overflow past the memory queue is dropped and counted (nsqd behaviour)."""

    __slots__ = ("dropped_count",)

    stored = None

    def __init__(self) -> None:
        self.dropped_count = 0

    @property
    def depth(self) -> int:
        return 0

    def put_many(self, messages: Sequence[Message]) -> None:
        self.dropped_count += len(messages)

    def read_many(self, max_count: int) -> list[Message]:
        return []

    def peek(self, max_count: int) -> list[Message]:
        return []

    def empty(self) -> None:
        pass

    def delete(self) -> None:
        pass

    def close(self) -> None:
        pass


class LazyBackend:
    """A disk queue opened the first time something is written to it.

    A channel's own store (requeues past ``--mem-queue-size``, what shutdown writes) is rarely
    needed once channels read their topic's log: creating a channel should not cost a queue's
    files. ``open_queue(name)`` makes the queue (blocking, raises ``BackendError``); until then
    the queue holds nothing. ``stored`` is the queue once open. (The opener and the name are
    kept apart, not bound in a ``partial``: one object fewer per idle channel.)
    """

    __slots__ = ("_name", "_open", "queue")

    def __init__(
        self,
        open_queue: Callable[[str], BackendQueue],
        name: str,
        queue: BackendQueue | None = None,
    ):
        self._open = open_queue
        self._name = name
        self.queue = queue
        """The queue, once opened (or given: one that had files at start-up)."""

    def opened(self) -> BackendQueue:
        """The queue, opened now if needed; raises ``BackendError``."""
        if self.queue is None:
            self.queue = self._open(self._name)
        return self.queue

    @property
    def stored(self) -> StoredQueue | None:
        return self.queue.stored if self.queue is not None else None

    @property
    def depth(self) -> int:
        return self.queue.depth if self.queue is not None else 0

    def put_many(self, messages: Sequence[Message]) -> None:
        self.opened().put_many(messages)

    def read_many(self, max_count: int) -> list[Message]:
        return self.queue.read_many(max_count) if self.queue is not None else []

    def peek(self, max_count: int) -> list[Message]:
        return self.queue.peek(max_count) if self.queue is not None else []

    def empty(self) -> None:
        if self.queue is not None:
            self.queue.empty()

    def delete(self) -> None:
        if self.queue is not None:
            self.queue.delete()

    def close(self) -> None:
        if self.queue is not None:
            self.queue.close()

"""The backend queue behind every topic's and channel's memory queue.

A topic or channel keeps at most ``--mem-queue-size`` messages in memory and hands the overflow to
its backend. Three implementations share this interface:

* ``MemoryBackend``: an unbounded in-memory FIFO (no persistence); used where no disk queue is
  configured, and never drops a message.
* ``DummyBackend``: ephemeral topics and channels (``#ephemeral``, ``#tmp``); drops what it is given
  and counts the drops, as nsqd's dummy backend does.
* ``lmqd.storage`` disk queue: segment files under ``--data-path``.

All methods are plain ``def`` and never await (trio-atomic); a disk backend does its fsyncs in a
worker thread, outside this interface.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Protocol

from lmqd.message import Message
from lmqd.storage.errors import BackendError as BackendError  # re-exported: its home is storage


class BackendQueue(Protocol):
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

    def empty(self) -> None:
        """Drop every stored message."""
        ...

    def delete(self) -> None:
        """Drop everything and release the storage (topic or channel deleted)."""
        ...

    def close(self) -> None:
        """Flush and release; the stored messages stay for the next start."""
        ...


class MemoryBackend:
    """Unbounded in-memory FIFO: nothing is dropped, nothing survives a restart."""

    __slots__ = ("_queue",)

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

    def empty(self) -> None:
        self._queue.clear()

    def delete(self) -> None:
        self._queue.clear()

    def close(self) -> None:
        pass


class DummyBackend:
    """Ephemeral queues: overflow past the memory queue is dropped and counted (nsqd behaviour)."""

    __slots__ = ("dropped_count",)

    def __init__(self) -> None:
        self.dropped_count = 0

    @property
    def depth(self) -> int:
        return 0

    def put_many(self, messages: Sequence[Message]) -> None:
        self.dropped_count += len(messages)

    def read_many(self, max_count: int) -> list[Message]:
        return []

    def empty(self) -> None:
        pass

    def delete(self) -> None:
        pass

    def close(self) -> None:
        pass

"""MemoryTail: a topic's messages kept in memory, each at its topic offset.

A topic (``stream.py``) keeps up to ``--mem-queue-size`` of its messages here instead of only in
its log: offsets ``[start, end)``, contiguous, oldest first. Channels read them by offset
(``cursor.py``); once every channel has read a message it leaves from the front without ever
being written (nsqd's memory queue: a consumer that keeps up costs no disk). What happens past
the bound (the oldest to the log, or, under a backlog, the new ones) is the stream's business.

A list with a head index rather than a deque: reading by offset is a slice (a deque has no O(1)
slicing), dropping from the front moves the head, and the dead prefix is deleted once it is half
the list (amortised O(1) per message).
"""

from __future__ import annotations

from collections.abc import Sequence

from lmqd.message import Message


class MemoryTail:
    """Messages at offsets ``start .. end-1``, oldest first; see the module docstring."""

    __slots__ = ("_head", "_items", "start")

    def __init__(self, start: int = 0) -> None:
        self._items: list[Message] = []
        self._head = 0
        self.start = start
        """The offset of the oldest message held (``end`` when empty)."""

    def __len__(self) -> int:
        return len(self._items) - self._head

    @property
    def end(self) -> int:
        """The offset after the newest message held."""
        return self.start + len(self._items) - self._head

    def extend(self, messages: Sequence[Message]) -> None:
        """Append messages whose offsets follow ``end``."""
        self._items.extend(messages)

    def slice(self, offset: int, count: int) -> list[Message]:
        """Up to ``count`` messages from ``offset`` (in ``[start, end]``) on. O(count)."""
        i = self._head + offset - self.start
        return self._items[i : i + count]

    def front(self, count: int) -> list[Message]:
        """The ``count`` oldest messages (not removed)."""
        return self._items[self._head : self._head + count]

    def drop_front(self, count: int) -> None:
        """Forget the ``count`` oldest messages."""
        count = min(count, len(self))
        if count <= 0:
            return
        self._head += count
        self.start += count
        if self._head * 2 >= len(self._items):
            del self._items[: self._head]
            self._head = 0

    def drop_until(self, offset: int) -> None:
        """Forget every message below ``offset``."""
        self.drop_front(offset - self.start)

    def reset(self, start: int) -> None:
        """Forget everything; the next message appended has offset ``start``."""
        self._items.clear()
        self._head = 0
        self.start = start


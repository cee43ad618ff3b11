"""A channel's deferred messages (REQ with a delay, DPUB): a min-heap on ``deliver_at``.

Nothing is ever taken out of the middle (a deferred message cannot be FIN'd or touched), so a
plain heap with no lazy deletion suffices. Entries carry an insertion sequence number so messages
due at the same time come out in the order they were deferred, and so the heap never compares
two ``Message`` objects.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Iterator

from lmqd.message import Message

_SEQUENCE = itertools.count()
"""Insertion numbers, shared by every queue (increasing in each one, which is all the order
needs): an idle channel holds no counter object of its own."""


class DeferredQueue:
    """Messages waiting for their ``deliver_at`` time before they join the channel's queue."""

    __slots__ = ("_heap", "_seq")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Message]] = []
        self._seq = _SEQUENCE

    def __len__(self) -> int:
        """O(1)."""
        return len(self._heap)

    def __iter__(self) -> Iterator[Message]:
        """The messages in no particular order (for flushing at shutdown). O(1) per message."""
        return (entry[2] for entry in self._heap)

    def push(self, msg: Message) -> None:
        """Hold ``msg`` until ``msg.deliver_at``. O(log n)."""
        heapq.heappush(self._heap, (msg.deliver_at, next(self._seq), msg))

    def next_deadline(self) -> float:
        """The earliest ``deliver_at``, ``math.inf`` when empty. O(1)."""
        return self._heap[0][0] if self._heap else math.inf

    def pop_due(self, now: float) -> list[Message]:
        """Remove and return the messages with ``deliver_at <= now``, earliest first (ties in
        insertion order). O(k log n) for k due messages."""
        heap = self._heap
        pop = heapq.heappop
        due: list[Message] = []
        while heap and heap[0][0] <= now:
            due.append(pop(heap)[2])
        return due

    def clear(self) -> list[Message]:
        """Remove everything; returns the messages in due order. O(n log n)."""
        out = [entry[2] for entry in sorted(self._heap, key=lambda e: (e[0], e[1]))]
        self._heap.clear()
        return out

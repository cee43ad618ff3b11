"""A channel's in-flight messages: by id for FIN/REQ/TOUCH, by deadline for timeouts.

Theory of operation: a dict ``id -> Message`` answers FIN, REQ and TOUCH in O(1), and a binary
heap of ``(deadline, id)`` entries gives the next timeout. Entries are never taken out of the
middle of the heap (that would need per-message heap indexes, as nsqd keeps, and O(log n) work
on every FIN); instead an entry goes *stale* when its id has left the dict or the message's
``deadline`` no longer equals the entry's (TOUCH pushed a newer entry). Stale entries are skipped
when they reach the top, and when they outnumber live entries about two to one the heap is
rebuilt from the dict, so under a high FIN rate memory stays within a constant factor of the
number of messages actually in flight, at an amortised O(1) cost per FIN.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator, Sequence

from lmqd.message import Message

# Rebuild when stale entries exceed twice the live ones; the floor keeps tiny queues from
# rebuilding on every other FIN (a 64-entry heap costs nothing to carry).
_COMPACT_RATIO = 3
_COMPACT_FLOOR = 64


class InFlightQueue:
    """Messages delivered to a client and neither finished, requeued nor timed out."""

    __slots__ = ("_heap", "_messages")

    def __init__(self) -> None:
        self._messages: dict[bytes, Message] = {}
        self._heap: list[tuple[float, bytes]] = []

    def __len__(self) -> int:
        """O(1)."""
        return len(self._messages)

    def __contains__(self, msg_id: object) -> bool:
        """O(1)."""
        return msg_id in self._messages

    def __iter__(self) -> Iterator[Message]:
        """The messages in delivery order (dict order). O(1) per message."""
        return iter(self._messages.values())

    @property
    def heap_size(self) -> int:
        """Heap entries, live and stale (for tests and metrics). O(1)."""
        return len(self._heap)

    def push(self, msg: Message) -> None:
        """Start ``msg`` in flight until ``msg.deadline``. O(log n)."""
        self._messages[msg.id] = msg
        heapq.heappush(self._heap, (msg.deadline, msg.id))

    def push_many(self, messages: Sequence[Message], deadline: float) -> None:
        """Start ``messages`` in flight, every one with ``deadline`` (already set on each).

        O(k log n) for k messages; the per-message work is one dict store and one heap push.
        """
        store = self._messages
        heap = self._heap
        push = heapq.heappush
        for m in messages:
            mid = m.id
            store[mid] = m
            push(heap, (deadline, mid))

    def get(self, msg_id: bytes) -> Message | None:
        """The in-flight message with ``msg_id``, or None. O(1)."""
        return self._messages.get(msg_id)

    def remove(self, msg_id: bytes) -> Message:
        """Take the message out of flight (``KeyError`` if absent). Amortised O(1)."""
        msg = self._messages.pop(msg_id)
        if len(self._heap) > _COMPACT_RATIO * len(self._messages) + _COMPACT_FLOOR:
            self._compact()
        return msg

    def set_deadline(self, msg: Message, deadline: float) -> None:
        """Move an in-flight message's deadline (TOUCH). O(log n) amortised."""
        msg.deadline = deadline
        # The old entry goes stale because its deadline no longer matches the message's.
        heapq.heappush(self._heap, (deadline, msg.id))
        if len(self._heap) > _COMPACT_RATIO * len(self._messages) + _COMPACT_FLOOR:
            self._compact()

    def next_deadline(self) -> float:
        """The earliest live deadline, ``math.inf`` when empty. Amortised O(log n).

        Drops stale entries from the top first, so a caller sleeping until this time is not
        woken for a message that was already finished.
        """
        heap = self._heap
        messages = self._messages
        while heap:
            deadline, mid = heap[0]
            msg = messages.get(mid)
            if msg is not None and msg.deadline == deadline:
                return deadline
            heapq.heappop(heap)
        return math.inf

    def pop_due(self, now: float) -> list[Message]:
        """Remove and return every message whose deadline is ``<= now``, earliest first.

        O(k log n) for k due or stale entries.
        """
        heap = self._heap
        messages = self._messages
        pop = heapq.heappop
        due: list[Message] = []
        while heap and heap[0][0] <= now:
            deadline, mid = pop(heap)
            msg = messages.get(mid)
            if msg is not None and msg.deadline == deadline:
                del messages[mid]
                due.append(msg)
        return due

    def clear(self) -> list[Message]:
        """Remove everything; returns the messages in delivery order. O(n)."""
        out = list(self._messages.values())
        self._messages.clear()
        self._heap.clear()
        return out

    def _compact(self) -> None:
        # O(n) rebuild; runs only after ~2n stale entries piled up, hence amortised O(1).
        self._heap = [(m.deadline, mid) for mid, m in self._messages.items()]
        heapq.heapify(self._heap)

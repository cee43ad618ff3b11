"""A channel's in-flight messages: by id for FIN/REQ/TOUCH, by deadline for timeouts.

Theory of operation: a dict ``id -> Message`` answers FIN, REQ and TOUCH in O(1), and a binary
heap gives the next timeout. One delivery round gives a client a batch of messages that all share
one deadline (``now + msg_timeout``), so a heap entry is ``(deadline, seq, [messages])`` for the
whole batch: per message, starting a flight costs one dict store, not a heap push.

Entries are never taken out of the middle of the heap (that would need per-message heap indexes,
as nsqd keeps, and O(log n) work on every FIN). A message in an entry is *stale* when it has left
the dict (FIN, REQ, timeout) or its ``deadline`` no longer equals the entry's (TOUCH pushed a new
entry, or it was requeued and delivered again); stale messages are skipped when their entry comes
due. ``next_deadline`` looks for the top entry's first live message from where its last look
stopped (the entry keeps that index): a consumer FINs its batch in order, so asking for the next
deadline after every delivery round costs O(1) amortised, not a scan of the finished prefix of
a batch of thousands each time. Stale references would keep finished messages (and their
bodies) alive until their old deadline, so when the references held by the heap exceed about
three times the live messages the heap is rebuilt from the dict: memory stays within a constant
factor of what is really in flight, at an amortised O(1) cost per message. The check runs when
entries are pushed, so FIN itself is just a dict lookup and delete.

The same rule holds in bytes: each entry carries its bodies' size (one sum per batch, or its
share of the delivery round's, passed in: an upper bound from the stream's byte marks when the
round was not summed, ``bytemarks.py``), and the heap is also rebuilt when the bytes it
references pass three times the live bytes at the last rebuild plus ``COMPACT_FLOOR_BYTES``.
Counting alone let 1024 finished messages live on, which for 1 MiB bodies is a gigabyte.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from lmqd.message import Message
from lmqd.protocol.errors import CLIENT_DOES_NOT_OWN_MESSAGE, ID_NOT_IN_FLIGHT

COMPACT_RATIO = 3
COMPACT_FLOOR = 1024
"""The heap is rebuilt when it references more than ``COMPACT_RATIO * live + COMPACT_FLOOR``
messages (stale references then exceed twice the live ones). The floor keeps a small queue (a
consumer that FINs everything at once) from rebuilding on every delivery, at the price of at most
that many finished messages kept alive a little longer."""
COMPACT_FLOOR_BYTES = 16 * 1024 * 1024
"""The floor in bytes: finished bodies kept alive by stale references stay under three times the
bytes live at the last rebuild plus this. 16 MiB: a rebuild (O(live messages)) at most every
sixteen deliveries of 1 MiB messages, never for small ones (the count floor comes first)."""


class ChannelError(Exception):
    """A FIN, REQ or TOUCH that cannot apply; ``str()`` is nsqd's reason text."""


class NotInFlight(ChannelError):
    """The message id is not in flight on this channel (nsqd: ``ID not in flight``)."""

    def __init__(self) -> None:
        super().__init__(ID_NOT_IN_FLIGHT)


class NotOwner(ChannelError):
    """The message is in flight to another client (nsqd: ``client does not own message``)."""

    def __init__(self) -> None:
        super().__init__(CLIENT_DOES_NOT_OWN_MESSAGE)


_SEQUENCE = itertools.count()
"""Heap entries' sequence numbers, shared by every queue (unique and increasing in each one,
which is all the heap needs): an idle channel holds no counter object of its own."""


class InFlightQueue:
    """Messages delivered to a client and neither finished, requeued nor timed out."""

    __slots__ = ("_compact_bytes", "_heap", "_messages", "_ref_bytes", "_refs", "_seq")

    def __init__(self) -> None:
        self._messages: dict[bytes, Message] = {}
        # [deadline, seq, messages, their body bytes, index of the first message that may be
        # live]: seq is unique, so the rest never compares; a list, so that the index can move
        self._heap: list[list[Any]] = []
        self._refs = 0  # message references held by heap entries, live and stale
        self._ref_bytes = 0  # their bodies' bytes
        self._compact_bytes = COMPACT_FLOOR_BYTES  # rebuild past this many referenced bytes
        self._seq = _SEQUENCE

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

    @property
    def ref_count(self) -> int:
        """Message references held by the heap, live and stale (for tests and metrics). O(1)."""
        return self._refs

    @property
    def ref_bytes(self) -> int:
        """Body bytes the heap references, live and stale (for tests and metrics). O(1)."""
        return self._ref_bytes

    def _push(self, messages: Sequence[Message], deadline: float, nbytes: int | None) -> None:
        if nbytes is None:
            nbytes = sum([len(m.body) for m in messages])
        heapq.heappush(self._heap, [deadline, next(self._seq), list(messages), nbytes, 0])
        self._refs += len(messages)
        self._ref_bytes += nbytes
        if (
            self._refs > COMPACT_RATIO * len(self._messages) + COMPACT_FLOOR
            or self._ref_bytes > self._compact_bytes
        ):
            self._compact()

    def push_many(self, messages: Sequence[Message], deadline: float) -> None:
        """Start ``messages`` in flight, every one with ``deadline`` (already set on each).

        O(k + log n) for k messages: one dict store each and one heap entry for them all.
        """
        if not messages:
            return
        store = self._messages
        for m in messages:
            store[m.id] = m
        self._push(messages, deadline, None)

    def start_many(
        self,
        messages: Sequence[Message],
        client_id: int,
        now: float,
        deadline: float,
        nbytes: int | None = None,
    ) -> None:
        """Deliver ``messages`` to ``client_id`` at ``now``: count the attempt, stamp the
        owner, delivery time and ``deadline`` on each, and start them in flight. ``nbytes``:
        their bodies' size when the caller has it (counted here otherwise).

        ``push_many`` with the per-message stamping folded into its one loop (the hot path of
        every delivery). O(k + log n).
        """
        if not messages:
            return
        store = self._messages
        for m in messages:
            m.attempts += 1
            m.client_id = client_id
            m.delivered_at = now
            m.deadline = deadline
            store[m.id] = m
        self._push(messages, deadline, nbytes)

    def get(self, msg_id: bytes) -> Message | None:
        """The in-flight message with ``msg_id``, or None. O(1)."""
        return self._messages.get(msg_id)

    def remove(self, msg_id: bytes) -> Message:
        """Take the message out of flight (``KeyError`` if absent). O(1)."""
        return self._messages.pop(msg_id)

    def owned(self, msg_id: bytes, client_id: int) -> Message:
        """The in-flight message with ``msg_id`` if ``client_id`` holds it. O(1).

        Raises ``NotInFlight`` or ``NotOwner``.
        """
        msg = self._messages.get(msg_id)
        if msg is None:
            raise NotInFlight()
        if msg.client_id != client_id:
            raise NotOwner()
        return msg

    def remove_owned(self, msg_id: bytes, client_id: int) -> Message:
        """Take the message out of flight if ``client_id`` holds it. O(1).

        Raises ``NotInFlight`` or ``NotOwner`` (nothing changes then).
        """
        messages = self._messages
        msg = messages.get(msg_id)
        if msg is None:
            raise NotInFlight()
        if msg.client_id != client_id:
            raise NotOwner()
        del messages[msg_id]
        return msg

    def remove_many_owned(
        self, msg_ids: Iterable[bytes], client_id: int
    ) -> tuple[list[Message], list[tuple[bytes, ChannelError]]]:
        """``remove_owned`` for each id in order: returns the messages taken out of flight and
        the ``(id, error)`` of those that were not (nothing changes for them). O(1) each."""
        messages = self._messages
        get = messages.get
        done: list[Message] = []
        failed: list[tuple[bytes, ChannelError]] = []
        for msg_id in msg_ids:
            msg = get(msg_id)
            if msg is not None and msg.client_id == client_id:
                del messages[msg_id]
                done.append(msg)
            else:
                failed.append((msg_id, NotInFlight() if msg is None else NotOwner()))
        return done, failed

    def set_deadline(self, msg: Message, deadline: float) -> None:
        """Move an in-flight message's deadline (TOUCH). O(log n) amortised."""
        msg.deadline = deadline
        # The old entry's reference goes stale: its deadline no longer matches the message's.
        self.push_many((msg,), deadline)

    def next_deadline(self) -> float:
        """The earliest live deadline, ``math.inf`` when empty. Amortised O(log n) (O(1) when
        nothing changed since the last call).

        Drops entries whose messages are all stale from the top first, so a caller sleeping
        until this time is not woken for messages that were already finished.
        """
        heap = self._heap
        messages = self._messages
        deadline: float
        batch: list[Message]
        while heap:
            entry = heap[0]
            deadline, _, batch, nbytes, start = entry
            # The messages before ``start`` were stale at an earlier look: one that became live
            # again with this very deadline (delivered again at the same instant) is in a newer
            # entry too, with the same deadline.
            for k in range(start, len(batch)):
                m = batch[k]
                if messages.get(m.id) is m and m.deadline == deadline:
                    entry[4] = k
                    return deadline
            heapq.heappop(heap)
            self._refs -= len(batch)
            self._ref_bytes -= nbytes
        return math.inf

    def pop_due(self, now: float) -> list[Message]:
        """Remove and return every message whose deadline is ``<= now``, earliest first.

        O(k + e log n) for k messages in e due entries.
        """
        heap = self._heap
        messages = self._messages
        due: list[Message] = []
        deadline: float
        batch: list[Message]
        while heap and heap[0][0] <= now:
            deadline, _, batch, nbytes, _ = heapq.heappop(heap)
            self._refs -= len(batch)
            self._ref_bytes -= nbytes
            for m in batch:
                mid = m.id
                if messages.get(mid) is m and m.deadline == deadline:
                    del messages[mid]
                    due.append(m)
        return due

    def clear(self) -> list[Message]:
        """Remove everything; returns the messages in delivery order. O(n)."""
        out = list(self._messages.values())
        self._messages.clear()
        self._heap.clear()
        self._refs = 0
        self._ref_bytes = 0
        self._compact_bytes = COMPACT_FLOOR_BYTES
        return out

    def _compact(self) -> None:
        # O(n) rebuild, one entry per distinct deadline; it runs only after ~2n stale references
        # piled up, hence amortised O(1) per message.
        groups: dict[float, list[Message]] = {}
        for m in self._messages.values():
            group = groups.get(m.deadline)
            if group is None:
                groups[m.deadline] = [m]
            else:
                group.append(m)
        seq = self._seq
        self._heap = [
            [d, next(seq), batch, sum([len(m.body) for m in batch]), 0]
            for d, batch in groups.items()
        ]
        heapq.heapify(self._heap)
        self._refs = len(self._messages)
        self._ref_bytes = sum(entry[3] for entry in self._heap)
        self._compact_bytes = COMPACT_RATIO * self._ref_bytes + COMPACT_FLOOR_BYTES

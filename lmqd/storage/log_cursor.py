"""A cursor: one channel's read position over its topic's log, and its low-water mark.

A cursor reads the log forward (``LogReader``) and remembers which of the messages it returned
are not yet **settled**. Its **low-water mark** (``low``) is the oldest offset not settled: the
oldest unsettled message's, or the read position when every message read is settled. That mark
is what the log persists for the cursor (``log_state.py``) and where the cursor resumes after a
restart or a crash: everything not settled is read again (at-least-once), along with settled
messages that followed the oldest unsettled one (duplicates, never loss). It is also what keeps
segments on disk: the log deletes a segment only once every cursor's mark has passed it.

Settling is the channel's business: a FIN settles a message; so does moving it into the
channel's own store (a message that stays unsettled for long must not pin the log). A channel
that keeps no promise across a crash (nsqd's default mode) reads with ``settle=True``.

The unsettled offsets are kept as an ``acks.AckTracker`` keyed by offset (a set and the read
order), so settling a batch is one C loop and the mark is the order's head after the settled
ones are popped from it: O(1) amortised per message.

``read_many``'s messages may be the very objects another cursor gets (the log's tail cache
shares them): read-only. ``read_messages`` returns the caller's own objects, with their offsets.
"""

from __future__ import annotations

from collections.abc import Iterable
from operator import attrgetter, itemgetter

from lmqd.message import Message
from lmqd.storage.acks import AckTracker
from lmqd.storage.log_cache import TailCache
from lmqd.storage.log_index import LogIndex
from lmqd.storage.log_reader import LogEntry, LogReader

_offset = itemgetter(0)
_message_offset = attrgetter("offset")


class Cursor:
    """A named read position over a topic log with a low-water mark; see the module docstring.

    Created by ``TopicLog.create_cursor`` (or restored when the log opens), never directly.
    """

    __slots__ = (
        "_acks",
        "_held",
        "_index",
        "_reader",
        "deleted",
        "dirty",
        "name",
        "read_before",
        "skips",
    )

    def __init__(self, name: str, index: LogIndex, cache: TailCache, offset: int) -> None:
        self.name = name
        self._index = index
        self._reader = LogReader(index, cache, offset)
        self._acks: AckTracker | None = None
        """The unsettled messages (None until the first read that leaves some: a cursor read
        with ``settle=True``, nsqd's default mode, never has any, and an idle one costs a set
        and a deque less)."""
        self.dirty = 0
        """Reads, settles and seeks since the log's last ``prepare_sync``."""
        self.deleted = False
        """Set by ``TopicLog.delete_cursor``: the cursor reads nothing any more."""
        self.read_before = offset
        """Offsets below this were read by the cursor before the log was last opened (its
        persisted read position): read again after a crash, they are redeliveries."""
        self.skips: list[tuple[int, int]] = []
        """Offset ranges ``[start, end)`` the cursor's owner steps over (a topic empty dropped
        them before it read them), persisted with the mark until it has passed them."""
        self._held: AckTracker | None = None
        """Messages read and not settled before a ``seek(keep_unsettled=True)``: they hold the
        mark until settled, wherever the cursor reads now (None until there are any: most
        cursors never seek, and a topic or channel should cost little while idle)."""

    @property
    def position(self) -> int:
        """The offset of the next message to read."""
        return self._reader.position

    @property
    def low(self) -> int:
        """The low-water mark: the oldest offset read and not settled, else ``position``."""
        acks = self._acks
        oldest = acks.oldest() if acks is not None else None
        low = self._reader.position if oldest is None else oldest
        held = self._held
        if held is not None and held.order:
            return min(low, held.order[0])
        return low

    @property
    def unsettled_count(self) -> int:
        """Messages read and not yet settled."""
        acks = self._acks
        held = self._held
        return (len(acks) if acks is not None else 0) + (len(held) if held is not None else 0)

    @property
    def lag(self) -> int:
        """Offsets between the position and the log's end: the messages not yet read (offsets
        lost to damage included)."""
        return max(self._index.next_offset - self._reader.position, 0)

    def read_many(
        self, max_count: int, *, settle: bool = False, until: int | None = None
    ) -> list[LogEntry]:
        """Up to ``max_count`` of the next messages (below offset ``until``, if given), with
        their offsets; the position moves past them. They stay unsettled (holding the
        low-water mark) until ``settle``\\ d, unless ``settle`` is true."""
        if self.deleted or max_count <= 0:
            return []
        got = self._reader.read_many(max_count, until)
        if got:
            self._note_read(len(got), settle, map(_offset, got))
        return got

    def read_messages(
        self, max_count: int, *, settle: bool = False, until: int | None = None
    ) -> list[Message]:
        """``read_many``'s messages as the caller's own objects, each carrying its offset
        (``LogReader.read_messages``): what a channel's cursor reads."""
        if self.deleted or max_count <= 0:
            return []
        got = self._reader.read_messages(max_count, until)
        if got:
            self._note_read(len(got), settle, map(_message_offset, got))
        return got

    def _note_read(self, count: int, settle: bool, offsets: Iterable[int]) -> None:
        # Counted either way: the read position is persisted too (``read_before``).
        self.dirty += count
        if not settle:
            read = list(offsets)
            acks = self._acks
            if acks is None:
                acks = self._acks = AckTracker()
            acks.outstanding.update(read)
            acks.order.extend(read)

    def settle(self, offset: int) -> bool:
        """Mark one message read as done; False if it is not unsettled."""
        acks = self._acks
        held = self._held
        if not (acks is not None and acks.ack(offset)) and not (held and held.ack(offset)):
            return False
        self.dirty += 1
        return True

    def settle_many(self, offsets: Iterable[int]) -> int:
        """Mark many messages done; returns how many were unsettled (each counted once).

        A message read again after a ``seek(keep_unsettled=True)`` while its first reading was
        still unsettled has two claims on the mark: each settle of its offset ends one."""
        acks = self._acks
        held = self._held
        if acks is None:
            known = held.ack_many(offsets) if held else 0
        elif not held:
            known = acks.ack_many(offsets)
        else:
            offsets = set(offsets)
            current = offsets & acks.outstanding
            known = acks.ack_many(current) + held.ack_many(offsets - current)
        self.dirty += known
        return known

    def seek(self, offset: int, *, keep_unsettled: bool = False) -> int:
        """Read from ``offset`` on (clamped to the log's earliest offset and its end). The
        unsettled messages are forgotten (the mark becomes the new position), or, with
        ``keep_unsettled``, keep holding the mark until settled (a channel's messages in flight
        across a seek). What is read after a seek is a replay, not a redelivery after a crash:
        ``read_before`` goes no further than the new position. Returns the new position."""
        acks = self._acks
        if keep_unsettled and acks is not None and acks.outstanding:
            held = self._held
            if held is None:
                held = self._held = AckTracker()
            held.outstanding |= acks.outstanding
            order = sorted(held.outstanding)
            held.order.clear()
            held.order.extend(order)
        elif not keep_unsettled:
            self._held = None
        self._acks = None
        self.dirty += 1
        position = self._reader.seek(offset)
        if self.read_before > position:
            self.read_before = position
        return position

    def add_skip(self, start: int, end: int) -> None:
        """The owner will step over ``[start, end)`` (at or after its position): persisted
        until the mark has passed it, so a restart steps over it too."""
        skips = self.skips
        if skips and skips[-1][1] == start:
            skips[-1] = (skips[-1][0], end)  # consecutive drops: one range
        else:
            skips.append((start, end))
        self.dirty += 1

    def pending_skips(self) -> tuple[tuple[int, int], ...]:
        """The skipped ranges the mark has not passed (what the state file keeps); the others
        are forgotten."""
        low = self.low
        self.skips = [r for r in self.skips if r[1] > low]
        return tuple(self.skips)

    def skip_to(self, offset: int) -> int:
        """Move forward to ``offset`` (clamped to the log's end), passing over the messages in
        between without reading them; unlike ``seek`` the unsettled messages stay unsettled.
        An offset at or before the position changes nothing. Returns the position."""
        if offset <= self._reader.position:
            return self._reader.position
        self.dirty += 1
        return self._reader.seek(offset)

    def close(self) -> None:
        """Release the read-ahead buffer (the log closes its cursors)."""
        self._reader.close()

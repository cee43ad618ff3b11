"""ByteMarks: how many body bytes a topic's stream took up to an offset, at checkpoints.

Theory of operation
-------------------
A delivery round must not give a consumer more than its byte room (``Channel.deliver``), so it
needs the size of the bodies it takes; summing them costs ~380 instructions a message, 4 % of
the engine's whole cost per message. But a round that reads its topic's stream takes a
contiguous range of offsets, and the topic already knows each publish batch's bytes (it counts
them for ``message_bytes``). So the stream keeps a running total of the body bytes it took, and
remembers it at *marks*: ``(offset, bytes taken before that offset)``. The bodies in any range
``[start, end)`` then add up to at most the total at the first mark at or after ``end`` minus
the total at the last mark at or before ``start``: an upper bound in O(log marks), with no look
at the messages. A round whose bound is below every consumer's room is not *tight* and skips the
sum; one that may come near a room is summed exactly, as before.

The bound is loose by what lies between a range's ends and the marks around them: at most two
stretches of ``MARK_EVERY`` offsets (or of a publish batch: marks fall only between batches),
so a range shorter than ``MARK_EVERY`` gets none (summing it is cheap, and a bound many times
its bytes would make the in-flight heap rebuild early for nothing). It counts what the range
holds but the round does not take (deferred and priority messages the cursor steps over, a
range emptied by topic empty), so it never falls below the truth. Only
offsets taken in this run are covered (``start``, the stream's ``known_from``): an earlier run's
messages, read from the log, are summed. Marks below every cursor are dropped (``forget_below``),
so a replay further back is summed too.

Cost: ``note`` is O(1) per publish batch (amortised: one append every ``MARK_EVERY`` offsets),
nothing per message; memory is two list entries per mark, about one byte a message of backlog.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right

__all__ = ["MARK_EVERY", "ByteMarks"]

MARK_EVERY = 64
"""Offsets between marks, at least. A round of a 2,500-message RDY window is then bounded within
~5 % of its bytes (two stretches of 64 messages), and a backlog of single-message PUBs costs ~1
byte of marks a message, not one entry each."""


class ByteMarks:
    """Body bytes taken up to an offset, at marks; see the module docstring."""

    __slots__ = ("_bytes", "_offsets", "_total")

    def __init__(self, start: int) -> None:
        self._offsets = [start]
        """Mark offsets, ascending; the first is where the covered offsets begin."""
        self._bytes = [0]
        """Body bytes taken before each mark's offset."""
        self._total = 0
        """Body bytes taken in all."""

    def __len__(self) -> int:
        """Marks kept (for tests). O(1)."""
        return len(self._offsets)

    def note(self, end: int, nbytes: int) -> None:
        """The offsets up to ``end`` (exclusive) were taken, their bodies ``nbytes`` in all
        (more is harmless: a batch cut short). O(1) amortised."""
        self._total += nbytes
        if end - self._offsets[-1] >= MARK_EVERY:
            self._offsets.append(end)
            self._bytes.append(self._total)

    def bytes_before(self, offset: int) -> int | None:
        """The body bytes taken before the last mark at or below ``offset``: where a bound of
        a range from ``offset`` starts (ask before reading it: reading may drop that mark);
        None when ``offset`` is before the first mark (not taken in this run, or its marks
        were dropped). O(log marks)."""
        offsets = self._offsets
        if offset < offsets[0]:
            return None
        return self._bytes[bisect_right(offsets, offset) - 1]

    def bound(self, start: int, before: int | None, end: int) -> int | None:
        """At least the body bytes at offsets ``[start, end)``, ``before`` being
        ``bytes_before(start)``; None when that is unknown or the range is shorter than
        ``MARK_EVERY`` (the caller sums them: a few ``len`` calls, where the bound could be
        many times the truth). O(log marks)."""
        if before is None or end - start < MARK_EVERY:
            return None
        offsets = self._offsets
        j = bisect_left(offsets, end)
        return (self._bytes[j] if j < len(offsets) else self._total) - before

    def forget_below(self, offset: int) -> None:
        """Drop the marks no range from ``offset`` on needs (the last one at or below it stays).
        Amortised O(1) per mark."""
        offsets = self._offsets
        if len(offsets) > 1 and offsets[1] <= offset:  # the stream trims often, mostly for none
            k = bisect_right(offsets, offset) - 1
            del offsets[:k]
            del self._bytes[:k]

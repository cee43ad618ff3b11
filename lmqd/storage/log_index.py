"""A topic log's segments as its readers see them: offsets, the sparse time index, lookups.

Theory of operation
-------------------
Every message of a topic log has an **offset** (``log.py``); a segment holds a contiguous run of
them, ``[base, next)`` minus whatever damage took (a gap, never a reuse). ``SegmentIndex`` keeps,
per segment, a **sparse index**: one entry per ``INDEX_INTERVAL`` bytes of records, each the file
position of a record, the offset of that record's first message, and the running maximum of the
messages' timestamps up to the end of the entry's *span* (the records from its position to the
next entry's). Entries are added as records are appended, and rebuilt at start-up by recovery's
scan (``log_recovery.py``): the index is never written to disk.

Lookups are two binary searches, over the segments and then over one segment's entries, followed
by a forward walk of at most one span (``INDEX_INTERVAL`` bytes plus one record):

* by offset (``locate``): the last segment whose ``base`` is at or below it, the last entry whose
  first offset is at or below it; the reader walks record headers (no CRC, no decoding) from
  there to the record holding the offset.
* by time (``locate_time``): the first segment whose running maximum timestamp reaches the time,
  then the first entry whose span maximum does; the reader decodes that span's entries until the
  first message at or after the time. Because every earlier span's maximum is below the time,
  that message is exactly the first one in offset order whose timestamp is at or after it, even
  when timestamps go backwards (a wall-clock step).

The offsets of a record come from its header ('O' records, format version 3). A record of a
disk queue's segment (versions 1 and 2, 'B' or 'M') carries none: its messages take the offsets
that follow the previous record's. One rule gives both, in recovery and in every reader alike:
a record's first offset is the larger of what it says and the end of the previous record's
offsets (``first_offset``), so offsets only ever increase, even over a record that claims
offsets already used (only files copied by hand can hold one).

Memory: three list slots per entry; a 10-million-message log of 100-byte messages (~1.4 GiB of
records) has ~45,000 entries, about 5 MB. Cost per lookup: O(log segments + log entries) in
memory, plus one read of at most ``INDEX_INTERVAL`` + ``record.MAX_BATCH_BYTES`` bytes.
"""

from __future__ import annotations

import logging
import os
from bisect import bisect_left, bisect_right
from operator import attrgetter

from lmqd.storage.atrest.seal import Opener
from lmqd.storage.repair import Damage
from lmqd.storage.segments import Segment
from lmqd.storage.timebase import TimeBase
from lmqd.units import KiB

log = logging.getLogger("lmqd.storage")

INDEX_INTERVAL = 32 * KiB
"""Bytes of records between two index entries. A lookup reads at most this much (plus one
record) after its binary searches: ~230 messages of 100 bytes, a pread and a walk of well under
a millisecond; at ~5 MB of entries per 10 million such messages the memory stays small."""

NO_TIMESTAMP = -(1 << 63)
"""The running maximum of a segment holding no message yet."""

_base = attrgetter("base")
_max_ns = attrgetter("max_ns")
_number = attrgetter("number")


def first_offset(stated: int, running: int) -> int:
    """A record's first offset: what its header states ('O' records; -1 for older records,
    which state none), but never below ``running``, the end of the previous record's offsets."""
    return stated if stated > running else running


class SegmentIndex:
    """One segment of a topic log: its offsets, its sparse index, its read descriptor."""

    __slots__ = (
        "base",
        "fd",
        "file",
        "max_ns",
        "newest_ns",
        "next",
        "offsets",
        "positions",
        "span_max",
        "types",
    )

    def __init__(self, file: Segment, base: int, max_ns: int, types: tuple[int, ...]) -> None:
        self.file = file
        """The file bookkeeping shared with the writer (path, end, skipped regions)."""
        self.base = base
        """No message of the segment has a smaller offset; the first record's offsets start
        here or later (``first_offset``)."""
        self.next = base
        """The offset after the segment's last message."""
        self.max_ns = max_ns
        """The largest timestamp of any message up to this segment's end (earlier segments
        included): non-decreasing along the log."""
        self.newest_ns = NO_TIMESTAMP
        """The largest timestamp of this segment's own messages (time retention)."""
        self.types = types
        """The record types valid in the file: offset batches, a disk queue's (a segment the
        log adopted), or all of them (a segment whose header is damaged)."""
        self.positions: list[int] = []
        """File positions of the indexed records, increasing."""
        self.offsets: list[int] = []
        """First offset of each indexed record, increasing."""
        self.span_max: list[int] = []
        """Running maximum timestamp up to the end of each entry's span, non-decreasing."""
        self.fd = -1
        """Read descriptor shared by the log's readers (opened on first use)."""

    @property
    def number(self) -> int:
        return self.file.number

    def add_record(self, pos: int, first: int, count: int, newest_ns: int) -> None:
        """A valid record at ``pos`` holding offsets ``first .. first+count-1``, whose newest
        timestamp is ``newest_ns`` (appended, or found by recovery; in file order)."""
        if newest_ns > self.newest_ns:
            self.newest_ns = newest_ns
        if newest_ns > self.max_ns:
            self.max_ns = newest_ns
        positions = self.positions
        if not positions or pos - positions[-1] >= INDEX_INTERVAL:
            positions.append(pos)
            self.offsets.append(first)
            self.span_max.append(self.max_ns)
        else:
            self.span_max[-1] = self.max_ns
        self.next = first + count

    def entry_for_offset(self, offset: int) -> int:
        """The index entry to start a walk to ``offset`` from; -1 if the segment has none."""
        if not self.positions:
            return -1
        return max(bisect_right(self.offsets, offset) - 1, 0)

    def entry_for_time(self, ts_ns: int) -> int:
        """The first entry whose span holds a timestamp at or after ``ts_ns``; -1 if none."""
        k = bisect_left(self.span_max, ts_ns)
        return k if k < len(self.span_max) else -1

    def close_fd(self) -> None:
        if self.fd >= 0:
            try:
                os.close(self.fd)
            except OSError:
                log.warning("could not close %s", self.file.path, exc_info=True)
            self.fd = -1


class LogIndex:
    """The state a topic log shares with its readers: segments (oldest first), the next offset,
    how to read them. The writer side (``log.py``) keeps it up to date."""

    __slots__ = ("damage", "name", "next_offset", "opener", "read_ahead", "segments", "timebase")

    def __init__(
        self,
        name: str,
        timebase: TimeBase,
        damage: Damage,
        read_ahead: int,
        opener: Opener | None = None,
    ) -> None:
        self.name = name
        self.opener = opener if opener is not None else Opener(None)
        """How the readers open sealed records (``atrest/seal.py``)."""
        self.timebase = timebase
        self.damage = damage
        self.read_ahead = read_ahead
        self.segments: list[SegmentIndex] = []
        """Every live segment, oldest first; the last is the write segment."""
        self.next_offset = 0
        """The offset the next message appended gets."""

    @property
    def earliest_offset(self) -> int:
        """The smallest offset a reader can start at (the first live segment's base)."""
        return self.segments[0].base if self.segments else self.next_offset

    def after(self, seg: SegmentIndex) -> SegmentIndex | None:
        """The live segment following ``seg``; None if ``seg`` is the last."""
        segments = self.segments
        i = bisect_right(segments, seg.number, key=_number)
        return segments[i] if i < len(segments) else None

    def locate(self, offset: int) -> tuple[SegmentIndex, int]:
        """The segment and index entry (-1: the segment's start) a walk to ``offset`` starts
        at; ``offset`` must be below ``next_offset`` and the log must have a segment."""
        segments = self.segments
        i = max(bisect_right(segments, offset, key=_base) - 1, 0)
        seg = segments[i]
        return seg, seg.entry_for_offset(offset)

    def locate_time(self, ts_ns: int) -> tuple[SegmentIndex, int] | None:
        """The segment and index entry whose span holds the first message with a timestamp at or
        after ``ts_ns``; None if no message has one."""
        segments = self.segments
        i = bisect_left(segments, ts_ns, key=_max_ns)
        while i < len(segments):
            seg = segments[i]
            k = seg.entry_for_time(ts_ns)
            if k >= 0:
                return seg, k
            i += 1  # only an empty segment (its maximum is its predecessor's) gets here
        return None

    def read_fd(self, seg: SegmentIndex) -> int:
        """A descriptor to ``pread`` segment ``seg`` (shared by every reader; raises OSError)."""
        if seg.fd < 0:
            seg.fd = os.open(seg.file.path, os.O_RDONLY)
        return seg.fd

    def close(self) -> None:
        for seg in self.segments:
            seg.close_fd()

"""A topic log's tail cache: the records appended last, kept as the message objects given.

Every ``TopicLog.append_many`` writes its records to disk and also keeps them here, as (segment,
position, end, first offset, messages), up to ``LOG_CACHE_BYTES`` of records; older ones fall
out of the front. Any number of readers (``log_reader.py``) that have kept up read their next
record from here instead of the files: no ``pread``, no CRC check, no decoding, and every such
reader gets the *same* message objects, so a body is held once however many channels read it.
What is on disk does not change (every record is written and synced all the same); a reader that
falls behind the cache reads the files, decoding for itself.

Unlike a disk queue's write-through cache (``write_cache.py``), nothing here is consumed: a
record leaves only by age (capacity) or when its segment is deleted, whatever the readers do.
A lookup by offset is a binary search over the records' first offsets.

Cost: the lists grow at the back and are trimmed from the front by moving a head index, with
the dead prefix deleted once it is half the list (amortised O(1) per record).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence

from lmqd.message import Message
from lmqd.storage.log_index import SegmentIndex
from lmqd.units import MiB

LOG_CACHE_BYTES = 1 * MiB
"""Bytes of records a log keeps as message objects: ~7,500 messages of 100 bytes. Measured end
to end (``scripts/bench_throughput.py``,
2 writers, 2 readers, ``--mem-queue-size=0``): against 4 MiB, the same daemon CPU per message with
1 and with 4 channels (channels that keep up read within the last rounds' records) and 13-15 MB
less peak RSS per busy topic (each cached message is ~300 bytes of objects)."""

CachedRecord = tuple[SegmentIndex, int, int, int, Sequence[Message]]
"""(segment, record position, record end, first offset, messages)."""


class TailCache:
    """The log's most recent records, oldest first; see the module docstring."""

    __slots__ = ("_firsts", "_head", "_records", "_sizes", "bytes", "capacity")

    def __init__(self, capacity: int = LOG_CACHE_BYTES) -> None:
        self.capacity = capacity
        """Bytes of records the cache may stand for (0 disables it)."""
        self._records: list[CachedRecord] = []
        self._firsts: list[int] = []
        """First offset of each record, for the binary search."""
        self._sizes: list[int] = []
        self._head = 0
        """Index of the oldest record still cached."""
        self.bytes = 0
        """Bytes on disk of the records cached."""

    def __len__(self) -> int:
        return len(self._records) - self._head

    def add(
        self, seg: SegmentIndex, pos: int, end: int, first: int, messages: Sequence[Message]
    ) -> None:
        """Cache the record just appended at ``pos .. end`` of ``seg``, evicting old ones."""
        if end - pos > self.capacity:
            self.clear()  # keep the cache contiguous: a record is never missing in the middle
            return
        self._records.append((seg, pos, end, first, messages))
        self._firsts.append(first)
        self._sizes.append(end - pos)
        self.bytes += end - pos
        while self.bytes > self.capacity:
            self.bytes -= self._sizes[self._head]
            self._head += 1
        self._compact()

    def find(self, offset: int) -> CachedRecord | None:
        """The cached record holding ``offset``, or the first one after it when ``offset`` is
        in a gap between two cached records (appends follow each other, so nothing else is
        there); None if it is older than the cache or past its end."""
        k = bisect_right(self._firsts, offset, lo=self._head) - 1
        if k < self._head:
            return None
        record = self._records[k]
        if offset < record[3] + len(record[4]):
            return record
        return self._records[k + 1] if k + 1 < len(self._records) else None

    def drop_segments_before(self, number: int) -> None:
        """Forget the records of segments numbered below ``number`` (they are being deleted)."""
        records = self._records
        while self._head < len(records) and records[self._head][0].number < number:
            self.bytes -= self._sizes[self._head]
            self._head += 1
        self._compact()

    def clear(self) -> None:
        self._records.clear()
        self._firsts.clear()
        self._sizes.clear()
        self._head = 0
        self.bytes = 0

    def _compact(self) -> None:
        head = self._head
        if head and head * 2 >= len(self._records):
            del self._records[:head]
            del self._firsts[:head]
            del self._sizes[:head]
            self._head = 0

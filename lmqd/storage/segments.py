"""Segment bookkeeping: a queue's segment files, in order, and which of them may be removed.

A queue's messages live in numbered segment files (``files.segment_filename``), each a header
and records (``record.py``). ``SegmentList`` knows them as ``Segment`` entries:

* ``live``: the segments that still hold unread messages, oldest first. The reader
  (``reader.py``) reads the first; the writer (``writer.py``) appends to the last; one segment
  can be both.
* ``retired``: segments the reader has left. A retired segment is unlinked only by the sync job
  that persists a read position past it (``release_consumed`` hands its path to the job,
  ``sync.py`` unlinks it after the positions file is durable), never earlier, so a crash cannot
  leave a positions file pointing into a deleted segment.

``bytes_on_disk`` is a running sum of the segments' sizes (writes add, releases subtract), so
reading it costs no system call. An entry's ``end`` is where its valid records end (the write
position, for the write segment); ``skips`` are the corrupt regions recovery or the reader set
aside, which reading jumps over (``Segment.bounds``).

The writer and the reader share one ``SegmentList`` and hold its deques directly: the deques are
never replaced, only cleared and refilled, so such a reference stays valid for the queue's life.
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque

from lmqd.storage.files import pwrite_all, segment_filename, unlink_quietly
from lmqd.storage.record import SEGMENT_HEADER_SIZE, encode_segment_header

log = logging.getLogger("lmqd.storage")


class Segment:
    """One segment file as the queue knows it."""

    __slots__ = ("end", "number", "path", "records", "saved", "skips")

    def __init__(
        self,
        number: int,
        path: str,
        end: int,
        skips: list[tuple[int, int]],
        records: int,
        saved: int = 0,
    ) -> None:
        self.number = number
        self.path = path
        self.end = end
        """Offset after the last record (the write position, for the write segment)."""
        self.skips = skips
        """Corrupt regions (start, end) the reader jumps over, sorted."""
        self.records = records
        """Messages in the file's valid records."""
        self.saved = saved
        """Bytes the file's sealed records take less than the plain records they hold
        (compression at rest; negative where sealing added more than it saved): its logical
        size is ``end + saved``."""

    def bounds(self, pos: int) -> tuple[int, int]:
        """Move ``pos`` past skipped regions; return it and where the next skip (or end) is."""
        for start, end in self.skips:
            if end <= pos:
                continue
            if start <= pos:
                pos = end
                continue
            return pos, start
        return pos, self.end


class SegmentList:
    """The segment files of queue ``name`` in ``directory``: live, retired, the next number."""

    __slots__ = (
        "bytes_on_disk",
        "directory",
        "live",
        "name",
        "next_number",
        "retired",
        "saved_bytes",
        "sealed",
    )

    def __init__(self, name: str, directory: str) -> None:
        self.name = name
        self.directory = directory
        self.live: deque[Segment] = deque()
        """The reader's segment first, the write segment last."""
        self.retired: deque[Segment] = deque()
        """Segments the reader has left, waiting for a persisted read position past them."""
        self.next_number = 0
        """The number the next segment created gets."""
        self.bytes_on_disk = 0
        """Bytes of the segment files not yet handed to a sync job to unlink."""
        self.saved_bytes = 0
        """The sum of those segments' ``saved``: their logical size is ``bytes_on_disk`` plus
        this (compression at rest)."""
        self.sealed = False
        """Segments created now get the format version that holds sealed batches (4, 5)."""

    def path(self, number: int) -> str:
        """The path of segment file ``number``."""
        return os.path.join(self.directory, segment_filename(self.name, number))

    def entry(self, number: int) -> Segment:
        """The entry for a segment just created: its header and no records."""
        return Segment(number, self.path(number), SEGMENT_HEADER_SIZE, [], 0)

    def create(self, number: int, base_offset: int | None = None) -> int:
        """Create segment file ``number`` with its header; returns an fd open for writing.

        ``base_offset``: a topic log's segment (format version 3), whose first message will
        have that offset; None for a disk queue's.
        """
        path = self.path(number)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            header = encode_segment_header(
                number, time.time_ns(), base_offset=base_offset, sealed=self.sealed
            )
            pwrite_all(fd, header, 0)
        except BaseException:
            os.close(fd)
            unlink_quietly(path, log)
            raise
        return fd

    def discard_new(self, number: int, fd: int, path: str) -> None:
        """Remove a segment created by a write that failed (never raises; logs instead).

        If the file cannot be removed its number is not reused.
        """
        try:
            try:
                os.ftruncate(fd, 0)  # whatever else fails, no record of the batch survives
            finally:
                os.close(fd)
            os.unlink(path)
        except OSError:
            log.error("DISKQUEUE(%s): cannot remove %s", self.name, path, exc_info=True)
            self.next_number = max(self.next_number, number + 1)

    def append(self, seg: Segment) -> None:
        """A new write segment, already on disk with ``seg.end`` bytes."""
        self.live.append(seg)
        self.bytes_on_disk += seg.end
        self.saved_bytes += seg.saved
        self.next_number = seg.number + 1

    def retire_first(self) -> None:
        """The reader has left the first live segment."""
        self.retired.append(self.live.popleft())

    def release_consumed(self, read_segment: int) -> list[str]:
        """The paths of the retired segments before ``read_segment``, for a sync job to unlink
        once it has persisted that read position; they stop counting in ``bytes_on_disk``."""
        paths = []
        retired = self.retired
        while retired and retired[0].number < read_segment:
            seg = retired.popleft()
            paths.append(seg.path)
            self.bytes_on_disk -= seg.end
            self.saved_bytes -= seg.saved
        return paths

    def paths(self) -> list[str]:
        """Every segment file the queue knows, retired ones first."""
        return [seg.path for seg in (*self.retired, *self.live)]

    def restart(self, seg: Segment) -> None:
        """Forget every segment: ``seg``, just created, is the only one (``DiskQueue.empty``)."""
        self.live.clear()
        self.retired.clear()
        self.bytes_on_disk = 0
        self.saved_bytes = 0
        self.append(seg)

    def clear(self) -> None:
        """Forget every segment (``DiskQueue.delete``)."""
        self.live.clear()
        self.retired.clear()
        self.bytes_on_disk = 0
        self.saved_bytes = 0

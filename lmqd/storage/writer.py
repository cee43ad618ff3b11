"""The writer side of a disk queue: messages to records on disk, all of a call or none of it.

Theory of operation
-------------------
``SegmentWriter.write`` encodes a call's messages as batch records (``encoder.py``: entries,
plan, frames), split where a segment fills up and at ``record.MAX_BATCH_BYTES``, and hands them
to the OS with one ``pwrite`` per segment it touches: the write segment at its write position,
then new segments, created as the plan needs them. Nothing is committed until every write has
succeeded: only then do the segments' ends, message counts and ``bytes_on_disk`` move and the
new segments join the ``SegmentList``.

If any write fails, whatever the call wrote is taken back: the segments it created are
truncated and unlinked (``SegmentList.discard_new``), and the write segment is truncated back to
where the call started. If even that truncation fails, it is retried before every later write,
and no write is accepted until it succeeds: the failed batch may hold complete records, which
recovery after a crash could not tell from records that were stored. Either way the call raises
``BackendError``: it is stored whole or not at all.

A topic log (``log.py``) passes the offset of the call's first message: its records are then
offset batches ('O') and the segments it creates get version-3 headers carrying their base
offset (the offset of their first message).

Durability is not the writer's business; it only keeps what a sync job needs: whether the write
segment was written since the last job (``dirty``) and the descriptors of segments it rolled
away from while dirty, which the next job fsyncs (``take_sync_fds``).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Sequence

from lmqd.message import Message
from lmqd.storage.encoder import (
    Batch,
    encode_entries,
    encode_options,
    encode_plain,
    frame_batches,
    plan_batches,
)
from lmqd.storage.errors import BackendError
from lmqd.storage.files import pwrite_all
from lmqd.storage.record import BATCH_OVERHEAD, OFFSET_BATCH_OVERHEAD, SEGMENT_HEADER_SIZE
from lmqd.storage.segments import Segment, SegmentList
from lmqd.storage.timebase import TimeBase

log = logging.getLogger("lmqd.storage")

Placed = tuple[int, int, list[Batch]]
"""Where a write put one segment's share of its batches: (segment number, offset, batches)."""


class SegmentWriter:
    """Appends records to the last segment of a ``SegmentList``, rolling to new ones."""

    __slots__ = (
        "_max_bytes",
        "_owner",
        "_pending_fds",
        "_segments",
        "_timebase",
        "_truncate_to",
        "dirty",
        "fd",
    )

    def __init__(
        self,
        name: str,
        segments: SegmentList,
        timebase: TimeBase,
        max_bytes_per_file: int,
        *,
        subject: str = "DISKQUEUE",
    ) -> None:
        self._owner = f"{subject}({name})"
        """How log lines and errors name the owner: ``DISKQUEUE(<name>)``, ``TOPICLOG(<name>)``."""
        self._segments = segments
        self._timebase = timebase
        self._max_bytes = max_bytes_per_file
        self.fd = -1
        """The write segment's descriptor (-1 until ``start``)."""
        self.dirty = False
        """Whether the write segment was written since the last ``take_sync_fds``."""
        self._truncate_to = -1
        """Write position to cut the write segment back to before the next write (-1: none)."""
        self._pending_fds: list[int] = []
        """Rolled segments' write descriptors, handed to the next sync job to fsync."""

    def start(self, fd: int) -> None:
        """Write through ``fd``, open on the ``SegmentList``'s last segment (opening, emptying)."""
        self.fd = fd
        self._truncate_to = -1

    def write(
        self,
        messages: Sequence[Message],
        first_offset: int | None = None,
        *,
        plain: bool = False,
    ) -> list[Placed]:
        """Append ``messages`` (at least one) in order; returns where their records went.

        ``first_offset``: a topic log's offset of ``messages[0]`` (offset batch records, see
        the module docstring); None for a disk queue. ``plain``: the caller knows that no
        message has an lmq extension (no option blocks; not looked for). Raises
        ``BackendError`` having stored none of them.
        """
        if self._truncate_to >= 0:
            self._truncate_tail()
        entries, bodies = encode_entries(messages, self._timebase.to_wall_ns)
        options = None if plain else encode_options(messages)
        overhead = BATCH_OVERHEAD if first_offset is None else OFFSET_BATCH_OVERHEAD
        chunks = plan_batches(
            bodies, self._segments.live[-1].end, self._max_bytes, overhead, options
        )
        return self._write_chunks(entries, bodies, chunks, first_offset, options)

    def write_plain(
        self, ids: Sequence[bytes], bodies: list[bytes], timestamp: int, first_offset: int
    ) -> list[Placed]:
        """``write`` of a topic log's plain publish, from its columns (``encode_plain``): no
        extension, no deliver-after time, attempts 0, one timestamp."""
        if self._truncate_to >= 0:
            self._truncate_tail()
        entries = encode_plain(ids, bodies, timestamp)
        chunks = plan_batches(
            bodies, self._segments.live[-1].end, self._max_bytes, OFFSET_BATCH_OVERHEAD
        )
        return self._write_chunks(entries, bodies, chunks, first_offset)

    def take_sync_fds(self) -> list[int]:
        """The descriptors a sync job must fsync, now owned by the caller (``prepare_sync``).

        The write segment's is duplicated, so the writer may go on writing, rolling, even
        closing while the job runs in a thread.
        """
        fds: list[int] = []
        if self.dirty:
            fds.append(os.dup(self.fd))
        fds.extend(self._pending_fds)
        self._pending_fds = []
        self.dirty = False
        return fds

    def close(self) -> None:
        """Close every descriptor the writer holds (failures are logged)."""
        for fd in [*self._pending_fds, self.fd]:
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    log.warning("%s: close failed", self._owner, exc_info=True)
        self._pending_fds = []
        self.fd = -1

    def _write_chunks(
        self,
        entries: list[bytes],
        bodies: list[bytes],
        chunks: list[list[Batch]],
        first_offset: int | None,
        options: list[bytes] | None = None,
    ) -> list[Placed]:
        """Write the planned batches; returns (segment, offset, batches) per segment written."""
        segments = self._segments
        seg = segments.live[-1]
        start_end = seg.end
        fd = self.fd
        pos = start_end
        created: list[tuple[int, int, str]] = []  # (number, fd, path)
        written: list[tuple[int, int]] = []  # (bytes, messages) per chunk
        wrote_current = False
        try:
            for k, batches in enumerate(chunks):
                if not batches:
                    written.append((0, 0))
                    continue
                if k > 0:
                    number = segments.next_number + len(created)
                    base = None if first_offset is None else first_offset + batches[0][0]
                    fd = segments.create(number, base)
                    created.append((number, fd, segments.path(number)))
                    pos = SEGMENT_HEADER_SIZE
                else:
                    wrote_current = True
                data = frame_batches(entries, bodies, batches, first_offset, options)
                pwrite_all(fd, data, pos)
                pos += len(data)
                written.append((len(data), batches[-1][1] - batches[0][0]))
        except OSError as exc:
            for number, cfd, path in created:
                segments.discard_new(number, cfd, path)
            if wrote_current:
                self._truncate_to = start_end
                with contextlib.suppress(BackendError):  # retried before the next write
                    self._truncate_tail()
            log.error("%s: write failed: %s", self._owner, exc)
            raise BackendError(f"{self._owner}: write failed: {exc}") from exc
        # Commit: only now do the positions move.
        placed: list[Placed] = []
        if wrote_current:
            size, count = written[0]
            seg.end = start_end + size
            seg.records += count
            segments.bytes_on_disk += size
            self.dirty = True
            placed.append((seg.number, start_end, chunks[0]))
        for (number, cfd, path), (size, count), batches in zip(
            created, written[1:], chunks[1:], strict=True
        ):
            self.roll_to(cfd, Segment(number, path, SEGMENT_HEADER_SIZE + size, [], count))
            placed.append((number, SEGMENT_HEADER_SIZE, batches))
        return placed

    def _truncate_tail(self) -> None:
        """Cut a failed write's bytes off the write segment; raises ``BackendError`` if it can't.

        Until that succeeds no write is accepted: the failed batch may hold complete records,
        which recovery after a crash could not tell from records that were stored.
        """
        try:
            os.ftruncate(self.fd, self._truncate_to)
        except OSError as exc:
            log.error("%s: cannot truncate a failed write: %s", self._owner, exc)
            raise BackendError(f"{self._owner}: write failed: {exc}") from exc
        self._truncate_to = -1

    def roll_to(self, fd: int, seg: Segment) -> None:
        """Make ``seg`` (written through ``fd``) the write segment; the old descriptor goes to
        the next sync job if it holds unsynced writes, else it is closed."""
        if self.dirty:
            self._pending_fds.append(self.fd)
        else:
            os.close(self.fd)
        self.fd = fd
        self.dirty = True
        self._segments.append(seg)

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

**Sealing** (compression and encryption at rest, ``atrest/seal.py``). A writer given a
``Sealer`` frames each batch record alone, seals it, and places the sealed records in segments
by their sealed sizes (a compressed batch takes less of a segment than its plain size, so
segments hold what ``max_bytes_per_file`` allows of what is stored). Segments it creates get the
sealed format versions (4, 5); a write segment of an older version is not appended to once
sealing starts (the next write starts a new segment), so an older build leaves the sealed
records alone. A writer without a sealer (``sealer`` None, chosen when the store is made or its
policy changes) takes the plain path: exactly the steps above, nothing more per message.

Durability is not the writer's business; it only keeps what a sync job needs: whether the write
segment was written since the last job (``dirty``) and the descriptors of segments it rolled
away from while dirty, which the next job fsyncs (``take_sync_fds``).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Mapping, Sequence

from lmqd.message import Message
from lmqd.message_ext import MessageExt
from lmqd.storage.atrest.seal import MAX_SEAL_GROWTH, Sealer
from lmqd.storage.encoder import (
    Batch,
    encode_entries,
    encode_options,
    encode_plain,
    ext_options,
    frame_batches,
    plan_batches,
)
from lmqd.storage.errors import BackendError
from lmqd.storage.files import pwrite_all
from lmqd.storage.record import BATCH_OVERHEAD, OFFSET_BATCH_OVERHEAD, SEGMENT_HEADER_SIZE
from lmqd.storage.segments import Segment, SegmentList
from lmqd.storage.timebase import TimeBase

log = logging.getLogger("lmqd.storage")

Placed = tuple[int, int, list[Batch], list[int]]
"""Where a write put one segment's share of its batches: (segment number, offset, batches,
each batch's record size as stored)."""
Framer = Callable[[int, list[Batch]], bytes | bytearray]
"""Chunk ``k``'s records as bytes, given its batches."""

_UNBOUNDED = 1 << 62
"""A segment size no write reaches: planning a sealed write's batches by the batch cap alone."""


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
        "roll_first",
        "sealer",
        "write_sealed",
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
        self.sealer: Sealer | None = None
        """The store's sealing step (``set_sealer``); None: records are written plain."""
        self.roll_first = False
        """The write segment's format version cannot hold sealed records: the next sealed
        write starts a new segment."""
        self.write_sealed = False
        """The write segment's format version holds sealed records (4 or 5)."""

    def set_sealer(self, sealer: Sealer | None) -> None:
        """Seal what is written from now on with ``sealer`` (None: plain); the segments
        created from now on get the matching format version."""
        self.sealer = sealer
        self._segments.sealed = sealer is not None
        self.roll_first = sealer is not None and not self.write_sealed

    def start(self, fd: int) -> None:
        """Write through ``fd``, open on the ``SegmentList``'s last segment (opening, emptying),
        whose format version is the one the list creates (``SegmentList.sealed``)."""
        self.fd = fd
        self._truncate_to = -1
        self.write_sealed = self._segments.sealed
        self.roll_first = False

    def write(
        self,
        messages: Sequence[Message],
        first_offset: int | None = None,
        *,
        plain: bool = False,
        noted: Mapping[bytes, int] | None = None,
    ) -> list[Placed]:
        """Append ``messages`` (at least one) in order; returns where their records went.

        ``first_offset``: a topic log's offset of ``messages[0]`` (offset batch records, see
        the module docstring); None for a disk queue. ``plain``: the caller knows that no
        message has an lmq extension (no option blocks; not looked for). ``noted``: a disk
        queue's topic offsets of messages without one (``encoder.encode_options``). Raises
        ``BackendError`` having stored none of them.
        """
        if self._truncate_to >= 0:
            self._truncate_tail()
        entries, bodies = encode_entries(messages, self._timebase.to_wall_ns)
        options = None if plain else encode_options(messages, noted)
        overhead = BATCH_OVERHEAD if first_offset is None else OFFSET_BATCH_OVERHEAD
        if self.sealer is not None:
            return self._write_sealed(entries, bodies, first_offset, options, overhead)
        chunks = plan_batches(
            bodies, self._segments.live[-1].end, self._max_bytes, overhead, options
        )
        return self._write_chunks(
            chunks,
            lambda _, batches: frame_batches(entries, bodies, batches, first_offset, options),
            [[overhead + payload for *_, payload in batches] for batches in chunks],
            first_offset,
        )

    def write_plain(
        self,
        ids: Sequence[bytes],
        bodies: list[bytes],
        timestamp: int,
        first_offset: int,
        exts: Sequence[MessageExt | None] | None = None,
    ) -> list[Placed]:
        """``write`` of a topic log's publish, from its columns (``encode_plain``): no
        deliver-after time, attempts 0, one timestamp; ``exts``: each body's extension (None:
        none has one), the same records ``write`` makes of such messages."""
        if self._truncate_to >= 0:
            self._truncate_tail()
        entries = encode_plain(ids, bodies, timestamp)
        options = ext_options(exts) if exts is not None else None
        if self.sealer is not None:
            return self._write_sealed(
                entries, bodies, first_offset, options, OFFSET_BATCH_OVERHEAD
            )
        chunks = plan_batches(
            bodies, self._segments.live[-1].end, self._max_bytes, OFFSET_BATCH_OVERHEAD, options
        )
        return self._write_chunks(
            chunks,
            lambda _, batches: frame_batches(entries, bodies, batches, first_offset, options),
            [[OFFSET_BATCH_OVERHEAD + payload for *_, payload in batches] for batches in chunks],
            first_offset,
        )

    def _write_sealed(
        self,
        entries: list[bytes],
        bodies: list[bytes],
        first_offset: int | None,
        options: list[bytes] | None,
        overhead: int,
    ) -> list[Placed]:
        """The sealed path of ``write``: batches planned by the batch cap alone, each framed
        and sealed, then placed in segments by their sealed sizes (the write segment first,
        unless its version cannot hold them: ``roll_first``)."""
        sealer = self.sealer
        assert sealer is not None
        plan = plan_batches(
            bodies, SEGMENT_HEADER_SIZE, _UNBOUNDED, overhead + MAX_SEAL_GROWTH, options
        )[0]
        records = [
            sealer.seal(frame_batches(entries, bodies, [batch], first_offset, options))
            for batch in plan
        ]
        max_bytes = self._max_bytes
        chunks: list[list[Batch]] = [[]]
        sealed: list[list[bytes]] = [[]]
        pos = max_bytes if self.roll_first else self._segments.live[-1].end
        for batch, record in zip(plan, records, strict=True):
            if pos + len(record) > max_bytes and (pos > SEGMENT_HEADER_SIZE):
                chunks.append([])
                sealed.append([])
                pos = SEGMENT_HEADER_SIZE
            chunks[-1].append(batch)
            sealed[-1].append(record)
            pos += len(record)
        placed = self._write_chunks(
            chunks,
            lambda k, _: b"".join(sealed[k]),
            [list(map(len, chunk)) for chunk in sealed],
            first_offset,
        )
        self.roll_first = False
        return placed

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
        chunks: list[list[Batch]],
        frame: Framer,
        sizes: list[list[int]],
        first_offset: int | None,
    ) -> list[Placed]:
        """Write the planned batches, each chunk's bytes made by ``frame``; ``sizes``: each
        record's size as stored. Returns (segment, offset, batches, sizes) per segment
        written."""
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
                data = frame(k, batches)
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
            if self.sealer is not None:
                saved = _saved(chunks[0], sizes[0], first_offset)
                seg.saved += saved
                segments.saved_bytes += saved
            self.dirty = True
            placed.append((seg.number, start_end, chunks[0], sizes[0]))
        for (number, cfd, path), (size, count), batches, stored in zip(
            created, written[1:], chunks[1:], sizes[1:], strict=True
        ):
            saved = 0 if self.sealer is None else _saved(batches, stored, first_offset)
            self.roll_to(cfd, Segment(number, path, SEGMENT_HEADER_SIZE + size, [], count, saved))
            placed.append((number, SEGMENT_HEADER_SIZE, batches, stored))
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
        self.write_sealed = self._segments.sealed
        self._segments.append(seg)


def _saved(batches: list[Batch], stored: list[int], first_offset: int | None) -> int:
    """Bytes the sealed records ``stored`` take less than the plain records of ``batches``."""
    overhead = BATCH_OVERHEAD if first_offset is None else OFFSET_BATCH_OVERHEAD
    return sum(overhead + payload for *_, payload in batches) - sum(stored)

"""The reader side of a disk queue: read ahead, verify, decode, hand out in order.

Theory of operation
-------------------
``SegmentReader.read_many`` reads the first live segment from the read position: ``read_ahead``
bytes per ``pread`` (more if one record is larger), then it frames whole records in that buffer,
checks each one's CRC again (the disk may have rotted since start-up) and decodes it
(``decoder.py``); no message of a record is returned before the record's CRC has matched. A
record only partly returned stays decoded (``pending``); the read position is then the record's
offset plus the index of the next message in it (``_read_pos``, ``_read_index``), and that pair
is what the positions file stores, so a close and reopen resumes exactly there. Before reading
the files, the reader takes the record at its read position from the write-through cache
(``write_cache.py``) if it is there: the same pending path, without the read.

Regions recovery or an earlier read set aside are jumped over (``Segment.bounds``). A record that
fails its checks is handled as recovery does (``repair.py``): the bad bytes in the rest of the
segment are copied aside, counted and skipped, the depth recounted. A segment the reader has
left is *retired* (``SegmentList.retire_first``); a sync job unlinks it later.

A sealed batch ('b': compression or encryption at rest, ``atrest/seal.py``) is opened by the
queue's ``Opener`` once its CRC has matched and decoded from the plain record it holds; the read
positions and tokens stay those of the stored record. One that does not open is a bad record.

In acknowledgement mode every message handed out is a ``StoredMessage`` with its token, and the
tokens of what ``_take`` hands out go to the ``AckTracker``'s containers as one ``range`` per
record.

Cost: the loops here run once per record, not per message (a batch's messages are built in
``decoder.decode_batch``'s loop); the reader keeps the containers it shares with other parts of
the queue (the live segments, the cache's records, the acknowledgement set and order) as its own
attributes so that those loops look up nothing more than they did inside one class.
"""

from __future__ import annotations

import logging
import os

from crc32c import crc32c

from lmqd.message import Message
from lmqd.storage.acks import AckTracker
from lmqd.storage.atrest.seal import Opener
from lmqd.storage.decoder import decode_batch, decode_message
from lmqd.storage.record import (
    MAX_RECORD_LENGTH,
    MIN_RECORD_LENGTH,
    RECORD_OVERHEAD,
    SEALED_RECORD_TYPES,
    SEGMENT_HEADER_SIZE,
    TYPE_BATCH,
    TYPE_MESSAGE,
    TYPE_SEALED_BATCH,
    U32,
    FormatError,
)
from lmqd.storage.repair import Damage, set_aside_damage
from lmqd.storage.segments import Segment, SegmentList
from lmqd.storage.timebase import TimeBase
from lmqd.storage.tokens import record_token
from lmqd.storage.write_cache import WriteCache
from lmqd.storage.writer import SegmentWriter
from lmqd.units import KiB

log = logging.getLogger("lmqd.storage")

DEFAULT_READ_AHEAD = 256 * KiB
"""Bytes per read syscall: ~2,000 small messages, small enough not to hold much memory per queue."""

MAX_REPAIRS_PER_READ = 64
"""Bound on corrupt regions handled in one read_many call, so damage never becomes a busy loop."""


class SegmentReader:
    """Reads a queue's messages in order from its live segments; see the module docstring."""

    __slots__ = (
        "_ack_mode",
        "_buf",
        "_buf_start",
        "_cache",
        "_cache_records",
        "_consumed",
        "_damage",
        "_fd",
        "_fd_segment",
        "_name",
        "_opener",
        "_order",
        "_outstanding",
        "_pending_end",
        "_pending_token",
        "_read_ahead",
        "_read_index",
        "_read_pos",
        "_segment_list",
        "_segments",
        "_timebase",
        "_writer",
        "depth",
        "pending",
    )

    def __init__(
        self,
        name: str,
        segments: SegmentList,
        *,
        writer: SegmentWriter,
        cache: WriteCache,
        acks: AckTracker,
        damage: Damage,
        timebase: TimeBase,
        ack_mode: bool,
        read_ahead: int = DEFAULT_READ_AHEAD,
        opener: Opener | None = None,
    ) -> None:
        self._name = name
        self._opener = opener if opener is not None else Opener(None)
        self._segment_list = segments
        self._segments = segments.live
        self._writer = writer
        """Read through its descriptor if the write segment was unlinked under us."""
        self._cache = cache
        self._cache_records = cache.records
        self._outstanding = acks.outstanding
        self._order = acks.order
        self._damage = damage
        self._timebase = timebase
        self._ack_mode = ack_mode
        self._read_ahead = max(read_ahead, RECORD_OVERHEAD)
        self._fd = -1
        self._fd_segment: Segment | None = None
        self._buf = b""
        self._buf_start = 0
        self._read_pos = SEGMENT_HEADER_SIZE
        """Offset of the record holding the next message to read (a record boundary)."""
        self._read_index = 0
        """Messages of the record at ``_read_pos`` already returned (or consumed before a
        restart)."""
        self.pending: list[Message] | None = None
        """The decoded messages of the record at ``_read_pos`` while it is partly returned."""
        self._pending_end = 0
        """Offset after the record ``pending`` came from."""
        self._pending_token = 0
        """Acknowledgement mode: the token of ``pending[0]``."""
        self._consumed = 0
        """Messages read from the reader's segment (for recounting after a corrupt region)."""
        self.depth = 0
        """Messages stored and not yet read (the writer's side adds to it)."""

    def position(self) -> tuple[int, int, int]:
        """(segment, record offset, index in the record) of the next message to read."""
        return self._segments[0].number, self._read_pos, self._read_index

    def reset(self, pos: int, consumed: int, index: int = 0) -> None:
        """Read the first live segment from ``pos`` (a record boundary), skipping ``index``
        messages of that record; ``consumed``: messages of the segment before that point."""
        self._buf = b""
        self._buf_start = pos
        self._read_pos = pos
        self._read_index = index
        self.pending = None
        self._consumed = consumed

    def close(self) -> None:
        """Release the read descriptor and the read-ahead buffer."""
        if self._fd >= 0:
            os.close(self._fd)
        self._fd = -1
        self._fd_segment = None
        self._buf = b""

    def read_many(self, max_count: int) -> list[Message]:
        """Remove and return up to ``max_count`` (> 0) of the oldest messages."""
        out: list[Message] = []
        if self.pending is not None:
            self._take(max_count, out)
        repairs = 0
        cache = self._cache_records
        segments = self._segments
        while len(out) < max_count and self.depth > 0:
            seg = segments[0]
            pos, stop = seg.bounds(self._read_pos)
            if pos != self._read_pos:
                self._read_pos = pos
                self._read_index = 0
            if pos >= seg.end:
                if len(segments) == 1:
                    break
                self._retire_segment()
                continue
            if pos >= stop:  # pragma: no cover - bounds() skips regions starting at pos
                break
            if cache and self._read_cached(seg.number, pos, max_count - len(out), out):
                continue
            try:
                ok = self._decode(seg, stop, max_count - len(out), out)
            except OSError:
                log.error("DISKQUEUE(%s): read failed", self._name, exc_info=True)
                break
            if not ok:
                repairs += 1
                if repairs > MAX_REPAIRS_PER_READ:
                    break
                try:
                    self._repair(seg)
                except OSError:
                    # Nothing is skipped that could not be copied aside: reading stops here
                    # until the repair succeeds (e.g. the disk has room again).
                    log.error(
                        "DISKQUEUE(%s): cannot set a bad record aside", self._name, exc_info=True
                    )
                    break
        if len(segments) > 1:
            seg = segments[0]
            if seg.bounds(self._read_pos)[0] >= seg.end:
                self._retire_segment()
        return out

    def _read_cached(self, number: int, pos: int, want: int, out: list[Message]) -> bool:
        """Read the record at (``number``, ``pos``) from the cache if it is there; False if the
        reader must read the files (the cache is dropped if it does not start at the reader)."""
        cache = self._cache
        records = self._cache_records
        seg_number, offset, end, msgs = records[0]
        if seg_number != number or offset != pos or self._read_index:
            cache.drop()
            return False
        records.popleft()
        cache.bytes -= end - offset
        self.pending = msgs
        self._pending_end = end
        self._pending_token = 0
        self._take(want, out)
        return True

    def _decode(self, seg: Segment, stop: int, want: int, out: list[Message]) -> bool:
        """Decode records from ``_read_pos`` (up to ``stop``) until ``want`` more messages are
        in ``out``; False at a bad record. Only whole records whose CRC matched are decoded."""
        buf = self._buf
        base = self._buf_start
        pos = self._read_pos
        if not base <= pos <= base + len(buf):
            buf = b""
            base = pos
        i = pos - base
        avail = min(stop, base + len(buf)) - base
        view = memoryview(buf)
        unpack_u32 = U32.unpack_from
        from_wall_ns = self._timebase.from_wall_ns
        ack_mode = self._ack_mode
        target = len(out) + want
        ok = True
        while len(out) < target:
            length = -1
            if i + 5 <= avail:
                length = unpack_u32(buf, i)[0]
                typ = buf[i + 4]
                if not MIN_RECORD_LENGTH <= length <= MAX_RECORD_LENGTH or (
                    typ != TYPE_BATCH and typ != TYPE_MESSAGE and typ != TYPE_SEALED_BATCH
                ):
                    ok = False
                    break
            elif base + i >= stop:
                break
            rec_end = i + 4 + length
            if length < 0 or rec_end > avail:
                need = 4 + length if length >= 0 else RECORD_OVERHEAD
                if base + i + need > stop:
                    ok = False
                    break
                base, buf, i, avail, view = self._refill(seg, base + i, need, stop)
                if i + need > avail:
                    ok = False  # the file is shorter than the queue thinks
                    break
                continue
            crc_at = rec_end - 4
            if crc32c(view[i + 4 : crc_at]) != unpack_u32(buf, crc_at)[0]:
                ok = False
                break
            token = record_token(seg.number, base + i)
            if typ == TYPE_BATCH:
                msgs = decode_batch(buf, view, i, rec_end, token, from_wall_ns, ack_mode)
            elif typ == TYPE_SEALED_BATCH:
                msgs = self._open_batch(seg, base + i, buf, i, rec_end, token)
            else:
                msgs = decode_message(buf, i, rec_end, token, from_wall_ns, ack_mode)
            if msgs is None:
                ok = False
                break
            # The record at _read_pos (base + i): hand out what is wanted, keep the rest pending.
            self.pending = msgs
            self._pending_end = base + rec_end
            self._pending_token = token
            i = rec_end
            self._take(target - len(out), out)
        # A fully consumed buffer is dropped: an idle queue should not pin its read-ahead.
        self._buf = buf if i < len(buf) else b""
        self._buf_start = base + i if i >= len(buf) else base
        return ok

    def _open_batch(
        self, seg: Segment, pos: int, buf: bytes, i: int, rec_end: int, token: int
    ) -> list[Message] | None:
        """The messages of the sealed batch at ``buf[i:rec_end]`` (file position ``pos``, its
        CRC checked); None if it does not open (damage)."""
        try:
            plain = self._opener.open(buf, i, rec_end)
        except FormatError as exc:
            log.error("DISKQUEUE(%s): %s: sealed batch at %d: %s", self._name, seg.path, pos, exc)
            return None
        return decode_batch(
            plain, memoryview(plain), 0, len(plain), token, self._timebase.from_wall_ns,
            self._ack_mode,
        )  # fmt: skip

    def _take(self, want: int, out: list[Message]) -> None:
        """Move up to ``want`` messages of the pending record to ``out``; past its end, the read
        position moves to the next record."""
        pending = self.pending
        assert pending is not None
        first = self._read_index
        end = first + want
        if end >= len(pending):
            end = len(pending)
            out.extend(pending if first == 0 else pending[first:])
            self.pending = None
            self._read_pos = self._pending_end
            self._read_index = 0
        else:
            out.extend(pending[first:end])
            self._read_index = end
        got = end - first
        if self._ack_mode and got > 0:
            tokens = range(self._pending_token + first, self._pending_token + end)
            self._outstanding.update(tokens)
            self._order.extend(tokens)
        self._consumed += got
        self.depth -= got

    def _refill(
        self, seg: Segment, pos: int, need: int, stop: int
    ) -> tuple[int, bytes, int, int, memoryview]:
        size = min(max(self._read_ahead, need), stop - pos)
        buf = os.pread(self._fd_for(seg), size, pos)
        return pos, buf, 0, len(buf), memoryview(buf)

    def _fd_for(self, seg: Segment) -> int:
        if self._fd_segment is not seg:
            self.close()
            try:
                self._fd = os.open(seg.path, os.O_RDONLY)
            except FileNotFoundError:
                if seg is not self._segments[-1]:
                    raise
                # Unlinked under us while we still write it: read through our write fd.
                self._fd = os.dup(self._writer.fd)
            self._fd_segment = seg
        return self._fd

    def _repair(self, seg: Segment) -> None:
        """The record at the read position is bad: set aside what is bad in the rest of ``seg``."""
        self._cache.drop()
        pos = self._read_pos
        self._buf = b""
        fd = self._fd_for(seg)
        damage = self._damage
        estimated_before = damage.lost_messages
        found, remaining = set_aside_damage(
            self._name, seg, fd, pos, damage, SEALED_RECORD_TYPES, opener=self._opener
        )
        if not found:
            log.warning("DISKQUEUE(%s): %s: re-reading at %d", self._name, seg.path, pos)
            return
        seg.skips = sorted([*seg.skips, *found])
        lost_records = (seg.records - self._consumed) - remaining
        # The segment's count from recovery makes the loss exact here, not an estimate.
        damage.lost_messages = estimated_before + max(lost_records, 0)
        seg.records -= lost_records
        self.depth -= lost_records

    def _retire_segment(self) -> None:
        self.close()
        self._segment_list.retire_first()
        self.reset(SEGMENT_HEADER_SIZE, 0)

"""Reading a topic log forward from an offset: the tail cache first, else the segment files.

Theory of operation
-------------------
A ``LogReader`` has one position: the next offset it returns (``position``), and where that
offset is: a segment, the file position of a record boundary, and the end of the previous
record's offsets (``_running``, which gives the next record its first offset:
``log_index.first_offset``). ``read_many`` returns ``(offset, message)`` pairs in offset order;
``read_messages`` returns the messages alone, as the caller's own objects carrying their offsets
(what a channel's cursor takes: the decoder makes them so, a cached record's are copied).

To get its next record, a reader first asks the log's tail cache (``log_cache.py``): if the
offset is there, it takes that record's message objects as they were appended, shared with every
other reader. Otherwise it reads the files: ``read_ahead`` bytes per ``pread`` (through a
descriptor the log shares between readers), frames the record at its position, checks its CRC
and decodes it (``decoder.py``); a record only partly returned stays decoded (``_pending``) for
the next call. Records wholly before the wanted offset, as after a ``seek``, are stepped over by
their headers: no CRC check, no decoding. So a seek costs the index's binary searches
(``log_index.py``) and a walk of at most one index span.

A sealed record (compression or encryption at rest, ``atrest/seal.py``) is framed by its clear
header like any other (its count and first offset are where an 'O' record has them) and, once
its CRC has matched, opened by the log's ``Opener``: everything after works on the plain record
it holds, as the tuple ``_verified`` returns says (the bytes, and where the record is in them).
A sealed record that does not open is a bad record like one with a bad CRC.

Regions set aside are jumped over (``Segment.bounds``). A record that fails its checks is
handled as a disk queue's reader does (``repair.py``): the bad bytes in the rest of the segment
are copied aside, counted and skipped, for every reader of the log at once (the regions are the
segment's); if they cannot be copied aside the read stops before them and is tried again later.

A reader holds no claim on the log: the segments it reads are kept by the cursors' low-water
marks (``log_cursor.py``). A tool's reader (``TopicLog.open_reader``, ``read_range``) that finds
its position deleted under it goes on from the earliest offset left.
"""

from __future__ import annotations

import logging
import os
from operator import or_
from typing import Any

from crc32c import crc32c

from lmqd.message import Message
from lmqd.storage.decoder import decode_batch, decode_message
from lmqd.storage.log_cache import TailCache
from lmqd.storage.log_index import LogIndex, SegmentIndex, first_offset
from lmqd.storage.reader import MAX_REPAIRS_PER_READ
from lmqd.storage.record import (
    BATCH_ENTRY,
    BATCH_ENTRY_SIZE,
    BATCH_FLAG_OPTIONS,
    BATCH_HEADER,
    MAX_RECORD_LENGTH,
    MIN_RECORD_LENGTH,
    OFFSET_BATCH_HEADER,
    OFFSET_BATCH_HEADER_SIZE,
    RECORD_OVERHEAD,
    RECORD_PREFIX,
    SEALED_TYPES,
    SEGMENT_HEADER_SIZE,
    TYPE_MESSAGE,
    TYPE_OFFSET_BATCH,
    TYPE_SEALED_OFFSET_BATCH,
    U32,
    FormatError,
    header_offset_size,
)
from lmqd.storage.repair import set_aside_damage
from lmqd.storage.verify import batch_layout, option_priorities

log = logging.getLogger("lmqd.storage")

LogEntry = tuple[int, Message]
"""A message read from a topic log, with its offset."""
Framed = tuple[int, int, int, int, int]
"""A record found at the reader's position: (its index in ``_buf``, the index after it, type,
first offset, message count)."""
Verified = tuple[bytes, int, int, int, int, int, int]
"""A record whose checks passed: (the bytes holding the plain record, its index there, the
index after it, its plain type, first offset, message count, its size as stored)."""


class _BadRecord(Exception):
    """The bytes at the reader's position are not a valid record."""


class LogReader:
    """Reads a topic log forward from an offset; see the module docstring."""

    __slots__ = (
        "_buf",
        "_buf_seg",
        "_buf_start",
        "_cache",
        "_index",
        "_next",
        "_pending",
        "_pending_end",
        "_pending_first",
        "_pending_shared",
        "_pos",
        "_running",
        "_seg",
    )

    def __init__(self, index: LogIndex, cache: TailCache, offset: int) -> None:
        self._index = index
        self._cache = cache
        self._buf = b""
        self._buf_seg: SegmentIndex | None = None
        """The segment ``_buf`` holds bytes of (from file position ``_buf_start``)."""
        self._buf_start = 0
        self._pending: list[Message] | None = None
        """The messages of the record at ``_pos`` while it is partly returned."""
        self._pending_first = 0
        """The offset of ``_pending[0]``."""
        self._pending_end = 0
        """File position after the record ``_pending`` came from."""
        self._pending_shared = False
        """``_pending`` is the tail cache's (shared with every reader), not decoded here."""
        self._seg = index.segments[-1]
        self._pos = SEGMENT_HEADER_SIZE
        self._running = 0
        self._next = 0
        self.seek(offset)

    @property
    def position(self) -> int:
        """The offset of the next message to read (or, past a gap, of where it would be)."""
        return self._next

    def seek(self, offset: int) -> int:
        """Read from ``offset`` on, clamped to the log's earliest offset and its end; returns
        the offset the reader is now at."""
        index = self._index
        offset = min(max(offset, index.earliest_offset), index.next_offset)
        self._pending = None
        self._next = offset
        if offset >= index.next_offset:
            seg = index.segments[-1]
            self._seg = seg
            self._pos = max(seg.file.end, SEGMENT_HEADER_SIZE)
            self._running = offset
            return offset
        seg, k = index.locate(offset)
        self._seg = seg
        if k < 0:
            self._pos = SEGMENT_HEADER_SIZE
            self._running = seg.base
        else:
            self._pos = seg.positions[k]
            self._running = seg.offsets[k]
        return offset

    def read_many(self, max_count: int, until: int | None = None) -> list[LogEntry]:
        """Up to ``max_count`` messages from the position on, with their offsets (below
        ``until`` if given); the position moves past them. The messages may be shared with
        other readers (the tail cache's): read-only."""
        out: list[LogEntry] = []
        self._read(max_count, until, out, True)
        return out

    def read_messages(self, max_count: int, until: int | None = None) -> list[Message]:
        """``read_many``'s messages as the caller's own: each one a fresh object carrying its
        offset (``Message.offset``), which the caller may change. A record decoded from the
        files is made so by the decoder; a cached record's shared messages are copied."""
        out: list[Message] = []
        self._read(max_count, until, out, False)
        return out

    def _read(self, max_count: int, until: int | None, out: list[Any], pairs: bool) -> None:
        """Up to ``max_count`` messages into ``out``: ``(offset, message)`` pairs
        (``read_many``) or the caller's own messages (``read_messages``)."""
        index = self._index
        if self._next < index.earliest_offset:
            # Only a tool's reader gets here (a cursor's mark keeps its segments): what it was
            # about to read was deleted under it, so it goes on from what is left.
            self.seek(index.earliest_offset)
        limit = index.next_offset if until is None else min(until, index.next_offset)
        while len(out) < max_count:
            pending = self._pending
            if pending is None:
                if self._next >= limit or not self._load():
                    break
                pending = self._pending
                assert pending is not None
            first = self._pending_first
            start = self._next - first
            take = min(max_count - len(out), len(pending) - start, limit - self._next)
            if take <= 0:
                break
            offsets = range(self._next, self._next + take)
            if pairs:
                out.extend(zip(offsets, pending[start : start + take], strict=True))
            elif self._pending_shared:
                new = Message
                out += [
                    new(m.id, m.body, m.timestamp, m.attempts, m.deliver_at, 0, 0.0, 0.0, k, m.ext)
                    for k, m in zip(offsets, pending[start : start + take], strict=True)
                ]
            else:
                out += pending[start : start + take]  # decoded for this reader, offsets set
            self._next += take
            if start + take == len(pending):
                self._pending = None
                self._pos = self._pending_end
                self._running = first + len(pending)
                if self._buf_seg is not self._seg or self._pos >= self._buf_start + len(self._buf):
                    self._buf = b""  # an idle reader should not pin its read-ahead
                    self._buf_seg = None

    def find_time(self, ts_ns: int) -> int:
        """The offset of the first message whose timestamp is at or after ``ts_ns`` (the log's
        end if none is); moves the reader there."""
        index = self._index
        found = index.locate_time(ts_ns)
        if found is None:
            return self.seek(index.next_offset)
        seg, k = found
        self._pending = None
        self._seg = seg
        self._pos = seg.positions[k]
        self._running = seg.offsets[k]
        self._next = seg.offsets[k]
        repairs = 0
        while True:
            try:
                framed = self._frame_next()
                if framed is None:
                    break
                buf, i, _rec_end, kind, first, count, stored = self._verified(framed)
            except _BadRecord:
                repairs += 1
                if repairs > MAX_REPAIRS_PER_READ or not self._repair():
                    break
                continue
            except OSError:
                log.error("TOPICLOG(%s): read failed", index.name, exc_info=True)
                break
            if kind == TYPE_MESSAGE:
                stamps = [RECORD_PREFIX.unpack_from(buf, i)[4]]
            else:
                at = i + header_offset_size(kind)
                with memoryview(buf) as view, view[at : at + count * BATCH_ENTRY_SIZE] as entries:
                    stamps = [entry[2] for entry in BATCH_ENTRY.iter_unpack(entries)]
            for j, stamp in enumerate(stamps):
                if stamp >= ts_ns:
                    return self.seek(first + j)
            self._pos += stored
            self._running = first + count
        return self.seek(index.next_offset)

    def pushed_offsets(self, until: int) -> list[int]:
        """The offsets, from the position up to ``until``, of the messages stored with a
        deliver-after time (DPUB) or an lmq priority; moves the reader to ``until`` (or the end
        of what it could read). Reads the records' entries and option blocks only: no message
        is made, no body touched."""
        self._pending = None
        found: list[int] = []
        repairs = 0
        start = self._next
        while self._next < until:
            try:
                framed = self._frame_next()
                if framed is None:
                    break
                i, rec_end, kind, first, count = framed
                if first + count <= start:
                    self._pos += rec_end - i
                    self._running = first + count
                    continue
                buf, i, rec_end, kind, first, count, stored = self._verified(framed)
            except _BadRecord:
                repairs += 1
                if repairs > MAX_REPAIRS_PER_READ or not self._repair():
                    break
                continue
            except OSError:
                log.error("TOPICLOG(%s): read failed", self._index.name, exc_info=True)
                break
            if first >= until:
                break
            if kind == TYPE_MESSAGE:
                if RECORD_PREFIX.unpack_from(buf, i)[6] and first >= start:
                    found.append(first)
            else:
                at = i + header_offset_size(kind)
                with memoryview(buf) as view, view[at : at + count * BATCH_ENTRY_SIZE] as entries:
                    pushed = [entry[4] for entry in BATCH_ENTRY.iter_unpack(entries)]
                if buf[i + 5] & BATCH_FLAG_OPTIONS:
                    _, _, options_at = batch_layout(buf, i, rec_end)
                    priorities = option_priorities(buf, options_at, rec_end - 4, count)
                    pushed = list(map(or_, pushed, priorities))
                found.extend(
                    first + k for k, p in enumerate(pushed) if p and start <= first + k < until
                )
            self._pos += stored
            self._running = first + count
            self._next = first + count
        if self._next > until:
            self.seek(until)
        return found

    def close(self) -> None:
        """Drop the read-ahead buffer and anything decoded (the reader may be used again)."""
        self._buf = b""
        self._buf_seg = None
        self._pending = None

    # -- internals ----------------------------------------------------------------------------

    def _load(self) -> bool:
        """Make the record holding the next offset (or the first after it) pending; False if
        there is none yet, or reading must stop (an I/O error, damage that could not be set
        aside)."""
        cache = self._cache
        if len(cache):
            cached = cache.find(self._next)
            if cached is not None:
                seg, pos, end, first, messages = cached
                self._seg = seg
                self._pos = pos
                self._pending = messages if isinstance(messages, list) else list(messages)
                self._pending_shared = True
                self._pending_first = first
                self._pending_end = end
                if self._next < first:
                    self._next = first  # a gap (offsets never written): the next message present
                return True
        repairs = 0
        while True:
            try:
                framed = self._frame_next()
                if framed is None:
                    return False
                i, rec_end, _, first, count = framed
                if first + count <= self._next:
                    # Wholly before the wanted offset (a walk from an index entry): step over.
                    self._pos += rec_end - i
                    self._running = first + count
                    continue
                self._decode(self._verified(framed))
                return True
            except _BadRecord:
                repairs += 1
                if repairs > MAX_REPAIRS_PER_READ or not self._repair():
                    return False
            except OSError:
                log.error("TOPICLOG(%s): read failed", self._index.name, exc_info=True)
                return False

    def _frame_next(self) -> Framed | None:
        """The header of the next record from the position on, moving over set-aside regions
        and into the next segment as needed: (index of the record in ``_buf``, index after it,
        type, first offset, message count); None at the end of the log. Raises ``_BadRecord``
        (the position is then the bad record's) or ``OSError``."""
        index = self._index
        while True:
            seg = self._seg
            file = seg.file
            pos, stop = file.bounds(self._pos)
            self._pos = pos
            if pos >= file.end:
                following = index.after(seg)
                if following is None:
                    return None
                self._seg = following
                self._pos = SEGMENT_HEADER_SIZE
                if following.base > self._running:
                    self._running = following.base
                continue
            if stop - pos < RECORD_OVERHEAD:
                raise _BadRecord
            i = self._ensure(seg, pos, OFFSET_BATCH_HEADER_SIZE, stop)
            buf = self._buf
            length = U32.unpack_from(buf, i)[0]
            kind = buf[i + 4]
            if (
                kind not in seg.types
                or not MIN_RECORD_LENGTH <= length <= MAX_RECORD_LENGTH
                or pos + 4 + length > stop
            ):
                raise _BadRecord
            if kind == TYPE_MESSAGE:
                count, stated = 1, -1
            elif kind in (TYPE_OFFSET_BATCH, TYPE_SEALED_OFFSET_BATCH):
                count, stated = OFFSET_BATCH_HEADER.unpack_from(buf, i)[3:]
            else:
                count, stated = BATCH_HEADER.unpack_from(buf, i)[3], -1
            return i, i + 4 + length, kind, first_offset(stated, self._running), count

    def _verified(self, framed: Framed) -> Verified:
        """``framed`` with its whole record in ``_buf``, its CRC checked and, sealed, opened
        (``_BadRecord`` if either fails)."""
        i, rec_end, kind, first, count = framed
        seg = self._seg
        pos = self._pos
        length = rec_end - i
        stop = seg.file.bounds(pos)[1]
        if rec_end > len(self._buf):
            i = self._ensure(seg, pos, length, stop)
            rec_end = i + length
        buf = self._buf
        with memoryview(buf) as view, view[i + 4 : rec_end - 4] as covered:
            if crc32c(covered) != U32.unpack_from(buf, rec_end - 4)[0]:
                raise _BadRecord
        if kind in SEALED_TYPES:
            try:
                plain = self._index.opener.open(buf, i, rec_end)
            except FormatError as exc:
                log.error(
                    "TOPICLOG(%s): %s: sealed batch at %d: %s",
                    self._index.name,
                    seg.file.path,
                    pos,
                    exc,
                )
                raise _BadRecord from None
            return plain, 0, len(plain), plain[4], first, count, length
        return buf, i, rec_end, kind, first, count, length

    def _decode(self, verified: Verified) -> None:
        """Make the verified record pending (``_BadRecord`` if its structure lies)."""
        buf, i, rec_end, kind, first, count, stored = verified
        from_wall_ns = self._index.timebase.from_wall_ns
        skip = self._next - first if self._next > first else 0
        if kind == TYPE_MESSAGE:
            msgs = decode_message(buf, i, rec_end, 0, from_wall_ns, False)
            if msgs is not None:
                msgs[0].offset = first
        else:
            # A read from the middle of a batch (a seek) leaves out the messages before it.
            msgs = decode_batch(
                buf,
                memoryview(buf),
                i,
                rec_end,
                0,
                from_wall_ns,
                False,
                header_offset_size(kind),
                skip,
                first + skip,
            )
        if kind == TYPE_MESSAGE or msgs is None:
            skip = 0
        if msgs is None or len(msgs) != count - skip:
            raise _BadRecord
        self._pending = msgs
        self._pending_shared = False
        self._pending_first = first + skip
        self._pending_end = self._pos + stored
        if self._next < first:
            self._next = first  # a gap (damage took those offsets): the next message present

    def _ensure(self, seg: SegmentIndex, pos: int, need: int, stop: int) -> int:
        """The index in ``_buf`` of file position ``pos`` of ``seg``, with at least ``need``
        bytes after it (a read of ``read_ahead`` bytes, or ``need``, up to ``stop``, if they
        are not there yet). Raises ``_BadRecord`` if the file ends first, ``OSError``."""
        i = pos - self._buf_start
        if self._buf_seg is seg and i >= 0 and i + need <= len(self._buf):
            return i
        size = min(max(self._index.read_ahead, need), stop - pos)
        data = os.pread(self._index.read_fd(seg), size, pos)
        self._buf = data
        self._buf_start = pos
        self._buf_seg = seg
        if len(data) < need:
            raise _BadRecord  # the file is shorter than the log thinks
        return 0

    def _repair(self) -> bool:
        """The record at the position is bad: set aside what is bad in the rest of its segment.
        False if nothing new was found or it could not be copied aside (reading stops here)."""
        index = self._index
        seg = self._seg
        self._buf = b""
        self._buf_seg = None
        try:
            found, _ = set_aside_damage(
                index.name,
                seg.file,
                index.read_fd(seg),
                self._pos,
                index.damage,
                seg.types,
                subject="TOPICLOG",
                opener=index.opener,
            )
        except OSError:
            # Nothing is skipped that could not be copied aside: reading stops here until the
            # repair succeeds (e.g. the disk has room again).
            log.error("TOPICLOG(%s): cannot set a bad record aside", index.name, exc_info=True)
            return False
        if not found:
            log.warning("TOPICLOG(%s): %s: cannot read at %d", index.name, seg.file.path, self._pos)
            return False
        seg.file.skips = sorted([*seg.file.skips, *found])
        return True

"""DiskQueue: the segment-log backend queue of one durable topic or channel.

Theory of operation
-------------------
A queue is a sequence of segment files ``<stem>.lmq.<number>.dat`` (``files.queue_stem``) in the
data directory, each a header and records (``record.py``). ``put_many`` encodes its messages as
*batch records* (one CRC32C per batch, one ``struct.pack`` per message), split where a segment
fills up and at ``record.MAX_BATCH_BYTES``, and hands them to the OS with one ``pwrite`` per
segment it touches, at the write position; what does not fit in ``max_bytes_per_file`` rolls to
a new segment. If any write fails, whatever the call wrote is truncated away or unlinked and
``BackendError`` is raised: the call is stored whole or not at all, and the positions never move
over a partial write.

``read_many`` reads ahead ``read_ahead`` bytes per ``pread`` and decodes whole records, checking
each CRC again (the disk may have rotted since start-up); no message of a record is returned
before the record's CRC has matched. A record that fails is handled like recovery does at
start-up (``recovery.py``): the bad bytes are copied aside, counted and skipped. A batch that is
only partly returned stays decoded in the reader (``_pending``); the read position is then the
batch's offset plus the index of the next message in it (``_rpos``, ``_ridx``), and that pair is
what the positions file stores, so a close and reopen resumes exactly there. A segment the reader
has left is *retired*; it is unlinked by the sync job that persists a read position past it
(``sync.py``), never before, so a crash cannot leave a positions file pointing into a deleted
segment.

Positions (``<stem>.lmq.pos.json``, ``positions.py``) are persisted only by sync jobs
(``prepare_sync`` in the event-loop thread, ``SyncJob.run`` in a worker thread) and by
``close``/``empty``. In acknowledgement mode (``ack_mode=True``) ``read_many`` returns
``StoredMessage`` objects carrying a ``token`` (segment, record offset and index in the record);
the persisted read position is the position of the oldest message not yet ``ack``-ed, so after a
crash everything not acknowledged is read again (at-least-once), along with any acknowledged
messages that followed it.

Opening a queue recovers it: every segment from the persisted read position on is verified;
consumed segments left behind by a crash are removed; a damaged or missing positions file is
rebuilt from the segments (reading restarts at the oldest record still on disk).
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import time
from collections import deque
from collections.abc import Iterable, Sequence

from crc32c import crc32c

from lmqd.message import Message
from lmqd.storage.decoder import decode_batch, decode_message
from lmqd.storage.encoder import encode_entries, frame_batches, plan_batches
from lmqd.storage.errors import BackendError
from lmqd.storage.files import (
    fsync_dir,
    positions_filename,
    pwrite_all,
    save_aside,
    segment_filename,
    unlink_quietly,
    write_file_durably,
)
from lmqd.storage.positions import Positions, encode_positions
from lmqd.storage.record import (
    BATCH_OVERHEAD,
    MAX_RECORD_LENGTH,
    MIN_RECORD_LENGTH,
    RECORD_OVERHEAD,
    SEGMENT_HEADER_SIZE,
    TYPE_BATCH,
    TYPE_MESSAGE,
    U32,
    encode_segment_header,
)
from lmqd.storage.recovery import recover_queue
from lmqd.storage.scan import scan_records
from lmqd.storage.sync import QueueFiles, SyncJob
from lmqd.storage.timebase import TimeBase
from lmqd.storage.tokens import record_token, token_index, token_position
from lmqd.units import KiB, MiB

log = logging.getLogger("lmqd.storage")

DEFAULT_READ_AHEAD = 256 * KiB
"""Bytes per read syscall: ~2,000 small messages, small enough not to hold much memory per queue."""

_MAX_REPAIRS_PER_READ = 64
WRITE_CACHE_BYTES = 1 * MiB
"""Bytes of records a queue whose reader keeps up keeps as message objects (see ``put_many``):
~7,000 messages of 100 bytes, enough for what a channel writes between two delivery rounds."""
"""Bound on corrupt regions handled in one read_many call, so damage never becomes a busy loop."""


class _Segment:
    __slots__ = ("end", "number", "path", "records", "skips")

    def __init__(
        self, number: int, path: str, end: int, skips: list[tuple[int, int]], records: int
    ) -> None:
        self.number = number
        self.path = path
        self.end = end
        """Offset after the last record (the write position, for the write segment)."""
        self.skips = skips
        """Corrupt regions (start, end) the reader jumps over, sorted."""
        self.records = records
        """Messages in the file's valid records."""


class DiskQueue:
    """A ``lmqd.backend.BackendQueue`` stored in segment files under ``data_path``.

    Opening recovers the queue (blocking: it reads every live segment; call it from a worker
    thread in the daemon). All other methods but ``close``, ``empty`` and ``delete`` only hand
    data to the OS and never wait for the disk; durability comes from ``prepare_sync``.
    Opening never raises for damaged content; it raises ``OSError`` if the files cannot be read,
    created or repaired (permissions, I/O errors, a full disk).

    One ``DiskQueue`` per name and data directory (the daemon's registry and ``DataDirLock``
    ensure it).
    """

    def __init__(
        self,
        name: str,
        data_path: str | os.PathLike[str],
        *,
        timebase: TimeBase,
        max_bytes_per_file: int = 100 * MiB,
        ack_mode: bool = False,
        read_ahead: int = DEFAULT_READ_AHEAD,
        write_cache: int = WRITE_CACHE_BYTES,
    ) -> None:
        if max_bytes_per_file <= SEGMENT_HEADER_SIZE:
            raise ValueError("max_bytes_per_file too small")
        self.name = name
        self._dir = os.fspath(data_path)
        self._timebase = timebase
        self._max_bytes = max_bytes_per_file
        self._ack_mode = ack_mode
        self._read_ahead = max(read_ahead, RECORD_OVERHEAD)
        self._write_cache = write_cache
        self._files = QueueFiles(name, self._dir, os.path.join(self._dir, positions_filename(name)))
        self._segments: deque[_Segment] = deque()
        """The reader's segment first, the write segment last."""
        self._retired: deque[_Segment] = deque()
        """Segments the reader has left, waiting for a persisted read position past them."""
        self._next_number = 0
        self._wfd = -1
        self._wdirty = False
        self._truncate_to = -1
        """Write position to cut the write segment back to before the next write (-1: none)."""
        self._pending_fds: list[int] = []
        """Rolled segments' write descriptors, handed to the next sync job to fsync."""
        self._rfd = -1
        self._rfd_segment: _Segment | None = None
        self._rbuf = b""
        self._rbuf_start = 0
        self._rpos = SEGMENT_HEADER_SIZE
        """Offset of the record holding the next message to read (a record boundary)."""
        self._ridx = 0
        """Messages of the record at ``_rpos`` already returned (or consumed before a restart)."""
        self._pending: list[Message] | None = None
        """The decoded messages of the record at ``_rpos`` while it is partly returned."""
        self._pending_end = 0
        """Offset after the record ``_pending`` came from."""
        self._pending_token = 0
        """Acknowledgement mode: the token of ``_pending[0]``."""
        self._rconsumed = 0
        """Messages read from the reader's segment (for recounting after a corrupt region)."""
        self._cache: deque[tuple[int, int, int, list[Message]]] = deque()
        """Write-through cache: (segment, offset, end, messages) of the last records written, from
        the one the reader reads next on (non-acknowledgement mode only; see ``put_many``)."""
        self._cache_bytes = 0
        self._cache_open = False
        """Whether records written now may join the cache (it is contiguous with the reader)."""
        self._depth = 0
        self._dirty = 0
        self._bytes = 0
        """Bytes of the segment files not yet handed to a sync job to unlink (``bytes_on_disk``)."""
        self._outstanding: set[int] = set()
        self._order: deque[int] = deque()
        """Tokens handed out, oldest first; acknowledged ones are dropped only from the front."""
        self._last_positions: Positions | None = None
        self._closed = False
        self.corrupt_count = 0
        """Corrupt regions found (at start-up and while reading) and set aside."""
        self.corrupt_bytes = 0
        self.torn_bytes = 0
        """Bytes of torn writes truncated at start-up (a crash mid-write; not data loss)."""
        self.missing_segments = 0
        """Segment files the positions file expected that were not found."""
        self.rebuilt_positions = False
        """True if the positions file was missing or damaged and was rebuilt from the segments."""
        try:
            self._open()
        except BaseException:
            self._close_fds()
            raise

    # -- public interface ---------------------------------------------------------------------

    @property
    def depth(self) -> int:
        """Messages stored and not yet read."""
        return self._depth

    @property
    def bytes_on_disk(self) -> int:
        """Bytes of this queue's segment files (headers and records up to each segment's end).

        Kept as a running sum (writes add, unlinks subtract), so reading it costs no system call.
        A segment stops counting once a sync job is given it to unlink; the small positions file
        and set-aside ``.bad`` copies are not counted.
        """
        return self._bytes

    @property
    def dirty_count(self) -> int:
        """Reads, writes and acknowledgements since the last ``prepare_sync`` (``--sync-every``)."""
        return self._dirty

    def needs_sync(self, sync_every: int) -> bool:
        """Whether ``--sync-every`` operations have accumulated since the last sync."""
        return self._dirty >= sync_every

    @property
    def unacked_count(self) -> int:
        """Acknowledgement mode: messages read and not yet acknowledged."""
        return len(self._outstanding)

    @property
    def ack_mode(self) -> bool:
        return self._ack_mode

    @property
    def closed(self) -> bool:
        return self._closed

    def put_many(self, messages: Sequence[Message]) -> None:
        """Append messages in order; raises ``BackendError`` having stored none of them.

        Write-through cache: while the reader keeps up (it has read everything written before),
        the records written are also kept as the message objects given, up to
        ``WRITE_CACHE_BYTES``, and ``read_many`` returns those objects instead of reading the
        records back and decoding them: a channel whose consumers keep up pays for the write but
        not for the read. The records are on disk all the same (what a restart or a crash
        finds does not change); once the reader falls further behind, it reads the files.
        """
        if self._closed:
            raise BackendError(f"DISKQUEUE({self.name}): closed")
        if not messages:
            return
        if self._truncate_to >= 0:
            self._truncate_tail()
        entries, bodies = encode_entries(messages, self._timebase.to_wall_ns)
        chunks = plan_batches(bodies, self._segments[-1].end, self._max_bytes)
        placed = self._write_chunks(entries, bodies, chunks)
        if not self._cache_open and self._depth == 0 and self._pending is None:
            self._cache_open = not self._ack_mode and not self._cache
        if self._cache_open:
            self._remember(messages, placed)
        self._depth += len(messages)
        self._dirty += len(messages)

    def read_many(self, max_count: int) -> list[Message]:
        """Remove and return up to ``max_count`` of the oldest messages.

        In acknowledgement mode they are ``StoredMessage`` objects to ``ack`` by token.
        """
        out: list[Message] = []
        if self._closed or max_count <= 0:
            return out
        if self._pending is not None:
            self._take(max_count, out)
        repairs = 0
        cache = self._cache
        while len(out) < max_count and self._depth > 0:
            seg = self._segments[0]
            pos, stop = self._bounds(seg, self._rpos)
            if pos != self._rpos:
                self._rpos = pos
                self._ridx = 0
            if pos >= seg.end:
                if len(self._segments) == 1:
                    break
                self._retire_reader_segment()
                continue
            if pos >= stop:  # pragma: no cover - _bounds skips regions starting at pos
                break
            if cache and self._read_cached(seg.number, pos, max_count - len(out), out):
                continue
            try:
                ok = self._decode(seg, stop, max_count - len(out), out)
            except OSError:
                log.error("DISKQUEUE(%s): read failed", self.name, exc_info=True)
                break
            if not ok:
                repairs += 1
                if repairs > _MAX_REPAIRS_PER_READ:
                    break
                try:
                    self._repair(seg)
                except OSError:
                    # Nothing is skipped that could not be copied aside: reading stops here
                    # until the repair succeeds (e.g. the disk has room again).
                    log.error(
                        "DISKQUEUE(%s): cannot set a bad record aside", self.name, exc_info=True
                    )
                    break
        if len(self._segments) > 1:
            seg = self._segments[0]
            if self._bounds(seg, self._rpos)[0] >= seg.end:
                self._retire_reader_segment()
        self._dirty += len(out)
        return out

    def ack(self, token: int) -> bool:
        """Acknowledgement mode: mark a read message done; False if the token is unknown."""
        outstanding = self._outstanding
        if token not in outstanding:
            return False
        outstanding.remove(token)
        order = self._order
        while order and order[0] not in outstanding:
            order.popleft()
        self._dirty += 1
        return True

    def ack_many(self, tokens: Iterable[int]) -> int:
        """Acknowledge many messages; returns how many tokens were known (each counted once)."""
        outstanding = self._outstanding
        before = len(outstanding)
        outstanding.difference_update(tokens)  # one C loop, not an ``ack`` call per token
        known = before - len(outstanding)
        order = self._order
        while order and order[0] not in outstanding:
            order.popleft()
        self._dirty += known
        return known

    def prepare_sync(self) -> SyncJob | None:
        """Snapshot what a sync must make durable; ``None`` if nothing changed since the last one.

        Non-blocking (event-loop thread): the job duplicates the descriptors it will fsync, so
        the queue may go on writing, rolling, even closing, while the job runs in a thread.
        """
        if self._closed:
            return None
        fds: list[int] = []
        if self._wdirty:
            fds.append(os.dup(self._wfd))
        fds.extend(self._pending_fds)
        self._pending_fds = []
        self._wdirty = False
        positions = self._positions()
        unlink = []
        retired = self._retired
        while retired and retired[0].number < positions.read_segment:
            seg = retired.popleft()
            unlink.append(seg.path)
            self._bytes -= seg.end
        if not fds and not unlink and positions == self._last_positions:
            self._dirty = 0
            return None
        self._last_positions = positions
        job = SyncJob(
            self._files,
            self._files.next_seq(),
            fds,
            encode_positions(self.name, positions),
            unlink,
            self._dirty,
        )
        self._dirty = 0
        return job

    def sync(self) -> None:
        """Blocking sync in the calling thread (tests, close); raises ``OSError``."""
        job = self.prepare_sync()
        if job is not None:
            job.run()

    def empty(self) -> None:
        """Drop every stored message (blocking: persists the new, empty positions at once).

        Raises ``BackendError`` if the new state cannot be persisted; the queue is unchanged then.
        """
        if self._closed:
            return
        number = self._next_number
        try:
            fd = self._create_segment(number)
        except OSError as exc:
            raise BackendError(f"DISKQUEUE({self.name}): empty failed: {exc}") from exc
        positions = Positions(number, SEGMENT_HEADER_SIZE, number, SEGMENT_HEADER_SIZE, 0)
        try:
            self._persist_now(positions)
        except OSError as exc:
            os.close(fd)
            _unlink_quietly(os.path.join(self._dir, segment_filename(self.name, number)))
            raise BackendError(f"DISKQUEUE({self.name}): empty failed: {exc}") from exc
        old = [*self._retired, *self._segments]
        self._close_fds()
        for seg in old:
            _unlink_quietly(seg.path)
        self._next_number = number + 1
        self._segments = deque([self._new_segment_entry(number)])
        self._retired.clear()
        self._bytes = SEGMENT_HEADER_SIZE
        self._wfd = fd
        self._truncate_to = -1
        self._reset_reader(SEGMENT_HEADER_SIZE, 0)
        self._drop_cache()
        self._depth = 0
        self._dirty = 0
        self._outstanding.clear()
        self._order.clear()
        self._last_positions = positions

    def delete(self) -> None:
        """Drop everything and remove the queue's files (set-aside ``.bad`` copies stay)."""
        with self._files.lock:
            self._files.deleted = True
        self._close_fds()
        for seg in [*self._retired, *self._segments]:
            _unlink_quietly(seg.path)
        _unlink_quietly(self._files.positions)
        _unlink_quietly(self._files.positions + ".tmp")
        try:
            fsync_dir(self._dir)
        except OSError:
            log.warning("DISKQUEUE(%s): fsync of %s failed", self.name, self._dir, exc_info=True)
        self._segments.clear()
        self._retired.clear()
        self._drop_cache()
        self._bytes = 0
        self._depth = 0
        self._closed = True

    def close(self) -> None:
        """Sync (blocking) and release the files; the messages stay for the next start.

        In acknowledgement mode the unacknowledged messages are read again after reopening.
        """
        if self._closed:
            return
        try:
            self.sync()
        except OSError:
            log.error("DISKQUEUE(%s): sync on close failed", self.name, exc_info=True)
        self._close_fds()
        self._drop_cache()
        self._closed = True

    # -- writing ------------------------------------------------------------------------------

    def _write_chunks(
        self, entries: list[bytes], bodies: list[bytes], chunks: list[list[tuple[int, int, int]]]
    ) -> list[tuple[int, int, list[tuple[int, int, int]]]]:
        """Write the planned batches; returns (segment, offset, batches) for each segment written.
        """
        seg = self._segments[-1]
        start_end = seg.end
        fd = self._wfd
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
                    number = self._next_number + len(created)
                    fd = self._create_segment(number)
                    created.append(
                        (number, fd, os.path.join(self._dir, segment_filename(self.name, number)))
                    )
                    pos = SEGMENT_HEADER_SIZE
                else:
                    wrote_current = True
                data = frame_batches(entries, bodies, batches)
                pwrite_all(fd, data, pos)
                pos += len(data)
                written.append((len(data), batches[-1][1] - batches[0][0]))
        except OSError as exc:
            for number, cfd, path in created:
                self._discard_new_segment(number, cfd, path)
            if wrote_current:
                self._truncate_to = start_end
                with contextlib.suppress(BackendError):  # retried before the next write
                    self._truncate_tail()
            log.error("DISKQUEUE(%s): write failed: %s", self.name, exc)
            raise BackendError(f"DISKQUEUE({self.name}): write failed: {exc}") from exc
        # Commit: only now do the positions move.
        placed = []
        if wrote_current:
            size, count = written[0]
            seg.end = start_end + size
            seg.records += count
            self._bytes += size
            self._wdirty = True
            placed.append((seg.number, start_end, chunks[0]))
        for (number, cfd, path), (size, count), batches in zip(
            created, written[1:], chunks[1:], strict=True
        ):
            self._roll_to(cfd, _Segment(number, path, SEGMENT_HEADER_SIZE + size, [], count))
            placed.append((number, SEGMENT_HEADER_SIZE, batches))
        return placed

    # -- the write-through cache -----------------------------------------------------------------

    def _remember(
        self, messages: Sequence[Message], placed: list[tuple[int, int, list[tuple[int, int, int]]]]
    ) -> None:
        """Cache the records just written (``put_many``), or close the cache if they don't fit."""
        size = sum(BATCH_OVERHEAD + payload for _, _, batches in placed for *_, payload in batches)
        if self._cache_bytes + size > self._write_cache:
            self._cache_open = False  # the reader is behind: it reads the files from here on
            return
        cache = self._cache
        listed = messages if isinstance(messages, list) else list(messages)  # a deque can't slice
        for number, pos, batches in placed:
            for first, end, payload in batches:
                rec_end = pos + BATCH_OVERHEAD + payload
                cache.append((number, pos, rec_end, listed[first:end]))
                pos = rec_end
        self._cache_bytes += size

    def _read_cached(self, number: int, pos: int, want: int, out: list[Message]) -> bool:
        """Read the record at (``number``, ``pos``) from the cache if it is there; False if the
        reader must read the files (the cache is dropped if it does not start at the reader)."""
        seg_number, offset, end, msgs = self._cache[0]
        if seg_number != number or offset != pos or self._ridx:
            self._drop_cache()
            return False
        self._cache.popleft()
        self._cache_bytes -= end - offset
        self._pending = msgs
        self._pending_end = end
        self._pending_token = 0
        self._take(want, out)
        return True

    def _drop_cache(self) -> None:
        self._cache.clear()
        self._cache_bytes = 0
        self._cache_open = False

    def _truncate_tail(self) -> None:
        """Cut a failed write's bytes off the write segment; raises ``BackendError`` if it can't.

        Until that succeeds no write is accepted: the failed batch may hold complete records,
        which recovery after a crash could not tell from records that were stored.
        """
        try:
            os.ftruncate(self._wfd, self._truncate_to)
        except OSError as exc:
            log.error("DISKQUEUE(%s): cannot truncate a failed write: %s", self.name, exc)
            raise BackendError(f"DISKQUEUE({self.name}): write failed: {exc}") from exc
        self._truncate_to = -1

    def _discard_new_segment(self, number: int, fd: int, path: str) -> None:
        try:
            try:
                os.ftruncate(fd, 0)  # whatever else fails, no record of the batch survives
            finally:
                os.close(fd)
            os.unlink(path)
        except OSError:
            log.error("DISKQUEUE(%s): cannot remove %s", self.name, path, exc_info=True)
            self._next_number = max(self._next_number, number + 1)

    def _roll_to(self, fd: int, seg: _Segment) -> None:
        if self._wdirty:
            self._pending_fds.append(self._wfd)
        else:
            os.close(self._wfd)
        self._wfd = fd
        self._wdirty = True
        self._segments.append(seg)
        self._bytes += seg.end
        self._next_number = seg.number + 1

    def _create_segment(self, number: int) -> int:
        """Create segment file ``number`` with its header; returns an fd open for writing."""
        path = os.path.join(self._dir, segment_filename(self.name, number))
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            pwrite_all(fd, encode_segment_header(number, time.time_ns()), 0)
        except BaseException:
            os.close(fd)
            _unlink_quietly(path)
            raise
        return fd

    def _new_segment_entry(self, number: int) -> _Segment:
        path = os.path.join(self._dir, segment_filename(self.name, number))
        return _Segment(number, path, SEGMENT_HEADER_SIZE, [], 0)

    # -- reading ------------------------------------------------------------------------------

    @staticmethod
    def _bounds(seg: _Segment, pos: int) -> tuple[int, int]:
        """Move ``pos`` past skipped regions; return it and where the next skip (or end) is."""
        for start, end in seg.skips:
            if end <= pos:
                continue
            if start <= pos:
                pos = end
                continue
            return pos, start
        return pos, seg.end

    def _reader_fd(self, seg: _Segment) -> int:
        if self._rfd_segment is not seg:
            self._close_reader()
            try:
                self._rfd = os.open(seg.path, os.O_RDONLY)
            except FileNotFoundError:
                if seg is not self._segments[-1]:
                    raise
                # Unlinked under us while we still write it: read through our write fd.
                self._rfd = os.dup(self._wfd)
            self._rfd_segment = seg
        return self._rfd

    def _decode(self, seg: _Segment, stop: int, want: int, out: list[Message]) -> bool:
        """Decode records from ``self._rpos`` (up to ``stop``) until ``want`` more messages are in
        ``out``; False at a bad record. Only whole records whose CRC matched are decoded."""
        buf = self._rbuf
        base = self._rbuf_start
        pos = self._rpos
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
                    typ != TYPE_BATCH and typ != TYPE_MESSAGE
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
            else:
                msgs = decode_message(buf, i, rec_end, token, from_wall_ns, ack_mode)
            if msgs is None:
                ok = False
                break
            # The record at _rpos (base + i): hand out what is wanted, keep the rest pending.
            self._pending = msgs
            self._pending_end = base + rec_end
            self._pending_token = token
            i = rec_end
            self._take(target - len(out), out)
        # A fully consumed buffer is dropped: an idle queue should not pin its read-ahead.
        self._rbuf = buf if i < len(buf) else b""
        self._rbuf_start = base + i if i >= len(buf) else base
        return ok

    def _take(self, want: int, out: list[Message]) -> None:
        """Move up to ``want`` messages of the pending record to ``out``; past its end, the read
        position moves to the next record."""
        pending = self._pending
        assert pending is not None
        first = self._ridx
        end = first + want
        if end >= len(pending):
            end = len(pending)
            out.extend(pending if first == 0 else pending[first:])
            self._pending = None
            self._rpos = self._pending_end
            self._ridx = 0
        else:
            out.extend(pending[first:end])
            self._ridx = end
        got = end - first
        if self._ack_mode and got > 0:
            tokens = range(self._pending_token + first, self._pending_token + end)
            self._outstanding.update(tokens)
            self._order.extend(tokens)
        self._rconsumed += got
        self._depth -= got

    def _refill(
        self, seg: _Segment, pos: int, need: int, stop: int
    ) -> tuple[int, bytes, int, int, memoryview]:
        size = min(max(self._read_ahead, need), stop - pos)
        buf = os.pread(self._reader_fd(seg), size, pos)
        return pos, buf, 0, len(buf), memoryview(buf)

    def _repair(self, seg: _Segment) -> None:
        """The record at the read position is bad: set aside what is bad in the rest of ``seg``."""
        self._drop_cache()
        pos = self._rpos
        self._rbuf = b""
        fd = self._reader_fd(seg)
        size = os.fstat(fd).st_size
        end = min(seg.end, size)
        ranges = []
        cursor = pos
        for start, stop in [*seg.skips, (seg.end, seg.end)]:
            if stop <= cursor:
                continue
            if start > cursor:
                ranges.append((cursor, min(start, end)))
            cursor = max(cursor, stop)
        remaining = 0
        found: list[tuple[int, int]] = []
        if end > pos:
            with mmap.mmap(fd, end, access=mmap.ACCESS_READ) as mm:
                for start, stop in ranges:
                    if start >= stop:
                        continue
                    scan = scan_records(mm, start, stop)
                    remaining += scan.records
                    for bad_start, bad_end, _ in scan.regions:
                        self._set_aside(seg, mm[bad_start:bad_end], bad_start, bad_end)
                        found.append((bad_start, bad_end))
        if end < seg.end:
            lost = seg.end - end
            self.corrupt_count += 1
            self.corrupt_bytes += lost
            log.error(
                "DISKQUEUE(%s): %s is %d bytes shorter than written; skipping them",
                self.name,
                seg.path,
                lost,
            )
            found.append((end, seg.end))
        if not found:
            log.warning("DISKQUEUE(%s): %s: re-reading at %d", self.name, seg.path, pos)
            return
        seg.skips = sorted([*seg.skips, *found])
        lost_records = (seg.records - self._rconsumed) - remaining
        seg.records -= lost_records
        self._depth -= lost_records

    def _set_aside(self, seg: _Segment, data: bytes, start: int, end: int) -> None:
        aside = save_aside(f"{seg.path}.bad-{start}", data)
        self.corrupt_count += 1
        self.corrupt_bytes += end - start
        log.error(
            "DISKQUEUE(%s): %s: corrupt region of %d bytes at offset %d set aside in %s",
            self.name,
            seg.path,
            end - start,
            start,
            aside,
        )

    def _retire_reader_segment(self) -> None:
        self._close_reader()
        self._retired.append(self._segments.popleft())
        self._reset_reader(SEGMENT_HEADER_SIZE, 0)

    def _reset_reader(self, pos: int, consumed: int, index: int = 0) -> None:
        self._rbuf = b""
        self._rbuf_start = pos
        self._rpos = pos
        self._ridx = index
        self._pending = None
        self._rconsumed = consumed

    def _close_reader(self) -> None:
        if self._rfd >= 0:
            os.close(self._rfd)
        self._rfd = -1
        self._rfd_segment = None
        self._rbuf = b""

    # -- positions ----------------------------------------------------------------------------

    def _positions(self) -> Positions:
        write = self._segments[-1]
        if self._order:
            oldest = self._order[0]
            read_segment, read_offset = token_position(oldest)
            read_index = token_index(oldest)
        else:
            read_segment, read_offset = self._segments[0].number, self._rpos
            read_index = self._ridx
        return Positions(
            read_segment,
            read_offset,
            write.number,
            write.end,
            self._depth + len(self._order),
            read_index,
        )

    def _persist_now(self, positions: Positions) -> None:
        data = encode_positions(self.name, positions)
        with self._files.lock:
            seq = self._files.next_seq()
            write_file_durably(self._files.positions, data)
            self._files.persisted_seq = seq
        fsync_dir(self._dir)

    def _close_fds(self) -> None:
        self._close_reader()
        for fd in [*self._pending_fds, self._wfd]:
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    log.warning("DISKQUEUE(%s): close failed", self.name, exc_info=True)
        self._pending_fds = []
        self._wfd = -1

    # -- opening ------------------------------------------------------------------------------

    def _open(self) -> None:
        os.makedirs(self._dir, exist_ok=True)
        state = recover_queue(self._dir, self.name)
        self.corrupt_count = state.corrupt_count
        self.corrupt_bytes = state.corrupt_bytes
        self.torn_bytes = state.torn_bytes
        self.missing_segments = state.missing_segments
        self.rebuilt_positions = state.rebuilt_positions
        for r in state.segments:
            self._segments.append(_Segment(r.number, r.path, r.end, r.skips, r.records))
        self._reset_reader(state.read_offset, state.read_consumed, state.read_index)
        self._depth = state.depth
        self._next_number = state.next_number
        if state.appendable:
            self._wfd = os.open(state.segments[-1].path, os.O_RDWR)
        else:
            number = self._next_number
            self._wfd = self._create_segment(number)
            self._segments.append(self._new_segment_entry(number))
            self._next_number = number + 1
        self._bytes = sum(seg.end for seg in self._segments)
        # Persist what recovery found at once, so a crash now does not redo the repairs.
        self._last_positions = self._positions()
        self._persist_now(self._last_positions)
        if self._depth or self.corrupt_count or self.rebuilt_positions:
            log.info("DISKQUEUE(%s): opened with depth %d", self.name, self._depth)


def _unlink_quietly(path: str) -> None:
    unlink_quietly(path, log)

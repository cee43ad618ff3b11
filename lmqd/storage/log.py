"""TopicLog: one topic's append-only segment log, read by any number of cursors.

Theory of operation
-------------------
A durable topic appends each message once (``append_many``), whatever its number of channels;
each channel is a ``Cursor`` (``log_cursor.py``) over the log: a read position and a low-water
mark. Every message gets the topic's next **offset** (monotonic, never given twice) and keeps
its timestamp. ``TopicLog`` is the public face; the work is done by parts of one purpose each:

* ``writer.py`` (shared with disk queues): a call's messages become offset batch records ('O',
  format version 3: ``record.py``), written with one ``pwrite`` per segment touched, rolling to
  new segments whose headers carry their base offset; a call is stored whole or not at all.
* ``log_index.py``: per segment, its offsets and a sparse index of (file position, first offset,
  running maximum timestamp); ``offset_for_time`` and every seek are binary searches over it
  plus a walk of at most one span.
* ``log_cache.py``: the records appended last, kept as the message objects given; cursors that
  keep up read those shared objects instead of the files.
* ``log_reader.py``: reading forward from an offset (cursors, ``read_range``), from the cache or
  the files (``pread``, CRC, ``decoder.py``), damage found while reading set aside (``repair.py``).
* ``log_retention.py``: which of the oldest segments may go (every cursor passed them, and the
  topic's retention no longer keeps them).
* ``log_state.py``: the state file (next offset, write position, every cursor's low-water mark),
  persisted by sync jobs (``sync.py``) exactly as a disk queue's positions are.
* ``atrest/``: the sealing step under the records (compression per topic, encryption per
  daemon): ``compression`` may change at any time, the writer then seals new batches with it;
  old segments stay as they were written (a log mixes sealed and plain segments).
* ``log_recovery.py``: opening verifies every segment (``recovery.py``: torn tail truncated,
  damage set aside and counted), rebuilds offsets and the index, restores the cursors with
  their marks checked against the segments.

A **fresh** log (``fresh=True``: a topic created at run time whose name has no files, which the
daemon knows from its start-up scan and its data-directory lock) skips recovery and creates no
file until its first append: creating a topic then costs no system call on the event loop (a
recovery is a directory scan, a header write and a state file with two fsyncs, 3-6 ms). The
first append creates segment 0 (an ``open`` and a header ``pwrite``); the next sync job fsyncs it
and its directory and writes the state file. Until then ``prepare_sync`` has nothing to persist:
cursors over a log without messages have no position worth keeping (the metadata file, written
in the same sync rounds, lists the channels).

Deletion happens in ``prepare_sync``: the segments ``log_retention`` allows are retired (no
reader can reach them any more) and handed to the job, which unlinks them only after it has
persisted the cursors' marks past them; so a crash never leaves a mark pointing into a deleted
segment (as for a disk queue's consumed segments).

Everything here is plain blocking code without trio, like the disk queue: opening reads every
segment (a worker thread in the daemon); ``append_many``, reads and ``prepare_sync`` only hand
data to the OS; ``SyncJob.run`` fsyncs (a worker thread); ``close`` and ``delete`` block.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence
from operator import attrgetter
from types import MappingProxyType
from typing import Literal

from lmqd.message import Message
from lmqd.message_ext import MessageExt
from lmqd.storage.atrest.compression import Compression
from lmqd.storage.atrest.seal import PLAIN, AtRest
from lmqd.storage.errors import BackendError
from lmqd.storage.files import fsync_dir, fsync_path, log_state_filename, unlink_quietly
from lmqd.storage.log_cache import LOG_CACHE_BYTES, TailCache
from lmqd.storage.log_cursor import Cursor
from lmqd.storage.log_index import NO_TIMESTAMP, LogIndex, SegmentIndex
from lmqd.storage.log_reader import LogEntry, LogReader
from lmqd.storage.log_recovery import recover_log
from lmqd.storage.log_retention import deletable_segments
from lmqd.storage.log_state import LogState, encode_log_state, snapshot_log_state
from lmqd.storage.reader import DEFAULT_READ_AHEAD
from lmqd.storage.record import SEGMENT_HEADER_SIZE, log_record_types
from lmqd.storage.repair import Damage, DamageCounters
from lmqd.storage.segments import SegmentList
from lmqd.storage.sync import QueueFiles, SyncJob
from lmqd.storage.timebase import TimeBase
from lmqd.storage.writer import Placed, SegmentWriter
from lmqd.units import MiB

log = logging.getLogger("lmqd.storage")

_timestamp = attrgetter("timestamp")

StartAt = int | Literal["earliest", "latest"]
"""Where a new cursor starts: an offset, or the log's earliest offset or its end."""


class TopicLog(DamageCounters):
    """The segment log of one durable topic in ``data_path``; see the module docstring.

    Opening recovers it (blocking: it reads every segment). It raises ``OSError`` if the files
    cannot be read, created or repaired, never for damaged content. One ``TopicLog`` per topic
    and data directory; a topic's log uses the file names of the topic's disk queue (and adopts
    such a queue's segments, ``log_recovery.py``): open one or the other, never both.
    """

    def __init__(
        self,
        name: str,
        data_path: str | os.PathLike[str],
        *,
        timebase: TimeBase,
        max_bytes_per_file: int = 100 * MiB,
        retention_ms: int | None = None,
        retention_bytes: int | None = None,
        cache_bytes: int = LOG_CACHE_BYTES,
        read_ahead: int = DEFAULT_READ_AHEAD,
        fresh: bool = False,
        recover_ids: int = 0,
        at_rest: AtRest = PLAIN,
        compression: Compression | None = None,
    ) -> None:
        if max_bytes_per_file <= SEGMENT_HEADER_SIZE:
            raise ValueError("max_bytes_per_file too small")
        self.name = name
        self.timebase = timebase
        """Trio time <-> wall clock for stored deadlines (and retention judged on trio time)."""
        self.retention_ms = _non_negative("retention_ms", retention_ms)
        """Keep segments every cursor has passed while their newest message is younger than
        this (None: no time retention). May be changed at any time."""
        self.retention_bytes = _non_negative("retention_bytes", retention_bytes)
        """Keep such segments while they and the newer ones take at most this many bytes
        (None: no size retention). May be changed at any time."""
        self.keep_recent_ms: int | None = None
        """Keep segments every cursor has passed while their newest message is younger than
        this, whatever the retention says (None: no floor): a topic's dedup windows, which the
        next start rebuilds from the log (``take_recovered_ids``). May be changed at any time."""
        self.stored_message_ttls = False
        """Some message found on disk when the log opened has its own TTL (lmq's extension;
        ``ext_notes.py``): the topic's channels screen for it from the start."""
        self._recover_ids = recover_ids
        self._recovered_ids: list[tuple[int, bytes]] = []
        self._dir = os.fspath(data_path)
        self._files = QueueFiles(
            name, self._dir, os.path.join(self._dir, log_state_filename(name)), subject="TOPICLOG"
        )
        self._segments = SegmentList(name, self._dir)
        self._writer = SegmentWriter(
            name, self._segments, timebase, max_bytes_per_file, subject="TOPICLOG"
        )
        self._at_rest = at_rest
        self._compression = compression
        self._writer.set_sealer(at_rest.sealer(compression))
        self._damage = Damage()
        self._index = LogIndex(name, timebase, self._damage, read_ahead, at_rest.opener)
        self._cache = TailCache(cache_bytes)
        self._cursors: dict[str, Cursor] = {}
        self._legacy: dict[int, int] = {}
        self._adopted: int | None = None
        self._dirty = 0
        self._last_state: LogState | None = None
        self._closed = False
        self._unborn = False
        """A fresh log whose files are not created yet (until its first append)."""
        try:
            if fresh:
                self._start_fresh()
            else:
                self._open()
        except BaseException:
            self._close_fds()
            raise

    # -- the log ------------------------------------------------------------------------------

    @property
    def next_offset(self) -> int:
        """The offset the next message appended gets (the log's end)."""
        return self._index.next_offset

    @property
    def earliest_offset(self) -> int:
        """The smallest offset still on disk (a cursor or a read cannot start before it)."""
        return self._index.earliest_offset

    @property
    def segment_count(self) -> int:
        """Segment files the log reads (retired ones waiting for their unlink not counted)."""
        return len(self._index.segments)

    @property
    def index_entries(self) -> int:
        """Entries of the sparse offset and time index, over every segment (held in memory)."""
        return sum(len(seg.positions) for seg in self._index.segments)

    @property
    def bytes_on_disk(self) -> int:
        """Bytes of the log's segment files (a running sum, as a disk queue's)."""
        return self._segments.bytes_on_disk

    @property
    def logical_bytes(self) -> int:
        """What ``bytes_on_disk`` would be without compression at rest: the plain records'
        bytes (the compression ratio is this over ``bytes_on_disk``)."""
        return self._segments.bytes_on_disk + self._segments.saved_bytes

    @property
    def compression(self) -> Compression | None:
        """The compression new batches get (None: the daemon's default); set, it applies to the
        batches written from then on (the segments written so far keep theirs)."""
        return self._compression

    @compression.setter
    def compression(self, compression: Compression | None) -> None:
        self._compression = compression
        self._writer.set_sealer(self._at_rest.sealer(compression))

    @property
    def dirty_count(self) -> int:
        """Messages appended, settled, and cursor changes since the last ``prepare_sync``."""
        return self._dirty + sum(c.dirty for c in self._cursors.values())

    def needs_sync(self, sync_every: int) -> bool:
        """Whether ``--sync-every`` operations have accumulated since the last sync."""
        return self.dirty_count >= sync_every

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def rebuilt_state(self) -> bool:
        """True if the state file was missing or damaged: no cursor was restored."""
        return self._damage.rebuilt_positions

    @property
    def adopted_offset(self) -> int | None:
        """The offset up to which the topic's disk queue had read when the log adopted its
        segments (where its existing channels' cursors start); None if nothing was adopted."""
        return self._adopted

    def take_recovered_ids(self) -> list[tuple[int, bytes]]:
        """The newest dedup ids (at most ``recover_ids``) of the messages found on disk when
        the log opened, as (timestamp ns, dedup id) in offset order; handed over once (the
        next call returns none)."""
        ids, self._recovered_ids = self._recovered_ids, []
        return ids

    def append_many(
        self,
        messages: Sequence[Message],
        first_offset: int | None = None,
        *,
        cache: bool = True,
        timestamp: int | None = None,
        plain: bool = False,
    ) -> int:
        """Append ``messages`` in order; returns the offset of the first (the others follow).

        ``first_offset`` (at or after ``next_offset``) gives the first message a later offset
        than the next one: the offsets skipped are a gap, as damage leaves (a topic that kept
        messages in memory and never wrote the ones every channel had read). All or nothing:
        raises ``BackendError`` having stored none of them. The message objects are kept (the
        tail cache) and handed to cursors as they are: do not change them after. Without
        ``cache`` they are not kept (the cache is emptied instead, so that it stays
        contiguous): the caller keeps them (a topic's memory tail, whose readers may take them
        for their own) or no reader is near enough the end to read them from the cache, and
        they are freed as soon as the caller lets them go. ``timestamp``: every message has this
        one (a publish's), and ``plain``: none has an lmq extension -- what the caller knows, so
        that the index and the writer need not look at each message for it.
        """
        if self._closed:
            raise BackendError(f"TOPICLOG({self.name}): closed")
        listed = messages if isinstance(messages, list) else list(messages)
        index = self._index
        first = index.next_offset
        if first_offset is not None:
            if first_offset < first:
                raise ValueError(
                    f"TOPICLOG({self.name}): offset {first_offset} was given already "
                    f"(next is {first})"
                )
            first = first_offset
        if not listed:
            return first
        if self._unborn:
            self._create_files()
        placed = self._writer.write(listed, first, plain=plain)
        self._index_placed(placed, first, len(listed), listed, cache, timestamp)
        return first

    def append_plain(
        self,
        ids: Sequence[bytes],
        bodies: list[bytes],
        timestamp: int,
        first_offset: int,
        exts: Sequence[MessageExt | None] | None = None,
    ) -> None:
        """Append a publish from its columns (no deliver-after time, one timestamp; ``exts``:
        each body's extension, None for none) at ``first_offset``, without message objects:
        the tail cache is emptied (it holds objects; no reader is near enough the end to want
        them, the caller knows). As ``append_many`` otherwise."""
        if self._closed:
            raise BackendError(f"TOPICLOG({self.name}): closed")
        if first_offset < self._index.next_offset:
            raise ValueError(
                f"TOPICLOG({self.name}): offset {first_offset} was given already "
                f"(next is {self._index.next_offset})"
            )
        if not bodies:
            return
        if self._unborn:
            self._create_files()
        placed = self._writer.write_plain(ids, bodies, timestamp, first_offset, exts)
        self._index_placed(placed, first_offset, len(bodies), None, False, timestamp)

    def _index_placed(
        self,
        placed: list[Placed],
        first: int,
        whole: int,
        messages: list[Message] | None,
        cache: bool,
        timestamp: int | None,
    ) -> None:
        """Index the records a write placed (each one's newest timestamp: ``timestamp``, else
        its ``messages``'); with ``cache``, keep them in the tail cache as those objects, else
        empty the cache (so that it stays contiguous)."""
        index = self._index
        segs = index.segments
        live = self._segments.live
        tail_cache = self._cache
        if not cache and len(tail_cache):
            tail_cache.clear()
        for number, pos, batches, stored in placed:
            seg = segs[-1]
            if seg.number != number:  # the writer rolled to a new segment
                seg = SegmentIndex(
                    live[len(segs)], first + batches[0][0], seg.max_ns, _types(self._segments)
                )
                segs.append(seg)
            for (b_first, b_end, _), size in zip(batches, stored, strict=True):
                end = pos + size
                chunk: list[Message] = []
                if messages is not None and (cache or timestamp is None):
                    chunk = messages if b_end - b_first == whole else messages[b_first:b_end]
                top = timestamp if timestamp is not None else max(map(_timestamp, chunk))
                seg.add_record(pos, first + b_first, b_end - b_first, top)
                if cache:
                    tail_cache.add(seg, pos, end, first + b_first, chunk)
                pos = end
        index.next_offset = first + whole
        self._dirty += whole

    def advance_to(self, offset: int) -> None:
        """Make ``offset`` the next offset without writing anything (the offsets skipped are a
        gap): a topic whose last messages were read from memory and never written keeps its
        offsets increasing across a restart. Persisted by the next sync; an offset below the
        next one is ignored."""
        if offset > self._index.next_offset and not self._closed:
            self._index.next_offset = offset
            self._dirty += 1

    @property
    def write_segment_base(self) -> int:
        """The base offset of the segment being written: every offset below it is in an older
        segment, which only the cursors' low-water marks (and retention) keep on disk."""
        return self._index.segments[-1].base if self._index.segments else self.next_offset

    def offset_for_time(self, ts_ns: int) -> int:
        """The offset of the first message whose timestamp (ns since the epoch) is at or after
        ``ts_ns``; the log's end if there is none. Binary searches over the index, then a read
        of at most one index span: milliseconds however large the log."""
        if self._closed:
            return self._index.next_offset
        reader = LogReader(self._index, self._cache, self._index.earliest_offset)
        try:
            return reader.find_time(ts_ns)
        finally:
            reader.close()

    def read_range(
        self, start_offset: int, max_count: int | None = None, *, end_offset: int | None = None
    ) -> list[LogEntry]:
        """The messages from ``start_offset`` on (or from the earliest offset on disk, if that
        is later), up to ``max_count`` of them and/or below ``end_offset``, as (offset, message)
        pairs in offset order. Consumes nothing and needs no cursor: for tools (the Spark
        source, replay). Offsets lost to damage are simply absent. The messages may be shared
        with cursors: treat them as read-only."""
        if max_count is None and end_offset is None:
            raise ValueError("read_range needs max_count or end_offset")
        if self._closed:
            return []
        limit = max_count if max_count is not None else self._index.next_offset
        reader = LogReader(self._index, self._cache, start_offset)
        try:
            return reader.read_many(limit, end_offset)
        finally:
            reader.close()

    def pushed_offsets(self, start_offset: int, end_offset: int) -> list[int]:
        """The offsets in ``[start_offset, end_offset)`` of messages stored with a deliver-after
        time (DPUB) or an lmq priority, in order: those a topic's pump pushes to its channels.
        Reads the records' entries and option blocks only (no message is made): a topic finds
        them in a backlog an earlier run left at this cost."""
        if self._closed or start_offset >= end_offset:
            return []
        reader = LogReader(self._index, self._cache, start_offset)
        try:
            return reader.pushed_offsets(end_offset)
        finally:
            reader.close()

    def open_reader(self, offset: int) -> LogReader:
        """A reader for a tool that reads on from ``offset`` in several calls
        (``LogReader.read_many``): it keeps its place and the rest of a decoded batch between
        calls, where each ``read_range`` finds its start again. It consumes nothing and holds
        no claim on the log: if the segments under it are deleted, it goes on from the earliest
        offset left. Drop it (or ``close`` it) when done."""
        return LogReader(self._index, self._cache, offset)

    # -- cursors ------------------------------------------------------------------------------

    @property
    def cursors(self) -> Mapping[str, Cursor]:
        """The log's cursors by name (read-only view)."""
        return MappingProxyType(self._cursors)

    def cursor(self, name: str) -> Cursor | None:
        """The cursor ``name`` (created earlier, or restored when the log opened), if any."""
        return self._cursors.get(name)

    def create_cursor(self, name: str, at: StartAt = "latest") -> Cursor:
        """A new cursor ``name`` starting at ``at``: ``"earliest"`` (every message on disk),
        ``"latest"`` (only messages appended from now on) or an offset (clamped to those two;
        ``offset_for_time`` gives the offset for a time). Raises ``ValueError`` if it exists.
        Persisted by the next sync."""
        if name in self._cursors:
            raise ValueError(f"TOPICLOG({self.name}): cursor {name!r} exists")
        if at == "earliest":
            offset = self._index.earliest_offset
        elif at == "latest":
            offset = self._index.next_offset
        else:
            offset = at
        cursor = Cursor(name, self._index, self._cache, offset)
        self._cursors[name] = cursor
        self._dirty += 1
        return cursor

    def delete_cursor(self, name: str) -> bool:
        """Forget cursor ``name`` (it reads nothing any more); False if there is none. The
        segments only it kept are deleted by a later sync."""
        cursor = self._cursors.pop(name, None)
        if cursor is None:
            return False
        cursor.deleted = True
        cursor.close()
        self._dirty += 1
        return True

    # -- sync, close, delete ------------------------------------------------------------------

    def prepare_sync(self, now_ns: int | None = None) -> SyncJob | None:
        """Retire what may be deleted (``log_retention``; ``now_ns``: wall-clock ns, by
        default now), then snapshot what a sync must make durable; None if nothing changed.

        Non-blocking (event-loop thread): the job duplicates the descriptors it fsyncs, and
        unlinks the retired segments only after persisting the cursors' marks past them.
        """
        if self._closed:
            return None
        if self._unborn:
            self._dirty = 0
            for cursor in self._cursors.values():
                cursor.dirty = 0
            return None
        self._retire(time.time_ns() if now_ns is None else now_ns)
        fds = self._writer.take_sync_fds()
        state = self._state()
        unlink = self._segments.release_consumed(self._segments.live[0].number)
        dirty = self.dirty_count
        self._dirty = 0
        for cursor in self._cursors.values():
            cursor.dirty = 0
        # The last job's state not persisted (a full disk): write it again even if unchanged.
        persisted = self._files.persisted_seq >= self._files.last_seq
        if not fds and not unlink and state == self._last_state and persisted:
            return None
        self._last_state = state
        return SyncJob(
            self._files,
            self._files.next_seq(),
            fds,
            encode_log_state(self.name, state),
            unlink,
            dirty,
        )

    def sync(self, now_ns: int | None = None) -> None:
        """Blocking sync in the calling thread (tests, close); raises ``OSError``."""
        job = self.prepare_sync(now_ns)
        if job is not None:
            job.run()

    def close(self) -> None:
        """Sync (blocking) and release the files; messages and cursors stay for the next start
        (each cursor resumes at its low-water mark)."""
        if self._closed:
            return
        try:
            self.sync()
        except OSError as exc:
            # A full or failing disk (logged without a traceback: an operator's problem, not a
            # bug). The segments keep what was written; the state file stays as it was and
            # recovery does not trust it over the segments.
            log.error("TOPICLOG(%s): sync on close failed: %s", self.name, exc)
        self._close_fds()
        self._cache.clear()
        self._closed = True

    def delete(self) -> None:
        """Drop everything and remove the log's files (set-aside ``.bad`` copies stay)."""
        with self._files.lock:
            self._files.deleted = True
        self._close_fds()
        if not self._unborn:
            for path in self._segments.paths():
                unlink_quietly(path, log)
            unlink_quietly(self._files.positions, log)
            unlink_quietly(self._files.positions + ".tmp", log)
            try:
                fsync_dir(self._dir)
            except OSError:
                log.warning("TOPICLOG(%s): fsync of %s failed", self.name, self._dir, exc_info=True)
        self._segments.clear()
        self._index.segments.clear()
        self._cache.clear()
        for cursor in self._cursors.values():
            cursor.deleted = True
        self._cursors.clear()
        self._closed = True

    # -- internals ----------------------------------------------------------------------------

    def retire_due(self, now_ns: int | None = None) -> bool:
        """Whether time alone (no write, no cursor move) has made segments deletable
        (``log_retention``: time retention or the dedup floor let one go at ``now_ns``, wall
        clock ns, by default now): the syncer then syncs the log at its tick although nothing
        is dirty, so an idle topic does not keep everything until its next write."""
        if self._closed or self._unborn:
            return False
        if self.retention_ms is None and self.keep_recent_ms is None:
            return False
        return self._deletable(time.time_ns() if now_ns is None else now_ns) > 0

    def _deletable(self, now_ns: int) -> int:
        return deletable_segments(
            self._index.segments,
            [c.low for c in self._cursors.values()],
            now_ns=now_ns,
            retention_ms=self.retention_ms,
            retention_bytes=self.retention_bytes,
            keep_recent_ms=self.keep_recent_ms,
        )

    def _retire(self, now_ns: int) -> None:
        """Take the segments that may be deleted out of reach; the next job unlinks them. When
        the write segment expired too, a new empty one at the log's end takes its place."""
        segs = self._index.segments
        count = self._deletable(now_ns)
        if count == len(segs) and not self._roll_empty():
            count -= 1  # no new segment (a full disk): the write segment stays for now
        if not count:
            return
        for seg in segs[:count]:
            seg.close_fd()
            self._segments.retire_first()
            self._legacy.pop(seg.number, None)
            log.debug("TOPICLOG(%s): deleting segment %d", self.name, seg.number)
        del segs[:count]
        self._cache.drop_segments_before(segs[0].number)

    def _state(self) -> LogState:
        return snapshot_log_state(
            self._index.next_offset, self._segments.live[-1], self._cursors, self._legacy,
            self._adopted,
        )  # fmt: skip

    def _close_fds(self) -> None:
        for cursor in self._cursors.values():
            cursor.close()
        self._index.close()
        self._writer.close()

    def _start_fresh(self) -> None:
        """A new, empty log in memory: segment 0 is known but not created (``_create_files``)."""
        segments = self._segments
        file = segments.entry(0)
        segments.live.append(file)  # not in bytes_on_disk: there is no file yet
        segments.next_number = 1
        self._index.segments.append(SegmentIndex(file, 0, NO_TIMESTAMP, _types(self._segments)))
        self._unborn = True

    def _roll_empty(self) -> bool:
        """Start a new, empty write segment at the log's end, so that time retention can
        delete the one being written (its messages expired); False if it cannot be created."""
        segments = self._segments
        number = segments.next_number
        index = self._index
        try:
            fd = segments.create(number, index.next_offset)
        except OSError as exc:
            log.error("TOPICLOG(%s): cannot start a new segment: %s", self.name, exc)
            return False
        self._writer.roll_to(fd, segments.entry(number))
        prev = index.segments[-1]
        index.segments.append(
            SegmentIndex(segments.live[-1], index.next_offset, prev.max_ns, _types(self._segments))
        )
        log.debug("TOPICLOG(%s): segment %d expired: new segment %d", self.name, prev.number,
                  number)  # fmt: skip
        return True

    def _create_files(self) -> None:
        """A fresh log's first append: create segment 0; the next sync job fsyncs it (and the
        directory) and writes the state file. Raises ``BackendError`` if it cannot."""
        segments = self._segments
        file = segments.live[0]
        try:
            os.makedirs(self._dir, exist_ok=True)
            fd = segments.create(file.number, self._index.segments[0].base)
        except OSError as exc:
            log.error("TOPICLOG(%s): cannot create %s: %s", self.name, file.path, exc)
            raise BackendError(f"TOPICLOG({self.name}): write failed: {exc}") from exc
        self._writer.start(fd)
        self._writer.dirty = True  # the new file and its directory entry: the next sync
        segments.bytes_on_disk += file.end
        self._unborn = False

    def _open(self) -> None:
        os.makedirs(self._dir, exist_ok=True)
        keep, opener, sealed = self._recover_ids, self._at_rest.opener, self._segments.sealed
        r = recover_log(self._dir, self.name, keep_ids=keep, opener=opener, sealed=sealed)
        damage = self._damage
        damage.add(r.damage)
        self.stored_message_ttls = r.notes.message_ttls
        self._recovered_ids = list(r.notes.dedup_ids)
        segments = self._segments
        index = self._index
        for seg in r.segments:
            segments.live.append(seg.file)
            index.segments.append(seg)
        segments.next_number = r.next_number
        index.next_offset = r.next_offset
        if r.appendable:
            self._writer.start(os.open(segments.live[-1].path, os.O_RDWR))
        else:
            number = segments.next_number
            fd = segments.create(number, r.next_offset)
            self._writer.start(fd)
            file = segments.entry(number)
            segments.live.append(file)
            segments.next_number = number + 1
            max_ns = index.segments[-1].max_ns if index.segments else NO_TIMESTAMP
            index.segments.append(SegmentIndex(file, r.next_offset, max_ns, _types(self._segments)))
        segments.bytes_on_disk = sum(seg.end for seg in segments.live)
        segments.saved_bytes = sum(seg.saved for seg in segments.live)
        self._legacy = r.legacy
        self._adopted = r.adopted
        for name, low in r.cursors.items():
            cursor = self._cursors[name] = Cursor(name, index, self._cache, low)
            cursor.read_before = max(min(r.read.get(name, low), index.next_offset), low)
            cursor.skips = r.skips.get(name, [])
        # What recovery found may have been in the OS only (a kill -9 before a sync): make it
        # durable before a state file says so, then persist that state at once, so a crash now
        # neither redoes the repairs nor takes the records found for corruption.
        synced = r.state.write_segment if r.state is not None else -1
        for file in segments.live:
            if file.number >= synced and file.end > SEGMENT_HEADER_SIZE:
                fsync_path(file.path)
        self._last_state = self._state()
        self._files.persist_now(encode_log_state(self.name, self._last_state))
        if r.next_offset or damage.corrupt_count or damage.rebuilt_positions:
            log.info(
                "TOPICLOG(%s): opened: offsets %d..%d, %d cursor(s)",
                self.name,
                index.earliest_offset,
                r.next_offset,
                len(self._cursors),
            )


def _types(segments: SegmentList) -> tuple[int, ...]:
    """The record types of a segment the log creates now (sealed or not)."""
    return log_record_types(segments.sealed)


def _non_negative(what: str, value: int | None) -> int | None:
    if value is not None and value < 0:
        raise ValueError(f"{what} must be >= 0")
    return value

"""DiskQueue: the segment-log backend queue of one durable topic or channel.

Theory of operation
-------------------
A queue is a sequence of segment files ``<stem>.lmq.<number>.dat`` (``files.queue_stem``) in the
data directory, each a header and records (``record.py``). ``DiskQueue`` is the public face; the
work is done by parts of one purpose each, which it composes and keeps consistent:

* ``segments.py``: which segment files exist, live (unread messages) or retired (read, waiting
  for a durable read position past them before they are unlinked); ``bytes_on_disk``.
* ``writer.py``: ``put_many``'s side. Messages become batch records (``encoder.py``), written with
  one ``pwrite`` per segment touched, rolling to new segments; a call is stored whole or not at
  all (``BackendError``), and the positions never move over a partial write.
* ``reader.py``: ``read_many``'s side. Read-ahead, CRC checked again, decoding (``decoder.py``),
  a partly returned record kept pending, damage found while reading set aside (``repair.py``).
* ``write_cache.py``: while the reader keeps up, the records just written are kept as the
  message objects given, and read back from there instead of from the files.
* ``acks.py``: acknowledgement mode (``ack_mode=True``): ``read_many`` returns ``StoredMessage``
  objects carrying a ``token`` (``tokens.py``); the persisted read position is the position of
  the oldest message not yet ``ack``-ed, so after a crash everything not acknowledged is read
  again (at-least-once), along with any acknowledged messages that followed it. Where the
  reader had got to is persisted too (``delivered``): a message read again below it was handed
  out before the crash, and counts that delivery in its ``attempts`` (``reads_are_deliveries``:
  a queue its owner reads ahead of delivering, all at once, says so and is not counted).

Positions (``<stem>.lmq.pos.json``, ``positions.py``) are persisted only by sync jobs
(``prepare_sync`` in the event-loop thread, ``SyncJob.run`` in a worker thread, ``sync.py``)
and by ``close``/``empty``. The read position persisted is a record's offset plus the index of
the next message in it, so a close and reopen resumes exactly there. A segment the reader has
left is unlinked by the sync job that persists a read position past it, never before, so a
crash cannot leave a positions file pointing into a deleted segment.

Opening a queue recovers it (``recovery.py``): every segment from the persisted read position on
is verified; consumed segments left behind by a crash are removed; a damaged or missing
positions file is rebuilt from the segments (reading restarts at the oldest record still on
disk).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping, Sequence

from lmqd.message import Message
from lmqd.storage.acks import AckTracker
from lmqd.storage.atrest.seal import PLAIN, AtRest
from lmqd.storage.errors import BackendError
from lmqd.storage.files import fsync_dir, positions_filename, unlink_quietly
from lmqd.storage.peek import peek_queue, stored_offsets
from lmqd.storage.positions import Positions, encode_positions
from lmqd.storage.reader import DEFAULT_READ_AHEAD, SegmentReader
from lmqd.storage.record import SEGMENT_HEADER_SIZE
from lmqd.storage.recovery import recover_queue
from lmqd.storage.repair import Damage, DamageCounters
from lmqd.storage.segments import Segment, SegmentList
from lmqd.storage.sync import QueueFiles, SyncJob
from lmqd.storage.timebase import TimeBase
from lmqd.storage.tokens import StoredMessage, record_token
from lmqd.storage.write_cache import WRITE_CACHE_BYTES, WriteCache
from lmqd.storage.writer import SegmentWriter
from lmqd.units import MiB

log = logging.getLogger("lmqd.storage")


class DiskQueue(DamageCounters):
    """A ``lmqd.engine.backend.BackendQueue`` stored in segment files under ``data_path``.

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
        at_rest: AtRest = PLAIN,
    ) -> None:
        if max_bytes_per_file <= SEGMENT_HEADER_SIZE:
            raise ValueError("max_bytes_per_file too small")
        self.name = name
        self._at_rest = at_rest
        self._dir = os.fspath(data_path)
        self._ack_mode = ack_mode
        self._files = QueueFiles(name, self._dir, os.path.join(self._dir, positions_filename(name)))
        self._segments = SegmentList(name, self._dir)
        self._writer = SegmentWriter(name, self._segments, timebase, max_bytes_per_file)
        self._writer.set_sealer(at_rest.sealer())
        self._cache = WriteCache(write_cache, enabled=not ack_mode)
        self._acks = AckTracker()
        self._damage = Damage()
        self._reader = SegmentReader(
            name,
            self._segments,
            writer=self._writer,
            cache=self._cache,
            acks=self._acks,
            damage=self._damage,
            timebase=timebase,
            ack_mode=ack_mode,
            read_ahead=read_ahead,
            opener=at_rest.opener,
        )
        self._timebase = timebase
        self._dirty = 0
        self._last_positions: Positions | None = None
        self._delivered: tuple[int, int, int] | None = None
        """Acknowledgement mode: the reader's position persisted before this opening, while
        the reader has not passed it again (``read_many`` counts the messages below it)."""
        self._delivered_token = -1
        """``_delivered`` as a token (-1: none), compared with each message read."""
        self.reads_are_deliveries = ack_mode
        """Acknowledgement mode: each message read is delivered (a channel's own store); False
        for a queue read ahead whole (a deferred store), whose position says nothing."""
        self.noted_offsets: Mapping[bytes, int] = {}
        """Topic offsets by id of messages written here without one (``Message.offset`` -1: a
        message read back from a channel's store), written with them all the same
        (``record.FLAG_OFFSET``): the channel's notes (``lmqd.engine.holds``)."""
        self._closed = False
        self.stored_message_ttls = False
        """Some message found on disk when the queue opened has its own TTL (lmq's extension;
        ``ext_notes.py``): its channel screens for it from the start."""
        try:
            self._open()
        except BaseException:
            self._close_fds()
            raise

    # -- public interface ---------------------------------------------------------------------

    @property
    def depth(self) -> int:
        """Messages stored and not yet read."""
        return self._reader.depth

    @property
    def bytes_on_disk(self) -> int:
        """Bytes of this queue's segment files (headers and records up to each segment's end).

        Kept as a running sum (writes add, unlinks subtract), so reading it costs no system call.
        A segment stops counting once a sync job is given it to unlink; the small positions file
        and set-aside ``.bad`` copies are not counted.
        """
        return self._segments.bytes_on_disk

    @property
    def logical_bytes(self) -> int:
        """What ``bytes_on_disk`` would be without compression at rest (``TopicLog``'s)."""
        return self._segments.bytes_on_disk + self._segments.saved_bytes

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
        return len(self._acks)

    @property
    def ack_mode(self) -> bool:
        return self._ack_mode

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def rebuilt_positions(self) -> bool:
        """True if the positions file was missing or damaged and was rebuilt from the segments."""
        return self._damage.rebuilt_positions

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
        placed = self._writer.write(messages, noted=self.noted_offsets)
        reader = self._reader
        cache = self._cache
        if not cache.open and reader.depth == 0 and reader.pending is None:
            cache.reader_caught_up()
        if cache.open:
            cache.remember(messages, placed)
        reader.depth += len(messages)
        self._dirty += len(messages)

    def read_many(self, max_count: int) -> list[Message]:
        """Remove and return up to ``max_count`` of the oldest messages.

        In acknowledgement mode they are ``StoredMessage`` objects to ``ack`` by token.
        """
        if self._closed or max_count <= 0:
            return []
        out = self._reader.read_many(max_count)
        self._dirty += len(out)
        if self._delivered_token >= 0 and out:
            self._count_redeliveries(out)
        return out

    def _count_redeliveries(self, out: list[Message]) -> None:
        """After a crash: the messages read again below the reader's persisted position were
        delivered before it (once more than their stored ``attempts`` say)."""
        before = self._delivered_token
        counting = self.reads_are_deliveries
        for m in out:
            if not isinstance(m, StoredMessage) or m.token >= before or not counting:
                self._delivered = None
                self._delivered_token = -1
                return
            m.attempts += 1

    def peek(self, max_count: int) -> list[Message]:
        """Up to ``max_count`` of the messages ``read_many`` would return next, read from the
        files without consuming or changing anything (``peek.py``); raises ``OSError``."""
        if self._closed or max_count <= 0:
            return []
        return peek_queue(
            list(self._segments.live),
            self._reader.position(),
            max_count,
            self._timebase.from_wall_ns,
            self._at_rest.opener,
        )

    def stored_offsets(self, *, read_too: bool = False) -> tuple[dict[bytes, int], int]:
        """The topic offsets of the messages ``read_many`` has still to return that carry one
        (``record.FLAG_OFFSET``), by id, and how many carry none: a read of the rest of the
        files (``peek.py``); ``read_too``: of every message still in the files, those already
        read too (done or not: acknowledgement mode keeps the unacknowledged ones there).
        Raises ``OSError``."""
        if self._closed:
            return {}, 0
        segments = self._segments
        opener = self._at_rest.opener
        if not read_too:
            return stored_offsets(list(segments.live), self._reader.position(), opener)
        files = [*segments.retired, *segments.live]
        return stored_offsets(files, (files[0].number, 0, 0), opener) if files else ({}, 0)

    def ack(self, token: int) -> bool:
        """Acknowledgement mode: mark a read message done; False if the token is unknown."""
        if not self._acks.ack(token):
            return False
        self._dirty += 1
        return True

    def ack_many(self, tokens: Iterable[int]) -> int:
        """Acknowledge many messages; returns how many tokens were known (each counted once)."""
        known = self._acks.ack_many(tokens)
        self._dirty += known
        return known

    def ack_messages(self, messages: Sequence[Message]) -> int:
        """``ack_many`` for the messages this queue returned (``StoredMessage``); others, which
        carry no token, are ignored."""
        return self.ack_many([m.token for m in messages if isinstance(m, StoredMessage)])

    @property
    def stored(self) -> DiskQueue:
        """This queue is stored on disk (the engine's ``BackendQueue.stored``)."""
        return self

    def prepare_sync(self) -> SyncJob | None:
        """Snapshot what a sync must make durable; ``None`` if nothing changed since the last one.

        Non-blocking (event-loop thread): the job duplicates the descriptors it will fsync, so
        the queue may go on writing, rolling, even closing, while the job runs in a thread.
        """
        if self._closed:
            return None
        fds = self._writer.take_sync_fds()
        positions = self._positions()
        unlink = self._segments.release_consumed(positions.read_segment)
        # The last job's positions not persisted (a full disk): write them again if unchanged.
        persisted = self._files.persisted_seq >= self._files.last_seq
        if not fds and not unlink and positions == self._last_positions and persisted:
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
        segments = self._segments
        number = segments.next_number
        try:
            fd = segments.create(number)
        except OSError as exc:
            raise BackendError(f"DISKQUEUE({self.name}): empty failed: {exc}") from exc
        positions = Positions(number, SEGMENT_HEADER_SIZE, number, SEGMENT_HEADER_SIZE, 0)
        try:
            self._files.persist_now(encode_positions(self.name, positions))
        except OSError as exc:
            os.close(fd)
            _unlink_quietly(segments.path(number))
            raise BackendError(f"DISKQUEUE({self.name}): empty failed: {exc}") from exc
        old = segments.paths()
        self._close_fds()
        for path in old:
            _unlink_quietly(path)
        segments.restart(segments.entry(number))
        self._writer.start(fd)
        self._reader.reset(SEGMENT_HEADER_SIZE, 0)
        self._cache.drop()
        self._reader.depth = 0
        self._dirty = 0
        self._acks.clear()
        self._delivered = None
        self._delivered_token = -1
        self._last_positions = positions

    def delete(self) -> None:
        """Drop everything and remove the queue's files (set-aside ``.bad`` copies stay)."""
        with self._files.lock:
            self._files.deleted = True
        self._close_fds()
        for path in self._segments.paths():
            _unlink_quietly(path)
        _unlink_quietly(self._files.positions)
        _unlink_quietly(self._files.positions + ".tmp")
        try:
            fsync_dir(self._dir)
        except OSError:
            log.warning("DISKQUEUE(%s): fsync of %s failed", self.name, self._dir, exc_info=True)
        self._segments.clear()
        self._cache.drop()
        self._reader.depth = 0
        self._closed = True

    def close(self) -> None:
        """Sync (blocking) and release the files; the messages stay for the next start.

        In acknowledgement mode the unacknowledged messages are read again after reopening.
        """
        if self._closed:
            return
        try:
            self.sync()
        except OSError as exc:
            # A full or failing disk: no traceback (not a bug). The positions file stays as it
            # was; recovery does not trust it over the segments.
            log.error("DISKQUEUE(%s): sync on close failed: %s", self.name, exc)
        self._close_fds()
        self._cache.drop()
        self._closed = True

    # -- internals ----------------------------------------------------------------------------

    def _positions(self) -> Positions:
        """The positions to persist now: in acknowledgement mode, the oldest message not yet
        acknowledged is where reading resumes after a restart (the reader's position if none)."""
        write = self._segments.live[-1]
        read = self._acks.oldest_position() or self._reader.position()
        delivered = None
        if self._ack_mode and self.reads_are_deliveries:
            reached = max(self._reader.position(), self._delivered or read)
            delivered = reached if reached > read else None
        return Positions(
            read[0],
            read[1],
            write.number,
            write.end,
            self._reader.depth + len(self._acks.order),
            read[2],
            delivered,
        )

    def _close_fds(self) -> None:
        self._reader.close()
        self._writer.close()

    def _open(self) -> None:
        os.makedirs(self._dir, exist_ok=True)
        state = recover_queue(
            self._dir, self.name, opener=self._at_rest.opener, sealed=self._segments.sealed
        )
        self._damage.corrupt_count = state.corrupt_count
        self._damage.corrupt_bytes = state.corrupt_bytes
        self._damage.torn_bytes = state.torn_bytes
        self._damage.missing_segments = state.missing_segments
        self._damage.rebuilt_positions = state.rebuilt_positions
        self._damage.lost_messages = state.lost_messages
        self._damage.rebuilt_count = 1 if state.rebuilt_positions else 0
        self.stored_message_ttls = state.message_ttls
        segments = self._segments
        for r in state.segments:
            segments.live.append(Segment(r.number, r.path, r.end, r.skips, r.records, r.saved))
        self._reader.reset(state.read_offset, state.read_consumed, state.read_index)
        self._reader.depth = state.depth
        delivered = state.positions.delivered if state.positions is not None else None
        if self._ack_mode and delivered is not None:
            self._delivered = delivered
            self._delivered_token = record_token(delivered[0], delivered[1]) + delivered[2]
        segments.next_number = state.next_number
        if state.appendable:
            self._writer.start(os.open(state.segments[-1].path, os.O_RDWR))
        else:
            number = segments.next_number
            self._writer.start(segments.create(number))
            segments.live.append(segments.entry(number))
            segments.next_number = number + 1
        segments.bytes_on_disk = sum(seg.end for seg in segments.live)
        segments.saved_bytes = sum(seg.saved for seg in segments.live)
        # Persist what recovery found at once, so a crash now does not redo the repairs.
        self._last_positions = self._positions()
        self._files.persist_now(encode_positions(self.name, self._last_positions))
        if self._reader.depth or self._damage.corrupt_count or self._damage.rebuilt_positions:
            log.info("DISKQUEUE(%s): opened with depth %d", self.name, self._reader.depth)


def _unlink_quietly(path: str) -> None:
    unlink_quietly(path, log)

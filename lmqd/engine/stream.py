"""TopicStream: a topic's messages by offset, in memory and in its log, stored once.

Theory of operation
-------------------
Every message a topic takes gets the topic's next **offset**. The messages from ``tail.start``
to ``tail.end`` are in its memory tail (``tail.py``), the others in its ``TopicLog``
(``lmqd.storage.log``); either way there is one copy of each message, whatever the number of
channels. Each channel reads the stream through its own cursor (``cursor.py``), in offset order.

``pumped`` splits the stream in two: the messages below it were handed to the channels (they
may read them), the ones from it on are still the topic's (``depth``). The topic's pump moves it
forward when the topic is not paused and has channels (nsqd's messagePump), so a topic without
channels keeps its backlog and its first channel reads it; a channel created later starts at
``pumped`` (nsqd: it sees only what the topic hands on from then on). ``pumped`` is kept in
the log as the cursor ``#topic`` (not a valid channel name), so it survives restarts, and it
keeps the log's segments from being deleted before they are pumped.

Where messages go (``append``):

* **Memory first** (nsqd's ``--mem-queue-size``, once per topic): the tail takes new messages
  while it holds fewer than ``limit``. A message every channel has read leaves the tail from the
  front (``trim``) without ever being written: the log has gaps there (offsets are never reused;
  storage handles gaps as it handles damage).
* **Past the bound**: when the tail would grow past ``limit``, its oldest messages go to the
  log (a burst: the channels read them back soon, from the log's tail cache).
* **Overflow** (a backlog; nsqd: a full memory queue sends new messages to the disk queue):
  once the tail has turned over (as many messages left it for the log as it holds) since it was
  last empty, a full tail keeps what it holds -- the oldest, which the channels read first --
  and the messages past its bound go to the log, after it, as does everything published until
  every channel has read the tail; then the tail, empty, starts again at the end. So under a
  backlog each message is written once as it arrives, while it is fresh in the CPU's caches,
  and freed at once, instead of waiting in memory for ``limit`` newer ones before being written
  (docs/benchmarks.md, "The speed back"). The log's offsets must grow, so when the tail
  overflows it is written too (once, as it is: it stays in memory for its readers), and the
  tail's messages at or after ``log.next_offset`` are the only ones not on disk
  (``_unwritten``). At shutdown those go to the log (``close``), as much of them as a full disk
  takes (``salvage.py``).
* **Write-through** (``--durable``, ``--mem-queue-size=0``, or a retention policy, which needs
  every message on disk): every message is appended at once and the tail stays empty; channels
  that keep up read the log's tail cache, the same objects, without decoding.
* **No log** (ephemeral topics): the tail holds what the pump has not handed on yet, up to
  ``limit``; past that new messages are dropped and counted (nsqd's dummy backend).

What the log appends after an overflowing tail, or in write-through, stays in its tail cache
(as the objects given) only while some reader is near its end (``_cache_wanted``): a backlog
that no channel is about to read is not held in memory a second time, and its messages are
freed as soon as they are written.

**Pushed messages**: deferred ones (DPUB) and those with an lmq priority are in the stream like
the others, but channels do not read them in order: the pump pushes each one, as it pumps it,
into every channel (its deferred queue; its priority lanes, ``lanes.py``), and the cursors step
over them. So a priority message overtakes every backlog, on disk or not, as soon as the topic
hands it on. ``pushed`` lists their offsets (those published in this run; the pump finds the
ones a previous run left in the log by reading the records' entries and option blocks,
``TopicLog.pushed_offsets``). A durable channel's copy must be fsynced before ``#topic`` may
pass the message (``pin``), or a crash could lose it for that channel.

**Syncing.** The stream is what the syncer syncs for the topic (``Syncable``): ``prepare_sync``
first moves every cursor kept in the log to where its channel really is (a channel reading from
memory does not move its log cursor; see ``cursor.py``), then hands over the log's sync job.
"""

from __future__ import annotations

import logging
from bisect import bisect_left, insort
from collections.abc import Callable, Sequence
from operator import attrgetter, itemgetter
from typing import Protocol

from lmqd.engine.bytemarks import ByteMarks
from lmqd.engine.salvage import Salvage
from lmqd.engine.tail import MemoryTail
from lmqd.message import Message
from lmqd.message_ext import MessageExt
from lmqd.storage import SyncJob, TopicLog

__all__ = ["TOPIC_CURSOR", "StreamCursor", "TopicStream"]

log = logging.getLogger("lmqd.topic")

TOPIC_CURSOR = "#topic"
"""The log cursor holding the topic's ``pumped`` offset (``#`` is in no valid channel name)."""

CACHE_REACH = 4096
"""A channel whose read position is at most this many messages behind the stream's end reads
what the log appends next from the log's tail cache (1 MiB: ~7,500 messages of 100 bytes), so
the log keeps the messages it appends as objects while one is (``_cache_wanted``)."""

_message = itemgetter(1)
_body = attrgetter("body")

READ_CHUNK = 256
"""Messages ``read_entries`` takes from the log per step while it watches its byte budget: a
step of 100-byte messages is one read-ahead of the log's reader."""


def _take_within(
    out: list[tuple[int, Message]], got: list[tuple[int, Message]], budget: int
) -> int:
    """Append ``got`` to ``out`` while the bodies fit ``budget`` bytes (-1: no limit; the first
    message always goes); returns the budget left (0: full)."""
    if budget < 0:
        out.extend(got)
        return budget
    total = sum(map(len, map(_body, map(_message, got))))  # C loops: no bytecode per message
    if total < budget:
        out.extend(got)
        return budget - total
    for entry in got:
        size = len(entry[1].body)
        if out and size > budget:
            return 0
        out.append(entry)
        budget = max(budget - size, 0)
        if budget == 0:
            return 0
    return budget


class StreamCursor(Protocol):
    """What the stream needs of its channels' cursors (``cursor.ChannelCursor``)."""

    @property
    def position(self) -> int:
        """The offset the channel reads next."""
        ...

    def skip(self, start: int, end: int) -> None:
        """The topic dropped ``[start, end)``."""
        ...

    def sync_log_cursor(self) -> None:
        """Move the cursor kept in the log to the channel's position."""
        ...


class TopicStream:
    """One topic's messages by offset: memory tail and log; see the module docstring."""

    def __init__(
        self,
        name: str,
        *,
        log: TopicLog | None,
        limit: int,
        write_through: bool = False,
        drop_overflow: bool = False,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.name = name
        self.log = log
        self._clock = clock
        """``trio.current_time``: the time retention is judged by (through the log's time
        base, so tests on a virtual clock see exact times); None: the wall clock."""
        self.limit = limit
        """Messages the tail may hold (``--mem-queue-size``)."""
        self.write_through = log is not None and (write_through or limit == 0)
        self.drop_overflow = drop_overflow and log is None
        start = log.next_offset if log is not None else 0
        self.next_offset = start
        """The offset the next message gets."""
        self.known_from = start
        """Offsets from here on were taken in this run (their pushed ones are in ``pushed``);
        older ones came from the log as an earlier run left it."""
        self.byte_marks = ByteMarks(start)
        """Body bytes taken from ``known_from`` on, by offset (``bytemarks.py``): a bound on
        the bytes of a range a cursor read, without summing its bodies."""
        self.tail = MemoryTail(start)
        self.cursors: list[StreamCursor] = []
        """The channels' cursors (``cursor.py``), and mirrors' holds (``holds.py``): what
        ``trim`` and ``prepare_sync`` look at."""
        self.on_append: Callable[[], None] | None = None
        """Called once per batch taken while a mirror waits for news of this stream (a long
        poll, ``lmqd.mirror.primary``); None otherwise: one attribute test per publish."""
        self.held = 0
        """Mirrors holding this stream (``holds.py``): channels then note the offset of each
        message they read from the tail, so that they can tell a mirror what they hold."""
        self.pushed: list[int] = []
        """Offsets of the pushed messages (deferred, or with a priority) not yet passed by every
        cursor, sorted."""
        self.dropped_count = 0
        """Messages dropped because the tail was full (no log)."""
        self.reader_lost_count = 0
        """Offsets readers by offset asked for that were not stored (deleted by retention or
        emptying, never written, lost to damage): ``/topic/read`` and ``/topic/offsets?from=``
        count them, the Spark source's ``failOnDataLoss`` reports them (docs/http.md)."""
        self.wrote_backend = False
        """Whether the last ``append`` wrote to the log (a success there clears bad health)."""
        self._pins: dict[int, int] = {}
        """Deferred messages whose durable channel copies are not fsynced yet: ``#topic`` may
        not pass them (offset -> copies pending)."""
        self._spilled = 0
        """Messages that left the full tail for the log since it was last empty: once they
        are as many as it holds, the tail overflows instead (see the module docstring)."""
        self.feeds = 0
        """Channels without a cursor (ephemeral ones) the pump puts copies into: they read what
        it hands on, at the end of the stream (the topic keeps this up to date)."""
        self._topic_cursor = None
        if log is not None:
            cursor = log.cursor(TOPIC_CURSOR)
            if cursor is None:
                adopted = log.adopted_offset
                # An adopted disk queue says how far it had handed messages on; anything else
                # without a record of it (a lost state file) starts from the earliest offset:
                # duplicates at worst, never a loss.
                cursor = log.create_cursor(
                    TOPIC_CURSOR, adopted if adopted is not None else "earliest"
                )
            self._topic_cursor = cursor
        self.pumped = self._topic_cursor.position if self._topic_cursor is not None else start
        """Messages below this offset were handed to the channels."""

    def __repr__(self) -> str:
        return f"<TopicStream {self.name} {self.pumped}/{self.next_offset}>"

    # -- sizes -------------------------------------------------------------------------------

    @property
    def depth(self) -> int:
        """Messages not handed to the channels yet."""
        return max(self.next_offset - self.pumped, 0)

    @property
    def backend_depth(self) -> int:
        """Of ``depth``, the messages not in the memory tail (in the log)."""
        if self.log is None:
            return 0
        tail = self.tail
        pumped = self.pumped
        in_tail = max(min(self.next_offset, tail.end) - max(pumped, tail.start), 0)
        return max(self.next_offset - pumped - in_tail, 0)

    @property
    def earliest_offset(self) -> int:
        """The oldest offset stored (the log's, else the tail's: a log holding nothing, all its
        messages read from memory, has no earliest of its own)."""
        log = self.log
        if log is not None and log.earliest_offset < min(log.next_offset, self.tail.start):
            return log.earliest_offset
        return self.tail.start

    def offset_for_time(self, ts_ns: int) -> int:
        """The offset of the first message stored whose timestamp is at or after ``ts_ns``
        (the log's index, then the memory tail); ``next_offset`` if there is none."""
        tail = self.tail
        start = tail.start
        if self.log is not None:
            found = self.log.offset_for_time(ts_ns)
            if found < self.log.next_offset:
                return found
            start = max(start, self.log.next_offset)
        for k, m in enumerate(tail.slice(start, tail.end - start), start):
            if m.timestamp >= ts_ns:
                return k
        return self.next_offset

    def read_entries(
        self, start: int, count: int, end: int | None = None, max_bytes: int | None = None
    ) -> tuple[list[tuple[int, Message]], int]:
        """Up to ``count`` messages from ``start`` on (or the earliest stored), below ``end``,
        with their offsets, and the offset to read on from. Consumes nothing; the messages are
        shared: read-only. ``max_bytes`` of bodies stops the read early (at least one message
        is returned). For tools (``GET /topic/read``, the Spark source)."""
        stop = self.next_offset if end is None else min(end, self.next_offset)
        position = max(start, self.earliest_offset)
        out: list[tuple[int, Message]] = []
        budget = max_bytes if max_bytes is not None else -1
        tail = self.tail
        log = self.log
        while position < stop and len(out) < count and budget != 0:
            if log is not None and not tail.start <= position < tail.end:
                until = min(stop, tail.start) if position < tail.start else stop
                position, budget = self._read_log_entries(position, until, count, budget, out)
            else:
                msgs = tail.slice(position, min(count - len(out), min(stop, tail.end) - position))
                budget = _take_within(out, list(enumerate(msgs, position)), budget)
                position = out[-1][0] + 1 if out else position + len(msgs)
        return out, position

    def _read_log_entries(
        self, position: int, until: int, count: int, budget: int, out: list[tuple[int, Message]]
    ) -> tuple[int, int]:
        """``read_entries`` of the log from ``position`` up to ``until``; returns where to read
        on and the budget left."""
        log = self.log
        assert log is not None
        before = len(out)
        reader = log.open_reader(position)
        try:
            while len(out) < count and budget != 0:
                got = reader.read_many(min(count - len(out), READ_CHUNK), until)
                if not got:
                    break
                budget = _take_within(out, got, budget)
            position = max(reader.position, position)
        finally:
            reader.close()
        if len(out) > before:
            return out[-1][0] + 1, budget
        if position >= log.next_offset or position >= until:
            return until, budget  # never written, or a gap: go on past it
        return position, 0  # unreadable for now: stop here

    def pushed_between(self, start: int, end: int) -> int:
        """Pushed messages known in ``[start, end)`` (``pushed``)."""
        if not self.pushed or start >= end:
            return 0
        return bisect_left(self.pushed, end) - bisect_left(self.pushed, start)

    # -- taking messages ---------------------------------------------------------------------

    def append(
        self,
        messages: Sequence[Message],
        nbytes: int,
        *,
        timestamp: int | None = None,
        plain: bool = False,
    ) -> None:
        """Take ``messages``, whose offsets are ``next_offset`` on, in order; ``nbytes``: their
        bodies' size; ``timestamp``: theirs if they all have one (a publish's), ``plain``: none
        has an lmq extension (hints for the log, ``TopicLog.append_many``). All or none: raises
        ``BackendError`` having kept none (a log write failed)."""
        self._store(messages, timestamp, plain)
        self.byte_marks.note(self.next_offset, nbytes)

    def _store(self, messages: Sequence[Message], timestamp: int | None, plain: bool) -> None:
        n = len(messages)
        if not n:
            return
        log = self.log
        tail = self.tail
        if log is None:
            self.wrote_backend = False
            if self.drop_overflow:
                room = self.limit - (self.next_offset - self.pumped)
                if room < n:
                    self.dropped_count += n - max(room, 0)
                    messages = messages[: max(room, 0)]
                    n = len(messages)
            tail.extend(messages)
            self.next_offset += n
            return
        if self._to_log_alone():
            unwritten = self._unwritten()
            if unwritten:  # a switch to write-through could not write the tail then
                log.append_many([*unwritten, *messages], self.next_offset - len(unwritten))
            else:
                log.append_many(
                    messages, self.next_offset, cache=self._cache_wanted(), timestamp=timestamp,
                    plain=plain,
                )  # fmt: skip
            self._appended(n)
            return
        room = max(self.limit - len(tail), 0)
        if n <= room:
            self.wrote_backend = False
            tail.extend(messages)
            self.next_offset += n
            return
        if self._spilled < self.limit:
            # Past the bound, but the tail has not turned over since it was empty: its oldest go
            # to the log, the tail's, then (past those) the new messages' first ones.
            excess = len(tail) + n - self.limit
            from_tail = min(excess, len(tail))
            direct = excess - from_tail
            spill = tail.front(from_tail)
            if direct:
                spill += messages[:direct]
            log.append_many(spill, tail.start)
            self.wrote_backend = True
            self._spilled += excess
            tail.drop_front(from_tail)
            if direct:
                tail.reset(self.next_offset + direct)
                messages = messages[direct:]
            tail.extend(messages)
            self.next_offset += n
            return
        # Overflow: the tail has turned over once already (a backlog, not a burst). It keeps the
        # oldest (filled up to its bound) and is written to the log as well, once (its readers
        # may take its objects for their own: not cached); the rest goes to the log alone.
        unwritten = self._unwritten()
        first = self.next_offset - len(unwritten)
        log.append_many([*unwritten, *messages], first, cache=False)
        if room:
            tail.extend(messages[:room])
        self.next_offset += n
        self.wrote_backend = True

    def append_plain(
        self,
        ids: Sequence[bytes],
        bodies: list[bytes],
        timestamp: int,
        nbytes: int,
        exts: Sequence[MessageExt | None] | None = None,
    ) -> bool:
        """A publish not deferred and with no priority (``exts``: each body's extension, None
        for none; one timestamp) as columns, straight into the log without message objects
        when that is where it goes (write-through, or behind an overflowing tail) and no reader
        is near the end to want the objects (``_cache_wanted``): the backlog case, each message
        written and gone. False, having stored nothing, when they must be made (the caller then
        calls ``append``). Raises ``BackendError`` having stored none of them."""
        log = self.log
        if log is None or not self._to_log_alone() or self._unwritten() or self._cache_wanted():
            return False
        log.append_plain(ids, bodies, timestamp, self.next_offset, exts)
        self._appended(len(bodies))
        self.byte_marks.note(self.next_offset, nbytes)
        return True

    def _to_log_alone(self) -> bool:
        """Whether what is published now goes to the log alone: write-through, or the tail
        overflowed (until every channel has read it, new messages follow it in the log: their
        offsets are past it). Forgets what every channel has read first."""
        log = self.log
        assert log is not None
        self.trim()
        tail = self.tail
        if self.write_through:
            return True
        if not len(tail):
            self._spilled = 0
            if tail.start != self.next_offset:
                tail.reset(self.next_offset)  # read by every channel: memory first again
        return log.next_offset > tail.end

    def _appended(self, n: int) -> None:
        """``n`` messages went to the log alone."""
        self.next_offset += n
        if self.write_through:
            self.tail.reset(self.next_offset)
        self.wrote_backend = True

    def _unwritten(self) -> list[Message]:
        """The tail's messages not in the log yet: those at or after the log's end."""
        tail = self.tail
        assert self.log is not None
        start = max(tail.start, self.log.next_offset)
        return tail.slice(start, tail.end - start) if start < tail.end else []

    def _cache_wanted(self) -> bool:
        """Whether what the log appends now should stay in its tail cache: some channel reads
        near the stream's end (``CACHE_REACH``), or the pump copies what it hands on."""
        if self.feeds:
            return True
        reach = self.next_offset - CACHE_REACH
        return any(c.position >= reach for c in self.cursors)

    def note_pushed(self, offsets: Sequence[int]) -> None:
        """Offsets just appended whose messages are pushed (deferred, or with a priority)."""
        self.pushed.extend(offsets)

    def set_write_through(self, on: bool) -> None:
        """Switch to writing every message to the log (a retention policy needs them there),
        or back to memory first. The tail goes to the log first; raises ``BackendError``
        (the switch is made all the same: the tail goes to the log with the next publish)."""
        if self.log is None:
            return
        was = self.write_through
        self.write_through = on or self.limit == 0
        if self.write_through and not was:
            self.flush_tail()

    def flush_tail(self) -> None:
        """Write what the tail holds only in memory to the log and empty the tail (a switch to
        write-through); raises ``BackendError``."""
        log = self.log
        tail = self.tail
        if log is None:
            return
        self.trim()
        unwritten = self._unwritten()
        if unwritten:
            log.append_many(unwritten, tail.end - len(unwritten))
        tail.reset(self.next_offset)

    # -- reading -----------------------------------------------------------------------------

    def read_range(self, start: int, end: int) -> list[Message]:
        """The messages in ``[start, end)`` (offsets lost to damage absent), as stored: shared
        objects, read-only. For channels that take copies of everything (ephemeral ones)."""
        out: list[Message] = []
        tail = self.tail
        log = self.log
        if log is not None and start < tail.start:
            out = [m for _, m in log.read_range(start, end_offset=min(end, tail.start))]
        low = max(start, tail.start)
        high = min(end, tail.end)
        if low < high:
            out += tail.slice(low, high - low)
        low = max(start, tail.end)
        if log is not None and low < end:
            out += [m for _, m in log.read_range(low, end_offset=end)]
        return out

    def peek(self, start: int, end: int, count: int) -> list[tuple[int, Message]]:
        """Up to ``count`` (offset, message) pairs in ``[start, end)``, as stored (shared,
        read-only), changing nothing: ``/peek``."""
        out: list[tuple[int, Message]] = []
        tail = self.tail
        log = self.log
        if log is not None and start < tail.start:
            out = log.read_range(start, count, end_offset=min(end, tail.start))
        start = max(start, tail.start)
        if len(out) < count and start < min(end, tail.end):
            msgs = tail.slice(start, min(count - len(out), min(end, tail.end) - start))
            out += zip(range(start, start + len(msgs)), msgs, strict=True)
        start = max(start, tail.end)
        if log is not None and len(out) < count and start < end:
            out += log.read_range(start, count - len(out), end_offset=end)
        return out

    def messages_at(self, offsets: Sequence[int]) -> list[Message]:
        """Copies of the messages at ``offsets``, each carrying its offset (those not stored,
        lost to damage, left out). For the pushed messages of a pump batch: one read of the
        log for the range they span (a pump batch at most)."""
        out: list[Message] = []
        tail = self.tail
        on_disk = (
            [o for o in offsets if not tail.start <= o < tail.end] if self.log is not None else []
        )
        if on_disk:
            wanted = set(on_disk)
            assert self.log is not None
            got = self.log.read_range(on_disk[0], end_offset=on_disk[-1] + 1)
            for offset, m in got:
                if offset in wanted:
                    m = m.copy()
                    m.offset = offset
                    out.append(m)
        for offset in offsets:
            if tail.start <= offset < tail.end:
                m = tail.slice(offset, 1)[0].copy()
                m.offset = offset
                out.append(m)
        return out

    def take_pump_batch(self, count: int) -> tuple[int, int, list[int]]:
        """Hand up to ``count`` more messages to the channels: (start, end, offsets of the
        pushed ones among them)."""
        start = self.pumped
        end = min(start + count, self.next_offset)
        self.pumped = end
        pushed = self.pushed
        if start < self.known_from and self.log is not None:
            # A backlog an earlier run left: find its pushed messages (entries, option blocks).
            for offset in self.log.pushed_offsets(start, min(end, self.known_from)):
                insort(pushed, offset)
        if not pushed:
            return start, end, []
        lo = bisect_left(pushed, start)
        hi = bisect_left(pushed, end, lo)
        return start, end, pushed[lo:hi]

    def trim(self) -> None:
        """Forget, from memory, the messages every channel has read (never written: nsqd's
        consumed memory queue), and the pushed offsets every cursor has passed."""
        low = self.pumped
        for cursor in self.cursors:
            if cursor.position < low:
                low = cursor.position
        tail = self.tail
        if len(tail) and low > tail.start:
            tail.drop_until(min(low, tail.end))
        pushed = self.pushed
        if pushed and pushed[0] < low:
            del pushed[: bisect_left(pushed, low)]
        self.byte_marks.forget_below(low)

    def reset_unpumped(self) -> None:
        """Topic empty (nsqd): drop the messages not yet handed to the channels: every cursor
        steps over them, and memory forgets them as soon as no channel holds an older one
        (``drop_unpumped``'s way). Their offsets are never given again: a reader by offset
        (the Spark source) that read them finds them gone, not new messages in their place."""
        self._skip_unpumped(self.pumped, self.next_offset)
        self.trim()

    def drop_unpumped(self, count: int) -> int:
        """``overflow="drop_oldest"``: drop the oldest ``count`` messages not yet handed to the
        channels (every cursor steps over them, as after ``reset_unpumped``); how many."""
        old = self.pumped
        new = min(old + count, self.next_offset)
        if new <= old:
            return 0
        self._skip_unpumped(old, new)
        self.trim()
        return new - old

    def _skip_unpumped(self, old: int, new: int) -> None:
        """``[old, new)``, not handed on yet, is dropped: ``pumped`` moves past it, every
        cursor steps over it, and its pushed offsets are forgotten."""
        self.pumped = new
        for cursor in self.cursors:
            cursor.skip(old, new)
        pushed = self.pushed
        if pushed:
            lo = bisect_left(pushed, old)
            del pushed[lo : bisect_left(pushed, new, lo)]

    # -- durable pushed copies ----------------------------------------------------------------

    def pin(self, offset: int) -> None:
        """A durable channel's copy of the pushed message at ``offset`` is not fsynced yet:
        ``#topic`` does not pass it until ``unpin``."""
        self._pins[offset] = self._pins.get(offset, 0) + 1

    def unpin(self, offset: int) -> None:
        left = self._pins.get(offset, 0) - 1
        if left > 0:
            self._pins[offset] = left
        else:
            self._pins.pop(offset, None)

    def clear_pins(self) -> None:
        """Every pinned copy is durable (the channels synced their stores at shutdown)."""
        self._pins.clear()

    # -- what the syncer calls ---------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self.log is None or self.log.closed

    @property
    def dirty_count(self) -> int:
        """The log's unsynced activity, at least 1 while time has made segments deletable
        (``TopicLog.retire_due``: an idle topic's syncer tick deletes them then, not at its
        next write)."""
        log_ = self.log
        if log_ is None:
            return 0
        dirty = log_.dirty_count
        if dirty or (log_.retention_ms is None and log_.keep_recent_ms is None):
            return dirty
        return int(log_.retire_due(self._now_ns()))

    def _now_ns(self) -> int | None:
        """Wall-clock ns for retention: the trio clock through the log's time base (exact
        times in tests on a virtual clock), else None (the log reads the wall clock)."""
        log_ = self.log
        if log_ is None or self._clock is None:
            return None
        return log_.timebase.to_wall_ns(self._clock())

    @property
    def bytes_on_disk(self) -> int:
        return self.log.bytes_on_disk if self.log is not None else 0

    def prepare_sync(self) -> SyncJob | None:
        """The log's sync job, once every cursor in it is where its channel is."""
        log_ = self.log
        if log_ is None:
            return None
        self.refresh_cursors()
        return log_.prepare_sync(self._now_ns())

    def refresh_cursors(self) -> None:
        """Move ``#topic`` to ``pumped`` (or the oldest pinned offset) and every channel's log
        cursor to its channel's position (``ChannelCursor.sync_log_cursor``)."""
        self.move_topic_cursor()
        for cursor in self.cursors:
            cursor.sync_log_cursor()

    def move_topic_cursor(self) -> None:
        """Move ``#topic`` to ``pumped`` (or the oldest pinned offset): after an unpin, so
        that the syncer's next tick persists it (a moved cursor is activity to sync)."""
        topic_cursor = self._topic_cursor
        if topic_cursor is not None and not topic_cursor.deleted:
            pumped = min(self.pumped, min(self._pins)) if self._pins else self.pumped
            target = self.log_target(pumped)
            if topic_cursor.position != target:
                topic_cursor.seek(target)

    def log_target(self, offset: int) -> int:
        """``offset`` clamped to the log's offsets, as a seek clamps it (comparing positions
        with unclamped offsets would seek, and dirty, the log at every sync)."""
        log_ = self.log
        if log_ is None:
            return offset
        return min(max(offset, log_.earliest_offset), log_.next_offset)

    # -- life cycle --------------------------------------------------------------------------

    def close(self, salvage: Salvage | None = None) -> None:
        """Shutdown, blocking: the tail to the log (as much of it as the disk takes, in order:
        ``Salvage``; the rest is counted lost under the topic), the cursors where their
        channels are, the log synced and closed."""
        log_ = self.log
        if log_ is None or log_.closed:
            return
        if salvage is None:
            salvage = Salvage()
        self.trim()
        tail = self.tail
        unwritten = self._unwritten()
        if unwritten:
            start = tail.end - len(unwritten)

            def write(chunk: Sequence[Message], index: int) -> None:
                log_.append_many(chunk, start + index)

            salvage.write(f"TOPIC({self.name})", self.name, write, unwritten)
            # What was not written leaves a gap in the log's offsets, as a consumed tail does.
        tail.reset(self.next_offset)
        log_.advance_to(self.next_offset)
        self.refresh_cursors()
        log_.close()

    def delete(self) -> None:
        """Drop every message and the log's files."""
        self.tail.reset(self.next_offset)
        self.pumped = self.next_offset
        self.pushed.clear()
        self._pins.clear()
        if self.log is not None:
            self.log.delete()

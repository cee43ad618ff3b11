"""ChannelCursor: one channel's read position over its topic's stream.

Theory of operation
-------------------
A channel reads its topic's messages in offset order from ``position`` up to the topic's
``pumped`` offset (``stream.py``): from the log while ``position`` is below the memory tail,
then from the tail, then from the log again if the tail overflowed (what followed it went to
the log). It takes what it may deliver (``read``), never more, so a channel holds in
memory only its in-flight, requeued and deferred messages; everything else it has not read yet
is the topic's, stored once.

**The log cursor.** A channel of a topic with a log also has a ``lmqd.storage.Cursor`` of the
same name in it: that is what the log persists (where the channel resumes after a restart) and
what keeps the log's segments from deletion (its low-water mark).

* Default mode: reads settle at once (nsqd promises nothing across a crash for messages read).
  Reading from the memory tail does not move the log cursor; the stream moves it to the
  channel's position before each sync and at shutdown (``sync_log_cursor``), and a read from the
  log first seeks it there.
* ``--durable``: every message stays in the log (write-through), the log cursor is the
  channel's reader, and a message read stays **unsettled** (it holds the low-water mark) until
  the channel settles it: FIN, or a copy of it in the channel's own store made durable
  (``lmqd.engine.durable``). So after a crash every message not FIN'd is read again.

**Copies.** The messages in the stream are shared (the log's tail cache and the memory tail
hold one object per message for every channel), so a cursor hands out copies
(``Message.copy``: same id, timestamp and body object, own attempts and flight fields; from the
log, carrying their offset: ``Cursor.read_messages`` copies what the tail cache shares, and a
record decoded from the files is decoded into the channel's own objects, not copied again).
The one exception: the last channel to read a message from the memory tail (every other cursor
is past it) takes the object itself, and the tail forgets it at once, so no other reader can see
it changed; a topic with one channel copies nothing.

**After a crash** (``--durable``), the messages a cursor reads again below its persisted read
position (``Cursor.read_before``) were delivered before the crash: their copies count that
delivery in ``attempts``.

**Pushed messages** (deferred ones, and those with an lmq priority) are pushed to the channels
by the topic's pump (``stream.py``), so a cursor steps over them (settling them: their copies
are elsewhere), except in a range it is replaying (``replay_until``: a cursor created at or
moved to an offset before ``pumped``; the pump never pushed those to this channel). A replay
reads in offset order, priorities included.

**Topic empty** drops the messages the topic had not handed on; a cursor that had not reached
them yet keeps the dropped range in ``_skips`` and steps over it. The range is persisted with
its log cursor (``Cursor.add_skip``) until the mark has passed it, so a restart before the
channel got there steps over it too.

**Reading ahead** (``ahead``, lmq's internal channels: ``internal.py``): the cursor reads up to
the topic's end instead of ``pumped``, so the channel sees every message as it is stored while
the pump, which does not count it as a channel, keeps the topic's backlog for the first of the
users' channels (nsqd's rule). The pump pushes nothing to it: it reads deferred and priority
messages in offset order, as a replay does (``replay_until`` past every offset). It never takes a
message object from the memory tail (the users' channels have not read it yet).

**Seek** moves the read position anywhere stored. In ``--durable``, messages read before it
and not settled (in flight, or requeued with their copies not yet fsynced) keep holding the
log's mark (``Cursor.seek(keep_unsettled=True)``) until they settle as usual: a crash brings
them back whatever the new position. What a seek back adds to the channel's backlog is counted
in ``replayed``, which the channel's ``message_count`` includes: the count never falls behind
the depth, and tools' rates (messages in, minus what is still held) stay right.
"""

from __future__ import annotations

from collections.abc import Iterable

from lmqd.engine.stream import TopicStream
from lmqd.message import Message, copies
from lmqd.storage import Cursor

__all__ = ["READ_ALL", "ChannelCursor", "DurableCursor", "pushed"]

READ_ALL = 1 << 62
"""``replay_until`` of a cursor reading ahead: past any offset, so it reads pushed messages in
order like the others (the pump pushes nothing to it)."""


class ChannelCursor:
    """A channel's position in its topic's stream; see the module docstring. Default mode:
    reads settle at once (``DurableCursor`` for ``--durable``)."""

    settles = True
    """Reads settle at once: messages read are done as far as the log is concerned."""

    __slots__ = (
        "_log_cursor", "_skips", "ahead", "name", "position", "replay_until",
        "replayed", "stream",
    )  # fmt: skip

    def __init__(
        self,
        stream: TopicStream,
        name: str,
        *,
        at: int | None = None,
        ahead: bool = False,
    ) -> None:
        self.stream = stream
        self.name = name
        self.ahead = ahead
        """Reads everything the topic stores, up to its end, ahead of the pump (an internal
        channel, ``internal.py``); else only what the pump handed on (``pumped``)."""
        self._skips: list[tuple[int, int]] = []
        self.replay_until = READ_ALL if ahead else 0
        """Pushed messages below this offset are read like the others (a replay; every one for
        a cursor reading ahead, to which the pump pushes nothing)."""
        self.replayed = 0
        """Messages handed to the channel outside the pump: again by a replay (``seek``), or
        the topic's backlog a cursor reading ahead found at its creation. nsqd's
        ``message_count`` counts what the topic puts into a channel, so the channel's count
        includes these (else it falls behind its depth)."""
        log = stream.log
        lc = log.cursor(name) if log is not None else None
        restored = lc is not None
        if lc is not None:
            self.position = lc.position  # restored: resume at its low-water mark
        else:
            # nsqd: a new channel sees what the topic hands on from now on (one reading ahead
            # sees, besides, what the topic holds for its channels: its backlog).
            self.position = stream.pumped
            if log is not None:
                lc = log.create_cursor(name, stream.log_target(stream.pumped))
        self._log_cursor: Cursor | None = lc
        if lc is not None and lc.skips:
            self._skips = [r for r in lc.skips if r[1] > self.position]
        if at is not None:
            self.seek(at)
        elif ahead and not restored:
            self.replayed = self.unread  # the topic's backlog, handed to it at creation
        stream.cursors.append(self)

    def __repr__(self) -> str:
        return f"<ChannelCursor {self.stream.name}:{self.name} at {self.position}>"

    # -- sizes -------------------------------------------------------------------------------

    @property
    def end(self) -> int:
        """Where the channel's readable messages end: what the pump handed on, or the topic's
        end for a cursor reading ahead."""
        return self.stream.next_offset if self.ahead else self.stream.pumped

    @property
    def unread(self) -> int:
        """Messages handed to the channel by the topic and not read yet (pushed ones, which
        the channel has already, not counted)."""
        stream = self.stream
        pos = self.position
        end = self.end
        if pos >= end:
            return 0
        n = end - pos - stream.pushed_between(max(pos, self.replay_until), end)
        for start, stop in self._skips:
            n -= max(min(stop, end) - max(start, pos), 0)
        return max(n, 0)

    @property
    def has_unread(self) -> bool:
        """``unread > 0``, cheaply (pushed ones aside): ``end`` inlined, asked at every delivery
        request."""
        stream = self.stream
        return self.position < (stream.next_offset if self.ahead else stream.pumped)

    @property
    def unread_on_disk(self) -> int:
        """Of ``unread``, the messages in the log (approximate over gaps a replay crosses)."""
        stream = self.stream
        if stream.log is None:
            return 0
        pos = self.position
        end = self.end
        tail = stream.tail
        n = 0
        # Below the memory tail, and after it (the tail overflowed, ``stream.py``).
        for start, stop in ((pos, min(end, tail.start)), (max(pos, tail.end), end)):
            if start < stop:
                n += stop - start - stream.pushed_between(max(start, self.replay_until), stop)
        return max(n, 0)

    @property
    def skips(self) -> list[tuple[int, int]]:
        """The ranges ``[start, end)`` at or after the position that the cursor steps over (a
        topic empty dropped them before it got there)."""
        return list(self._skips)

    @property
    def low(self) -> int:
        """The low-water mark the log keeps for this channel (its position without a log)."""
        lc = self._log_cursor
        return lc.low if lc is not None else self.position

    @property
    def unsettled_count(self) -> int:
        lc = self._log_cursor
        return lc.unsettled_count if lc is not None else 0

    # -- reading -----------------------------------------------------------------------------

    def read(self, count: int) -> list[Message]:
        """Up to ``count`` of the next messages handed to the channel, as the channel's own
        copies, pushed ones stepped over; the position moves past them."""
        stream = self.stream
        limit = self.end
        out: list[Message] = []
        while len(out) < count and self.position < limit:
            end = limit
            if self._skips:
                start, stop = self._skips[0]
                if self.position >= start:
                    self.position = max(self.position, stop)
                    del self._skips[0]
                    continue
                end = min(end, start)
            want = count - len(out)
            tail = stream.tail
            if stream.log is not None and not tail.start <= self.position < tail.end:
                # The log: below the tail, or after it (the tail overflowed, ``stream.py``).
                until = min(end, tail.start) if self.position < tail.start else end
                got = self._read_log(want, until)
                if got is None:
                    break  # unreadable for now (see the storage log); tried again later
                out += got
            else:
                out += self._read_tail(want, min(end, tail.end))
        return out

    def _read_log(self, want: int, until: int) -> list[Message] | None:
        stream = self.stream
        log = stream.log
        lc = self._log_cursor
        assert log is not None and lc is not None
        if lc.position != self.position:
            if lc.position < self.position:
                lc.skip_to(self.position)  # keeps what is unsettled
            else:
                lc.seek(self.position, keep_unsettled=True)  # (none unsettled: default mode)
        got = lc.read_messages(want, settle=self.settles, until=until)
        if not got:
            if lc.position >= until:
                self.position = lc.position  # a gap (damage) up to there
            elif lc.position >= log.next_offset:
                self.position = until  # past the log's end: never written (read from memory)
            else:
                return None
            return []
        self.position = lc.position
        first = got[0].offset
        if first < lc.read_before:
            # Read before a crash, they were delivered then: count that delivery.
            below = lc.read_before
            for m in got:
                if m.offset < below:
                    m.attempts += 1
        if first >= stream.known_from and not stream.pushed_between(first, self.position):
            return got
        replay = self.replay_until
        out: list[Message] = []
        passed: list[int] = []
        for m in got:
            if m.offset >= replay and pushed(m):
                passed.append(m.offset)  # the pump pushed it to the channel
            else:
                out.append(m)
        if passed:
            lc.settle_many(passed)  # (a no-op in default mode: reads settle at once)
        return out

    def _read_tail(self, want: int, end: int) -> list[Message]:
        stream = self.stream
        pos = self.position
        msgs = stream.tail.slice(pos, min(want, end - pos))
        after = pos + len(msgs)
        self.position = after
        # The messages every other channel has read already, no channel reads after this one:
        # it takes the objects themselves and the tail forgets them at once (so nobody can see
        # them changed); of the others it takes copies.
        # (Nor does a channel the pump has not handed them to yet: below ``pumped`` only.)
        others = min(
            min((c.position for c in stream.cursors if c is not self), default=after),
            stream.pumped,
        )
        own = min(max(others - pos, 0), len(msgs))
        if own < len(msgs):
            msgs = msgs[:own] + copies(msgs[own:])
        if stream.held:
            # A mirror follows (``holds.py``): what the channel holds is told to it by offset.
            for offset, m in enumerate(msgs, pos):
                m.offset = offset
        if stream.pushed_between(max(pos, self.replay_until), after):
            replay = self.replay_until
            msgs = [m for k, m in enumerate(msgs, pos) if k < replay or not pushed(m)]
        if own:
            stream.trim()
        return msgs

    def peek(self, count: int) -> list[tuple[int, Message]]:
        """Up to ``count`` of the messages ``read`` would return next, as (offset, message)
        with the stored objects (read-only), changing nothing: ``/peek``."""
        stream = self.stream
        out: list[tuple[int, Message]] = []
        position = self.position
        skips = self._skips
        end = self.end
        while len(out) < count and position < end:
            got = stream.peek(position, end, count - len(out) + 16)
            if not got:
                break
            for offset, m in got:
                if any(start <= offset < stop for start, stop in skips):
                    continue
                if offset >= self.replay_until and pushed(m):
                    continue  # the pump pushed it to the channel
                out.append((offset, m))
                if len(out) == count:
                    break
            position = got[-1][0] + 1
        return out

    # -- moving ------------------------------------------------------------------------------

    def settle_many(self, offsets: Iterable[int]) -> int:
        """``--durable``: messages read are done (FIN, or a durable copy stands for them)."""
        lc = self._log_cursor
        return lc.settle_many(offsets) if lc is not None else 0

    def seek(self, offset: int, *, keep_unsettled: bool = True) -> int:
        """Read from ``offset`` on (clamped to the earliest offset stored and the topic's
        end): a replay, or a jump ahead (channel empty). Pushed messages in a replayed range
        are read too. ``--durable``: the messages read and not settled keep the log's claim on
        them unless ``keep_unsettled`` is false (they were dropped). Returns the new
        position."""
        stream = self.stream
        log = stream.log
        lowest = log.earliest_offset if log is not None else stream.tail.start
        position = min(max(offset, lowest), stream.next_offset)
        unread = self.unread
        self.position = position
        if not self.ahead:
            self.replay_until = stream.pumped if position < stream.pumped else 0
        self._skips.clear()
        lc = self._log_cursor
        if lc is not None:
            lc.skips.clear()
            lc.seek(stream.log_target(position), keep_unsettled=keep_unsettled)
        self.replayed += max(self.unread - unread, 0)
        return position

    def skip_older_than(self, ts_ns: int) -> int:
        """Step over the messages in the log, from the position on, published before
        ``ts_ns`` (expired: the topic's ``ttl_ms``), found by the log's time index without
        reading them (below the memory tail, or after it); returns how many (pushed ones,
        which the channel has already, not counted).

        The index finds the first message at or after ``ts_ns`` in offset order, so every
        message below it is older even if the wall clock stepped back. Only the log: the memory
        tail is checked message by message as the channel takes it.
        """
        stream = self.stream
        log = stream.log
        pos = self.position
        tail = stream.tail
        if log is None or tail.start <= pos < tail.end:
            return 0
        limit = tail.start if pos < tail.start else self.end
        end = min(log.offset_for_time(ts_ns), limit, self.end)
        if end <= pos:
            return 0
        n = end - pos - stream.pushed_between(max(pos, self.replay_until), end)
        for start, stop in self._skips:
            n -= max(min(stop, end) - max(start, pos), 0)
        self.position = end  # the log cursor follows at the next read (keeping the unsettled)
        return max(n, 0)

    def skip(self, start: int, end: int) -> None:
        """The topic dropped ``[start, end)`` (topic empty); ``start`` is at or after the
        position."""
        if self.position >= start:
            self.position = max(self.position, end)
        else:
            if self._skips and self._skips[-1][1] == start:
                # Consecutive drops (drop_oldest on a paused topic) make one range, not a list
                # that grows with every publish.
                self._skips[-1] = (self._skips[-1][0], end)
            else:
                self._skips.append((start, end))
            if self._log_cursor is not None:
                self._log_cursor.add_skip(start, end)

    def sync_log_cursor(self) -> None:
        """Move the log cursor to the channel's position (it lags while the channel reads from
        memory)."""
        lc = self._log_cursor
        if lc is None or lc.deleted:
            return
        target = self.stream.log_target(self.position)
        if lc.position != target:
            self._sync_to(lc, target)

    def _sync_to(self, lc: Cursor, target: int) -> None:
        lc.seek(target)

    def delete(self) -> None:
        """The channel is deleted: forget the cursor (the log deletes what only it kept)."""
        stream = self.stream
        if self in stream.cursors:
            stream.cursors.remove(self)
        if stream.log is not None and not stream.log.closed:
            stream.log.delete_cursor(self.name)
        self._log_cursor = None
        self.position = stream.next_offset  # nothing left to read


class DurableCursor(ChannelCursor):
    """``--durable``: what the channel reads stays unsettled in the log until it settles it
    (FIN, or a durable copy in one of its stores), so that a crash reads it again."""

    __slots__ = ()

    settles = False

    def _sync_to(self, lc: Cursor, target: int) -> None:
        # Only forward (gaps, skips), keeping the unsettled: the log cursor is the reader.
        if target > lc.position:
            lc.skip_to(target)


def pushed(m: Message) -> bool:
    """Whether the topic's pump pushes ``m`` to its channels (``stream.py``): deferred, or with
    an lmq priority."""
    return bool(m.deliver_at or (m.ext is not None and m.ext.priority))

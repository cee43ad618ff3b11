"""MirrorHold: what a mirror has not copied yet, kept by the primary's topic stream.

Theory of operation
-------------------
A mirror (``lmqd.mirror``) copies a topic's stream offset by offset through ``/mirror/read``.
Without help the primary would not keep what it copies: a message every channel read from the
memory tail leaves it without ever being written (``stream.py``), and a segment every channel's
cursor passed is deleted. So each mirror has a **hold** on each topic: one more reader of the
stream, at the offset up to which the mirror has its copy (``position``; the mirror says so with
each read, ``acked``). Being in ``TopicStream.cursors``, it is what every cursor is to the
stream: ``trim`` keeps the tail's messages it has not passed (past ``--mem-queue-size`` they go
to the log as a backlog's do), a channel reading the tail takes copies instead of the objects
while the hold is behind (``ChannelCursor._read_tail``), and its log cursor ``#mirror:<id>``
keeps the segments it has not passed from deletion and survives the primary's restarts. A
channel of a held stream also sets the offset of what it reads from the tail on each message, so
that what it holds unfinished can be told to the mirror by offset (``unfinished_offsets``).

**Bounded.** A mirror that stops reading would make the primary keep everything. ``release``
(the mirror registry calls it once a second, ``lmqd.mirror.primary``) moves a hold that lags more
than ``--mirror-max-lag`` messages behind the stream's end up to that bound: the primary keeps
the newest ones and lets the rest go as it would without a mirror, counts what it released and
logs it; the mirror finds the offsets missing when it reads again and reports the **gap**
(``lmqd.mirror.follower``). Never silently: both sides count it.

**Since.** A hold made for a topic that already has messages cannot bring back what the memory
tail already forgot (read by every channel before the mirror came): ``since`` is the first
offset the hold vouches for, the tail's start when it was made (the log holds the rest, gaps
and all), its position when restored at start-up. The mirror counts the offsets missing below
it as not kept before it came, and those at or above it as a gap.

**Topic empty** drops the messages the topic had not handed on; a hold keeps those it has not
passed (the mirror copies them, and the primary's channels' skips, which the mirror follows, step
over them there too): an offset the primary accepted is copied or reported, never skipped.

**In sync.** Each fetch also tells the hold what the mirror stored and when it asked
(``fetched``, ``answered``): ``insync.py`` judges from those whether the mirror is in sync and
how far it has copied, for ``--min-insync-mirrors``.

Costs: the hold is one entry more in ``stream.cursors`` (``trim``, ``_cache_wanted`` and a tail
read look at it), and with a hold the channels reading the tail copy the messages and set their
offsets (a loop over the batch): measured in docs/benchmarks.md ("Mirrors").
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable

from lmqd.engine.stream import TopicStream
from lmqd.message import Message
from lmqd.storage import Cursor

__all__ = [
    "HOLD_PREFIX",
    "MirrorHold",
    "forget_offsets",
    "is_hold_name",
    "note_offsets",
    "restored_holds",
    "unfinished_offsets",
]

log = logging.getLogger("lmqd.mirror")

HOLD_PREFIX = "#mirror:"
"""Log cursors of holds are named ``#mirror:<mirror id>`` (``#`` starts no channel name)."""


def is_hold_name(name: str) -> bool:
    """Whether a log cursor name is a mirror's hold."""
    return name.startswith(HOLD_PREFIX)


class MirrorHold:
    """One mirror's hold on one topic's stream; see the module docstring."""

    __slots__ = (
        "_log_cursor",
        "answered_end",
        "caught_up_at",
        "contact_at",
        "copied",
        "fetched_from",
        "in_sync_since",
        "mirror_id",
        "position",
        "released",
        "since",
        "stream",
    )

    def __init__(self, stream: TopicStream, mirror_id: str, *, at: int | None = None) -> None:
        """The hold of mirror ``mirror_id``: restored from the stream's log if it has one,
        else made at ``at`` (None: the oldest message stored)."""
        self.stream = stream
        self.mirror_id = mirror_id
        self.released = 0
        """Messages this hold let go because the mirror lagged past the limit (``release``)."""
        log_ = stream.log
        name = HOLD_PREFIX + mirror_id
        lc: Cursor | None = log_.cursor(name) if log_ is not None else None
        if lc is not None:
            self.position = lc.position
            self.since = self.position
        else:
            start = stream.earliest_offset if at is None else at
            self.position = min(max(start, stream.earliest_offset), stream.next_offset)
            self.since = max(self.position, stream.tail.start)
            if log_ is not None:
                lc = log_.create_cursor(name, stream.log_target(self.position))
        self._log_cursor = lc
        # What ``fetched`` learns, for ``--min-insync-mirrors`` (``insync.py``).
        self.copied = self.position
        """The offset below which the mirror said it has its copy (fsynced, if durable); unlike
        ``position``, never moved by ``release``."""
        self.fetched_from = self.position
        """Where the mirror's last fetch read from: what it has stored."""
        self.contact_at = -math.inf
        """When (trio time) the mirror last fetched this topic."""
        self.caught_up_at = -math.inf
        """When a fetch of the mirror last asked from at least ``answered_end``."""
        self.answered_end = stream.next_offset
        """The stream's end when the mirror was last answered (``answered``)."""
        self.in_sync_since = -math.inf
        """When (trio time) the fetch came that made the mirror in sync, as far as
        ``in_sync`` tells (-inf: not since this hold was made)."""
        stream.cursors.append(self)
        stream.held += 1

    def __repr__(self) -> str:
        return f"<MirrorHold {self.stream.name} {self.mirror_id} at {self.position}>"

    @property
    def lag(self) -> int:
        """Offsets the mirror has not copied yet."""
        return max(self.stream.next_offset - self.position, 0)

    def in_sync(self, now: float, timeout: float) -> bool:
        """Whether the mirror is in sync at ``now`` (Kafka's ISR; ``timeout``:
        ``--mirror-ack-timeout``): it fetched within ``timeout`` and, within that time too,
        had copied everything or asked from at least the end it was told the fetch before."""
        horizon = now - timeout
        return self.contact_at >= horizon and (
            self.fetched_from >= self.stream.next_offset or self.caught_up_at >= horizon
        )

    def fetched(self, offset: int, acked: int, now: float, timeout: float) -> None:
        """A fetch of the mirror at ``now``: it has stored everything below ``offset``, and
        durably (if it is durable) below ``acked``; ``timeout``: ``--mirror-ack-timeout``
        (``in_sync``), to tell when it came back in sync."""
        was_in_sync = self.in_sync(now, timeout)
        end = self.stream.next_offset
        offset = min(offset, end)
        acked = min(acked, offset)
        self.contact_at = now
        if offset >= self.answered_end:
            self.caught_up_at = now
        self.fetched_from = offset
        if acked > self.copied:
            self.copied = acked
        if not was_in_sync and self.in_sync(now, timeout):
            self.in_sync_since = now
        self.acknowledge(acked)

    def answered(self) -> None:
        """A fetch of the mirror is answered now: to be caught up, its next fetch asks from at
        least the stream's end of this moment."""
        self.answered_end = self.stream.next_offset

    def joined(self, contact_at: float, now: float) -> None:
        """A hold made for a topic new to a mirror already known: in sync from the start
        (nothing to copy yet) as far as the mirror's last contact says."""
        self.contact_at = contact_at
        self.caught_up_at = now
        self.in_sync_since = now

    def acknowledge(self, offset: int) -> None:
        """The mirror has (durably, if it is durable) everything below ``offset``."""
        stream = self.stream
        offset = min(offset, stream.next_offset)
        if offset > self.position:
            self.position = offset
            stream.trim()

    def release(self, max_lag: int) -> int:
        """Let go of what lags more than ``max_lag`` messages behind the end (0: no bound);
        returns how many offsets were released (counted in ``released``)."""
        if max_lag <= 0:
            return 0
        stream = self.stream
        floor = stream.next_offset - max_lag
        if self.position >= floor:
            return 0
        released = floor - self.position
        self.position = floor
        self.released += released
        stream.trim()
        self.sync_log_cursor()  # dirties the log: the syncer's next tick deletes what may go
        return released

    # -- what the stream asks of its cursors (``stream.StreamCursor``) -----------------------

    def skip(self, start: int, end: int) -> None:
        """Topic empty dropped ``[start, end)``: the hold keeps what it has not passed (the
        mirror copies it; the channels' skips, which it follows, step over it there too)."""

    def sync_log_cursor(self) -> None:
        lc = self._log_cursor
        if lc is None or lc.deleted:
            return
        target = self.stream.log_target(self.position)
        if lc.position != target:
            lc.seek(target)

    def delete(self) -> None:
        """The mirror is forgotten (or the topic goes): the stream and its log let go."""
        stream = self.stream
        if self in stream.cursors:
            stream.cursors.remove(self)
            stream.held -= 1
        log_ = stream.log
        if log_ is not None and not log_.closed and self._log_cursor is not None:
            log_.delete_cursor(self._log_cursor.name)
        self._log_cursor = None
        stream.trim()


def restored_holds(stream: TopicStream) -> list[str]:
    """The mirror ids whose holds the stream's log kept from an earlier run."""
    log_ = stream.log
    if log_ is None:
        return []
    return sorted(name[len(HOLD_PREFIX) :] for name in log_.cursors if is_hold_name(name))


# -- the offsets of what a channel keeps in its own stores -----------------------------------
#
# A message a channel of a held stream requeues (REQ, a timeout, its consumer gone), defers or
# copies out of its log's way (``release.py``) goes to the channel's own stores, and what they
# give back is a new ``Message`` without its offset. So the channel's keeping notes the offset by
# id when the message goes (``note_offsets``) and forgets it when the message is done
# (``forget_offsets``: FIN, dead-lettered, dropped; the channel emptied clears them all): the
# notes are the offsets of every message the channel keeps unfinished in its stores, on disk or
# read back, which ``unfinished_offsets`` adds to what it holds. A note outliving its message
# (a way out not seen here) costs a duplicate after a promotion, never a loss. Cost: a dict of
# the requeued messages' ids while a mirror holds the stream; nothing without one.
#
# **Across restarts.** The notes live in memory, so the stores keep the offsets too: a channel's
# store writes a message's topic offset with it (``record.FLAG_OFFSET``): its own when it has one
# (a copy of a message of the log), else the note (the channel's notes are the dict its stores
# were given, ``Stores.offset_notes``). A channel restored where a mirror held its topic (the
# log has a hold's cursor) reads those offsets from its stores before it reads anything back
# (``Keeping.note_stored``), and so does every channel of a topic a mirror holds for the first
# time (what it stored before, from the log). So a promotion finds every message a primary's
# channel keeps in its stores by offset, however often the primary restarted. Cost: 13 bytes a
# message in a store with an offset (an option block; a topic log's records carry none), and a
# read of a channel's stores at start-up when a mirror holds its topic, or when one first does.


def note_offsets(
    notes: dict[bytes, int], stream: TopicStream | None, messages: Iterable[Message]
) -> None:
    """Add the offsets of ``messages`` to ``notes`` if a mirror holds ``stream``."""
    if stream is None or not stream.held:
        return
    for m in messages:
        if m.offset >= 0:
            notes[m.id] = m.offset


def forget_offsets(notes: dict[bytes, int] | None, messages: Iterable[Message]) -> None:
    """``messages`` are done: their notes go."""
    if notes:
        for m in messages:
            notes.pop(m.id, None)


def unfinished_offsets(
    messages: Iterable[Message], notes: dict[bytes, int] | None = None
) -> tuple[list[int], list[bytes]]:
    """Of the messages a channel holds unfinished, the offsets known (sorted; with those of
    ``notes``, what it keeps in its stores) and the ids of those whose offset it does not know
    (read back from one of its stores before the stream was held, or after a restart)."""
    offsets: set[int] = set(notes.values()) if notes else set()
    ids: list[bytes] = []
    for m in messages:
        if m.offset >= 0:
            offsets.add(m.offset)
        elif notes is None or m.id not in notes:
            ids.append(m.id)
    return sorted(offsets), ids

"""HeldRelease: a ``--durable`` channel's messages held in flight, out of its topic log's way.

Theory of operation
-------------------
A durable channel leaves each message it reads unsettled in its topic's log until it is FIN'd
(``cursor.py``), so the log's low-water mark for the channel is its oldest message in flight.
One message a consumer holds for long (a slow job, a client that never answers within
``--msg-timeout``, up to 15 minutes) would keep that mark while the channel reads and finishes
everything after it: the segments stay on disk, and a ``kill -9`` replays everything published
since the held message (1.38 million duplicates for 652,133 messages in issue 30's harness).

So a message held too far back is **copied** to the channel's deferred store and its offset
settled once the copy is fsynced; the copy stands for it from then on (``DurableAcks.alias``:
a FIN acknowledges the copy). "Too far back" is:

* more than what is in flight plus one sync window (``--sync-every`` messages) behind what the
  channel has read: a crash then replays at most that much (and what the last sync window
  finished), not the backlog; a consumer's own RDY window never triggers a copy;
* or in a segment older than the one being written, so a message held across a segment keeps
  no old segment on disk however slow the traffic.

The copy is **due at once** if a crash brings it back (its ``deliver_at`` is the time of the
copy, in the past after a restart), as the log gives back its unsettled messages; at run time
it is never delivered on its own, the message in flight stands for it. Its ``attempts`` are the
deliveries so far, so after a crash it comes back counting them.

Cost. ``check`` runs at most once a second (``RELEASE_CHECK_S``) while the channel has unsettled
messages, and at once when a delivery round finds the mark a sync window behind (two offsets
compared per round, at most every ``RELEASE_RECHECK_S``); only then does it walk the in-flight
messages. The copy is one write and one urgent sync round per check that finds any, none for a
channel whose consumers finish what they get in time. A default-mode channel has none of this.
"""

from __future__ import annotations

import logging
import math
from typing import Protocol

from lmqd.engine.backend import BackendError, BackendQueue
from lmqd.engine.context import EngineContext
from lmqd.engine.durable import DurableAcks
from lmqd.engine.inflight import InFlightQueue
from lmqd.engine.sources import ReadySources
from lmqd.message import Message

__all__ = ["RELEASE_CHECK_S", "RELEASE_RECHECK_S", "HeldRelease"]

log = logging.getLogger("lmqd.channel")

RELEASE_CHECK_S = 1.0
"""How often a channel with unsettled messages checks whether one held in flight keeps the
log's low-water mark too far back: a comparison of two offsets, so once a second costs nothing.
A delivery round that finds the mark a sync window behind asks for the check at once."""

RELEASE_RECHECK_S = 0.1
"""The least time between two checks a delivery round asks for: until the copies of the last
one are fsynced the mark stays behind, and each check walks the in-flight messages."""


class ReleaseChannel(Protocol):
    """The channel, as ``HeldRelease`` sees it (``channel.Channel``)."""

    @property
    def ctx(self) -> EngineContext: ...

    @property
    def subject(self) -> str: ...

    @property
    def sources(self) -> ReadySources: ...

    @property
    def in_flight(self) -> InFlightQueue: ...

    def wake_at(self, deadline: float) -> None: ...


class ReleaseKeeping(Protocol):
    """The channel's keeping, as ``HeldRelease`` sees it (``keeping.DurableKeeping``)."""

    def open_deferred_store(self) -> BackendQueue | None: ...

    def load_deferred(self, in_flight: dict[bytes, Message] | None = None) -> None: ...

    def note(self, messages: list[Message]) -> None: ...


class HeldRelease:
    """Copies a durable channel's long-held in-flight messages out of its log's way."""

    __slots__ = ("_acks", "_channel", "_checked_at", "_keeping", "_release_at", "_window")

    def __init__(self, keeping: ReleaseKeeping, channel: ReleaseChannel, acks: DurableAcks) -> None:
        self._keeping = keeping
        self._channel = channel
        self._acks = acks
        self._release_at = math.inf
        """When ``check`` runs next (``math.inf``: nothing unsettled since the last one)."""
        self._checked_at = -math.inf
        """When ``check`` last looked."""
        self._window = channel.ctx.options.sync_every
        """One sync window, in messages."""

    @property
    def next_check(self) -> float:
        """When the channel's timer must call ``check`` (``math.inf``: no need)."""
        return self._release_at

    def delivered(self, now: float) -> None:
        """A delivery round ran at ``now``: a check within a second, or at once if the mark
        is a sync window behind what the channel read."""
        if self._release_at == math.inf:
            self._release_at = now + RELEASE_CHECK_S
        elif self._release_at > now and now >= self._checked_at + RELEASE_RECHECK_S:
            cursor = self._channel.sources.cursor
            if cursor is not None and cursor.low < self._behind(cursor.position):
                self._release_at = now
                self._channel.wake_at(now)

    def _behind(self, position: int) -> int:
        """Offsets below this are held too far back: what the channel read, less what is in
        flight and one sync window."""
        return position - len(self._channel.in_flight) - self._window

    def check(self, now: float) -> None:
        """Copy the messages held too far back (see the module docstring)."""
        if now < self._release_at:
            return
        channel = self._channel
        cursor = channel.sources.cursor
        self._release_at = math.inf
        if cursor is None or not cursor.unsettled_count:
            return
        self._release_at = now + RELEASE_CHECK_S
        self._checked_at = now
        log_ = cursor.stream.log
        if log_ is None:
            return
        limit = max(log_.write_segment_base, self._behind(cursor.position))
        if cursor.low >= limit:
            return
        held = [m for m in channel.in_flight if 0 <= m.offset < limit]
        if not held:
            return  # held by requeues whose copies are being synced: they settle soon
        copies = [Message(m.id, m.body, m.timestamp, m.attempts, now, ext=m.ext) for m in held]
        try:
            dq = self._keeping.open_deferred_store()
            if dq is None:
                return
            dq.put_many(copies)
        except BackendError as exc:
            log.warning(
                "%s: cannot copy %d long-held messages to the deferred store (they keep "
                "holding the log): %s",
                channel.subject,
                len(held),
                exc,
            )
            return
        offsets = {m.id: m.offset for m in held}
        self._keeping.note(held)  # a mirror follows them by these offsets (``holds.py``)
        unread = {m.id: m for m in held}
        for m in held:
            m.offset = -1  # its copy in the deferred store stands for it from now on
        self._keeping.load_deferred(unread)
        for m in unread.values():
            # Its copy was not read back (see the storage log): no alias, so the log keeps it.
            m.offset = offsets.pop(m.id)
        self._acks.settle_when_copied(list(offsets.values()), dq.stored, urgent=True)
        log.debug("%s: %d long-held messages copied to the deferred store", channel.subject,
                  len(offsets))  # fmt: skip

"""The mirror's bookkeeping, sans I/O: what to fetch next, what an answer means, the state and
lag of each followed topic, and the backoff while the primary does not answer.

Theory of operation
-------------------
For each followed topic a ``TopicLink`` knows the primary's end and earliest offset as last
heard, what the copy holds (its end, passed in: the topic's stream knows it), what is durable
(``acked``: the primary's hold moves there), and what went missing. A fetch asks each topic from
the copy's end; the answer's section says where to read on (``next``) and carries the messages
in ``[asked, next)`` the primary still had. Offsets of that range that did not come are
**missing**: below the hold's ``since`` in the answer that made the hold, for a copy that was
empty, they were finished before this mirror followed the primary (``skipped``); otherwise the
primary accepted them and no longer had them -- released past ``--mirror-max-lag``, lost in a
crash of a primary without ``--durable`` -- and they are a **gap**: counted, logged, and the
topic's state is ``gap`` for ``GAP_STATE_S``.

**State** (``stats.FOLLOW_STATES``): ``disconnected`` while the primary does not answer,
``gap`` (above), ``catching_up`` while the last answer did not reach the primary's end,
``following`` otherwise. **Lag**: messages, the primary's end minus the copy's; seconds, the age
of the oldest message not copied (its timestamp, which the primary sends as ``next_ts``: the
primary's clock), and while the primary does not answer, at least the time since it last did
(everything published since is not copied).

**Backoff**: after ``n`` failed requests in a row the next waits
``min(BACKOFF_MAX_S, BACKOFF_BASE_S * 2 ** (n - 1))``, reset by an answer.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

import attrs

from lmqd.mirror.stats import MirrorTopicStats
from lmqd.mirror.wire import Section

__all__ = [
    "BACKOFF_BASE_S",
    "BACKOFF_MAX_S",
    "GAP_STATE_S",
    "Backoff",
    "Missing",
    "TopicLink",
    "missing_offsets",
]

log = logging.getLogger("lmqd.mirror")

BACKOFF_BASE_S = 0.5
BACKOFF_MAX_S = 30.0
"""A primary that is down is asked at most twice a minute: its restart is noticed within 30 s,
and a dead machine costs a log line per try, not a busy loop."""
GAP_STATE_S = 300.0
"""How long a topic stays in state ``gap`` after offsets went missing (the counter stays)."""


@attrs.define
class Backoff:
    """Delays between failed requests to the primary."""

    failures: int = 0
    last_error: str = ""

    def failed(self, error: str) -> float:
        """A request failed: the delay before the next."""
        self.failures += 1
        self.last_error = error
        return float(min(BACKOFF_MAX_S, BACKOFF_BASE_S * 2.0 ** (self.failures - 1)))

    def succeeded(self) -> None:
        self.failures = 0
        self.last_error = ""


@attrs.frozen
class Missing:
    """What an answer did not bring: offsets finished before the mirror came, and a gap."""

    skipped: int = 0
    gap: int = 0
    first_gap: int = -1
    """The first offset of the gap (-1: none)."""


def missing_offsets(
    asked: int, next_offset: int, spans: Sequence[tuple[int, int]]
) -> list[tuple[int, int]]:
    """The ranges ``[start, end)`` of ``[asked, next_offset)`` not in ``spans`` (the ranges
    an answer brought, ascending)."""
    out: list[tuple[int, int]] = []
    position = asked
    for start, end in spans:
        if start > position:
            out.append((position, start))
        position = max(position, end)
    if next_offset > position:
        out.append((position, next_offset))
    return out


@attrs.define
class TopicLink:
    """One followed topic's bookkeeping; see the module docstring."""

    name: str
    primary_end: int = 0
    primary_earliest: int = 0
    acked: int = 0
    """The copy is durable below this offset (what the primary's hold may pass)."""
    next_ts: int = 0
    """Timestamp (ns) of the oldest message not copied, 0 when caught up."""
    caught_up: bool = False
    """The last answer reached the primary's end."""
    copied: int = 0
    gap: int = 0
    skipped: int = 0
    gap_at: float = -math.inf
    """Trio time of the last gap found."""
    channels: int = 0
    untracked: int = 0

    def answered(
        self,
        section: Section,
        asked: int,
        spans: Sequence[tuple[int, int]],
        *,
        copy_was_empty: bool,
        now: float,
    ) -> Missing:
        """A fetch answer's section for this topic, asked from ``asked``, whose messages were
        at the offsets ``spans`` (``[start, end)`` ranges, ascending). Returns what went
        missing (and logs a gap)."""
        self.primary_end = section.end
        self.primary_earliest = section.earliest
        self.next_ts = section.next_ts
        self.caught_up = section.next_offset >= section.end
        spans = [(max(start, asked), end) for start, end in spans if end > asked]
        self.copied += sum(end - start for start, end in spans)
        holes = missing_offsets(asked, section.next_offset, spans)
        if not holes:
            return Missing()
        skipped = gap = 0
        first_gap = -1
        for start, end in holes:
            if section.new_hold and copy_was_empty and start < section.since:
                below = min(end, section.since) - start
                skipped += below
                start += below
            if end > start:
                gap += end - start
                if first_gap < 0:
                    first_gap = start
        self.skipped += skipped
        if skipped:
            log.info(
                "MIRROR: TOPIC(%s): %d offsets below %d were finished before this mirror "
                "followed the primary (not stored there): not copied",
                self.name, skipped, section.since,
            )  # fmt: skip
        if gap:
            self.gap += gap
            self.gap_at = now
            log.error(
                "MIRROR: TOPIC(%s): GAP: %d offsets from %d were accepted by the primary and "
                "were gone when this mirror asked for them (%d in all)",
                self.name, gap, first_gap, self.gap,
            )  # fmt: skip
        return Missing(skipped, gap, first_gap)

    def state(self, *, connected: bool, now: float) -> str:
        if not connected:
            return "disconnected"
        if now - self.gap_at < GAP_STATE_S:
            return "gap"
        return "following" if self.caught_up else "catching_up"

    def statistics(
        self,
        end_offset: int,
        *,
        connected: bool,
        now: float,
        wall_ns: int,
        last_contact_ns: int,
    ) -> MirrorTopicStats:
        lag = max(self.primary_end - end_offset, 0)
        lag_s = max(wall_ns - self.next_ts, 0) / 1e9 if lag and self.next_ts else 0.0
        if not connected and last_contact_ns:
            lag_s = max(lag_s, (wall_ns - last_contact_ns) / 1e9)
        return MirrorTopicStats(
            topic_name=self.name,
            state=self.state(connected=connected, now=now),
            lag_messages=lag,
            lag_seconds=lag_s,
            copied_messages=self.copied,
            gap_messages=self.gap,
            skipped_messages=self.skipped,
            end_offset=end_offset,
            channels=self.channels,
            untracked_messages=self.untracked,
        )

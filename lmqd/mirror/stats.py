"""Frozen snapshots of replication, for ``/stats`` (a ``mirror`` object on a mirror, a
``mirrors`` list on a primary), ``/metrics`` and ``lmqadmin stats``: the follower and the
registry build them, the others only serialise them (as ``lmqd.stats``'s)."""

from __future__ import annotations

from typing import Any

import attrs

__all__ = [
    "FOLLOW_STATES",
    "InSyncStats",
    "MirrorHoldStats",
    "MirrorLinkStats",
    "MirrorStats",
    "MirrorTopicStats",
]

FOLLOW_STATES = ("following", "catching_up", "disconnected", "gap")
"""A followed topic's state: copying as it comes (``following``: no more than a fetch behind),
copying a backlog (``catching_up``), the primary not answering (``disconnected``), or offsets
the primary no longer had when the mirror asked for them (``gap``, until the operator has seen
it: it stays until the mirror restarts or is promoted, and ``gap_messages`` counts them)."""


@attrs.frozen(kw_only=True)
class MirrorTopicStats:
    """One topic a mirror follows."""

    topic_name: str
    state: str
    lag_messages: int
    """Offsets the primary has that the copy has not (at the last answer)."""
    lag_seconds: float
    """Age of the oldest message not copied (the primary's clock); since the last contact
    while disconnected."""
    copied_messages: int
    """Messages copied since this mirror started."""
    gap_messages: int
    """Offsets the primary had accepted but no longer held when the mirror asked for them."""
    skipped_messages: int
    """Offsets the primary had finished (and not stored) before this mirror followed it."""
    end_offset: int
    """The copy's end (the next offset it takes)."""
    channels: int
    untracked_messages: int
    """Messages the primary's channels hold unfinished without a known offset (their own disk
    stores): followed by count only, see docs/mirrors.md."""

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


@attrs.frozen(kw_only=True)
class MirrorStats:
    """A mirror's view of its primary and of every topic it follows."""

    primary: str
    primary_node_id: str
    primary_epoch: int
    node_id: str
    epoch: int
    state: str
    """``following`` while every topic is; else the worst of them (``gap`` before
    ``disconnected`` before ``catching_up``); ``promoted`` once promoted."""
    last_contact: float
    """Unix time of the last answer from the primary (0: none yet)."""
    seconds_since_contact: float
    """-1 before the first answer."""
    failures: int
    """Requests to the primary that failed in a row (the backoff grows with them)."""
    last_error: str
    topics: tuple[MirrorTopicStats, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        out = attrs.asdict(self, recurse=False)
        out["topics"] = [t.to_dict() for t in self.topics]
        return out


@attrs.frozen(kw_only=True)
class MirrorHoldStats:
    """One topic of one mirror of this primary (its hold, ``lmqd.engine.holds``)."""

    topic_name: str
    in_sync: bool
    """In sync (Kafka's ISR, docs/mirrors.md): it fetched within --mirror-ack-timeout and, within
    that time too, had copied everything or asked from the end it was last told of."""
    in_sync_since: float
    """Unix time of the fetch that made it in sync (0: not in sync)."""
    stored_offset: int
    """Where its last fetch read from: it has stored everything below."""
    synced_offset: int
    """Below this it said its copy is durable (fsynced on a --durable mirror; as stored
    otherwise): what --min-insync-mirrors counts."""
    end_offset: int
    """The topic's end here."""
    lag_messages: int
    """Offsets the primary keeps for it (below ``end_offset``, not copied, not released)."""


@attrs.frozen(kw_only=True)
class MirrorLinkStats:
    """One mirror of this primary."""

    mirror_id: str
    address: str
    remote_address: str
    durable: bool
    last_contact: float
    """Unix time of its last request (0: none since this primary started)."""
    seconds_since_contact: float
    """-1: no request since this primary started (a hold restored from the logs)."""
    lag_messages: int
    """Offsets it has not copied, over every topic."""
    released_messages: int
    """Offsets the primary let go uncopied because the mirror lagged past --mirror-max-lag."""
    topics: int
    in_sync: bool
    """In sync on every topic it holds (and it holds some)."""
    in_sync_since: float
    """Unix time since which it has been in sync on every topic (0: not in sync)."""
    topics_in_sync: int
    holds: tuple[MirrorHoldStats, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


@attrs.frozen(kw_only=True)
class InSyncStats:
    """A primary's publishes held for its mirrors (``--min-insync-mirrors``,
    ``lmqd.engine.insync``); counts since this primary started."""

    min_insync_mirrors: int
    """The flag: the default of the topics' ``min_insync_mirrors`` policy."""
    mirror_ack_timeout: float
    waiting_publishes: int
    """Publishes whose ``OK`` waits for the mirrors now."""
    held_publishes: int
    """Publishes (a command, an HTTP request) whose ``OK`` waited for the mirrors."""
    refused_publishes: int
    """Refused before anything was stored: fewer mirrors in sync than needed."""
    timed_out_publishes: int
    """Failed after the append: not stored by enough mirrors within the timeout."""
    topics_below: tuple[str, ...]
    """Topics with fewer mirrors in sync than they need (their ``min_insync_mirrors``): their
    publishes are refused."""

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)

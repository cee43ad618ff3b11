"""What a primary and its mirrors say to each other, both sides: the followed state of topics
and channels (``GET /mirror/topics``) and the sections of a fetch (``POST /mirror/fetch``).

**Topics** (JSON): per non-ephemeral topic, where its stream starts and ends, how far the pump
handed it on, its paused flag and policy, and per non-ephemeral channel where it reads
(``position``), the ranges it steps over (``skips``, a topic empty), what it holds unfinished by
offset as ranges (``unfinished``: in flight, requeued, deferred, in its priority lanes; the
offsets of a channel that keeps up are a few ranges, whatever their number), the due times of
its deferred ones (``deferred``: a REQ's delay is the channel's, not the log's) and the attempts
of those delivered more than once, how many it holds whose offsets it does not know
(``untracked``: read back from its own disk stores), its paused flag and policy::

    {"node_id": "9a1e...", "epoch": 0, "topics": {"orders": {
        "earliest": 0, "end": 1200, "pumped": 1200, "paused": false, "policy": {},
        "channels": {"billing": {"position": 1150, "skips": [], "unfinished": [[1100, 1150]],
                                 "deferred": [[1101, 1700000060000]], "attempts": [[1102, 3]],
                                 "untracked": 0, "paused": false, "policy": {}}}}}}

**Fetch**: the mirror posts, for each topic, the offset it reads from and the offset below which
it has its copy (``acked``: the primary's hold moves there, ``lmqd.engine.holds``); the answer
is one section per topic with news, each a fixed header, the topic's name and its copy frames
(``frames.py``)::

    0  2  name length n       2  8  next: where to read on     10  8  end: the stream's end
   18  8  earliest stored    26  8  since (``holds.py``)       34  8  the timestamp of the
   42  4  frames length f    46  1  flags (0x01: new hold,          message at ``next`` (0:
                                       0x02: publishes waiting)
   47  n  name               47+n f copy frames                     none, caught up)
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from typing import Any

import attrs

from lmqd.engine.channel import Channel
from lmqd.engine.holds import unfinished_offsets
from lmqd.engine.topic import Topic

__all__ = [
    "FLAG_NEW_HOLD",
    "FLAG_WAITING",
    "SECTION",
    "ChannelFollow",
    "Section",
    "TopicFollow",
    "decode_sections",
    "describe_topic",
    "encode_section",
    "from_ranges",
    "to_ranges",
]

MAX_UNTRACKED_IDS = 10_000
"""Ids of untracked messages listed per channel at most (the rest are only counted)."""

SECTION = struct.Struct(">HqqqqqIB")
FLAG_NEW_HOLD = 0x01
FLAG_WAITING = 0x02
"""Publishes on the primary wait for this topic's mirrors (``--min-insync-mirrors``): a
``--durable`` mirror fsyncs what it copied before its next fetch, which acknowledges it."""


def to_ranges(offsets: Sequence[int]) -> list[list[int]]:
    """Sorted offsets as ``[start, end)`` ranges of consecutive ones."""
    out: list[list[int]] = []
    for offset in offsets:
        if out and out[-1][1] == offset:
            out[-1][1] = offset + 1
        elif not out or out[-1][1] < offset:
            out.append([offset, offset + 1])
    return out


def from_ranges(ranges: Iterable[Sequence[int]]) -> list[int]:
    """The offsets of ``to_ranges``'s ranges."""
    out: list[int] = []
    for start, end in ranges:
        out.extend(range(start, end))
    return out


# -- the primary's side ------------------------------------------------------------------------


def describe_channel(channel: Channel) -> dict[str, Any]:
    """A channel as a mirror follows it (see the module docstring)."""
    cursor = channel.cursor
    assert cursor is not None
    sources = channel.sources
    held = channel.keeping.held_messages()
    offsets, ids = unfinished_offsets(held, channel.keeping.offset_notes)
    # What the stores hold without an offset: at most what they had when last read.
    on_disk = min(channel.keeping.unnoted_stored, sources.stored_depth)
    log_ = cursor.stream.log
    assert log_ is not None
    to_wall = log_.timebase.to_wall_ns
    return {
        "position": cursor.position,
        "skips": [list(r) for r in cursor.skips],
        "unfinished": to_ranges(offsets),
        "deferred": sorted(
            [m.offset, to_wall(m.deliver_at) // 1_000_000]
            for m in channel.deferred
            if m.offset >= 0
        ),
        "attempts": sorted(
            [m.offset, m.attempts] for m in held if m.attempts > 1 and m.offset >= 0
        ),
        "untracked": len(ids) + on_disk,
        "untracked_ids": [i.decode("ascii", "replace") for i in ids[:MAX_UNTRACKED_IDS]],
        "paused": channel.paused,
        "policy": dict(channel.policy_settings),
    }


def describe_topic(topic: Topic) -> dict[str, Any]:
    """A topic and its stored channels as a mirror follows them."""
    stream = topic.stream
    return {
        "earliest": stream.earliest_offset,
        "end": stream.next_offset,
        "pumped": stream.pumped,
        "paused": topic.paused,
        "policy": dict(topic.policy_settings),
        "channels": {
            name: describe_channel(c)
            for name, c in sorted(topic.channels.items())
            if c.cursor is not None and not c.exiting
        },
    }


def encode_section(
    name: str,
    frames: bytes,
    *,
    next_offset: int,
    end: int,
    earliest: int,
    since: int,
    next_ts: int,
    new_hold: bool,
    waiting: bool = False,
) -> bytes:
    raw = name.encode()
    flags = (FLAG_NEW_HOLD if new_hold else 0) | (FLAG_WAITING if waiting else 0)
    head = SECTION.pack(len(raw), next_offset, end, earliest, since, next_ts, len(frames),
                        flags)  # fmt: skip
    return head + raw + frames


# -- the mirror's side ---------------------------------------------------------------------------


@attrs.frozen
class Section:
    """One topic's part of a fetch answer."""

    topic: str
    next_offset: int
    end: int
    earliest: int
    since: int
    next_ts: int
    new_hold: bool
    frames: bytes
    waiting: bool = False
    """Publishes on the primary wait for this mirror's acknowledgement (``FLAG_WAITING``)."""


def decode_sections(data: bytes) -> list[Section]:
    """The sections of a fetch answer; raises ``ValueError`` if it is not framed so."""
    out: list[Section] = []
    pos = 0
    head = SECTION.size
    while pos < len(data):
        if pos + head > len(data):
            raise ValueError("truncated section")
        n, nxt, end, earliest, since, next_ts, length, flags = SECTION.unpack_from(data, pos)
        start = pos + head
        stop = start + n + length
        if stop > len(data):
            raise ValueError("truncated section")
        name = data[start : start + n].decode()
        out.append(Section(name, nxt, end, earliest, since, next_ts, bool(flags & FLAG_NEW_HOLD),
                           data[start + n : stop], bool(flags & FLAG_WAITING)))  # fmt: skip
        pos = stop
    return out


@attrs.frozen
class ChannelFollow:
    """A primary's channel as its mirror last heard of it."""

    position: int
    skips: tuple[tuple[int, int], ...] = ()
    unfinished: tuple[tuple[int, int], ...] = ()
    deferred: tuple[tuple[int, int], ...] = ()
    """(offset, due time in wall-clock ms) of the unfinished messages waiting for a time (a
    DPUB's, or a REQ's delay, which only the channel knows)."""
    attempts: tuple[tuple[int, int], ...] = ()
    """(offset, attempts) of the unfinished messages delivered more than once."""
    untracked: int = 0
    untracked_ids: tuple[str, ...] = ()
    paused: bool = False
    policy: tuple[tuple[str, Any], ...] = ()

    @property
    def oldest(self) -> int:
        """The oldest offset the channel still needs (its position, or older unfinished)."""
        return min(self.position, self.unfinished[0][0]) if self.unfinished else self.position

    @classmethod
    def from_json(cls, doc: Any) -> ChannelFollow:
        """Raises ``ValueError`` (or ``KeyError``, ``TypeError``) for a malformed one."""
        return cls(
            position=_offset(doc["position"]),
            skips=_ranges(doc.get("skips", [])),
            unfinished=_ranges(doc.get("unfinished", [])),
            deferred=_pairs(doc.get("deferred", [])),
            attempts=_pairs(doc.get("attempts", [])),
            untracked=_offset(doc.get("untracked", 0)),
            untracked_ids=tuple(str(i) for i in doc.get("untracked_ids", [])),
            paused=bool(doc.get("paused", False)),
            policy=tuple(sorted(dict(doc.get("policy", {})).items())),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "position": self.position,
            "skips": [list(r) for r in self.skips],
            "unfinished": [list(r) for r in self.unfinished],
            "deferred": [list(p) for p in self.deferred],
            "attempts": [list(p) for p in self.attempts],
            "untracked": self.untracked,
            "untracked_ids": list(self.untracked_ids),
            "paused": self.paused,
            "policy": dict(self.policy),
        }


@attrs.frozen
class TopicFollow:
    """A primary's topic as its mirror last heard of it."""

    earliest: int = 0
    end: int = 0
    pumped: int = 0
    paused: bool = False
    policy: tuple[tuple[str, Any], ...] = ()
    channels: tuple[tuple[str, ChannelFollow], ...] = ()

    @property
    def channel_map(self) -> dict[str, ChannelFollow]:
        return dict(self.channels)

    @classmethod
    def from_json(cls, doc: Any) -> TopicFollow:
        """Raises ``ValueError`` (or ``KeyError``, ``TypeError``) for a malformed one."""
        channels = doc.get("channels", {})
        if not isinstance(channels, dict):
            raise ValueError("channels is not an object")
        return cls(
            earliest=_offset(doc.get("earliest", 0)),
            end=_offset(doc.get("end", 0)),
            pumped=_offset(doc.get("pumped", 0)),
            paused=bool(doc.get("paused", False)),
            policy=tuple(sorted(dict(doc.get("policy", {})).items())),
            channels=tuple(
                (str(name), ChannelFollow.from_json(c)) for name, c in sorted(channels.items())
            ),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "earliest": self.earliest,
            "end": self.end,
            "pumped": self.pumped,
            "paused": self.paused,
            "policy": dict(self.policy),
            "channels": {name: c.to_json() for name, c in self.channels},
        }


def _offset(value: Any) -> int:
    if type(value) is not int or value < 0:
        raise ValueError(f"not an offset: {value!r}")
    return value


def _pairs(value: Any) -> tuple[tuple[int, int], ...]:
    out = []
    for item in value:
        first, second = item
        out.append((_offset(first), _offset(second)))
    return tuple(out)


def _ranges(value: Any) -> tuple[tuple[int, int], ...]:
    out = []
    for item in value:
        start, end = item
        if _offset(start) > _offset(end):
            raise ValueError(f"bad range {item!r}")
        out.append((start, end))
    return tuple(out)

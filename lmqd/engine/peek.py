"""Peek: what a topic or channel holds, in each state, without changing anything.

Operators look into queues (nsqd#848) without consuming: the messages a topic has not handed
on, a channel's ready messages in the order it would deliver them, its deferred messages by due
time, its in-flight messages by deadline. Every function here only reads (no cursor moves, no
store is read from, nothing is settled) and returns at most ``count`` entries, so a peek costs
what it shows: the ready ones come from the stores' own peeks (``SpillQueue.peek``,
``ChannelCursor.peek``: memory, the log's read-by-offset, a disk queue's files), the others are
``heapq.nsmallest`` over the channel's in-memory heaps.
"""

from __future__ import annotations

import heapq
from operator import attrgetter

import attrs

from lmqd.engine.channel import Channel
from lmqd.engine.topic import Topic
from lmqd.message import Message

__all__ = ["MAX_PEEK", "PEEK_STATES", "Peeked", "peek_channel", "peek_topic"]

PEEK_STATES = ("queued", "deferred", "in_flight")
MAX_PEEK = 1000
"""The most entries one peek returns: enough to look, bounded like every read of the API."""

_deadline = attrgetter("deadline")
_deliver_at = attrgetter("deliver_at")


@attrs.frozen
class Peeked:
    """One message as a peek shows it; times on the trio clock (0: none)."""

    message: Message
    offset: int
    """Its offset in the topic's log, -1 where it has none (a channel's own store)."""
    deliver_at: float
    deadline: float


def peek_topic(topic: Topic, count: int) -> list[Peeked]:
    """The messages the topic has not handed to its channels yet (its ``depth``), oldest
    first."""
    stream = topic.stream
    return [
        Peeked(m, offset, m.deliver_at, 0.0)
        for offset, m in stream.peek(stream.pumped, stream.next_offset, count)
    ]


def peek_channel(channel: Channel, state: str, count: int) -> list[Peeked]:
    """The channel's messages in ``state`` (one of ``PEEK_STATES``): ready ones in delivery
    order, deferred ones by due time, in-flight ones by deadline."""
    if state == "queued":
        return [Peeked(m, offset, 0.0, 0.0) for offset, m in channel.sources.peek_queued(count)]
    if state == "deferred":
        return [
            Peeked(m, m.offset, m.deliver_at, 0.0)
            for m in heapq.nsmallest(count, channel.deferred, key=_deliver_at)
        ]
    if state == "in_flight":
        return [
            Peeked(m, m.offset, 0.0, m.deadline)
            for m in heapq.nsmallest(count, channel.in_flight, key=_deadline)
        ]
    raise ValueError(f"unknown state {state!r}")

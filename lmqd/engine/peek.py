"""Peek: what a topic or channel holds, in each state, without changing anything.

Operators look into queues (nsqd#848) without consuming: the messages a topic has not handed
on, a channel's ready messages in the order it would deliver them, its deferred messages by due
time, its in-flight messages by deadline. Every function here only reads (no cursor moves, no
store is read from, nothing is settled) and returns at most ``count`` entries, so a peek costs
what it shows: the ready ones come from the stores' own peeks (``SpillQueue.peek``,
``ChannelCursor.peek``: memory, the log's read-by-offset, a disk queue's files), the others are
``heapq.nsmallest`` over the channel's in-memory heaps.

Paging (``skip``): a topic's queued messages are a range of its log, so skipping is an offset
(cost: the page). A channel's ready messages come from several stores in delivery order (the
priority lanes, its own store, then the cursor, which steps over messages already settled), so
skipping reads the skipped ones too, as do the heaps' ``nsmallest``: a page costs ``skip +
count`` reads, which ``MAX_PEEK_SKIP`` bounds.
"""

from __future__ import annotations

import heapq
from operator import attrgetter

import attrs

from lmqd.engine.channel import Channel
from lmqd.engine.topic import Topic
from lmqd.message import Message

__all__ = ["MAX_PEEK", "MAX_PEEK_SKIP", "PEEK_STATES", "Peeked", "peek_channel", "peek_topic"]

PEEK_STATES = ("queued", "deferred", "in_flight")
MAX_PEEK = 1000
"""The most entries one peek returns: enough to look, bounded like every read of the API."""
MAX_PEEK_SKIP = 100_000
"""The most entries a peek skips. A channel's page reads what it skips, on the event loop:
a page of 1,000 after 100,000 messages of ~100 bytes read from the log took 0.13 s (median of
5; 0.016 s after 10,000), about the most one admin request should hold the daemon up; deeper
than that, read the topic's log by offset."""

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


def peek_topic(topic: Topic, count: int, skip: int = 0) -> list[Peeked]:
    """The messages the topic has not handed to its channels yet (its ``depth``), oldest
    first, after the first ``skip`` of them."""
    stream = topic.stream
    return [
        Peeked(m, offset, m.deliver_at, 0.0)
        for offset, m in stream.peek(stream.pumped + skip, stream.next_offset, count)
    ]


def peek_channel(channel: Channel, state: str, count: int, skip: int = 0) -> list[Peeked]:
    """The channel's messages in ``state`` (one of ``PEEK_STATES``): ready ones in delivery
    order, deferred ones by due time, in-flight ones by deadline; after the first ``skip``."""
    upto = skip + count
    if state == "queued":
        ready = channel.sources.peek_queued(upto)[skip:]
        return [Peeked(m, offset, 0.0, 0.0) for offset, m in ready]
    if state == "deferred":
        return [
            Peeked(m, m.offset, m.deliver_at, 0.0)
            for m in heapq.nsmallest(upto, channel.deferred, key=_deliver_at)[skip:]
        ]
    if state == "in_flight":
        return [
            Peeked(m, m.offset, 0.0, m.deadline)
            for m in heapq.nsmallest(upto, channel.in_flight, key=_deadline)[skip:]
        ]
    raise ValueError(f"unknown state {state!r}")

"""Replica: a mirror's copy of a primary's topic, and its channels' followed positions.

Theory of operation
-------------------
A mirror (``lmqd.mirror``) keeps, for every topic of its primary, a topic of its own whose log
holds the same messages **at the same offsets**: ``store_copies`` appends what the primary's
``/mirror/read`` sent straight to the log at those offsets (a gap where the primary had none:
the log keeps gaps as a consumed memory tail leaves them), never through the publish path, so
ids, timestamps, attempts, deferred due times and lmq extensions are the primary's and nothing
is given a new id or offset. The memory tail stays empty: a mirror delivers nothing while it
follows, so everything goes to disk once, as in write-through.

A followed topic does not pump (``Topic.following``): its ``pumped`` offset is the primary's
(``follow_pumped``), and each followed channel is a channel of the topic whose cursor stands
where the primary's channel reads (``follow_channel``, not a replay: the pushed messages were
pushed there by the primary's pump) with the primary's skips (a topic empty). What the
primary's channel holds unfinished -- in flight, requeued, deferred, in its priority lanes --
is a list of offsets the mirror keeps beside (``lmqd.mirror.state``), and a log cursor
``#unfinished`` at the oldest of them keeps their segments (``keep_unfinished``).

**Promotion** (``promote_topic``) makes the topic a primary's again: the stream's write mode
follows its policy, each followed channel gets copies of its unfinished messages read from the
log (``restore_unfinished``: into its deferred queue, its lanes or its ready queue, as the
primary had them), ``#unfinished`` goes, and the pump starts. A channel then delivers again
exactly what the primary had not finished when it was last followed, plus what the primary
finished in the last second before it was lost (at least once).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from lmqd.engine.channel import Channel
from lmqd.engine.cursor import pushed
from lmqd.engine.topic import Topic
from lmqd.message import Message

__all__ = [
    "UNFINISHED_CURSOR",
    "advance_copy",
    "follow_channel",
    "follow_pumped",
    "keep_unfinished",
    "promote_topic",
    "restore_unfinished",
    "store_copies",
]

log = logging.getLogger("lmqd.mirror")

RESTORE_CHUNK = 2048
"""Offsets ``restore_unfinished`` reads per step (``TopicStream.messages_at`` reads the log
once for the range a step spans: a pump batch's worth)."""

UNFINISHED_CURSOR = "#unfinished"
"""The log cursor that keeps the segments of the followed channels' unfinished messages."""


def store_copies(topic: Topic, entries: Sequence[tuple[int, Message]]) -> int:
    """Append the primary's messages at their offsets (ascending, at or after the topic's
    end; those below it are skipped: a copy already stored); returns how many were stored.
    Raises ``BackendError`` having stored none of the run that failed (the earlier runs
    stay, the next read asks again from the end)."""
    stream = topic.stream
    log_ = stream.log
    if log_ is None:
        raise ValueError(f"topic {topic.name} has no log to copy into")
    fresh = [e for e in entries if e[0] >= stream.next_offset]
    if not fresh:
        return 0
    stored = 0
    start = 0
    while start < len(fresh):
        end = start + 1
        while end < len(fresh) and fresh[end][0] == fresh[end - 1][0] + 1:
            end += 1
        run = fresh[start:end]
        first = run[0][0]
        messages = [m for _, m in run]
        log_.append_many(messages, first, cache=False)
        nbytes = sum(len(m.body) for m in messages)
        stream.next_offset = first + len(messages)
        stream.tail.reset(stream.next_offset)
        stream.byte_marks.note(stream.next_offset, nbytes)
        stream.note_pushed([first + k for k, m in enumerate(messages) if pushed(m)])
        topic.message_count += len(messages)
        topic.message_bytes += nbytes
        stored += len(messages)
        start = end
    stream.wrote_backend = True
    syncer = topic.ctx.syncer
    if syncer is not None:
        syncer.note_dirty(stream)
    return stored


def advance_copy(topic: Topic, until: int) -> None:
    """The primary has nothing below ``until`` that the copy lacks (read on from there): the
    offsets the copy skips are a gap in its log, as they are in the primary's."""
    stream = topic.stream
    log_ = stream.log
    if log_ is None or until <= stream.next_offset:
        return
    log_.advance_to(until)
    stream.next_offset = until
    stream.tail.reset(until)
    syncer = topic.ctx.syncer
    if syncer is not None:
        syncer.note_dirty(stream)


def follow_pumped(topic: Topic, pumped: int) -> None:
    """The primary has handed its channels the stream up to ``pumped`` (clamped to what the
    copy holds)."""
    stream = topic.stream
    value = min(max(pumped, 0), stream.next_offset)
    if value != stream.pumped:
        stream.pumped = value
        stream.move_topic_cursor()


def follow_channel(channel: Channel, position: int, skips: Sequence[tuple[int, int]]) -> int:
    """Stand the channel's cursor where the primary's reads (clamped to what the copy holds),
    stepping over ``skips``; returns the position."""
    cursor = channel.cursor
    if cursor is None:
        raise ValueError(f"channel {channel.topic_name}:{channel.name} has no cursor")
    if cursor.position == position and cursor.skips == list(skips):
        return position
    at = cursor.seek(position)
    cursor.replay_until = 0  # not a replay: the primary's pump pushed what it had to
    for start, end in skips:
        if end > at:
            cursor.skip(max(start, at), end)
    return at


def keep_unfinished(topic: Topic, oldest: int | None) -> None:
    """Keep the log's segments from ``oldest`` on (the oldest unfinished offset of the followed
    channels; None: nothing unfinished below their positions)."""
    log_ = topic.stream.log
    if log_ is None or log_.closed:
        return
    cursor = log_.cursor(UNFINISHED_CURSOR)
    if oldest is None:
        if cursor is not None:
            log_.delete_cursor(UNFINISHED_CURSOR)
        return
    target = topic.stream.log_target(oldest)
    if cursor is None:
        log_.create_cursor(UNFINISHED_CURSOR, target)
    elif cursor.position != target:
        cursor.seek(target)


def restore_unfinished(
    channel: Channel,
    stream_offsets: Sequence[int],
    now: float,
    *,
    due: Mapping[int, float] | None = None,
    attempts: Mapping[int, int] | None = None,
) -> int:
    """Put copies of the messages at ``stream_offsets`` (read from the topic's stream) into the
    channel, as the primary held them: deferred ones wait for their time (``due``: trio time
    by offset, where the primary's channel had its own, a REQ's delay), those with a priority
    go to their lanes, the rest are ready (``Channel.put_many``); ``attempts`` by offset.
    Returns how many were found (the caller reports the others). Raises ``BackendError`` (a
    durable channel's stores: they are written at once, and the caller syncs them)."""
    cursor = channel.cursor
    if not stream_offsets or cursor is None:
        return 0
    stream = cursor.stream
    found: list[Message] = []
    for i in range(0, len(stream_offsets), RESTORE_CHUNK):
        found += stream.messages_at(list(stream_offsets[i : i + RESTORE_CHUNK]))
    if not found:
        return 0
    for m in found:
        if due and m.offset in due:
            m.deliver_at = due[m.offset]
        if attempts and m.offset in attempts:
            m.attempts = attempts[m.offset]
        if channel.durable:
            m.offset = -1  # its copy in the channel's stores stands for it from now on
    channel.put_many(found, now)
    channel.request_delivery()
    return len(found)


def promote_topic(topic: Topic) -> None:
    """Stop following: the stream writes as its policy says, ``#unfinished`` goes (the
    channels now hold those messages themselves), and the pump starts."""
    keep_unfinished(topic, None)
    topic.following = False
    topic.stream.set_write_through(topic.policy.retains or topic.options.durable)
    topic.wake_pump()

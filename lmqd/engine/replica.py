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

import attrs

from lmqd.engine.channel import Channel
from lmqd.engine.cursor import pushed
from lmqd.engine.topic import Topic
from lmqd.message import Message

__all__ = [
    "UNFINISHED_CURSOR",
    "Copy",
    "PlainRun",
    "advance_copy",
    "copy_spans",
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


@attrs.frozen
class PlainRun:
    """Consecutive plain messages of a copy (no extension, not deferred, attempts 0, one
    timestamp: a publish's), as columns: stored without a message object each
    (``TopicLog.append_plain``), the common case of a mirror's copy."""

    first: int
    ids: list[bytes]
    bodies: list[bytes]
    timestamp: int


Copy = PlainRun | tuple[int, Message]
"""What a mirror stores: a plain run, or one message at its offset."""


def store_copies(topic: Topic, copies: Sequence[Copy]) -> int:
    """Append the primary's messages at their offsets (ascending, at or after the topic's
    end; those below it are skipped: a copy already stored); returns how many were stored.
    Raises ``BackendError`` having stored none of the run that failed (the earlier runs
    stay, the next read asks again from the end)."""
    stream = topic.stream
    log_ = stream.log
    if log_ is None:
        raise ValueError(f"topic {topic.name} has no log to copy into")
    stored = 0
    nbytes = 0
    pending: list[tuple[int, Message]] = []
    for copy in copies:
        if isinstance(copy, PlainRun):
            stored, nbytes = _store_messages(topic, pending, stored, nbytes)
            pending = []
            skip = max(stream.next_offset - copy.first, 0)
            if skip >= len(copy.ids):
                continue
            first = copy.first + skip
            bodies = copy.bodies[skip:] if skip else copy.bodies
            log_.append_plain(copy.ids[skip:] if skip else copy.ids, bodies, copy.timestamp, first)
            size = sum(map(len, bodies))
            _stored(topic, first + len(bodies), size)
            stored += len(bodies)
            nbytes += size
        elif copy[0] >= stream.next_offset:
            if pending and copy[0] != pending[-1][0] + 1:
                stored, nbytes = _store_messages(topic, pending, stored, nbytes)
                pending = []
            pending.append(copy)
    stored, nbytes = _store_messages(topic, pending, stored, nbytes)
    if stored:
        topic.message_count += stored
        topic.message_bytes += nbytes
        stream.wrote_backend = True
        syncer = topic.ctx.syncer
        if syncer is not None:
            syncer.note_dirty(stream)
    return stored


def copy_spans(copies: Sequence[Copy]) -> list[tuple[int, int]]:
    """The offsets ``copies`` hold, as ``[start, end)`` ranges (ascending as they are)."""
    spans: list[tuple[int, int]] = []
    for copy in copies:
        if isinstance(copy, PlainRun):
            start, end = copy.first, copy.first + len(copy.ids)
        else:
            start, end = copy[0], copy[0] + 1
        if spans and spans[-1][1] == start:
            spans[-1] = (spans[-1][0], end)
        else:
            spans.append((start, end))
    return spans


def _store_messages(
    topic: Topic, run: list[tuple[int, Message]], stored: int, nbytes: int
) -> tuple[int, int]:
    """A run of consecutive offsets, as message objects."""
    if not run:
        return stored, nbytes
    stream = topic.stream
    log_ = stream.log
    assert log_ is not None
    first = run[0][0]
    messages = [m for _, m in run]
    log_.append_many(messages, first, cache=False)
    size = sum(len(m.body) for m in messages)
    _stored(topic, first + len(messages), size)
    stream.note_pushed([first + k for k, m in enumerate(messages) if pushed(m)])
    return stored + len(messages), nbytes + size


def _stored(topic: Topic, end: int, nbytes: int) -> None:
    stream = topic.stream
    stream.next_offset = end
    stream.tail.reset(end)
    stream.byte_marks.note(end, nbytes)


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
        for channel in topic.channels.values():
            if channel.clients:  # a mirror's own replay channel: more to read (the pump's job)
                channel.request_delivery()


def follow_channel(channel: Channel, position: int, skips: Sequence[tuple[int, int]]) -> int:
    """Stand the channel's cursor where the primary's reads (clamped to what the copy holds),
    stepping over ``skips``; returns the position."""
    cursor = channel.cursor
    if cursor is None:
        raise ValueError(f"channel {channel.topic_name}:{channel.name} has no cursor")
    if cursor.position == position and cursor.skips == list(skips):
        return position
    at = cursor.seek(position)
    if not cursor.ahead:
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

"""``GET /peek?topic=T[&channel=C][&state=queued|deferred|in_flight][&n=N][&skip=K]`` (lmq).

Answers what a topic or channel holds without changing anything (``lmqd.engine.peek``)::

    {"topic": "T", "channel": "C", "state": "queued", "skip": 0, "count": 2, "more": false,
     "messages": [
      {"id": "...", "timestamp": 1700000000000000000, "attempts": 0, "priority": 0,
       "headers": {}, "deliver_at": null, "deadline": null, "offset": 12,
       "body": "hello", "body_encoding": "utf-8"}, ...]}

Pages: ``skip`` (0..``MAX_PEEK_SKIP``, default 0) leaves out the first K messages of that order;
``more`` says whether any follow this page (the next page is ``skip + count``).

Without ``channel`` only ``state=queued`` (the messages the topic has not handed on); with it,
the channel's ready messages in delivery order, its deferred messages by due time, or its
in-flight ones by deadline. ``deliver_at`` and ``deadline`` are wall-clock milliseconds since
the epoch (null: none); ``offset`` is the message's offset in the topic's log (null where it has
none: a requeued message in the channel's own store); ``priority`` and ``headers`` are lmq's
per-message fields (0 and ``{}`` for NSQ's messages); the body is text when it is UTF-8, else
base64 (``body_encoding``). ``state`` defaults to ``queued``, ``n`` to 10 (1..1000).

Errors (400 unless said): ``MISSING_ARG_TOPIC``, ``INVALID_ARG_TOPIC``, 404
``TOPIC_NOT_FOUND``, ``INVALID_ARG_CHANNEL``, 404 ``CHANNEL_NOT_FOUND``, ``INVALID_ARG_STATE``,
``MISSING_ARG_CHANNEL`` (``deferred``/``in_flight`` of a topic), ``INVALID_ARG_N``,
``INVALID_ARG_SKIP``, 500
``INTERNAL_ERROR`` when stored messages cannot be read.
"""

from __future__ import annotations

import base64
import re
import time
from typing import TYPE_CHECKING, Any

import trio

from lmqd.engine.peek import (
    MAX_PEEK,
    MAX_PEEK_SKIP,
    PEEK_STATES,
    Peeked,
    peek_channel,
    peek_topic,
)
from lmqd.httpapi import args
from lmqd.httpapi.asgi import HttpError, Request, Response, json_response
from lmqd.names import valid_name

if TYPE_CHECKING:
    from lmqd.broker import Broker

__all__ = ["PeekApi"]

DEFAULT_PEEK = 10
_COUNT = re.compile(r"[0-9]{1,4}")
_SKIP = re.compile(r"[0-9]{1,6}")


class PeekApi:
    """The ``/peek`` handler, for ``HttpApi`` to route."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    async def peek(self, request: Request) -> Response:
        query = args.query(request)
        topic_name = args.topic_name(query)
        state = query.get("state")
        if state is None:
            state = "queued"
        elif state not in PEEK_STATES:
            raise HttpError(400, "INVALID_ARG_STATE")
        raw_n = query.get("n")
        count = DEFAULT_PEEK
        if raw_n is not None:
            if not _COUNT.fullmatch(raw_n) or not 1 <= int(raw_n) <= MAX_PEEK:
                raise HttpError(400, "INVALID_ARG_N")
            count = int(raw_n)
        raw_skip = query.get("skip")
        skip = 0
        if raw_skip is not None:
            if not _SKIP.fullmatch(raw_skip) or int(raw_skip) > MAX_PEEK_SKIP:
                raise HttpError(400, "INVALID_ARG_SKIP")
            skip = int(raw_skip)
        channel_name = query.get("channel")
        if channel_name is not None and not valid_name(channel_name):
            raise HttpError(400, "INVALID_ARG_CHANNEL")
        topic = args.existing_topic(self.broker, topic_name)
        try:
            if channel_name is None:
                if state != "queued":
                    raise HttpError(400, "MISSING_ARG_CHANNEL")
                entries = peek_topic(topic, count + 1, skip)
            else:
                channel = topic.channel_or_none(channel_name)
                if channel is None:
                    raise HttpError(404, "CHANNEL_NOT_FOUND")
                entries = peek_channel(channel, state, count + 1, skip)
        except OSError:
            raise HttpError(500, "INTERNAL_ERROR") from None
        # One entry more than asked says whether another page follows.
        more = len(entries) > count
        entries = entries[:count]
        now = trio.current_time()
        wall_ms = time.time() * 1000
        return json_response(
            {
                "topic": topic_name,
                "channel": channel_name,
                "state": state,
                "skip": skip,
                "count": len(entries),
                "more": more,
                "messages": [_entry(e, now, wall_ms) for e in entries],
            }
        )


def _wall_ms(t: float, now: float, wall_ms: float) -> int | None:
    return round(wall_ms + (t - now) * 1000) if t else None


def _entry(e: Peeked, now: float, wall_ms: float) -> dict[str, Any]:
    m = e.message
    ext = m.ext
    try:
        body, encoding = m.body.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        body, encoding = base64.b64encode(m.body).decode("ascii"), "base64"
    return {
        "id": m.id.decode("ascii", "replace"),
        "timestamp": m.timestamp,
        "attempts": m.attempts,
        "priority": ext.priority if ext is not None else 0,
        "headers": dict(ext.headers) if ext is not None else {},
        "deliver_at": _wall_ms(e.deliver_at, now, wall_ms),
        "deadline": _wall_ms(e.deadline, now, wall_ms),
        "offset": e.offset if e.offset >= 0 else None,
        "body": body,
        "body_encoding": encoding,
    }

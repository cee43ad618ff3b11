"""Replay and reading by offset: lmq's HTTP endpoints over a topic's stored stream.

Every message of a topic has an offset (``lmqd.engine.stream``). These endpoints use them; none
of them exists in nsqd, and nsqd's own calls are unchanged (``/channel/create`` without
``from``):

* ``POST /channel/create?topic=T&channel=C&from=POS``: a new channel whose cursor starts at
  ``POS`` instead of at the end (nsqd's behaviour, ``from=latest``); 400 ``CHANNEL_EXISTS`` if
  it exists (``/channel/seek`` moves it).
* ``POST /channel/seek?topic=T&channel=C&to=POS``: move an existing channel's cursor; its
  in-flight, requeued and deferred messages stay and settle as usual. Answers
  ``{"offset": N}``, where it now reads from.
* ``GET /topic/offsets?topic=T[&at=POS][&from=N]``: ``{"topic", "earliest", "end", "pumped"[,
  "offset"][, "lost"]}``: the offsets a tool can read (``earliest`` .. ``end`` - 1), where the
  channels are handed the stream up to (``pumped``), with ``at`` the offset ``POS`` stands for,
  and with ``from`` (a reader's position) how many offsets from ``N`` on are gone (``lost``:
  those below ``earliest``), which the topic counts.
* ``GET /topics/offsets[?topics=A,B]``: ``{"topics": {"A": {"earliest", "end", "pumped"}}}``
  for every topic (or those named that exist) in one answer: a reader of many topics (the Spark
  source's ``subscribe``, ``subscribePattern``) asks each node once per micro-batch. A mirror,
  and a promoted one, add ``"replica_of": ["host:port"]``: the node whose offsets it has (its
  primary), so that a reader moved to it goes on where it stood there (docs/mirrors.md).
* ``GET /topic/read?topic=T&offset=N[&count=M][&end=E][&format=json][&ext=1]``: the messages
  from offset ``N`` on, consuming nothing (the Spark source, ``lmqadmin tail --from``): binary
  frames by default, JSON on request (layouts in docs/http.md). Messages' priority and headers
  (lmq's extension) are keys of the JSON when set; in binary frames only with ``ext=1``, which
  adds each frame's extension block and answers ``X-Lmq-Ext: 1``, so that a reader that does
  not ask gets the frames it always got, and a reader that asks an older lmqd (which ignores
  ``ext``) can tell.

Both reads count what a reader asked for and did not find (``TopicStream.reader_lost_count``,
``reader_lost_count`` in ``/stats``): offsets below the earliest stored, and gaps in a read's
range (never written, lost to damage).

``POS`` is ``earliest`` (the oldest message stored), ``latest`` (for a channel: what the topic
hands on from now, nsqd's default; for ``/topic/offsets``: the end), an RFC 3339 time (the first
message published at or after it), a Unix time in milliseconds, or ``offset:N`` (the one rule:
``lmqd.positions``). An offset outside what is stored is clamped to it, however large (a number
past ``MAX_OFFSET`` is that: past everything): the answer's ``"offset"`` says where the channel
reads, and lmqadmin tells its user. Number arguments (``offset``, ``end``, ``from``, ``count``)
are decimal digits, likewise capped; ``count`` is 1 to ``MAX_READ_COUNT`` (400
``INVALID_ARG_COUNT`` outside, as nsqd answers an argument out of its range).

Errors follow nsqd's style (``{"message": "CODE"}``): 400 ``MISSING_ARG_TOPIC`` /
``INVALID_ARG_TOPIC`` / ``MISSING_ARG_CHANNEL`` / ``INVALID_ARG_CHANNEL``, 404
``TOPIC_NOT_FOUND`` / ``CHANNEL_NOT_FOUND``, 400 ``INVALID_ARG_FROM`` / ``MISSING_ARG_TO`` /
``INVALID_ARG_TO`` / ``INVALID_ARG_AT`` / ``MISSING_ARG_OFFSET`` / ``INVALID_ARG_OFFSET`` /
``INVALID_ARG_COUNT`` / ``INVALID_ARG_END`` / ``INVALID_ARG_TOPICS``, and 400 ``NOT_STORED``
for a channel that keeps nothing (ephemeral: it has no cursor to move). The binary frames are
``lmqd.message.READ_FRAME``.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs

from lmqd.engine.backend import BackendError
from lmqd.engine.errors import TopicExiting
from lmqd.engine.internal import reads_ahead
from lmqd.engine.stream import TopicStream
from lmqd.engine.topic import Topic
from lmqd.httpapi import args
from lmqd.httpapi.asgi import HttpError, Query, Request, Response, json_response
from lmqd.message import READ_CONTENT_TYPE, Message, encode_read_frames
from lmqd.names import is_ephemeral, valid_name
from lmqd.positions import Position, parse_number, parse_position
from lmqd.units import MiB

if TYPE_CHECKING:
    from lmqd.broker import Broker

__all__ = [
    "DEFAULT_READ_COUNT",
    "MAX_READ_BYTES",
    "MAX_READ_COUNT",
    "ReplayApi",
]

DEFAULT_READ_COUNT = 1000
MAX_READ_COUNT = 10_000
"""Messages one ``/topic/read`` answers at most: ~1.4 MB of 100-byte messages, a few ms of the
event loop (reads of the log's files run in it, like every storage read of the daemon)."""
MAX_READ_BYTES = 4 * MiB
"""Body bytes one ``/topic/read`` answers at most (at least one message is always sent): keeps a
read of large messages as short as a read of small ones."""


def resolve(stream: TopicStream, position: Position, *, latest: int) -> int:
    """The offset ``position`` stands for in ``stream`` (``latest``: what "latest" means)."""
    if position.earliest:
        return stream.earliest_offset
    if position.latest:
        return latest
    if position.time_ns is not None:
        return stream.offset_for_time(position.time_ns)
    assert position.offset is not None
    return position.offset


class ReplayApi:
    """The handlers above, for ``HttpApi`` to route."""

    def __init__(
        self, broker: Broker, replica_of: Callable[[], list[str]] | None = None
    ) -> None:
        self.broker = broker
        self._replica_of = replica_of
        """The nodes whose offsets this one has (``/topics/offsets``' ``replica_of``)."""

    # -- shared checks (nsqd's order: topic name, channel name, existence) -------------------

    _query = staticmethod(args.query)

    def _topic(self, query: Query) -> Topic:
        return args.existing_topic(self.broker, args.topic_name(query))

    @staticmethod
    def _position(query: Query, key: str, *, required: bool) -> Position | None:
        value = query.get(key)
        if value is None:
            if required:
                raise HttpError(400, f"MISSING_ARG_{key.upper()}")
            return None
        position = parse_position(value)
        if position is None:
            raise HttpError(400, f"INVALID_ARG_{key.upper()}")
        return position

    @staticmethod
    def _count(
        query: Query, key: str, default: int | None, *, low: int = 0, high: int | None = None
    ) -> int | None:
        """A number argument: decimal digits (an offset past ``MAX_OFFSET`` is taken as it:
        past everything stored), ``low`` to ``high``, else 400 ``INVALID_ARG_<KEY>`` (nsqd's
        rule for an argument out of its range, as ``defer`` on ``/pub``)."""
        value = query.get(key)
        if value is None:
            return default
        number = parse_number(value)
        if number is None or number < low or (high is not None and number > high):
            raise HttpError(400, f"INVALID_ARG_{key.upper()}")
        return number

    # -- channels ----------------------------------------------------------------------------

    def create_channel_from(self, topic: Topic, name: str, value: str) -> None:
        """``/channel/create`` with ``from`` (``HttpApi`` has checked the names and topic, and
        answers)."""
        position = parse_position(value)
        if position is None:
            raise HttpError(400, "INVALID_ARG_FROM")
        if topic.channel_or_none(name) is not None:
            raise HttpError(400, "CHANNEL_EXISTS")
        if topic.stream.log is None or is_ephemeral(name):
            raise HttpError(400, "NOT_STORED")
        stream = topic.stream
        latest = stream.next_offset if reads_ahead(name) else stream.pumped
        start = resolve(stream, position, latest=latest)
        try:
            topic.get_channel(name, start_at=start)
        except TopicExiting:
            raise HttpError(503, "EXITING") from None
        except BackendError:
            raise HttpError(500, "INTERNAL_ERROR") from None

    async def channel_seek(self, request: Request) -> Response:
        query = self._query(request)
        topic_name, channel_name = args.names(query)
        position = self._position(query, "to", required=True)
        assert position is not None
        topic = args.existing_topic(self.broker, topic_name)
        channel = topic.channel_or_none(channel_name)
        if channel is None:
            raise HttpError(404, "CHANNEL_NOT_FOUND")
        if channel.cursor is None:
            raise HttpError(400, "NOT_STORED")
        offset = channel.seek(resolve(topic.stream, position, latest=channel.cursor.end))
        return json_response({"offset": offset})

    # -- reading by offset ---------------------------------------------------------------------

    async def topic_offsets(self, request: Request) -> Response:
        query = self._query(request)
        topic = self._topic(query)
        position = self._position(query, "at", required=False)
        stream = topic.stream
        answer: dict[str, object] = {
            "topic": topic.name,
            "earliest": stream.earliest_offset,
            "end": stream.next_offset,
            "pumped": stream.pumped,
        }
        if position is not None:
            answer["offset"] = resolve(stream, position, latest=stream.next_offset)
        reader_at = self._count(query, "from", None)
        if reader_at is not None:
            lost = max(stream.earliest_offset - reader_at, 0)
            stream.reader_lost_count += lost
            answer["lost"] = lost
        return json_response(answer)

    async def topics_offsets(self, request: Request) -> Response:
        query = self._query(request)
        topics = self.broker.topics
        listed = query.get("topics")
        if listed is None:
            chosen = list(topics.values())
        else:
            names = [name for name in listed.split(",") if name]
            if not all(valid_name(name) for name in names):
                raise HttpError(400, "INVALID_ARG_TOPICS")
            chosen = [topics[name] for name in dict.fromkeys(names) if name in topics]
        answer = {}
        for topic in chosen:
            stream = topic.stream
            answer[topic.name] = {
                "earliest": stream.earliest_offset,
                "end": stream.next_offset,
                "pumped": stream.pumped,
            }
        replicas = self._replica_of() if self._replica_of is not None else []
        if replicas:
            return json_response({"topics": answer, "replica_of": replicas})
        return json_response({"topics": answer})

    async def topic_read(self, request: Request) -> Response:
        query = self._query(request)
        topic = self._topic(query)
        start = self._count(query, "offset", None)
        if start is None:
            raise HttpError(400, "MISSING_ARG_OFFSET" if "offset" not in query
                            else "INVALID_ARG_OFFSET")
        count = self._count(query, "count", DEFAULT_READ_COUNT, low=1, high=MAX_READ_COUNT)
        assert count is not None
        end = self._count(query, "end", None)
        with_ext = query.get("ext") == "1"
        stream = topic.stream
        entries, following = stream.read_entries(start, count, end, MAX_READ_BYTES)
        # Every offset of [start, following) not among the entries was asked for and not stored.
        stream.reader_lost_count += max(following - start - len(entries), 0)
        headers: tuple[tuple[str, str], ...] = (
            ("X-Lmq-Next-Offset", str(following)),
            ("X-Lmq-Earliest-Offset", str(stream.earliest_offset)),
            ("X-Lmq-End-Offset", str(stream.next_offset)),
        )
        if query.get("format") == "json":
            # The same X-Lmq-* offsets as the binary answer: a reader switching formats keeps
            # its paging code.
            answer = json_response({
                "topic": topic.name,
                "earliest": stream.earliest_offset,
                "end": stream.next_offset,
                "next": following,
                "messages": [_json_entry(offset, m) for offset, m in entries],
            })
            return attrs.evolve(answer, headers=headers)
        if with_ext:
            headers += (("X-Lmq-Ext", "1"),)
        return Response(
            200, encode_read_frames(entries, ext=with_ext), READ_CONTENT_TYPE, v1=False,
            headers=headers,
        )  # fmt: skip


def _json_entry(offset: int, m: Message) -> dict[str, object]:
    """One message of a JSON ``/topic/read``: ``priority`` and ``headers`` only when set, so
    the answer for NSQ's messages is what it was before the extension."""
    entry: dict[str, object] = {
        "offset": offset,
        "id": m.id.decode("ascii", "replace"),
        "timestamp": m.timestamp,
        "attempts": m.attempts,
        "body": base64.b64encode(m.body).decode(),
    }
    ext = m.ext
    if ext is not None:
        if ext.priority:
            entry["priority"] = ext.priority
        if ext.headers:
            entry["headers"] = dict(ext.headers)
    return entry

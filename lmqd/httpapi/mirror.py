"""Replication's HTTP endpoints (docs/mirrors.md), and the refusal of writes on a mirror.

On a primary (what a mirror asks):

* ``GET /mirror/topics?mirror=ID[&address=A][&durable=true]``: who the primary is and every
  non-ephemeral topic with its channels' positions (``lmqd.mirror.wire``).
* ``POST /mirror/fetch?mirror=ID[&wait_ms=N]`` with ``{"topics": {"T": [offset, acked]}}``: the
  messages of each topic from ``offset`` on, as copy frames (``lmqd.mirror.frames``) in one
  section per topic (``wire.py``); the mirror's hold moves to ``acked``. Nothing new: the
  answer waits up to ``wait_ms`` (at most ``MAX_WAIT_MS``) for a publish to one of them.
* ``POST /mirror/forget?mirror=ID``: drop a mirror and its holds (404 ``MIRROR_NOT_FOUND``).

On a mirror: ``POST /mirror/promote`` (400 ``NOT_A_MIRROR`` on a primary). On both:
``GET /mirror``, the node's role and its replication's statistics.

A mirror answers ``/mirror/topics`` and ``/mirror/fetch`` with 409 ``NOT_PRIMARY`` (naming its
primary): a mirror of a mirror is not supported. ``ID`` is a mirror's node id: 1 to 64 of
``[0-9a-zA-Z_-]``, else 400 ``INVALID_ARG_MIRROR``.

**Writes refused** (``refusal``): on a mirror, every endpoint that changes a followed topic or
channel -- ``/pub``, ``/mpub``, topic and channel create, delete, empty, pause, policy, seek,
redrive -- answers 403 ``{"message": "MIRROR_READ_ONLY", "primary": "host:port"}`` before
anything else is looked at (a publish does not create the topic). ``/channel/create?from=`` of a
channel the primary does not have makes a replay channel of the mirror's own, which may be
consumed and administered like any channel.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from operator import attrgetter, itemgetter
from typing import TYPE_CHECKING

import trio

from lmqd.engine.topic import Topic
from lmqd.httpapi import args
from lmqd.httpapi.asgi import HttpError, Query, Request, Response, json_response
from lmqd.message import Message
from lmqd.mirror.frames import encode_copies
from lmqd.mirror.primary import MirrorRegistry
from lmqd.mirror.service import NotAMirror, Replication
from lmqd.mirror.wire import describe_topic, encode_section
from lmqd.units import MiB

if TYPE_CHECKING:
    from lmqd.broker import Broker

__all__ = ["MAX_FETCH_BYTES", "MAX_FETCH_COUNT", "MAX_WAIT_MS", "MirrorApi", "refusal"]

Handler = Callable[[Request], Awaitable[Response]]

MAX_FETCH_COUNT = 32_768
"""Messages of one topic per fetch at most: with ``MAX_FETCH_BYTES``, a fetch of 100-byte
messages is ~30k messages, a few ms of the primary's event loop to read and encode."""
MAX_FETCH_BYTES = 4 * MiB
"""Body bytes of one fetch at most (at least one message of each topic with news is sent)."""
FETCH_MIN_MESSAGES = 4096
FETCH_LINGER_S = 0.025
"""A fetch that finds fewer than ``FETCH_MIN_MESSAGES`` new messages waits this much more
before it answers (Kafka's ``fetch.min.bytes`` with ``fetch.max.wait.ms``): a mirror that keeps
up would otherwise make a request per publish batch, and a request costs the primary as much as
a few hundred messages. Measured at 100k messages a second (docs/benchmarks.md, "Mirrors"):
the primary's CPU per message with a mirror went from 2.8 to 2.1 µs (1.1 µs alone) between a
5 ms and this 25 ms linger, the mirror's lag p99 from 80 to 150 ms."""
MAX_WAIT_MS = 30_000
MAX_BODY = 4 * MiB
"""A fetch request lists topics and two offsets each: 4 MiB is ~100k topics."""

_message = itemgetter(1)
_body = attrgetter("body")
_MIRROR_ID = re.compile(r"[0-9A-Za-z_-]{1,64}")


def refusal(broker: Broker, query: Query, *, channel: bool) -> Response | None:
    """On a mirror, the 403 for a write to a followed topic (or channel); None if allowed."""
    guard = broker.guard
    if guard is None:
        return None
    topic = query.get("topic") or ""
    if channel:
        reason = guard.refuse_channel(topic, query.get("channel") or "")
    else:
        reason = guard.refuse_topic(topic)
    if reason is None:
        return None
    return json_response({"message": "MIRROR_READ_ONLY", "primary": guard.primary}, 403)


class MirrorApi:
    """The endpoints above, for ``HttpApi`` to route."""

    def __init__(self, broker: Broker, replication: Replication | None) -> None:
        self.broker = broker
        self.replication = replication
        self._rotation = 0

    def guarded(self, handler: Handler, *, channel: bool = False) -> Handler:
        """``handler`` behind the mirror's refusal (see the module docstring)."""

        async def guarded_handler(request: Request) -> Response:
            refused = refusal(self.broker, args.query(request), channel=channel)
            return refused if refused is not None else await handler(request)

        return guarded_handler

    def channel_create(self, handler: Handler) -> Handler:
        """``/channel/create`` on a mirror: ``from=`` makes a replay channel of its own."""

        async def create(request: Request) -> Response:
            query = args.query(request)
            follower = self.replication.follower if self.replication is not None else None
            topic, name = query.get("topic") or "", query.get("channel") or ""
            own = follower is not None and "from" in query and not self._followed(topic, name)
            refused = None if own else refusal(self.broker, query, channel=True)
            if refused is not None:
                return refused
            answer = await handler(request)
            if own and follower is not None and answer.status == 200:
                follower.add_local_channel(topic, name)
            return answer

        return create

    def replica_of(self) -> list[str]:
        """The nodes whose offsets this one has: its primary (a mirror), the primary it took
        over from (a promoted mirror); ``/topics/offsets`` tells readers (the Spark source)."""
        return self.replication.replica_of() if self.replication is not None else []

    def _followed(self, topic: str, channel: str) -> bool:
        t = self.broker.topic_or_none(topic)
        return t is not None and t.channel_or_none(channel) is not None

    # -- a primary's side ----------------------------------------------------------------------

    def _registry(self) -> MirrorRegistry:
        replication = self.replication
        if replication is None or replication.registry is None:
            guard = self.broker.guard
            primary = guard.primary if guard is not None else ""
            raise _NotPrimary(primary)
        return replication.registry

    def _contact(self, request: Request, query: Query, registry: MirrorRegistry) -> str:
        mirror_id = query.get("mirror")
        if mirror_id is None:
            raise HttpError(400, "MISSING_ARG_MIRROR")
        if not _MIRROR_ID.fullmatch(mirror_id):
            raise HttpError(400, "INVALID_ARG_MIRROR")
        registry.contact(
            mirror_id,
            address=query.get("address") or "",
            remote=request.remote,
            durable=query.get("durable") == "true",
            now=trio.current_time(),
        )
        return mirror_id

    async def topics(self, request: Request) -> Response:
        try:
            registry = self._registry()
        except _NotPrimary as exc:
            return exc.response()
        query = args.query(request)
        self._contact(request, query, registry)
        role = registry.role
        return json_response({
            "node_id": role.node_id,
            "epoch": role.epoch,
            "topics": {t.name: describe_topic(t) for t in registry.mirrored_topics()},
        })

    async def fetch(self, request: Request) -> Response:
        try:
            registry = self._registry()
        except _NotPrimary as exc:
            return exc.response()
        query = args.query(request)
        mirror_id = self._contact(request, query, registry)
        wait_ms = _int(query.get("wait_ms"), "WAIT_MS", default=0)
        body = await request.read_body(MAX_BODY + 1)
        if len(body) > MAX_BODY:
            raise HttpError(413, "BODY_TOO_BIG")
        asked = _fetch_request(body)
        wanted: list[tuple[Topic, int]] = []
        news: dict[str, bool] = {}
        now = trio.current_time()
        insync = self.broker.insync
        for name, (offset, acked) in asked.items():
            topic = self.broker.topic_or_none(name)
            if topic is None or topic.ephemeral or topic.stream.log is None or topic.exiting:
                continue
            hold, new = registry.hold(mirror_id, topic)
            hold.fetched(offset, acked, now, self.broker.options.mirror_ack_timeout)
            insync.acknowledged(topic.stream, now)
            news[name] = new
            wanted.append((topic, offset))
        if wait_ms and wanted:
            if not any(_has_news(t, o) or news[t.name] for t, o in wanted):
                topics = [t for t, _ in wanted]
                event = registry.watch(topics)
                try:
                    with trio.move_on_after(min(wait_ms, MAX_WAIT_MS) / 1000):
                        await event.wait()
                finally:
                    registry.unwatch(topics, event)
            pending = sum(max(t.stream.next_offset - o, 0) for t, o in wanted)
            # Publishers waiting for this mirror (--min-insync-mirrors) are answered sooner.
            waiting = any(insync.waiting(t.name) for t, _ in wanted)
            if 0 < pending < FETCH_MIN_MESSAGES and not waiting:
                await trio.sleep(FETCH_LINGER_S)  # a few more publishes: fewer, fuller fetches
        return Response(200, self._sections(registry, mirror_id, wanted, news), v1=False)

    def _sections(
        self,
        registry: MirrorRegistry,
        mirror_id: str,
        wanted: list[tuple[Topic, int]],
        news: dict[str, bool],
    ) -> bytes:
        """Each topic's section (only those with news, unless none has any), fairly: a
        different topic goes first at each fetch."""
        if wanted:
            self._rotation = (self._rotation + 1) % len(wanted)
            wanted = wanted[self._rotation :] + wanted[: self._rotation]
        budget = MAX_FETCH_BYTES
        insync = self.broker.insync
        parts: list[bytes] = []
        headers: list[bytes] = []
        for topic, offset in wanted:
            if topic.exiting:
                continue
            stream = topic.stream
            log_ = stream.log
            assert log_ is not None
            hold = registry.holds.get(mirror_id, {}).get(topic.name)
            since = hold.since if hold is not None else 0
            if hold is not None:
                hold.answered()
            entries: list[tuple[int, Message]] = []
            following = offset
            if offset < stream.next_offset and budget > 0:
                entries, following = stream.read_entries(offset, MAX_FETCH_COUNT, None, budget)
                budget -= sum(map(len, map(_body, map(_message, entries))))
            next_ts = 0
            if following < stream.next_offset:
                ahead, _ = stream.read_entries(following, 1)
                next_ts = ahead[0][1].timestamp if ahead else 0
            section = encode_section(
                topic.name, encode_copies(entries, log_.timebase),
                next_offset=following, end=stream.next_offset, earliest=stream.earliest_offset,
                since=since, next_ts=next_ts, new_hold=news.get(topic.name, False),
                waiting=insync.waiting(topic.name),
            )  # fmt: skip
            if entries or following != offset or news.get(topic.name):
                parts.append(section)
            else:
                headers.append(section)
        return b"".join(parts) if parts else b"".join(headers)

    async def forget(self, request: Request) -> Response:
        try:
            registry = self._registry()
        except _NotPrimary as exc:
            return exc.response()
        mirror_id = args.query(request).get("mirror")
        if mirror_id is None:
            raise HttpError(400, "MISSING_ARG_MIRROR")
        if not registry.forget(mirror_id):
            raise HttpError(404, "MIRROR_NOT_FOUND")
        return Response(200)

    # -- a mirror's side -----------------------------------------------------------------------

    async def promote(self, request: Request) -> Response:
        replication = self.replication
        if replication is None:
            raise HttpError(400, "NOT_A_MIRROR")
        try:
            summary = await replication.promote()
        except NotAMirror:
            raise HttpError(400, "NOT_A_MIRROR") from None
        return json_response(summary)

    async def status(self, request: Request) -> Response:
        replication = self.replication
        if replication is None:
            raise HttpError(404, "NOT_FOUND")
        return json_response(replication.status(trio.current_time()))


class _NotPrimary(Exception):
    def __init__(self, primary: str) -> None:
        super().__init__(primary)
        self.primary = primary

    def response(self) -> Response:
        return json_response({"message": "NOT_PRIMARY", "primary": self.primary}, 409)


def _has_news(topic: Topic, offset: int) -> bool:
    return offset < topic.stream.next_offset


def _int(value: str | None, name: str, *, default: int) -> int:
    if value is None:
        return default
    if not value.isdigit() or len(value) > 12:
        raise HttpError(400, f"INVALID_ARG_{name}")
    return int(value)


def _fetch_request(body: bytes) -> dict[str, tuple[int, int]]:
    """``{"topics": {"T": [offset, acked]}}``; 400 ``INVALID_BODY`` otherwise."""
    try:
        doc = json.loads(body)
        topics = doc["topics"]
        out = {}
        for name, (offset, acked) in topics.items():
            if type(offset) is not int or type(acked) is not int or offset < 0 or acked < 0:
                raise ValueError(name)
            out[str(name)] = (offset, acked)
    except (ValueError, KeyError, TypeError, AttributeError):
        raise HttpError(400, "INVALID_BODY") from None
    return out

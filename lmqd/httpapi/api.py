"""nsqd's HTTP endpoints (nsq-reference §2), plus ``GET /metrics`` and lmq's replay endpoints
(``replay.py``) and topic policies (``policy.py``).

Every handler reproduces nsqd v1.3.0's ``nsqd/http.go`` step for step, because the order of the
checks decides which error a bad request gets: ``/pub`` checks the size before the topic, reads
at most ``--max-msg-size`` + 1 bytes, creates the topic before it validates ``defer``; ``/mpub``
checks ``Content-Length`` against ``--max-body-size`` before anything else; the admin endpoints
that need an existing topic answer ``404 TOPIC_NOT_FOUND`` without validating the name, and so on.
Status codes and message texts are nsqd's, word for word.

Publishing goes through ``broker.publish`` exactly as TCP PUB/MPUB/DPUB do (one code path into
the topic); any failure there is nsqd's ``503 EXITING``. HTTP publishers are not clients, so
they never appear in ``producers`` (nsqd behaviour). A topic's publish policies
(``lmqd.engine.admission``) answer ``503 TOPIC_FULL`` (``max_depth``, ``overflow=reject``: the
service cannot take it now, as for ``EXITING``) and ``429 RATE_LIMITED`` with ``Retry-After``
(the publisher asked too fast: RFC 6585's meaning, and a client that honours it succeeds when
it retries); a request within the rate waits for its tokens, at most ``PUBLISH_WAIT_MAX``.
"""

from __future__ import annotations

import gc
import logging
import math
import re
import socket
import time
from functools import partial
from typing import TYPE_CHECKING, Any

import attrs
import trio
from prometheus_client.exposition import choose_encoder

from lmqd import NSQD_COMPAT_VERSION
from lmqd.engine.admission import RateLimited, TopicFull
from lmqd.engine.backend import BackendError
from lmqd.engine.errors import TopicExiting
from lmqd.engine.insync import NotEnoughMirrors
from lmqd.engine.topic import Topic
from lmqd.httpapi import args
from lmqd.httpapi.asgi import (
    EMPTY,
    JSON_CONTENT_TYPE,
    OK,
    AsgiApp,
    HttpError,
    Query,
    Request,
    Response,
    error_response,
    go_json,
    json_response,
)
from lmqd.httpapi.channel_policy import ChannelPolicyApi
from lmqd.httpapi.config_api import get_option, put_option
from lmqd.httpapi.extension import batch_exts, request_ext
from lmqd.httpapi.mirror import MirrorApi
from lmqd.httpapi.peek import PeekApi
from lmqd.httpapi.policy import PolicyApi
from lmqd.httpapi.replay import ReplayApi
from lmqd.httpapi.stats_text import format_stats
from lmqd.memory import FREE_MEMORY_GENERATIONS, MEMORY_KEYS, memory_stats, trim_heap
from lmqd.message_ext import MessageExt
from lmqd.metrics import make_registry
from lmqd.names import valid_name
from lmqd.net import split_address

if TYPE_CHECKING:
    from lmqd.broker import Broker
    from lmqd.engine.channel import Channel
    from lmqd.mirror.service import Replication

__all__ = ["HttpApi"]

log = logging.getLogger("lmqd.httpapi")

# nsqd's boolParams: anything else leaves the default (true for include_clients/include_mem;
# for /mpub's binary it means binary, with a deprecation warning).
_BOOL_PARAMS = {"true": True, "1": True, "false": False, "0": False}
_GO_INT = re.compile(r"[+-]?[0-9]+")  # strconv.ParseInt(s, 10, 64)'s syntax
_INT64_MAX = 2**63 - 1


def _ns(seconds: float) -> int:
    return round(seconds * 1_000_000_000)


class HttpApi(AsgiApp):
    """The ASGI application serving one daemon's HTTP API."""

    def __init__(
        self,
        broker: Broker,
        *,
        http_port: int = -1,
        tls_required_https_port: int | None = None,
        replication: Replication | None = None,
    ) -> None:
        super().__init__()
        self.broker = broker
        self.replication = replication
        """The node's replication (``lmqd.mirror``): None in tools and tests without one."""
        self.http_port = http_port
        """The bound HTTP port, reported by /info (``-1`` as nsqd reports a unix socket)."""
        if tls_required_https_port is not None:
            # nsqd's httpServer.ServeHTTP with --tls-required=true on the plain listener: every
            # request, whatever its path, gets this (the spaces are nsqd's, it uses Sprintf).
            body = f'{{"message": "TLS_REQUIRED", "https_port": {tls_required_https_port}}}'
            self.refusal = Response(403, body.encode(), JSON_CONTENT_TYPE)
        self.registry = make_registry(broker, replication)
        """trio time of the last full collection ``/debug/freememory`` ran."""
        self.quiet_paths = frozenset({"/pub", "/mpub"})
        # Prometheus scrapes /metrics and health checks poll /ping every few seconds: their
        # request lines at INFO would bury everything else in the log.
        self.debug_paths = frozenset({"/metrics", "/ping"})
        add = self.router.add
        # lmq's replication (mirror.py): on a mirror, writes to what it follows are refused.
        self.mirror = MirrorApi(broker, replication)
        topic_write = self.mirror.guarded
        channel_write = partial(self.mirror.guarded, channel=True)
        add("GET", "/ping", self.ping)
        add("GET", "/info", self.info)
        add("POST", "/pub", topic_write(self.pub))
        add("POST", "/mpub", topic_write(self.mpub))
        add("GET", "/stats", self.stats)
        add("POST", "/topic/create", topic_write(self.topic_create))
        add("POST", "/topic/delete", topic_write(self.topic_delete))
        add("POST", "/topic/empty", topic_write(self.topic_empty))
        add("POST", "/topic/pause", topic_write(self.topic_pause))
        add("POST", "/topic/unpause", topic_write(self.topic_pause))
        add("POST", "/channel/create", self.mirror.channel_create(self.channel_create))
        add("POST", "/channel/delete", channel_write(self.channel_delete))
        add("POST", "/channel/empty", channel_write(self.channel_empty))
        add("POST", "/channel/pause", channel_write(self.channel_pause))
        add("POST", "/channel/unpause", channel_write(self.channel_pause))
        # lmq's replay and reading by offset (replay.py)
        self.replay = ReplayApi(broker, self.mirror.replica_of)
        add("POST", "/channel/seek", channel_write(self.replay.channel_seek))
        add("GET", "/topic/offsets", self.replay.topic_offsets)
        add("GET", "/topic/read", self.replay.topic_read)
        add("GET", "/topics/offsets", self.replay.topics_offsets)
        self.policy = PolicyApi(broker)  # lmq's topic policies (policy.py)
        add("GET", "/topic/policy", self.policy.topic_policy)
        add("POST", "/topic/policy", topic_write(self.policy.topic_policy))
        # lmq's channel policies and redrive (channel_policy.py)
        self.channel_policy = ChannelPolicyApi(broker, self._existing_channel)
        add("GET", "/channel/policy", self.channel_policy.channel_policy)
        add("POST", "/channel/policy", channel_write(self.channel_policy.channel_policy))
        add("POST", "/channel/redrive", channel_write(self.channel_policy.channel_redrive))
        add("GET", "/mirror", self.mirror.status)
        add("GET", "/mirror/topics", self.mirror.topics)
        add("POST", "/mirror/fetch", self.mirror.fetch)
        add("POST", "/mirror/forget", self.mirror.forget)
        add("POST", "/mirror/promote", self.mirror.promote)
        self.peek = PeekApi(broker)  # lmq: look into a queue without consuming (peek.py)
        add("GET", "/peek", self.peek.peek)
        add("GET", "/config/:opt", self.config)
        add("PUT", "/config/:opt", self.config)
        add("POST", "/debug/freememory", self.free_memory)
        add("GET", "/metrics", self.metrics)

    # -- shared checks -----------------------------------------------------------------------

    _query = staticmethod(args.query)

    def _new_topic_name(self, request: Request) -> tuple[Query, str]:
        """nsqd's ``getTopicFromQuery`` (the caller creates the topic)."""
        query = self._query(request)
        name = query.get("topic")
        if name is None:
            raise HttpError(400, "MISSING_ARG_TOPIC")
        if not valid_name(name):
            raise HttpError(400, "INVALID_TOPIC")
        return query, name

    def _topic_and_channel_name(self, request: Request) -> tuple[Topic, str]:
        """nsqd's ``getExistingTopicFromQuery``: valid names, existing topic."""
        topic_name, channel_name = args.names(args.query(request))
        return args.existing_topic(self.broker, topic_name), channel_name

    def _existing_channel(self, request: Request) -> Channel:
        topic, name = self._topic_and_channel_name(request)
        channel = topic.channel_or_none(name)
        if channel is None:
            raise HttpError(404, "CHANNEL_NOT_FOUND")
        return channel

    def _persist_metadata(self) -> None:
        # nsqd persists metadata right after (un)pausing so a crash cannot undo it.
        self.broker.persist_metadata()

    def _get_topic(self, name: str) -> Topic:
        try:
            return self.broker.get_topic(name)
        except BackendError:  # its disk queue could not be opened
            raise HttpError(500, "INTERNAL_ERROR") from None

    async def _publish(
        self,
        topic: str,
        bodies: list[bytes],
        defer_s: float = 0.0,
        exts: list[MessageExt | None] | None = None,
    ) -> Response:
        # The one publish path shared with TCP; with --durable it returns once fsynced, so the
        # OK below means what a TCP OK means.
        gate = self.broker.publish_gate(topic)
        if gate is not None and gate.bucket is not None:
            now = trio.current_time()
            paid, wait = gate.reserve([len(bodies)], now)
            if not paid:
                refused = gate.refuse_rate(len(bodies), now)
                return _rate_limited(refused)
            if wait > 0:
                await trio.sleep(wait)  # this request only: its tokens are reserved
        try:
            await self.broker.publish_durable(topic, bodies, defer_s, exts)
        except TopicFull:
            raise HttpError(503, "TOPIC_FULL") from None
        except NotEnoughMirrors:
            # --min-insync-mirrors: refused before it was stored, or not on the mirrors in time.
            raise HttpError(503, "NOT_ENOUGH_MIRRORS") from None
        except (BackendError, TopicExiting):
            # nsqd answers every PutMessage(s) failure (exiting or a failed backend write) so.
            raise HttpError(503, "EXITING") from None
        return OK

    # -- /ping, /info ------------------------------------------------------------------------

    async def ping(self, request: Request) -> Response:
        """``OK``, or 500 ``NOK - <error>`` while unhealthy (plain text, no V1 header)."""
        health = self.broker.health.encode()
        return Response(200 if self.broker.is_healthy else 500, health, v1=False)

    async def info(self, request: Request) -> Response:
        broker = self.broker
        options = broker.options
        if broker.addresses is not None:
            tcp_port = broker.addresses.tcp[1]
        else:
            try:
                tcp_port = split_address(options.tcp_address, default_host="0.0.0.0")[1]
            except ValueError:
                tcp_port = -1
        return json_response({
            "version": NSQD_COMPAT_VERSION,
            "broadcast_address": options.broadcast_address,
            "hostname": socket.gethostname(),
            "http_port": self.http_port,
            "tcp_port": tcp_port,
            "start_time": broker.start_time,
            "max_heartbeat_interval": _ns(options.max_heartbeat_interval),
            "max_output_buffer_size": options.max_output_buffer_size,
            "max_output_buffer_timeout": _ns(options.max_output_buffer_timeout),
            "max_deflate_level": options.max_deflate_level,
        })

    # -- publishing --------------------------------------------------------------------------

    async def pub(self, request: Request) -> Response:
        options = self.broker.options
        limit = options.max_msg_size
        if request.content_length is not None and request.content_length > limit:
            raise HttpError(413, "MSG_TOO_BIG")
        body = await request.read_body(limit + 1)
        if len(body) > limit:
            raise HttpError(413, "MSG_TOO_BIG")
        if not body:
            raise HttpError(400, "MSG_EMPTY")
        query, name = self._new_topic_name(request)
        self._get_topic(name)  # nsqd creates the topic before it looks at defer
        defer_ms = 0
        raw_defer = query.get("defer")
        if raw_defer is not None:
            if not _GO_INT.fullmatch(raw_defer) or abs(int(raw_defer)) > _INT64_MAX:
                raise HttpError(400, "INVALID_DEFER")
            defer_ms = int(raw_defer)
            if defer_ms < 0 or defer_ms * 1_000_000 > _ns(options.max_req_timeout):
                raise HttpError(400, "INVALID_DEFER")
        ext = request_ext(request, query)  # lmq: priority, ttl_ms, dedup_id, Lmq-Header-*
        return await self._publish(
            name, [body], defer_ms / 1000, None if ext is None else [ext]
        )

    async def mpub(self, request: Request) -> Response:
        options = self.broker.options
        max_body = options.max_body_size
        if request.content_length is not None and request.content_length > max_body:
            raise HttpError(413, "BODY_TOO_BIG")
        query, name = self._new_topic_name(request)
        self._get_topic(name)
        ext = request_ext(request, query)
        binary = False
        raw_binary = query.get("binary")
        if raw_binary is not None:
            binary = _BOOL_PARAMS.get(raw_binary, True)
            if raw_binary not in _BOOL_PARAMS:
                self._warn_binary(raw_binary)
        body = await request.read_body(max_body + 1)
        if binary:
            if len(body) > max_body:
                # nsqd reads a binary body unbounded when Content-Length is absent; lmqd bounds
                # every read, so an oversized chunked body is refused like an oversized one.
                raise HttpError(413, "BODY_TOO_BIG")
            bodies = _parse_binary_mpub(body, options.max_msg_size, max_body)
        else:
            bodies = _parse_text_mpub(body, options.max_msg_size, max_body + 1)
        if bodies:
            return await self._publish(name, bodies, exts=batch_exts(ext, len(bodies)))
        return OK

    @staticmethod
    def _warn_binary(value: str) -> None:
        log.warning("deprecated value '%s' used for /mpub binary param", value)

    # -- /stats ------------------------------------------------------------------------------

    async def stats(self, request: Request) -> Response:
        query = self._query(request)
        broker = self.broker
        topic = query.get("topic") or None
        channel = query.get("channel") or None
        include_clients = _BOOL_PARAMS.get(query.get("include_clients") or "", True)
        include_mem = _BOOL_PARAMS.get(query.get("include_mem") or "", True)
        topics = broker.statistics(topic=topic, channel=channel, include_clients=include_clients)
        if channel is not None:
            # nsqd's GetStats skips a topic that has no channel of that name.
            topics = [t for t in topics if t.channels]
        producers = broker.producers() if include_clients else []
        if topic is not None:
            # nsqd's client.Stats(topic): a producer's pub_counts narrowed to that topic.
            producers = [
                attrs.evolve(p, pub_counts=tuple(c for c in p.pub_counts if c.topic == topic))
                for p in producers
            ]
        memory = memory_stats() if include_mem else None
        if query.get("format") != "json":
            text = format_stats(topics=topics, producers=producers, memory=memory,
                                health=broker.health, start_time=broker.start_time,
                                now=time.time())
            return Response(200, text.encode())
        # Go's nil slices: "topics" is null when ?topic= names no topic, "producers" is null
        # when there are none or clients were not asked for.
        topics_missing = topic is not None and broker.topic_or_none(topic) is None
        document: dict[str, Any] = {
            "version": NSQD_COMPAT_VERSION,
            "health": broker.health,
            "start_time": broker.start_time,
            "topics": None if topics_missing else [t.to_dict() for t in topics],
        }
        if memory is not None:
            document["memory"] = {key: memory[key] for key in MEMORY_KEYS}
        document["producers"] = [p.to_dict() for p in producers] if producers else None
        replication = self.replication
        if replication is not None:
            # lmq: replication (docs/mirrors.md), keys nsqd's tools ignore.
            now = trio.current_time()
            mirror = replication.mirror_statistics(now)
            if mirror is not None:
                document["mirror"] = mirror.to_dict()
            links = replication.link_statistics(now)
            if links:
                document["mirrors"] = [m.to_dict() for m in links]
            insync = replication.insync_statistics(now)
            if insync is not None:
                document["min_insync"] = insync.to_dict()
        return Response(200, go_json(document), "application/json; charset=utf-8")

    # -- topic administration ----------------------------------------------------------------

    async def topic_create(self, request: Request) -> Response:
        _, name = self._new_topic_name(request)
        self._get_topic(name)
        return EMPTY

    async def topic_delete(self, request: Request) -> Response:
        name = self._query(request).get("topic")
        if name is None:
            raise HttpError(400, "MISSING_ARG_TOPIC")
        try:
            self.broker.delete_topic(name)
        except KeyError:
            raise HttpError(404, "TOPIC_NOT_FOUND") from None
        return EMPTY

    async def topic_empty(self, request: Request) -> Response:
        _, name = self._new_topic_name(request)
        topic = self.broker.topic_or_none(name)
        if topic is None:
            raise HttpError(404, "TOPIC_NOT_FOUND")
        try:
            topic.empty()
        except BackendError:
            raise HttpError(500, "INTERNAL_ERROR") from None
        return EMPTY

    async def topic_pause(self, request: Request) -> Response:
        name = self._query(request).get("topic")
        if name is None:
            raise HttpError(400, "MISSING_ARG_TOPIC")
        topic = self.broker.topic_or_none(name)
        if topic is None:
            raise HttpError(404, "TOPIC_NOT_FOUND")
        if request.path.endswith("/unpause"):
            topic.unpause()
        else:
            topic.pause()
        self._persist_metadata()
        return EMPTY

    # -- channel administration --------------------------------------------------------------

    async def channel_create(self, request: Request) -> Response:
        topic, name = self._topic_and_channel_name(request)
        start = self._query(request).get("from")
        if start is not None:  # lmq: a channel that starts elsewhere than at the end
            self.replay.create_channel_from(topic, name, start)
        elif topic.channel_or_none(name) is None:
            try:
                topic.get_channel(name)
            except TopicExiting:
                raise HttpError(503, "EXITING") from None
            except BackendError:  # its disk queue could not be opened
                raise HttpError(500, "INTERNAL_ERROR") from None
        else:
            return EMPTY
        try:
            # --durable: answered once the channel's start in the log is fsynced, so a crash
            # after the answer never gives it messages the topic handed on before it existed.
            await self.broker.wait_durable(topic.name)
        except BackendError:
            raise HttpError(500, "INTERNAL_ERROR") from None
        return EMPTY

    async def channel_delete(self, request: Request) -> Response:
        topic, name = self._topic_and_channel_name(request)
        try:
            topic.delete_channel(name)
        except KeyError:
            raise HttpError(404, "CHANNEL_NOT_FOUND") from None
        return EMPTY

    async def channel_empty(self, request: Request) -> Response:
        channel = self._existing_channel(request)
        try:
            channel.empty()
        except BackendError:
            raise HttpError(500, "INTERNAL_ERROR") from None
        return EMPTY

    async def channel_pause(self, request: Request) -> Response:
        channel = self._existing_channel(request)
        if request.path.endswith("/unpause"):
            channel.unpause()
        else:
            channel.pause()
        self._persist_metadata()
        return EMPTY

    # -- /config, /debug, /metrics -----------------------------------------------------------

    async def config(self, request: Request) -> Response:
        key = request.path_params["opt"]
        if request.method == "PUT":
            limit = self.broker.options.max_msg_size
            # nsqd reads up to the limit and then refuses; refusing on Content-Length gives the
            # same answer without waiting for a body that would be discarded.
            if request.content_length is not None and request.content_length > limit:
                raise HttpError(413, "INVALID_VALUE")
            body = await request.read_body(limit + 1)
            if not body or len(body) > limit:
                raise HttpError(413, "INVALID_VALUE")
            return json_response(put_option(self.broker, key, body))
        return json_response(get_option(self.broker.options, key))

    async def free_memory(self, request: Request) -> Response:
        """nsqd's ``debug.FreeOSMemory``, in steps that let other tasks run between them: the
        youngest generation (``lmqd.memory.FREE_MEMORY_GENERATIONS``, never a full collection),
        then the C heap's free pages back to the OS."""
        for generation in FREE_MEMORY_GENERATIONS:
            gc.collect(generation)
            await trio.lowlevel.checkpoint()
        await trio.to_thread.run_sync(trim_heap)
        return Response(200, v1=False)

    async def metrics(self, request: Request) -> Response:
        encode, content_type = choose_encoder(request.accept)
        return Response(200, encode(self.registry), content_type, v1=False)


def _rate_limited(refused: RateLimited) -> Response:
    """``429 RATE_LIMITED`` with the whole seconds until the request's tokens would be there."""
    retry = max(1, math.ceil(refused.retry_after))
    return attrs.evolve(
        error_response(429, "RATE_LIMITED"), headers=(("Retry-After", str(retry)),)
    )


def _parse_text_mpub(body: bytes, max_msg: int, read_max: int) -> list[bytes]:
    """nsqd's text ``/mpub``: newline-separated, empty lines skipped, ``\\r`` kept. ``body`` was
    read with ``read_max`` (= max body + 1): reaching it means the body was too big."""
    out = []
    total = 0
    pieces = body.split(b"\n")
    last = len(pieces) - 1
    for i, piece in enumerate(pieces):
        total += len(piece) + (i != last)
        if total == read_max:
            raise HttpError(413, "BODY_TOO_BIG")
        if not piece:
            continue
        if len(piece) > max_msg:
            raise HttpError(413, "MSG_TOO_BIG")
        out.append(piece)
    return out


def _parse_binary_mpub(body: bytes, max_msg: int, max_body: int) -> list[bytes]:
    """nsqd's ``readMPUB`` on a whole body: ``[num][size][bytes]...`` (TCP MPUB's body without
    its leading size); errors are 413 with the TCP code minus ``E_``."""
    end = len(body)
    if end < 4:
        raise HttpError(413, "BAD_BODY")
    count = int.from_bytes(body[:4], "big", signed=True)
    # 4 bytes of count, then at least 4 bytes of size + 1 byte of body per message.
    if count <= 0 or count > (max_body - 4) // 5:
        raise HttpError(413, "BAD_BODY")
    out = []
    pos = 4
    for _ in range(count):
        if pos + 4 > end:
            raise HttpError(413, "BAD_MESSAGE")
        size = int.from_bytes(body[pos : pos + 4], "big", signed=True)
        pos += 4
        if size <= 0 or size > max_msg or pos + size > end:
            raise HttpError(413, "BAD_MESSAGE")
        out.append(body[pos : pos + size])
        pos += size
    return out

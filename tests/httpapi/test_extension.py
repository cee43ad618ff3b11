"""``/pub`` and ``/mpub`` with lmq's per-message fields: query parameters and Lmq-Header-*.

Rules for this module: the in-process daemon with HTTP on 127.0.0.1 port 0; requests with
``tests.support.http``; what was stored is read from the consumer's frames (a consumer that
negotiated the extension) or, for the fields consumers never see (TTL, dedup id), from the
channel's in-flight messages.
"""

from __future__ import annotations

import pytest
import trio

from lmqd.message_ext import MessageExt
from lmqd.protocol import MessageFrame
from tests.support.daemon import RunningDaemon, StartDaemon
from tests.support.http import http
from tests.support.wire import Wire

TIMEOUT = 10


async def _consume(running: RunningDaemon, count: int) -> list[MessageFrame]:
    wire = await Wire.connect(running.tcp, feature_negotiation=True, lmq_ext=1)
    await wire.sub("t", "c", rdy=count)
    frames = []
    for _ in range(count):
        frame = await wire.frame()
        assert isinstance(frame, MessageFrame)
        frames.append(frame)
    await wire.aclose()
    return frames


async def test_pub_with_priority_ttl_dedup_id_and_headers(start_daemon: StartDaemon) -> None:
    with trio.fail_after(TIMEOUT):
        running = await start_daemon(http=True)
        await http(running.http, "POST", "/topic/create?topic=t")
        await http(running.http, "POST", "/channel/create?topic=t&channel=c")
        answer = await http(
            running.http, "POST", "/pub?topic=t&priority=3&ttl_ms=5000&dedup_id=order-9",
            b"body", headers=(("Lmq-Header-Trace", "abc"), ("lmq-header-tenant", "acme")),
        )
        assert (answer.status, answer.body) == (200, b"OK")
        [frame] = await _consume(running, 1)
        assert frame.body == b"body"
        assert frame.ext == MessageExt(priority=3, headers=(("trace", "abc"), ("tenant", "acme")))
        [held] = list(running.broker.topics["t"].channels["c"].in_flight)
        assert held.ext == MessageExt(3, 5000, b"order-9", (("trace", "abc"), ("tenant", "acme")))


async def test_mpub_applies_the_fields_to_every_message_with_its_own_dedup_id(
    start_daemon: StartDaemon,
) -> None:
    with trio.fail_after(TIMEOUT):
        running = await start_daemon(http=True)
        await http(running.http, "POST", "/topic/create?topic=t")
        await http(running.http, "POST", "/channel/create?topic=t&channel=c")
        answer = await http(
            running.http, "POST", "/mpub?topic=t&priority=2&dedup_id=batch-1", b"a\nb\nc\n",
            headers=(("Lmq-Header-Source", "etl"),),
        )
        assert answer.status == 200
        frames = await _consume(running, 3)
        assert {f.ext for f in frames} == {MessageExt(priority=2, headers=(("source", "etl"),))}
        held = sorted(running.broker.topics["t"].channels["c"].in_flight, key=lambda m: m.body)
        assert [m.ext.dedup_id for m in held if m.ext] == [b"batch-1:0", b"batch-1:1",
                                                             b"batch-1:2"]


async def test_a_plain_pub_stores_no_extension(start_daemon: StartDaemon) -> None:
    with trio.fail_after(TIMEOUT):
        running = await start_daemon(http=True)
        await http(running.http, "POST", "/topic/create?topic=t")
        await http(running.http, "POST", "/channel/create?topic=t&channel=c")
        assert (await http(running.http, "POST", "/pub?topic=t&priority=0", b"x")).status == 200
        [frame] = await _consume(running, 1)
        assert frame.ext is None
        [held] = list(running.broker.topics["t"].channels["c"].in_flight)
        assert held.ext is None


@pytest.mark.parametrize(
    ("target", "headers", "error"),
    [
        ("/pub?topic=t&priority=10", (), "INVALID_PRIORITY"),
        ("/pub?topic=t&priority=-1", (), "INVALID_PRIORITY"),
        ("/pub?topic=t&priority=x", (), "INVALID_PRIORITY"),
        ("/pub?topic=t&ttl_ms=0", (), "INVALID_TTL_MS"),
        ("/pub?topic=t&ttl_ms=4294967296", (), "INVALID_TTL_MS"),
        ("/pub?topic=t&dedup_id=", (), "INVALID_DEDUP_ID"),
        ("/pub?topic=t&dedup_id=" + "x" * 256, (), "INVALID_DEDUP_ID"),
        ("/mpub?topic=t&dedup_id=" + "x" * 254, (), "INVALID_DEDUP_ID"),
        ("/pub?topic=t", (("Lmq-Header-K", "v" * 17000),), "INVALID_HEADER"),
    ],
)
async def test_bad_fields_are_400_and_nothing_is_published(
    start_daemon: StartDaemon, target: str, headers: tuple[tuple[str, str], ...], error: str
) -> None:
    with trio.fail_after(TIMEOUT):
        running = await start_daemon(http=True)
        answer = await http(running.http, "POST", target, b"x\ny\n", headers=headers)
        assert answer.status == 400
        assert error in answer.body.decode()
        topic = running.broker.topics.get("t")
        assert topic is None or topic.depth == 0

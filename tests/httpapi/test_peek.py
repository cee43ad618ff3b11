"""``GET /peek``: every state of a topic and a channel, from memory and from disk, while
consumers run; nothing changes; bad input.

Rules for this module: the in-process daemon with HTTP on 127.0.0.1 port 0; real V2 consumers
(``Wire``); what a peek shows is checked against what the consumer then receives.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from lmqd.message_ext import MessageExt
from lmqd.protocol.extension import XpubMessage, encode_xpub
from tests.support.daemon import RunningDaemon, StartDaemon, eventually
from tests.support.http import http
from tests.support.wire import OK, Wire

TIMEOUT = 10


async def peek(running: RunningDaemon, query: str) -> dict[str, Any]:
    answer = await http(running.http, "GET", "/peek?" + query)
    assert answer.status == 200, answer.body
    doc: dict[str, Any] = answer.json()
    return doc


async def publish(running: RunningDaemon, *bodies: bytes) -> None:
    for body in bodies:
        assert (await http(running.http, "POST", "/pub?topic=t", body)).status == 200


@pytest.mark.parametrize("mem_queue_size", [10_000, 0])
async def test_peek_shows_the_topics_backlog_and_changes_nothing(
    start_daemon: StartDaemon, tmp_path: Path, mem_queue_size: int
) -> None:
    with trio.fail_after(TIMEOUT):
        running = await start_daemon(tmp_path, http=True, mem_queue_size=mem_queue_size)
        await publish(running, b"a", b"\xff\xfe", b"c")  # no channel: the topic keeps them
        doc = await peek(running, "topic=t&n=2")
        assert (doc["channel"], doc["state"], doc["count"]) == (None, "queued", 2)
        first, second = doc["messages"]
        assert (first["body"], first["body_encoding"], first["offset"]) == ("a", "utf-8", 0)
        assert (second["body"], second["body_encoding"]) == ("//4=", "base64")
        assert first["priority"] == 0 and first["headers"] == {} and first["attempts"] == 0
        assert running.broker.topics["t"].depth == 3
        consumer = await Wire.connect(running.tcp)
        await consumer.sub("t", "c", rdy=3)
        assert [(await consumer.message()).body for _ in range(3)] == [b"a", b"\xff\xfe", b"c"]
        await consumer.aclose()


async def test_peek_of_each_channel_state_while_a_consumer_holds_messages(
    start_daemon: StartDaemon, tmp_path: Path
) -> None:
    with trio.fail_after(TIMEOUT):
        running = await start_daemon(tmp_path, http=True, mem_queue_size=0)
        consumer = await Wire.connect(running.tcp, msg_timeout=60_000)
        await consumer.sub("t", "c", rdy=2)
        await publish(running, b"m1", b"m2", b"m3", b"m4")
        held = [await consumer.message() for _ in range(2)]
        await consumer.rdy(0)
        await consumer.req(held[1].id, 30_000)  # m2 deferred 30 s
        channel = running.broker.topics["t"].channels["c"]
        await eventually(lambda: channel.deferred_count == 1)
        in_flight = await peek(running, "topic=t&channel=c&state=in_flight")
        assert [m["body"] for m in in_flight["messages"]] == ["m1"]
        assert in_flight["messages"][0]["deadline"] is not None
        assert in_flight["messages"][0]["attempts"] == 1
        deferred = await peek(running, "topic=t&channel=c&state=deferred")
        assert [m["body"] for m in deferred["messages"]] == ["m2"]
        assert deferred["messages"][0]["deliver_at"] is not None
        queued = await peek(running, "topic=t&channel=c")
        assert [(m["body"], m["offset"]) for m in queued["messages"]] == [("m3", 2), ("m4", 3)]
        # Nothing moved: the consumer gets exactly what the peek showed, in that order.
        await consumer.fin(held[0].id)
        await consumer.rdy(2)
        assert (await consumer.message()).body == b"m3"
        assert (await consumer.message()).body == b"m4"
        await consumer.aclose()


async def test_peek_shows_requeued_messages_from_the_channels_own_store_after_a_restart(
    start_daemon: StartDaemon, tmp_path: Path
) -> None:
    with trio.fail_after(TIMEOUT):
        first = await start_daemon(tmp_path, http=True)
        consumer = await Wire.connect(first.tcp)
        await consumer.sub("t", "c", rdy=1)
        await publish(first, b"back")
        m = await consumer.message()
        await consumer.aclose()  # in flight when the connection goes: requeued
        await first.stop()
        second = await start_daemon(tmp_path, http=True)
        queued = await peek(second, "topic=t&channel=c")
        assert [(q["body"], q["id"], q["attempts"]) for q in queued["messages"]] == [
            ("back", m.id.decode(), 1)
        ]


async def test_peek_shows_priority_and_headers(start_daemon: StartDaemon) -> None:
    with trio.fail_after(TIMEOUT):
        running = await start_daemon(http=True)
        producer = await Wire.connect(running.tcp, feature_negotiation=True, lmq_ext=1)
        ext = MessageExt(priority=6, ttl_ms=1000, headers=(("source", "dlq"),))
        await producer.send(encode_xpub("t", [XpubMessage(b"x", ext)]))
        assert await producer.frame() == OK
        await producer.aclose()
        [m] = (await peek(running, "topic=t"))["messages"]
        assert (m["priority"], m["headers"]) == (6, {"source": "dlq"})


async def pages(running: RunningDaemon, query: str, n: int) -> list[list[str]]:
    """Every page of ``n`` bodies, following ``skip`` until ``more`` is false."""
    found: list[list[str]] = []
    skip = 0
    while True:
        doc = await peek(running, f"{query}&n={n}&skip={skip}")
        assert doc["skip"] == skip and doc["count"] == len(doc["messages"]) <= n
        found.append([m["body"] for m in doc["messages"]])
        if not doc["more"]:
            return found
        assert doc["count"] == n  # a page that says more is full
        skip += doc["count"]


@pytest.mark.parametrize("mem_queue_size", [10_000, 3])
async def test_peek_pages_through_each_state_in_order(
    start_daemon: StartDaemon, tmp_path: Path, mem_queue_size: int
) -> None:
    with trio.fail_after(TIMEOUT):
        running = await start_daemon(tmp_path, http=True, mem_queue_size=mem_queue_size)
        bodies = [f"m{i}" for i in range(25)]
        await publish(running, *(b.encode() for b in bodies))
        assert await pages(running, "topic=t", 10) == [bodies[:10], bodies[10:20], bodies[20:]]
        assert await pages(running, "topic=t", 25) == [bodies]
        last = await peek(running, "topic=t&skip=25")
        assert (last["count"], last["more"], last["messages"]) == (0, False, [])

        consumer = await Wire.connect(running.tcp, msg_timeout=60_000)
        await consumer.sub("t", "c", rdy=4)
        held = [await consumer.message() for _ in range(4)]
        await consumer.rdy(0)
        await consumer.req(held[0].id, 0)  # back to the channel's own store: first in line
        await consumer.req(held[1].id, 30_000)  # deferred
        channel = running.broker.topics["t"].channels["c"]
        await eventually(lambda: channel.deferred_count == 1 and channel.in_flight_count == 2)
        ready = ["m0", *bodies[4:]]
        assert (await peek(running, "topic=t&channel=c&n=1000"))["messages"][0]["body"] == "m0"
        found = await pages(running, "topic=t&channel=c", 7)
        assert [len(p) for p in found] == [7, 7, 7, 1]
        assert [b for page in found for b in page] == ready
        assert await pages(running, "topic=t&channel=c&state=in_flight", 1) == [["m2"], ["m3"]]
        assert await pages(running, "topic=t&channel=c&state=deferred", 1) == [["m1"]]
        deep = await peek(running, "topic=t&channel=c&skip=100000")
        assert (deep["count"], deep["more"]) == (0, False)
        # Paging changed nothing: the consumer gets the ready ones in the order shown.
        await consumer.rdy(30)
        assert [(await consumer.message()).body.decode() for _ in ready] == ready
        await consumer.aclose()


@pytest.mark.parametrize(
    ("query", "status", "error"),
    [
        ("", 400, "MISSING_ARG_TOPIC"),
        ("topic=bad!", 400, "INVALID_ARG_TOPIC"),
        ("topic=nope", 404, "TOPIC_NOT_FOUND"),
        ("topic=t&channel=bad!", 400, "INVALID_ARG_CHANNEL"),
        ("topic=t&channel=nope", 404, "CHANNEL_NOT_FOUND"),
        ("topic=t&state=waiting", 400, "INVALID_ARG_STATE"),
        ("topic=t&state=in_flight", 400, "MISSING_ARG_CHANNEL"),
        ("topic=t&n=0", 400, "INVALID_ARG_N"),
        ("topic=t&n=1001", 400, "INVALID_ARG_N"),
        ("topic=t&n=x", 400, "INVALID_ARG_N"),
        ("topic=t&skip=-1", 400, "INVALID_ARG_SKIP"),
        ("topic=t&skip=x", 400, "INVALID_ARG_SKIP"),
        ("topic=t&skip=", 400, "INVALID_ARG_SKIP"),
        ("topic=t&skip=100001", 400, "INVALID_ARG_SKIP"),
        ("topic=t&skip=0000001", 400, "INVALID_ARG_SKIP"),
    ],
)
async def test_bad_peeks(start_daemon: StartDaemon, query: str, status: int, error: str) -> None:
    with trio.fail_after(TIMEOUT):
        running = await start_daemon(http=True)
        await http(running.http, "POST", "/topic/create?topic=t")
        answer = await http(running.http, "GET", "/peek?" + query)
        assert answer.status == status
        assert error in answer.body.decode()

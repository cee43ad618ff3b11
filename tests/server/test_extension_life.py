"""A message's headers and priority through its whole life, as a consumer that negotiated lmq's
extension sees them: requeued (REQ with and without a delay, a timeout), stored on disk (a
backlog spilled to the topic's log, the channel's own store), across a clean restart (default
and ``--durable``), and dead-lettered (the original headers kept, the ``lmq-dead-letter-*`` ones
added or replaced). The kill -9 case is in ``tests/durability/test_extension_crash.py``.

Rules for this module (STYLE.md):
- A real ``LmqDaemon`` (``start_daemon``, 127.0.0.1 port 0). The requeue test talks to it over
  memory streams (``serve_in_memory``) on the autojump clock and asserts exact virtual times;
  the others use TCP and the real clock, each under ``fail_after``.
- Every delivery is checked, not only the first: its id, timestamp, body and the fields the
  consumer must see (priority and headers; never the TTL or the dedup id), frame type 3 exactly
  when there are such fields.
- Messages of different priorities are compared by body, never by order (priority delivery is
  tested elsewhere).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio
import trio.testing

from lmqd.message_ext import MessageExt
from lmqd.protocol import MessageFrame
from lmqd.protocol.extension import XpubMessage, encode_xpub
from tests.support.daemon import RunningDaemon, StartDaemon, eventually, serve_in_memory
from tests.support.http import http
from tests.support.rawbytes import MAGIC_V2, identify
from tests.support.wire import OK, Wire

TIMEOUT = 20
NEGOTIATE = {"feature_negotiation": True, "lmq_ext": 1}


def ext_of(i: int) -> MessageExt | None:
    """What message ``i`` is published with: every third plain, the others with a priority, a
    TTL (an hour), a dedup id and headers of their own."""
    if i % 3 == 2:
        return None
    return MessageExt(
        priority=1 + i % 9, ttl_ms=3_600_000, dedup_id=b"id-%d" % i,
        headers=(("seq", str(i)), ("trace", "t" * (i % 5))),
    )  # fmt: skip


def body_of(i: int) -> bytes:
    return b"m-%03d" % i


def seen(ext: MessageExt | None) -> MessageExt | None:
    """What a negotiating consumer gets of ``ext``: priority and headers, None for neither."""
    if ext is None or not (ext.priority or ext.headers):
        return None
    return MessageExt(priority=ext.priority, headers=ext.headers)


EXPECTED = {body_of(i): seen(ext_of(i)) for i in range(100)}


def xpub(topic: str, indexes: range, defer_ms: int | None = None) -> bytes:
    return encode_xpub(
        topic, [XpubMessage(body_of(i), ext_of(i) or MessageExt()) for i in indexes], defer_ms
    )


def check(frame: MessageFrame) -> None:
    """The frame carries exactly the fields its message was published with."""
    assert frame.ext == EXPECTED[frame.body], (frame.body, frame.ext)


# -- requeue and timeout, on the autojump clock ------------------------------------------------


async def _memory_wire(running: RunningDaemon, nursery: trio.Nursery, **ident: object) -> Wire:
    wire = Wire(serve_in_memory(running.broker, nursery))
    await wire.send(MAGIC_V2 + identify(**ident))
    await wire.response()
    return wire


@pytest.mark.parametrize("mem_queue_size", [10_000, 0], ids=["memory", "own-store"])
async def test_req_and_timeout_redeliver_the_same_fields_at_exact_times(
    start_daemon: StartDaemon,
    nursery: trio.Nursery,
    autojump_clock: trio.testing.MockClock,
    mem_queue_size: int,
) -> None:
    running = await start_daemon(mem_queue_size=mem_queue_size)
    consumer = await _memory_wire(
        running, nursery, msg_timeout=5000, heartbeat_interval=60_000, **NEGOTIATE
    )
    await consumer.sub("t", "c", rdy=6)
    producer = await _memory_wire(running, nursery, **NEGOTIATE)
    await producer.send(xpub("t", range(6)))
    assert await producer.frame() == OK
    first = {}
    for _ in range(6):
        frame = await consumer.message()
        check(frame)
        assert frame.attempts == 1
        first[frame.body] = frame
    start = trio.current_time()
    # m-000 and m-002 (plain) back at once, m-001 after 2 s, m-003 by its timeout (5 s);
    # m-004 and m-005 are FIN'd.
    await consumer.req(first[b"m-000"].id, 0)
    await consumer.req(first[b"m-002"].id, 0)
    await consumer.req(first[b"m-001"].id, 2000)
    await consumer.fin(first[b"m-004"].id)
    await consumer.fin(first[b"m-005"].id)
    when = {}
    for _ in range(4):
        frame = await consumer.message()
        check(frame)
        before = first[frame.body]
        assert (frame.id, frame.timestamp, frame.attempts) == (before.id, before.timestamp, 2)
        when[frame.body] = trio.current_time() - start
        if frame.body != b"m-003":
            # Out of the way for a minute (before its 5 s timeout could bring it back).
            await consumer.req(frame.id, 60_000)
        else:
            await consumer.fin(frame.id)
    assert when == {b"m-000": 0.0, b"m-002": 0.0, b"m-001": 2.0, b"m-003": 5.0}
    # The third delivery, from the deferred queue: still the same fields.
    third = {}
    for _ in range(3):
        frame = await consumer.message()
        check(frame)
        third[frame.body] = (frame.attempts, trio.current_time() - start)
    assert third == {b"m-000": (3, 60.0), b"m-002": (3, 60.0), b"m-001": (3, 62.0)}
    channel = running.broker.topics["t"].channels["c"]
    assert (channel.requeue_count, channel.timeout_count) == (6, 1)


# -- disk and restart, on the real clock ---------------------------------------------------------


async def _consume_all(
    running: RunningDaemon, topic: str, channel: str, bodies: set[bytes]
) -> dict[bytes, list[int]]:
    """Subscribe with the extension and FIN until every one of ``bodies`` came; each delivery
    ``check``-ed. Returns the attempts of every delivery per body."""
    consumer = await Wire.connect(running.tcp, **NEGOTIATE)
    await consumer.sub(topic, channel, rdy=50)
    got: dict[bytes, list[int]] = {}
    while not bodies <= set(got):
        frame = await consumer.message()
        check(frame)
        got.setdefault(frame.body, []).append(frame.attempts)
        await consumer.fin(frame.id)
    await consumer.aclose()
    return got


async def test_a_backlog_spilled_to_the_log_keeps_every_message_s_fields(
    start_daemon: StartDaemon, tmp_path: Path
) -> None:
    with trio.fail_after(TIMEOUT):
        running = await start_daemon(tmp_path, mem_queue_size=2)
        waiting = await Wire.connect(running.tcp, **NEGOTIATE)
        await waiting.sub("t", "c")  # the channel exists, nobody is ready
        producer = await Wire.connect(running.tcp, **NEGOTIATE)
        for start in range(0, 60, 10):
            await producer.send(xpub("t", range(start, start + 10)))
            assert await producer.frame() == OK
        await producer.send(xpub("lonely", range(60)))  # a topic without a channel
        assert await producer.frame() == OK
        await producer.aclose()
        assert running.broker.topics["t"].stream.log is not None  # on disk: the topic log
        bodies = {body_of(i) for i in range(60)}
        assert await _consume_all(running, "t", "c", bodies) == {b: [1] for b in bodies}
        assert await _consume_all(running, "lonely", "c", bodies) == {b: [1] for b in bodies}
        await waiting.aclose()


@pytest.mark.parametrize("durable", [False, True], ids=["default", "durable"])
async def test_fields_survive_a_clean_restart_in_every_store(
    start_daemon: StartDaemon, tmp_path: Path, durable: bool
) -> None:
    """Before the restart: a backlog in the topic log (``t``, and ``lonely`` with no channel),
    requeued messages in the channel's own store (``--mem-queue-size 2``), deferred ones (REQ
    with a delay, a deferred XPUB), two still in flight at shutdown."""
    with trio.fail_after(TIMEOUT):
        first = await start_daemon(tmp_path, mem_queue_size=2, durable=durable)
        consumer = await Wire.connect(first.tcp, msg_timeout=60_000, **NEGOTIATE)
        await consumer.sub("t", "c")
        producer = await Wire.connect(first.tcp, **NEGOTIATE)
        for command in (xpub("t", range(30)), xpub("t", range(30, 33), 200), xpub("lonely",
                                                                                  range(20))):
            await producer.send(command)
            assert await producer.frame() == OK
        await producer.aclose()
        await consumer.rdy(8)
        held = [await consumer.message() for _ in range(8)]
        for frame in held:
            check(frame)
        await consumer.rdy(0)
        for frame in held[:4]:
            await consumer.req(frame.id, 0)  # the own store (on disk: 2 fit in memory)
        await consumer.req(held[4].id, 300)  # deferred
        await consumer.fin(held[5].id)
        # held[6:] are in flight when the daemon stops.
        channel = first.broker.topics["t"].channels["c"]
        await eventually(lambda: channel.in_flight_count == 2)
        await consumer.aclose()
        await first.stop()

        second = await start_daemon(tmp_path, mem_queue_size=2, durable=durable)
        rest = {body_of(i) for i in range(33)} - {held[5].body}
        got = await _consume_all(second, "t", "c", rest)
        assert set(got) == rest
        for frame in held[:5] + held[6:]:
            assert got[frame.body] == [2], frame.body  # delivered once before the restart
        assert await _consume_all(second, "lonely", "c", {body_of(i) for i in range(20)})


# -- dead letters ---------------------------------------------------------------------------------


async def _post(running: RunningDaemon, target: str, doc: dict[str, object]) -> None:
    answer = await http(running.http, "POST", target, json.dumps(doc).encode())
    assert answer.status == 200, answer.body


def _origin(
    topic: str, channel: str, reason: str, attempts: int, path: str = ""
) -> tuple[tuple[str, str], ...]:
    return (
        ("lmq-dead-letter-topic", topic),
        ("lmq-dead-letter-channel", channel),
        ("lmq-dead-letter-reason", reason),
        ("lmq-dead-letter-attempts", str(attempts)),
        ("lmq-dead-letter-path", path or topic),
    )


async def test_dead_letters_keep_their_fields_and_name_their_origin(
    start_daemon: StartDaemon, tmp_path: Path
) -> None:
    """Out of attempts and expired, with the dead-letter topic on disk; a message dead-lettered
    twice names its last origin (and both topics in its path); one whose headers leave no room
    keeps only the origin."""
    with trio.fail_after(TIMEOUT):
        running = await start_daemon(tmp_path, http=True, mem_queue_size=2)
        dead = await Wire.connect(running.tcp, **NEGOTIATE)
        await dead.sub("t.dead", "x")  # a consumer of the dead-letter topic, not ready yet
        again = await Wire.connect(running.tcp, **NEGOTIATE)
        await again.sub("t.dead", "y")  # gives its messages up in turn
        worker = await Wire.connect(running.tcp, **NEGOTIATE)
        await worker.sub("t", "c")
        await _post(running, "/channel/policy?topic=t&channel=c",
                    {"max_attempts": 2, "dead_letter_topic": "t.dead"})  # fmt: skip
        await _post(running, "/channel/policy?topic=t.dead&channel=y",
                    {"max_attempts": 1, "dead_letter_topic": "t.dead2"})  # fmt: skip
        full = MessageExt(priority=2, headers=tuple((f"k{i}", "v") for i in range(64)))
        producer = await Wire.connect(running.tcp, **NEGOTIATE)
        messages = [XpubMessage(body_of(i), ext_of(i) or MessageExt()) for i in range(6)]
        messages.append(XpubMessage(b"full", full))
        await producer.send(encode_xpub("t", messages))
        assert await producer.frame() == OK
        # Out of attempts: each REQ'd twice.
        await worker.rdy(10)
        for _ in range(14):
            frame = await worker.message()
            await worker.req(frame.id, 0)
        await worker.rdy(0)
        # Expired: its own ttl_ms, 50 ms, passes before anyone is ready.
        short = MessageExt(priority=5, ttl_ms=50, headers=(("kind", "short"),))
        await producer.send(encode_xpub("t", [XpubMessage(b"short", short)]))
        assert await producer.frame() == OK
        await trio.sleep(0.2)
        await worker.rdy(1)

        expected = {
            body_of(i): MessageExt(
                priority=(ext_of(i) or MessageExt()).priority,
                headers=(ext_of(i) or MessageExt()).headers + _origin("t", "c", "max_attempts", 2),
            )
            for i in range(6)
        }
        # 64 headers and 5 more do not fit in one message: the origin wins.
        expected[b"full"] = MessageExt(priority=2, headers=_origin("t", "c", "max_attempts", 2))
        expected[b"short"] = MessageExt(
            priority=5, headers=(("kind", "short"), *_origin("t", "c", "expired", 0))
        )
        await dead.rdy(20)
        got: dict[bytes, MessageFrame] = {}
        while len(got) < len(expected):
            frame = await dead.message()
            assert frame.body not in got, frame.body
            got[frame.body] = frame
        assert {b: f.ext for b, f in got.items()} == expected
        # Attempts start again on the dead-letter topic (the count is in the origin header).
        assert {b: f.attempts for b, f in got.items()} == {b: 1 for b in expected}

        # Given up again, on t.dead/y: the origin is replaced, the path grows, the rest kept.
        dead2 = await Wire.connect(running.tcp, **NEGOTIATE)
        await dead2.sub("t.dead2", "z", rdy=1)
        await again.rdy(1)
        frame = await again.message()
        assert frame.ext == expected[frame.body]
        await again.req(frame.id, 0)
        twice = await dead2.message()
        before = expected[frame.body]
        assert (frame.attempts, twice.body, twice.attempts) == (1, frame.body, 1)
        assert twice.ext == MessageExt(
            priority=before.priority,
            headers=before.headers[:-5]
            + _origin("t.dead", "y", "max_attempts", frame.attempts, "t,t.dead"),
        )
        for wire in (dead, dead2, again, worker, producer):
            await wire.aclose()

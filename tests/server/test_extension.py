"""lmq's message extension on a real daemon: negotiation, XPUB, frame type 3, and nsqd's bytes
for every client that did not ask.

Rules for this module: the in-process daemon on 127.0.0.1 port 0 (``start_daemon``); exact
bytes through ``tests.support.rawbytes.NsqSocket`` (a raw socket that trusts no codec of ours),
run in a worker thread; the ``Wire`` client where decoded frames are enough.
"""

from __future__ import annotations

import struct
from pathlib import Path

import trio

from lmqd.message_ext import MessageExt, encode_ext
from lmqd.protocol import Error, MessageFrame, Mpub
from lmqd.protocol.extension import XpubMessage, encode_xpub
from tests.support.daemon import StartDaemon, eventually
from tests.support.http import http
from tests.support.rawbytes import NsqSocket, identify, rdy, sub
from tests.support.wire import OK, Wire

TIMEOUT = 10
EXT = MessageExt(priority=4, ttl_ms=60_000, dedup_id=b"d-1", headers=(("trace", "abc"),))
NEGOTIATE: dict[str, object] = {"feature_negotiation": True, "lmq_ext": 1}


async def _xpub(address: tuple[str, int], topic: str, messages: list[XpubMessage]) -> None:
    producer = await Wire.connect(address, **NEGOTIATE)
    assert producer.negotiated is not None and producer.negotiated["lmq_ext"] == 1
    await producer.send(encode_xpub(topic, messages))
    assert await producer.frame() == OK
    await producer.aclose()


def _frames(address: str, ident: dict[str, object] | None, count: int) -> list[tuple[int, bytes]]:
    with NsqSocket(address) as s:
        if ident is not None:
            s.send(identify(**ident))
            s.read_skipping_heartbeats()
        s.send(sub("t", "c"))
        s.expect_response()
        s.send(rdy(count))
        return [tuple(s.read_skipping_heartbeats()) for _ in range(count)]  # type: ignore[misc]


async def test_a_client_that_asks_gets_frame_type_3_and_others_nsqd_s_bytes(
    start_daemon: StartDaemon,
) -> None:
    with trio.fail_after(TIMEOUT):
        running = await start_daemon()
        address = f"{running.tcp[0]}:{running.tcp[1]}"
        # Both channels exist before the publish, so each gets both messages.
        for ident in (NEGOTIATE, None):
            wire = await Wire.connect(running.tcp, **(ident or {}))
            await wire.sub("t", "c" if ident else "plain")
            await wire.aclose()
        await _xpub(running.tcp, "t", [XpubMessage(b"one", EXT), XpubMessage(b"two", MessageExt())])

        ext_frames = await trio.to_thread.run_sync(_frames, address, NEGOTIATE, 2)
        (t1, d1), (t2, d2) = ext_frames
        block = encode_ext(MessageExt(priority=4, headers=(("trace", "abc"),)))
        assert t1 == 3
        assert d1[26:28] == struct.pack(">H", len(block))
        assert d1[28 : 28 + len(block)] == block and d1[28 + len(block) :] == b"one"
        assert (t2, d2[26:]) == (2, b"two")

        def plain() -> list[tuple[int, bytes]]:
            with NsqSocket(address) as s:
                s.send(sub("t", "plain"))
                s.expect_response()
                s.send(rdy(2))
                return [tuple(s.read_skipping_heartbeats()) for _ in range(2)]  # type: ignore[misc]

        frames = await trio.to_thread.run_sync(plain)
        assert [(t, d[10:26] != b"", d[26:]) for t, d in frames] == [
            (2, True, b"one"),
            (2, True, b"two"),
        ]


async def test_the_identify_answer_says_what_was_accepted(start_daemon: StartDaemon) -> None:
    with trio.fail_after(TIMEOUT):
        running = await start_daemon()
        plain = await Wire.connect(running.tcp, feature_negotiation=True)
        assert plain.negotiated is not None and "lmq_ext" not in plain.negotiated
        future = await Wire.connect(running.tcp, feature_negotiation=True, lmq_ext=2)
        assert future.negotiated is not None and future.negotiated["lmq_ext"] == 0
        wrong_type = await Wire.connect(running.tcp, feature_negotiation=True, lmq_ext="1")
        assert wrong_type.negotiated is not None and wrong_type.negotiated["lmq_ext"] == 0
        for wire in (plain, future, wrong_type):
            await wire.aclose()


async def test_xpub_without_the_extension_is_refused(start_daemon: StartDaemon) -> None:
    with trio.fail_after(TIMEOUT):
        running = await start_daemon()
        for ident in ({}, {"feature_negotiation": True}, {"feature_negotiation": True,
                                                           "lmq_ext": 2}):
            wire = await Wire.connect(running.tcp, **ident)
            await wire.send(encode_xpub("t", [XpubMessage(b"x", EXT)]))
            error = await wire.frame()
            assert isinstance(error, Error) and error.code == "E_INVALID"
            assert "XPUB needs the lmq extension" in error.text
            await wire.aclose()
        assert "t" not in running.broker.topics


async def test_a_malformed_block_is_a_clear_error_and_nothing_is_stored(
    start_daemon: StartDaemon,
) -> None:
    with trio.fail_after(TIMEOUT):
        running = await start_daemon()
        wire = await Wire.connect(running.tcp, **NEGOTIATE)
        good = encode_xpub("t", [XpubMessage(b"a", EXT), XpubMessage(b"b", EXT)])
        bad = good.replace(b"\x05trace", b"\x05tr\nce")  # a control character in a key
        await wire.send(bad)
        error = await wire.frame()
        assert isinstance(error, Error)
        assert (error.code, error.text) == (
            "E_BAD_MESSAGE", "XPUB message 0: a header key has a control character"
        )
        assert "t" not in running.broker.topics
        other = await Wire.connect(running.tcp, **NEGOTIATE)  # the daemon carries on
        await other.send(encode_xpub("t", [XpubMessage(b"c", EXT)], defer_ms=10))
        assert await other.frame() == OK
        assert running.broker.topics["t"].depth == 1
        await wire.aclose()
        await other.aclose()


async def test_headers_and_priority_survive_disk_and_a_restart(
    start_daemon: StartDaemon, tmp_path: Path
) -> None:
    with trio.fail_after(TIMEOUT):
        first = await start_daemon(tmp_path, mem_queue_size=0)
        wire = await Wire.connect(first.tcp, **NEGOTIATE)
        await wire.sub("t", "c")
        await wire.aclose()
        await _xpub(first.tcp, "t", [XpubMessage(b"kept", EXT)])
        await first.stop()
        second = await start_daemon(tmp_path, mem_queue_size=0)
        consumer = await Wire.connect(second.tcp, **NEGOTIATE)
        await consumer.sub("t", "c", rdy=1)
        frame = await consumer.frame()
        assert isinstance(frame, MessageFrame)
        assert frame.body == b"kept"
        assert frame.ext == MessageExt(priority=4, headers=(("trace", "abc"),))
        await consumer.aclose()


async def test_a_repeated_dedup_id_is_answered_ok_and_enqueued_once(
    start_daemon: StartDaemon,
) -> None:
    with trio.fail_after(TIMEOUT):
        running = await start_daemon()
        producer = await Wire.connect(running.tcp, **NEGOTIATE)
        for body in (b"first", b"retry of first"):
            await producer.send(encode_xpub("t", [XpubMessage(body, MessageExt(dedup_id=b"o-1"))]))
            assert await producer.frame() == OK
        topic = running.broker.topics["t"]
        assert topic.depth == 1
        assert topic.statistics(trio.current_time()).to_dict()["topic_name"] == "t"
        assert topic.publish_counters.deduplicated == 1
        await producer.aclose()


async def test_a_dead_lettered_message_names_where_it_came_from(
    start_daemon: StartDaemon,
) -> None:
    with trio.fail_after(TIMEOUT):
        running = await start_daemon(http=True)
        consumer = await Wire.connect(running.tcp, **NEGOTIATE)
        await consumer.sub("t", "c")
        channel = running.broker.topics["t"].channels["c"]
        channel.set_policy({"max_attempts": 1, "dead_letter_topic": "t.dead"})
        await _xpub(running.tcp, "t", [XpubMessage(b"bad", EXT)])
        await consumer.rdy(1)
        frame = await consumer.frame()
        assert isinstance(frame, MessageFrame) and frame.body == b"bad"
        await consumer.req(frame.id, 0)  # out of attempts: dead-lettered
        await eventually(lambda: "t.dead" in running.broker.topics
                          and running.broker.topics["t.dead"].depth + sum(
                              c.depth for c in running.broker.topics["t.dead"].channels.values()
                          ) > 0)  # fmt: skip
        answer = await http(running.http, "GET", "/peek?topic=t.dead&channel=lmq.redrive")
        [message] = answer.json()["messages"]
        assert (message["body"], message["priority"]) == ("bad", 4)
        assert message["headers"] == {
            "trace": "abc",
            "lmq-dead-letter-topic": "t",
            "lmq-dead-letter-channel": "c",
            "lmq-dead-letter-reason": message["headers"]["lmq-dead-letter-reason"],
            "lmq-dead-letter-attempts": "1",
            "lmq-dead-letter-path": "t",
        }
        assert message["headers"]["lmq-dead-letter-reason"]
        await consumer.aclose()


async def test_xpubs_sent_together_are_answered_and_delivered_in_order(
    start_daemon: StartDaemon,
) -> None:
    # One buffer of XPUBs to one topic (the ones without dedup ids or deferral are published
    # as one run), an MPUB and a deferred XPUB among them: an OK each, every message once, in
    # order, with its fields; a repeated dedup id still enqueued once (the deferred one waits).
    with trio.fail_after(TIMEOUT):
        running = await start_daemon()
        consumer = await Wire.connect(running.tcp, **NEGOTIATE)
        await consumer.sub("t", "c")
        a = MessageExt(headers=(("h", "a"),))
        b = MessageExt(priority=2, headers=(("h", "b"),))
        commands = [
            encode_xpub("t", [XpubMessage(b"1", a), XpubMessage(b"2", a)]),
            encode_xpub("t", [XpubMessage(b"3", b), XpubMessage(b"4", MessageExt())]),
            Mpub(topic="t", bodies=[b"5"]).encode(),
            encode_xpub("t", [XpubMessage(b"6", a)]),
            encode_xpub("t", [XpubMessage(b"7", MessageExt(dedup_id=b"x"))]),
            encode_xpub("t", [XpubMessage(b"8", MessageExt(dedup_id=b"x"))]),
            encode_xpub("t", [XpubMessage(b"9", a)]),
            encode_xpub("t", [XpubMessage(b"10", a)], defer_ms=60_000),
        ]
        producer = await Wire.connect(running.tcp, **NEGOTIATE)
        await producer.send(b"".join(commands))
        assert [await producer.frame() for _ in commands] == [OK] * len(commands)
        await consumer.rdy(100)
        got = []
        for _ in range(8):
            frame = await consumer.frame()
            assert isinstance(frame, MessageFrame)
            got.append((frame.body, frame.ext))
        # b's priority may put "3" ahead of messages not yet delivered: compare as a set of
        # (body, fields), and the order of the rest.
        assert sorted(got) == sorted(
            [(b"1", a), (b"2", a), (b"3", b), (b"4", None), (b"5", None), (b"6", a),
             (b"7", None), (b"9", a)]
        )  # fmt: skip
        plain = [body for body, ext in got if ext is None or not ext.priority]
        assert plain == [b"1", b"2", b"4", b"5", b"6", b"7", b"9"]
        topic = running.broker.topics["t"]
        assert topic.message_count == 9 and topic.publish_counters.deduplicated == 1
        await producer.aclose()
        await consumer.aclose()

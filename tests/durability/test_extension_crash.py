"""``kill -9`` in ``--durable`` mode: every message keeps its headers and priority, wherever it
was (the topic log, a channel's own store after a REQ, in flight, deferred, a dead-letter topic).

Rules for this module (STYLE.md):
- The daemon is ``python -m lmqd`` (``tests.support.process.start_lmqd``) on 127.0.0.1 port 0
  with its data in ``tmp_path``; clients speak V2 (``tests.support.wire.Wire``) and negotiate
  lmq's extension.
- A message counts as published only once its ``OK`` was read (``--durable``: after the fsync).
  After the crash a message may come again (at least once), never without its fields: every
  delivery is checked.
- Bounded: every wait has a ``fail_after``.
"""

from __future__ import annotations

from pathlib import Path

import trio

from lmq_client.http import HTTPClient
from lmqd.message_ext import MessageExt
from lmqd.protocol import MessageFrame
from lmqd.protocol.extension import XpubMessage, encode_xpub
from tests.support.process import LmqdProcess, start_lmqd, stop_lmqd
from tests.support.wire import OK, Wire

from .conftest import IDENTIFY

TIMEOUT = 40
FLAGS = ["--durable", "--mem-queue-size=2"]
NEGOTIATE = {**IDENTIFY, "feature_negotiation": True, "lmq_ext": 1}
COUNT = 40
ORIGIN = (
    ("lmq-dead-letter-topic", "t"),
    ("lmq-dead-letter-channel", "dlq"),
    ("lmq-dead-letter-reason", "max_attempts"),
    ("lmq-dead-letter-attempts", "1"),
    ("lmq-dead-letter-path", "t"),
)


def ext_of(i: int) -> MessageExt:
    """Every fourth message plain; the others with a priority, a dedup id and headers."""
    if i % 4 == 3:
        return MessageExt()
    return MessageExt(
        priority=1 + i % 9, dedup_id=b"id-%d" % i, headers=(("seq", str(i)), ("k", "v" * i))
    )


def seen(i: int) -> MessageExt | None:
    ext = ext_of(i)
    return MessageExt(priority=ext.priority, headers=ext.headers) if ext.headers else None


def index_of(frame: MessageFrame) -> int:
    return int(frame.body.removeprefix(b"m-"))


async def connect(server: LmqdProcess) -> Wire:
    return await Wire.connect(server.tcp_host_port, **NEGOTIATE)


async def drain(
    server: LmqdProcess, topic: str, channel: str, want: set[int]
) -> list[MessageFrame]:
    """Every delivery on ``topic``/``channel`` (FIN'd) until each of ``want`` came and then
    0.5 s with nothing more."""
    consumer = await connect(server)
    await consumer.sub(topic, channel, rdy=50)
    frames: list[MessageFrame] = []
    while True:
        with trio.move_on_after(0.5 if want <= {index_of(f) for f in frames} else 10):
            frame = await consumer.message()
            frames.append(frame)
            await consumer.fin(frame.id)
            continue
        break
    await consumer.aclose()
    return frames


async def test_kill9_in_durable_mode_keeps_every_message_s_fields(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with trio.fail_after(TIMEOUT):
        first = await trio.to_thread.run_sync(start_lmqd, data, FLAGS)
        assert first.http_address is not None
        consumer = await connect(first)
        await consumer.sub("t", "c")
        bad = await connect(first)
        await bad.sub("t", "dlq")
        policy = {"max_attempts": 1, "dead_letter_topic": "t.dead"}
        await trio.to_thread.run_sync(
            lambda: HTTPClient(str(first.http_address)).channel_policy("t", "dlq", policy)
        )
        producer = await connect(first)
        for start in range(0, COUNT, 10):
            batch = [XpubMessage(b"m-%03d" % i, ext_of(i)) for i in range(start, start + 10)]
            await producer.send(encode_xpub("t", batch))
            assert await producer.frame() == OK  # fsynced
        await producer.aclose()

        # t/c: 3 back in the channel's own store, 1 deferred for 300 ms, 2 in flight.
        await consumer.rdy(6)
        held = [await consumer.message() for _ in range(6)]
        for frame in held:
            assert frame.ext == seen(index_of(frame))
        await consumer.rdy(0)
        for frame in held[:3]:
            await consumer.req(frame.id, 0)
        await consumer.req(held[3].id, 300)
        # t/dlq: 5 dead-lettered to t.dead.
        await bad.rdy(5)
        given_up = [await bad.message() for _ in range(5)]
        await bad.rdy(0)
        for frame in given_up:
            await bad.req(frame.id, 0)

        def dead_lettered() -> int:
            stats = HTTPClient(str(first.http_address)).stats("t")
            [topic] = stats["topics"]
            return sum(c["dead_letter_count"] for c in topic["channels"])

        for _ in range(200):  # polls /stats: 10 s at most
            if await trio.to_thread.run_sync(dead_lettered) == 5:
                break
            await trio.sleep(0.05)
        else:
            raise AssertionError("the 5 messages were not dead-lettered")
        await trio.sleep(0.5)  # the group commit's fsync of the REQs and the dead letters
        first.process.kill()
        await trio.to_thread.run_sync(first.process.wait)
        first.terminate()  # collects its output
        assert "Traceback" not in first.output(), first.output()
        for wire in (consumer, bad):
            await wire.aclose()

        second = await trio.to_thread.run_sync(start_lmqd, data, FLAGS)
        try:
            everything = set(range(COUNT))
            for channel in ("c", "dlq"):
                frames = await drain(second, "t", channel, everything - (
                    {index_of(f) for f in given_up} if channel == "dlq" else set()))  # fmt: skip
                for frame in frames:
                    assert frame.ext == seen(index_of(frame)), (channel, frame.body, frame.ext)
                assert {index_of(f) for f in frames} >= everything - {
                    index_of(f) for f in given_up if channel == "dlq"
                }
            dead = await drain(second, "t.dead", "lmq.redrive", {index_of(f) for f in given_up})
            assert {index_of(f) for f in dead} == {index_of(f) for f in given_up}
            for frame in dead:
                ext = ext_of(index_of(frame))
                assert frame.ext == MessageExt(priority=ext.priority, headers=ext.headers + ORIGIN)
        finally:
            await trio.to_thread.run_sync(stop_lmqd, second)

"""Default mode across a graceful restart: spill, metadata, nothing lost, deferred keep their time.

Rules for this module (STYLE.md):
- Real ``LmqDaemon``\\ s run in the test's nursery on 127.0.0.1 port 0 with ``data_path`` in
  ``tmp_path``; "restart" is a graceful shutdown (what SIGTERM does) and a new daemon on the same
  directory. Clients speak V2 through ``tests.support.wire.Wire``.
- Timing tests run on ``clock`` (a ``MockClock`` that jumps only after 0.1 s of real idleness, so
  the daemon's worker-thread calls finish before virtual time moves) with the wall clock the
  storage reads tied to virtual time (``fake_wall``): stored deadlines are then exact, and tests
  assert exact virtual times. A ticker task bounds any jump to ``TICK`` seconds.
- Every test has a ``fail_after`` guard.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import trio
import trio.testing

from lmqd.message import Message
from lmqd.protocol import MessageFrame, Response
from lmqd.storage import (
    AnchoredTimeBase,
    ChannelMetadata,
    DataDirLocked,
    DiskQueue,
    Metadata,
    StoredMessage,
    TopicLog,
    TopicMetadata,
    save_metadata,
)
from tests.support.daemon import RunningDaemon, StartDaemon, eventually
from tests.support.wire import Connect

TIMEOUT = 300.0  # virtual seconds (the clock below jumps)
TICK = 10.0
WALL0_NS = 1_750_000_000 * 10**9
OK = Response(data=b"OK")


@pytest.fixture
def clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0.1)


class FakeWall:
    """``time`` for ``lmqd.storage.timebase``: wall clock = ``WALL0_NS`` + virtual time."""

    @staticmethod
    def time_ns() -> int:
        return WALL0_NS + round(trio.current_time() * 1e9)


@pytest.fixture
def fake_wall(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr("lmqd.storage.timebase.time", FakeWall)
    yield


@pytest.fixture
async def ticker(nursery: trio.Nursery) -> AsyncIterator[None]:
    async def tick() -> None:
        for _ in range(int(TIMEOUT / TICK) + 1):  # a deadline every TICK bounds every jump
            await trio.sleep(TICK)

    nursery.start_soon(tick)
    yield


def make_messages(count: int) -> list[Message]:
    return [Message(b"%016x" % i, b"m%d" % i, WALL0_NS + i) for i in range(count)]


def body_set(n: int, prefix: bytes = b"m") -> set[bytes]:
    return {prefix + b"%d" % i for i in range(n)}


async def test_graceful_restart_loses_nothing_and_deferred_keep_their_time(
    start_daemon: StartDaemon,
    tmp_path: Path,
    connect: Connect,
    clock: trio.testing.MockClock,
    fake_wall: None,
    ticker: None,
) -> None:
    with trio.fail_after(TIMEOUT):
        first = await start_daemon(tmp_path, mem_queue_size=4)
        consumer = await connect(first.tcp, msg_timeout=60000)
        await consumer.sub("t", "c", rdy=3)
        producer = await connect(first.tcp)
        bodies = [b"m%d" % i for i in range(20)]
        assert await producer.mpub("t", bodies) == OK
        held = [await consumer.message() for _ in range(3)]  # in flight at the shutdown
        assert [m.body for m in held] == bodies[:3]
        channel = first.broker.topics["t"].channels["c"]
        assert channel.backend_depth > 0  # past --mem-queue-size: spilled to disk
        assert channel.depth == 17
        await consumer.req(held[0].id, 10_000)
        requeued_at = trio.current_time()
        assert await producer.dpub("t", 30_000, b"late") == OK
        deferred_at = trio.current_time()
        # A topic with no channel keeps its messages: memory (4) and disk (2).
        assert await producer.mpub("kept", [b"k%d" % i for i in range(6)]) == OK
        await trio.sleep(1)
        await first.stop()

        second = await start_daemon(tmp_path, mem_queue_size=4)
        restarted = trio.current_time()
        assert set(second.broker.topics) == {"t", "kept"}
        consumer = await connect(second.tcp, msg_timeout=60000)
        await consumer.sub("t", "c", rdy=100)
        got: dict[bytes, MessageFrame] = {}
        while len(got) < 19:  # 17 never delivered + 2 that were in flight
            m = await consumer.message()
            got[m.body] = m
            await consumer.fin(m.id)
        assert trio.current_time() == restarted
        assert set(got) == set(bodies) - {b"m0"}
        assert [got[b.body].attempts for b in held[1:]] == [2, 2]  # delivered once before
        again = await consumer.message()
        assert (again.body, again.attempts) == (b"m0", 2)
        assert trio.current_time() == pytest.approx(requeued_at + 10.0, abs=1e-6)
        await consumer.fin(again.id)
        late = await consumer.message()
        assert (late.body, late.attempts) == (b"late", 1)
        assert trio.current_time() == pytest.approx(deferred_at + 30.0, abs=1e-6)
        await consumer.fin(late.id)

        other = await connect(second.tcp)
        await other.sub("kept", "c", rdy=10)
        kept = {(await other.message()).body for _ in range(6)}
        # Order across a restart is not kept (nsqd's flush: memory after the disk's contents).
        assert kept == body_set(6, b"k")
        await second.stop()


@pytest.mark.parametrize("mem_queue_size", [0, 10])
async def test_topic_and_channel_spill_to_disk_in_order(
    start_daemon: StartDaemon, tmp_path: Path, connect: Connect, mem_queue_size: int
) -> None:
    with trio.fail_after(30):
        running = await start_daemon(tmp_path, mem_queue_size=mem_queue_size)
        producer = await connect(running.tcp)
        bodies = [b"s%d" % i for i in range(100)]
        assert await producer.mpub("spill", bodies) == OK
        topic = running.broker.topics["spill"]
        assert isinstance(topic.log, TopicLog)
        assert (topic.depth, topic.backend_depth) == (100, 100 - mem_queue_size)
        consumer = await connect(running.tcp)
        await consumer.sub("spill", "c")
        channel = topic.channels["c"]
        await eventually(lambda: topic.depth == 0)
        assert (channel.depth, channel.backend_depth) == (100, 100 - mem_queue_size)
        await consumer.send(b"RDY 7\n")
        received = []
        for _ in range(100):
            m = await consumer.message()
            received.append(m.body)
            await consumer.fin(m.id)
        assert received == bodies
        await running.stop()


async def test_metadata_restores_topics_channels_and_paused_flags(
    start_daemon: StartDaemon, tmp_path: Path
) -> None:
    with trio.fail_after(30):
        first = await start_daemon(tmp_path)
        daemon = first.broker
        a = daemon.get_topic("a")
        a.get_channel("x").pause()
        a.get_channel("y")
        a.pause()
        b = daemon.get_topic("b")
        b.get_channel("z")
        b.get_channel("gone#ephemeral")
        daemon.get_topic("e#ephemeral").get_channel("c")
        daemon.get_topic("deleted").get_channel("c")
        daemon.delete_topic("deleted")
        daemon.persist_metadata()
        await first.stop()

        saved = json.loads((tmp_path / "lmqd.dat").read_text())
        assert saved["topics"] == [
            {
                "name": "a",
                "paused": True,
                "channels": [{"name": "x", "paused": True}, {"name": "y", "paused": False}],
            },
            {"name": "b", "paused": False, "channels": [{"name": "z", "paused": False}]},
        ]
        assert not any(
            p.name.startswith(("deleted", "e%23")) for p in await trio.Path(tmp_path).iterdir()
        )

        second = await start_daemon(tmp_path)
        topics = second.broker.topics
        assert set(topics) == {"a", "b"}
        assert topics["a"].paused and not topics["b"].paused
        assert set(topics["a"].channels) == {"x", "y"}
        assert topics["a"].channels["x"].paused and not topics["a"].channels["y"].paused
        assert set(topics["b"].channels) == {"z"}
        await second.stop()


async def test_damaged_metadata_file_does_not_stop_the_daemon(
    start_daemon: StartDaemon, tmp_path: Path, connect: Connect
) -> None:
    with trio.fail_after(30):
        first = await start_daemon(tmp_path)
        producer = await connect(first.tcp)
        assert await producer.pub("orders", b"one") == OK
        consumer = await connect(first.tcp)
        await consumer.sub("orders", "archive")
        first.broker.topics["orders"].pause()
        assert await producer.pub("orders", b"two") == OK
        await first.stop()
        (tmp_path / "lmqd.dat").write_bytes(b'{"topics": [{"name": ')  # torn

        second = await start_daemon(tmp_path)
        # Restored from the queues' files (unpaused: the flag was only in the damaged file).
        assert (tmp_path / "lmqd.dat.bad").exists()
        topic = second.broker.topics["orders"]
        assert set(topic.channels) == {"archive"}
        consumer = await connect(second.tcp)
        await consumer.sub("orders", "archive", rdy=5)
        assert {(await consumer.message()).body for _ in range(2)} == {b"one", b"two"}
        await second.stop()


async def test_corrupt_segment_does_not_stop_the_daemon(
    start_daemon: StartDaemon, tmp_path: Path, connect: Connect
) -> None:
    with trio.fail_after(30):
        first = await start_daemon(tmp_path, mem_queue_size=0)
        producer = await connect(first.tcp)
        for i in range(3):
            assert await producer.pub("t", b"message-%d" % i) == OK
        await first.stop()
        (segment,) = [p for p in os.listdir(tmp_path) if p.startswith("t.lmq.0")]
        data = bytearray((tmp_path / segment).read_bytes())
        data[data.index(b"message-1")] ^= 0xFF  # damage the second record's body
        (tmp_path / segment).write_bytes(bytes(data))

        second = await start_daemon(tmp_path, mem_queue_size=0)
        topic = second.broker.topics["t"]
        assert topic.log is not None and topic.log.corrupt_count == 1
        consumer = await connect(second.tcp)
        await consumer.sub("t", "c", rdy=5)
        assert [(await consumer.message()).body for _ in range(2)] == [b"message-0", b"message-2"]
        await second.stop()


@pytest.mark.parametrize("durable", [False, True])
async def test_a_data_directory_from_before_topic_logs_loses_nothing(
    start_daemon: StartDaemon, tmp_path: Path, connect: Connect, durable: bool
) -> None:
    """An lmqd from before topic logs kept a disk queue per topic and per channel: the topic's
    holds what it had not handed on yet, each channel's what it had received. The log adopts
    the topic's queue; each channel's queue becomes its own store."""
    timebase = AnchoredTimeBase(0.0, WALL0_NS)
    with trio.fail_after(30):
        topic_queue = DiskQueue("up", tmp_path, timebase=timebase, ack_mode=durable)
        topic_queue.put_many(make_messages(6))  # m0..m5
        pumped = topic_queue.read_many(4)  # handed to both channels
        for m in pumped:
            if isinstance(m, StoredMessage):
                topic_queue.ack(m.token)
        topic_queue.close()
        for channel, kept in (("a", pumped), ("b", pumped[2:])):  # b had consumed m0, m1
            queue = DiskQueue(f"up:{channel}", tmp_path, timebase=timebase, ack_mode=durable)
            queue.put_many([Message(m.id, m.body, m.timestamp) for m in kept])
            queue.close()
        save_metadata(
            str(tmp_path / "lmqd.dat"),
            Metadata((TopicMetadata("up", False, (ChannelMetadata("a"), ChannelMetadata("b"))),)),
        )

        running = await start_daemon(tmp_path, durable=durable, mem_queue_size=2)
        topic = running.broker.topics["up"]
        await eventually(lambda: topic.depth == 0)  # m4, m5: handed on now
        assert [topic.channels[c].depth for c in ("a", "b")] == [6, 4]
        for channel, want in (("a", 6), ("b", 4)):
            consumer = await connect(running.tcp)
            await consumer.sub("up", channel, rdy=10)
            got = []
            for _ in range(want):
                m = await consumer.message()
                got.append(m.body)
                await consumer.fin(m.id)
            assert sorted(got) == [b"m%d" % i for i in range(6 - want, 6)]
            with trio.move_on_after(0.2):
                extra = await consumer.message()
                pytest.fail(f"channel {channel} got {extra.body!r} twice")
        await running.stop()
        again = await start_daemon(tmp_path, durable=durable, mem_queue_size=2)
        assert set(again.broker.topics["up"].channels) == {"a", "b"}
        for channel in ("a", "b"):
            assert again.broker.topics["up"].channels[channel].depth == 0
        await again.stop()


async def test_second_daemon_on_the_same_data_path_fails_to_start(
    start_daemon: StartDaemon, tmp_path: Path
) -> None:
    with trio.fail_after(30):
        first: RunningDaemon = await start_daemon(tmp_path)
        with pytest.raises(DataDirLocked, match="in use by another lmqd"):
            await start_daemon(tmp_path)
        assert first.broker.addresses is not None  # the first one is unaffected
        await first.stop()
        again = await start_daemon(tmp_path)  # released at shutdown
        await again.stop()

"""Topic policies: retention by time and by size, on the autojump clock with exact times.

Rules for this module:
- A ``Topic`` with a real ``TopicLog`` in ``tmp_path`` (small segments) and a fake subscriber;
  the test runs the topic on pytest-trio's ``autojump_clock`` and syncs its stream itself (what
  the syncer's rounds do), at exact virtual times.
- Message timestamps and the time base both follow the virtual clock (``WALL0_NS`` + trio
  time), so "a segment 10 s old" means exactly that.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import trio

from lmqd.engine.policy import PolicyError, TopicPolicy, parse_update
from lmqd.engine.topic import Topic
from lmqd.message import GuidFactory
from lmqd.options import Options
from lmqd.storage import AnchoredTimeBase, TopicLog

from .engine_fakes import FakeClient, engine

WALL0_NS = 1_750_000_000 * 10**9
BODY = b"x" * 100
SEGMENT = 1000
"""Bytes per segment: seven 100-byte messages written one per publish."""

PUBLISH_OFF = {
    "ttl_ms": 0, "max_depth": 0, "overflow": "reject", "publish_rate": 0, "publish_burst": 0,
    "dedup_window_ms": 0, "compression": "none", "min_insync_mirrors": 0,
}
"""The TTL and publish policy keys, all off (``lmqd.engine.policy``)."""


def virtual_wall_ns() -> int:
    """The engine's wall clock: message timestamps on the virtual clock."""
    return WALL0_NS + round(trio.current_time() * 1e9)


def make_topic(path: Path, **options: Any) -> Topic:
    log = TopicLog(
        "t", path, timebase=AnchoredTimeBase(0.0, WALL0_NS), max_bytes_per_file=SEGMENT
    )
    ctx = engine(
        Options.from_mapping({"mem_queue_size": 0, **options}),
        guid=GuidFactory(1),
        rng=random.Random(3),
        wall_clock=virtual_wall_ns,
    )
    return Topic(ctx, "t", log=log)


def sync(topic: Topic) -> None:
    job = topic.stream.prepare_sync()
    if job is not None:
        job.run()


def segments(path: Path) -> int:
    return len(list(path.glob("t.lmq.*.dat")))


async def consume_all(topic: Topic, count: int, client_id: int = 1) -> None:
    """Publish ``count`` messages one per publish and let the channel read and FIN them."""
    client = FakeClient(client_id, ready=count)
    channel = topic.get_channel(f"c{client_id}")
    client.subscribe(channel)
    for _ in range(count):
        topic.publish([BODY], trio.current_time())
    await client.wait_writes(1)
    while len(client.received) < count:
        await client.wait_writes(len(client.writes) + 1)
    channel.finish_many(client.sub, [m.id for m in client.received], trio.current_time())  # type: ignore[arg-type]


def test_compression_policy_is_stored_as_spelled_canonically() -> None:
    assert parse_update({"compression": "ZSTD-3"}) == {"compression": "zstd"}
    assert parse_update({"compression": "zstd:9"}) == {"compression": "zstd:9"}
    options = Options(compression="lz4")
    assert TopicPolicy.effective(options, {}).compression == "lz4"
    assert TopicPolicy.effective(options, {"compression": "none"}).compression == "none"


def test_policy_updates_are_checked_whole() -> None:
    assert parse_update({"retention_ms": 5, "retention_bytes": 0, "ttl_ms": 9}) == {
        "retention_ms": 5, "retention_bytes": 0, "ttl_ms": 9,
    }
    for bad, message in (
        ([], "must be a JSON object"),
        ({"retention": 5}, "unknown key 'retention'"),
        ({"retention_ms": -1}, "retention_ms must be an integer"),
        ({"retention_ms": 1.5}, "retention_ms must be an integer"),
        ({"retention_bytes": True}, "retention_bytes must be an integer"),
        ({"retention_bytes": "5"}, "retention_bytes must be an integer"),
        ({"retention_ms": 2**63}, "retention_ms must be an integer"),
        ({"ttl_ms": -1}, "ttl_ms must be an integer"),
        ({"compression": "brotli"}, "compression invalid: unknown compression 'brotli'"),
        ({"compression": "zstd:99"}, "compression invalid: zstd level must be 1..22"),
        ({"compression": 3}, "compression must be a string"),
    ):
        with pytest.raises(PolicyError, match=message):
            parse_update(bad)
    options = Options(retention_ms=7, retention_bytes=9)
    assert TopicPolicy.effective(options, {"retention_bytes": 0}).to_dict() == {
        "retention_ms": 7, "retention_bytes": 0, **PUBLISH_OFF,
    }


async def test_without_retention_passed_segments_go_at_the_next_sync(
    tmp_path: Path, autojump_clock: trio.abc.Clock
) -> None:
    topic = make_topic(tmp_path)
    async with trio.open_nursery() as nursery:
        await nursery.start(topic.run)
        await consume_all(topic, 30)
        assert segments(tmp_path) == 5
        sync(topic)
        assert segments(tmp_path) == 1  # the write segment stays
        topic.close()


async def test_time_retention_keeps_passed_segments_exactly_that_long(
    tmp_path: Path, autojump_clock: trio.abc.Clock
) -> None:
    topic = make_topic(tmp_path, retention_ms=10_000)  # the daemon's default
    assert topic.policy.retention_ms == 10_000
    async with trio.open_nursery() as nursery:
        await nursery.start(topic.run)
        await consume_all(topic, 30)  # all published at t=0
        assert trio.current_time() == 0.0
        await trio.sleep(9.999)
        sync(topic)
        assert segments(tmp_path) == 5
        await trio.sleep(0.001)  # exactly 10 s after their newest message
        sync(topic)
        assert segments(tmp_path) == 1
        # A topic's own policy overrides the default; 0 is "no retention".
        topic.set_policy({"retention_ms": 0})
        assert topic.policy.to_dict() == {"retention_ms": 0, "retention_bytes": 0, **PUBLISH_OFF}
        topic.close()


async def test_size_retention_keeps_the_newest_bytes(
    tmp_path: Path, autojump_clock: trio.abc.Clock
) -> None:
    topic = make_topic(tmp_path)
    topic.set_policy({"retention_bytes": 2 * SEGMENT})
    async with trio.open_nursery() as nursery:
        await nursery.start(topic.run)
        await consume_all(topic, 30)
        sync(topic)
        assert segments(tmp_path) == 2  # the write segment and the newest full one
        replay = FakeClient(2, ready=100)
        channel = topic.get_channel("replay", start_at=0)
        replay.subscribe(channel)
        channel.deliver(trio.current_time())
        # What retention kept can be replayed: the newest full segment and the write segment.
        assert 0 < len(replay.received) <= 14
        assert replay.received[-1].offset == 29
        topic.close()


async def test_retention_writes_every_message_to_the_log(
    tmp_path: Path, autojump_clock: trio.abc.Clock
) -> None:
    topic = make_topic(tmp_path, mem_queue_size=100)
    async with trio.open_nursery() as nursery:
        await nursery.start(topic.run)
        await consume_all(topic, 3)  # memory first: read from memory, never written
        assert topic.log is not None and topic.log.next_offset == 0
        topic.set_policy({"retention_ms": 60_000})
        await consume_all(topic, 3, client_id=2)
        # Offsets 0..2 were never written (read from memory by every channel): a gap.
        assert [o for o, _ in topic.log.read_range(0, 10)] == [3, 4, 5]
        topic.close()

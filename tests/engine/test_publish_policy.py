"""Topic publish policies in the engine: max_depth (reject, drop_oldest), dedup, counters.

Rules for this module:
- Topics are built directly (``Topic``, memory backends; a real ``TopicLog`` in ``tmp_path``
  where the log matters) and run on pytest-trio's ``autojump_clock``; times are exact.
- Consumers are ``FakeClient``s; what they were sent is what a client would see.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import trio

from lmqd.engine.admission import TopicFull
from lmqd.engine.backend import BackendQueue, MemoryBackend
from lmqd.engine.topic import Topic
from lmqd.message import GuidFactory
from lmqd.message_ext import MessageExt
from lmqd.options import Options
from lmqd.stats import PublishPolicyStats
from lmqd.storage import AnchoredTimeBase, TopicLog

from .engine_fakes import FakeClient, engine

TIMEBASE = AnchoredTimeBase(0.0, 1_700_000_000 * 10**9)


def memory_backend(topic: str, channel: str) -> BackendQueue:
    return MemoryBackend()


def make_topic(path: Path | None = None, **options: object) -> Topic:
    log = TopicLog("t", path, timebase=TIMEBASE) if path is not None else None
    ctx = engine(Options.from_mapping(options), guid=GuidFactory(1), rng=random.Random(5))
    return Topic(ctx, "t", log=log)


def bodies(*numbers: int) -> list[bytes]:
    return [b"m%d" % n for n in numbers]


async def drain(topic: Topic, client: FakeClient, channel: str = "c") -> list[bytes]:
    """Subscribe ``client`` with room for everything and return the bodies it is sent."""
    client.ready_count = 1000
    client.subscribe(topic.get_channel(channel))
    await trio.testing.wait_all_tasks_blocked()
    return [m.body for write in client.writes for m in write]


def counters(topic: Topic) -> PublishPolicyStats | None:
    return topic.statistics(0.0).publish_policy


async def test_reject_refuses_whole_commands_and_keeps_what_was_accepted(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    topic = make_topic(tmp_path)
    topic.set_policy({"max_depth": 5})
    topic.publish(bodies(1, 2, 3), 0.0)
    # A run of a PUB, an MPUB of 2 (fits: 5), an MPUB of 2 (would be 7): two accepted.
    outcome = topic.publish_run(bodies(4, 5, 6, 7, 8), [1, 2, 2], 0.0)
    assert outcome.accepted == 1
    assert isinstance(outcome.refusal, TopicFull)
    assert str(outcome.refusal) == "topic t is full (max_depth 5)"
    assert [m.body for m in outcome.messages] == bodies(4)
    outcome = topic.publish_run(bodies(5), [1], 0.0)
    assert (outcome.accepted, outcome.refusal) == (1, None)
    with pytest.raises(TopicFull):
        topic.publish(bodies(6), 0.0)
    assert topic.backlog() == 5
    stats = counters(topic)
    assert stats is not None
    assert stats.overflow_refused_count == 3  # the MPUB of 2, then the PUB
    async with trio.open_nursery() as nursery:
        await nursery.start(topic.run)
        client = FakeClient(1)
        assert await drain(topic, client) == bodies(1, 2, 3, 4, 5)  # nothing accepted lost
        nursery.cancel_scope.cancel()
    topic.close()


async def test_reject_bounds_each_channels_backlog_not_the_sum(
    autojump_clock: trio.testing.MockClock,
) -> None:
    topic = make_topic(max_depth=3)  # the daemon-wide default
    async with trio.open_nursery() as nursery:
        await nursery.start(topic.run)
        fast, slow = FakeClient(1, ready=100), FakeClient(2)
        fast.subscribe(topic.get_channel("fast"))
        slow.subscribe(topic.get_channel("slow"))
        for n in range(3):
            topic.publish(bodies(n), trio.current_time())
            await trio.testing.wait_all_tasks_blocked()
        assert (topic.channels["fast"].depth, topic.channels["slow"].depth) == (0, 3)
        with pytest.raises(TopicFull):
            topic.publish(bodies(9), trio.current_time())  # the slow channel is full
        assert topic.backlog() == 3
        # In-flight messages are not backlog: the slow consumer takes two, two more fit.
        slow.ready_count = 2
        topic.channels["slow"].consumer_ready()
        await trio.testing.wait_all_tasks_blocked()
        topic.publish(bodies(10, 11), trio.current_time())
        nursery.cancel_scope.cancel()


async def test_an_internal_channels_backlog_counts_once(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    # The redrive channel reads ahead of the pump: what it has unread is the topic's own
    # backlog too (engine/internal.py); max_depth must not count it twice.
    topic = make_topic(tmp_path, max_depth=3)
    async with trio.open_nursery() as nursery:
        await nursery.start(topic.run)
        redrive = topic.get_channel("lmq.redrive")
        topic.publish(bodies(1, 2, 3), 0.0)
        await trio.testing.wait_all_tasks_blocked()
        assert (topic.depth, redrive.depth, topic.backlog()) == (3, 3, 3)
        with pytest.raises(TopicFull):
            topic.publish(bodies(4), 0.0)
        # A user's channel takes the backlog; the redrive channel still holds its three.
        user = FakeClient(1)
        assert await drain(topic, user, "audit") == bodies(1, 2, 3)
        assert (topic.depth, redrive.depth, topic.backlog()) == (0, 3, 3)
        with pytest.raises(TopicFull):
            topic.publish(bodies(4), 0.0)
        nursery.cancel_scope.cancel()
    topic.close()


async def test_drop_oldest_keeps_the_newest_in_every_channel(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    topic = make_topic(tmp_path, mem_queue_size=2)  # past 2, the oldest are in the log
    topic.set_policy({"max_depth": 3, "overflow": "drop_oldest"})
    # No channel yet: the topic's own backlog is bounded.
    topic.publish(bodies(1, 2, 3, 4), 0.0)
    assert topic.depth == 3
    async with trio.open_nursery() as nursery:
        await nursery.start(topic.run)
        idle = topic.get_channel("idle")  # nobody reads it: its backlog is what is kept
        await trio.testing.wait_all_tasks_blocked()
        assert idle.depth == 3
        for n in range(5, 10):
            topic.publish(bodies(n), trio.current_time())
            await trio.testing.wait_all_tasks_blocked()
        assert idle.depth == 3
        topic.publish(bodies(10, 11, 12, 13, 14), trio.current_time())  # more than max_depth
        await trio.testing.wait_all_tasks_blocked()
        client = FakeClient(1)
        assert await drain(topic, client, "idle") == bodies(12, 13, 14)
        nursery.cancel_scope.cancel()
    stats = counters(topic)
    assert stats is not None
    # 1 (no channel), then 5 one by one on the channel, then 5 of the batch of 5.
    assert stats.overflow_dropped_count == 1 + 5 + 5
    assert stats.overflow_refused_count == 0
    topic.close()


async def test_duplicate_body_within_the_window_once_after_it_twice(
    autojump_clock: trio.testing.MockClock,
) -> None:
    topic = make_topic()
    topic.set_policy({"dedup_window_ms": 5000})
    start = trio.current_time()
    assert len(topic.publish([b"a", b"b", b"a"], start)) == 2  # within one MPUB too
    assert topic.publish([b"a"], start + 4.999) == []  # answered, not enqueued
    await trio.sleep_until(start + 5.0)
    assert [m.body for m in topic.publish([b"a"], trio.current_time())] == [b"a"]
    stats = counters(topic)
    assert stats is not None
    assert stats.deduplicated_count == 2
    assert topic.message_count == 3
    # Off again: every body is enqueued, the counters stay.
    topic.set_policy({"dedup_window_ms": 0})
    assert topic.gate is None
    assert len(topic.publish([b"a"], trio.current_time())) == 1
    assert counters(topic) == stats


async def test_a_refused_publish_is_not_remembered_by_the_dedup_window(
    autojump_clock: trio.testing.MockClock,
) -> None:
    topic = make_topic()
    topic.set_policy({"dedup_window_ms": 60_000, "max_depth": 1})
    topic.publish([b"a"], 0.0)
    with pytest.raises(TopicFull):
        topic.publish([b"b"], 0.0)
    topic.empty()
    # The retry of the refused body is new, not a duplicate.
    assert [m.body for m in topic.publish([b"b"], 0.0)] == [b"b"]


async def test_no_policy_no_gate_no_extra_stats() -> None:
    topic = make_topic()
    assert topic.gate is None
    assert counters(topic) is None
    assert "deduplicated_count" not in topic.statistics(0.0).to_dict()
    topic.set_policy({"overflow": "drop_oldest"})  # without max_depth: nothing to apply
    assert topic.gate is None
    topic.set_policy({"publish_rate": 10})
    assert topic.gate is not None and topic.gate.bucket is not None
    assert list(topic.statistics(0.0).to_dict())[-4:] == [
        "overflow_dropped_count", "overflow_refused_count", "rate_limited_count",
        "deduplicated_count",
    ]  # fmt: skip


async def test_a_publish_mixing_ids_and_none_keeps_the_rest_in_order(
    autojump_clock: trio.abc.Clock,
) -> None:
    """Messages without an id, with headers only, and ids new, seen before and repeated in the
    same publish: the repeats are left out, everything else kept in order with its fields."""
    topic = make_topic()
    now = trio.current_time()
    assert topic.publish([b"seen"], now, exts=[MessageExt(dedup_id=b"s")]) != []
    headers = MessageExt(headers=(("k", "v"),))
    exts = [None, MessageExt(dedup_id=b"n"), headers, MessageExt(dedup_id=b"s"),
            MessageExt(dedup_id=b"n"), MessageExt(dedup_id=b"m"), None]  # fmt: skip
    got = topic.publish([b"0", b"1", b"2", b"3", b"4", b"5", b"6"], now, exts=exts)
    assert [(m.body, m.ext) for m in got] == [
        (b"0", None), (b"1", exts[1]), (b"2", headers), (b"5", exts[5]), (b"6", None),
    ]  # fmt: skip
    assert topic.publish_counters.deduplicated == 2
    topic.close()


async def test_dedup_ids_within_the_window_are_enqueued_once(
    autojump_clock: trio.abc.Clock,
) -> None:
    """lmq's dedup ids: a publish whose id the topic accepted within its window (the default
    five minutes without dedup_window_ms) is left out and counted; after the window, again."""
    topic = make_topic()
    now = trio.current_time()
    first = topic.publish([b"a", b"b", b"a2"], now, exts=[
        MessageExt(dedup_id=b"1"), MessageExt(dedup_id=b"2"), MessageExt(dedup_id=b"1"),
    ])  # fmt: skip
    assert [m.body for m in first] == [b"a", b"b"]  # the third repeats id 1 in the same publish
    assert topic.publish([b"again"], now + 299, exts=[MessageExt(dedup_id=b"1")]) == []
    assert topic.publish([b"same body"], now, exts=[None]) != []  # no id: not deduplicated
    later = topic.publish([b"later"], now + 300, exts=[MessageExt(dedup_id=b"1")])
    assert [m.body for m in later] == [b"later"]
    assert topic.publish_counters.deduplicated == 2
    topic.set_policy({"dedup_window_ms": 1000})  # the policy's window applies to ids too
    assert topic.publish([b"x"], now + 300.5, exts=[MessageExt(dedup_id=b"1")]) == []
    assert [m.body for m in topic.publish([b"y"], now + 301.5,
                                          exts=[MessageExt(dedup_id=b"1")])] == [b"y"]  # fmt: skip
    topic.close()

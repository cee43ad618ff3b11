"""Priority delivery (lmq's extension): higher levels first within a channel, FIFO within a
level, across the whole backlog (the topic's log included) and across restarts.

The daemon's own restore path over tmpfs (``engine_restart.Engine``), plain-def entry points with
``now`` passed in; a consumer with RDY 1 that FINs each message sees the order delivery takes.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

from lmqd.engine.topic import Topic
from lmqd.message import GuidFactory, Message
from lmqd.message_ext import MessageExt

from ..storage.storage_helpers import memory_dir
from .engine_fakes import FakeClient
from .engine_fakes import engine as engine_context
from .engine_restart import NOW, Engine

BACKLOG = 300
"""Plain messages published first: with ``max_bytes_per_file=400`` they fill dozens of log
segments, so the priority messages published after them overtake a backlog on disk."""

RANKED = [(b"a1", 1), (b"b1", 5), (b"c1", 9), (b"b2", 5), (b"a2", 1), (b"c2", 9)]
IN_ORDER = [b"c1", b"c2", b"b1", b"b2", b"a1", b"a2"]


MODES = {"default": (False, 0), "memory-tail": (False, 10_000), "durable": (True, 0)}
"""(durable, --mem-queue-size): the log written at once, memory first, ``--durable``."""


@pytest.fixture(params=list(MODES))
def engine(request: pytest.FixtureRequest) -> Iterator[Engine]:
    durable, mem = MODES[request.param]
    with memory_dir() as base:
        e = Engine(base, durable=durable, mem_queue_size=mem)
        try:
            yield e
        finally:
            e.close()


def publish_backlog(engine: Engine) -> list[bytes]:
    bodies = [b"plain%03d" % k for k in range(BACKLOG)]
    engine.topic.publish(bodies, NOW)
    return bodies


def publish_ranked(engine: Engine, ranked: list[tuple[bytes, int]] = RANKED) -> None:
    for body, level in ranked:
        engine.topic.publish([body], NOW, exts=[MessageExt(priority=level)])


def one_by_one(engine: Engine, name: str, count: int) -> list[Message]:
    """``count`` deliveries to a consumer with RDY 1, each FIN'd before the next."""
    channel = engine.topic.channels[name]
    client = engine.clients[name]
    client.ready_count = 1
    assert client.sub is not None
    got: list[Message] = []
    for _ in range(count):
        before = len(client.received)
        channel.deliver(NOW)
        new = client.received[before:]
        assert len(new) == 1
        got += new
        channel.finish(client.sub, new[0].id, NOW)
    return got


def test_higher_levels_overtake_a_backlog_fifo_within_a_level(engine: Engine) -> None:
    engine.subscribe(engine.topic, "a")
    backlog = publish_backlog(engine)
    publish_ranked(engine)
    engine.topic.publish([b"last"], NOW)
    engine.pump()
    channel = engine.topic.channels["a"]
    assert channel.priority_depths == {9: 2, 5: 2, 1: 2}
    assert channel.depth == BACKLOG + len(RANKED) + 1
    first = one_by_one(engine, "a", len(RANKED) + 2)
    assert [m.body for m in first] == [*IN_ORDER, b"plain000", b"plain001"]
    assert [m.ext.priority if m.ext else 0 for m in first[:3]] == [9, 9, 5]
    rest = engine.drain("a")
    assert [m.body for m in rest] == [*backlog[2:], b"last"]
    assert channel.priority_depths == {} and channel.depth == 0


def test_every_channel_gets_each_ranked_message(engine: Engine) -> None:
    for name in ("a", "b"):
        engine.subscribe(engine.topic, name)
    publish_backlog(engine)
    publish_ranked(engine)
    engine.pump()
    for name in ("a", "b"):
        got = one_by_one(engine, name, len(RANKED))
        assert [m.body for m in got] == IN_ORDER
    assert [m.body for m in engine.drain("a")][:1] == [b"plain000"]


@pytest.mark.parametrize(
    ("mode", "how"),
    # Default mode promises nothing across a crash (nsqd's memory queue): not a case.
    [("default", "restart"), ("memory-tail", "restart"), ("durable", "restart"),
     ("durable", "crash")],
)  # fmt: skip
def test_order_holds_across_a_restart(mode: str, how: str) -> None:
    durable, mem = MODES[mode]
    with memory_dir() as base:
        engine = Engine(base, durable=durable, mem_queue_size=mem)
        try:
            order_holds_across_a_restart(engine, how)
        finally:
            engine.close()


def order_holds_across_a_restart(engine: Engine, how: str) -> None:
    engine.subscribe(engine.topic, "a")
    backlog = publish_backlog(engine)
    publish_ranked(engine)
    engine.pump()
    # c1 in flight at the restart: it comes back at its level (requeued there, as a REQ
    # would: behind c2 after a clean shutdown; where it was after a crash in --durable).
    [c1] = one_by_one_unfinished(engine, "a")
    assert c1.body == b"c1"
    engine.sync()
    engine.restart() if how == "restart" else engine.crash()
    engine.pump()
    got = [m.body for m in engine.drain("a")]
    assert sorted(got[:2]) == [b"c1", b"c2"]
    assert got[2:] == [*IN_ORDER[2:], *backlog]


def test_a_ranked_backlog_left_unpumped_is_found_after_a_restart(engine: Engine) -> None:
    engine.subscribe(engine.topic, "a")
    engine.topic.pause()  # the topic keeps it all: the next run pumps it, reading the log
    backlog = publish_backlog(engine)
    publish_ranked(engine)
    engine.sync()
    engine.restart()
    engine.topic.unpause()
    engine.pump()
    assert [m.body for m in engine.drain("a")] == [*IN_ORDER, *backlog]


def one_by_one_unfinished(engine: Engine, name: str) -> list[Message]:
    """One delivery to a consumer with RDY 1, left in flight."""
    client = engine.clients[name]
    client.ready_count = 1
    before = len(client.received)
    engine.topic.channels[name].deliver(NOW)
    return client.received[before:]


def test_a_requeue_or_a_timeout_goes_back_to_its_level(engine: Engine) -> None:
    engine.subscribe(engine.topic, "a")
    publish_backlog(engine)
    publish_ranked(engine, [(b"low", 1), (b"high", 9)])
    engine.pump()
    channel = engine.topic.channels["a"]
    client = engine.clients["a"]
    assert client.sub is not None
    [high] = one_by_one_unfinished(engine, "a")
    assert high.body == b"high"
    channel.requeue(client.sub, high.id, 0.0, NOW)
    [again] = one_by_one_unfinished(engine, "a")
    assert (again.body, again.attempts) == (b"high", 2)
    channel.process_due(NOW + 61.0)  # its 60 s timeout: requeued, still at level 9
    [third] = one_by_one_unfinished(engine, "a")
    assert (third.body, third.attempts) == (b"high", 3)
    channel.finish(client.sub, third.id, NOW + 61.0)
    assert [m.body for m in one_by_one(engine, "a", 2)] == [b"low", b"plain000"]


def test_a_deferred_ranked_message_is_ranked_once_due(engine: Engine) -> None:
    engine.subscribe(engine.topic, "a")
    publish_backlog(engine)
    engine.topic.publish([b"later"], NOW, defer=5.0, exts=[MessageExt(priority=3)])
    engine.pump()
    channel = engine.topic.channels["a"]
    assert channel.deferred_count == 1
    assert [m.body for m in one_by_one(engine, "a", 1)] == [b"plain000"]
    channel.process_due(NOW + 5.0)
    assert channel.priority_depths == {3: 1}
    assert [m.body for m in one_by_one(engine, "a", 2)] == [b"later", b"plain001"]


def test_peek_shows_the_order_delivery_takes(engine: Engine) -> None:
    engine.subscribe(engine.topic, "a")
    publish_backlog(engine)
    publish_ranked(engine)
    engine.pump()
    peeked = engine.topic.channels["a"].sources.peek_queued(len(RANKED) + 1)
    assert [m.body for _, m in peeked] == [*IN_ORDER, b"plain000"]
    assert [m.body for m in one_by_one(engine, "a", len(RANKED) + 1)] == [
        *IN_ORDER,
        b"plain000",
    ]


@pytest.mark.parametrize("mode", ["default", "durable"])  # what is read from memory is not kept
def test_a_replay_reads_in_offset_order(mode: str) -> None:
    durable, mem = MODES[mode]
    with memory_dir() as base:
        engine = Engine(base, durable=durable, mem_queue_size=mem)
        try:
            a_replay_reads_in_offset_order(engine)
        finally:
            engine.close()


def a_replay_reads_in_offset_order(engine: Engine) -> None:
    engine.subscribe(engine.topic, "a")
    publish_ranked(engine, [(b"p", 0), (b"q", 7), (b"r", 0)])
    engine.pump()
    assert [m.body for m in engine.drain("a")] == [b"q", b"p", b"r"]
    engine.topic.channels["a"].seek(0)
    assert [m.body for m in engine.drain("a")] == [b"p", b"q", b"r"]


def test_finished_ranked_messages_stay_finished_after_a_crash() -> None:
    with memory_dir() as base:
        engine = Engine(base, durable=True)
        try:
            engine.subscribe(engine.topic, "a")
            publish_ranked(engine)
            engine.topic.publish([b"plain"], NOW)
            engine.pump()
            done = one_by_one(engine, "a", 3)  # c1, c2, b1 FIN'd
            assert [m.body for m in done] == IN_ORDER[:3]
            engine.sync()
            engine.crash()
            engine.pump()
            assert [m.body for m in engine.drain("a")] == [*IN_ORDER[3:], b"plain"]
            engine.sync()
            engine.crash()
            engine.pump()
            assert engine.drain("a") == []
        finally:
            engine.close()


@pytest.mark.parametrize("topic_name", ["t#ephemeral", "t"])
def test_channels_without_a_cursor_rank_too(topic_name: str) -> None:
    """An ephemeral topic (no log) and an ephemeral channel get copies from the pump, not
    through a cursor: the ranked ones still go first."""
    topic = Topic(engine_context(guid=GuidFactory(1), rng=random.Random(3)), topic_name)
    client = FakeClient(1)
    channel = topic.get_channel("c#ephemeral")
    client.subscribe(channel)
    topic.publish([b"plain0", b"plain1"], NOW)
    for body, level in RANKED:
        topic.publish([body], NOW, exts=[MessageExt(priority=level)])
    while topic.stream.depth:
        topic._pump_batch(NOW)
    assert channel.priority_depths == {9: 2, 5: 2, 1: 2}
    client.ready_count = 100
    channel.deliver(NOW)
    assert [m.body for m in client.received] == [*IN_ORDER, b"plain0", b"plain1"]
    topic.close()


def test_drop_oldest_drops_the_plain_backlog_first_then_the_lowest_levels(engine: Engine) -> None:
    engine.subscribe(engine.topic, "a")
    engine.topic.publish([b"p0", b"p1"], NOW)
    publish_ranked(engine)
    engine.pump()
    channel = engine.topic.channels["a"]
    assert channel.drop_oldest(4, NOW) == 4  # p0, p1, then a1, a2 (level 1)
    assert [m.body for m in engine.drain("a")] == [b"c1", b"c2", b"b1", b"b2"]


def test_deleting_a_channel_deletes_its_lane_stores() -> None:
    with memory_dir() as base:
        engine = Engine(base, durable=False)  # --mem-queue-size=0: the lanes are on disk
        try:
            engine.subscribe(engine.topic, "a")
            publish_ranked(engine)
            engine.pump()
            engine.sync()
            lanes = sorted(p.name for p in engine.root.glob("t%3Aa%23p*"))
            assert {name.split(".lmq.")[0] for name in lanes} == {
                "t%3Aa%23p1", "t%3Aa%23p5", "t%3Aa%23p9"
            }
            engine.topic.delete_channel("a")
            assert list(engine.root.glob("t%3Aa%23p*")) == []
        finally:
            engine.close()

"""Topic behaviour: publishing into the stream, the pump, channels' life cycle, ephemeral deletion.

Rules for this module:
- Tests that need the pump run ``Topic.run`` on pytest-trio's ``autojump_clock`` and wait for the
  fake subscribers' writes; nothing here sleeps on the real clock.
- A topic with a log gets a real ``TopicLog`` in ``tmp_path`` (``logged_topic``); without one, a
  non-ephemeral topic keeps everything in memory (what the engine does when nothing is stored).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import trio

from lmqd.engine.backend import BackendError, BackendQueue, DummyBackend, MemoryBackend
from lmqd.engine.channel import Channel
from lmqd.engine.errors import TopicExiting
from lmqd.engine.topic import Topic
from lmqd.message import GuidFactory, Message
from lmqd.options import Options
from lmqd.storage import AnchoredTimeBase, ChannelMetadata, TopicLog, TopicMetadata

from .engine_fakes import (
    FakeClient,
    GivenBackends,
    RecordingEvents,
    bodies,
    engine,
    make_messages,
)

TIMEBASE = AnchoredTimeBase(0.0, 1_700_000_000 * 10**9)


class Backends:
    """A channel_backend_factory that remembers what it made."""

    def __init__(self) -> None:
        self.made: dict[tuple[str, str], MemoryBackend] = {}

    def __call__(self, topic: str, channel: str) -> BackendQueue:
        backend = MemoryBackend()
        self.made[(topic, channel)] = backend
        return backend


def make_topic(
    name: str = "t",
    *,
    log: TopicLog | None = None,
    deleted: list[Topic] | None = None,
    backends: Backends | None = None,
    **options: object,
) -> Topic:
    events = RecordingEvents()
    if deleted is not None:
        events.emptied = deleted  # type: ignore[assignment]
    ctx = engine(
        Options.from_mapping(options),
        stores=GivenBackends(backends if backends is not None else Backends()),
        events=events,
        guid=GuidFactory(1),
        rng=random.Random(99),
    )
    return Topic(ctx, name, log=log)


def open_log(path: Path, **kwargs: Any) -> TopicLog:
    return TopicLog("t", path, timebase=TIMEBASE, **kwargs)


def logged_topic(path: Path, **options: object) -> Topic:
    return make_topic(log=open_log(path), **options)


def subscribe(topic: Topic, channel: str, client: FakeClient) -> Channel:
    ch = topic.get_channel(channel)
    client.subscribe(ch)
    return ch


async def receive(client: FakeClient, count: int) -> list[Message]:
    while len(client.received) < count:
        await client.wait_writes(len(client.writes) + 1)
    return client.received


# -- publishing ---------------------------------------------------------------------------------


def test_publish_builds_messages_and_counts() -> None:
    topic = make_topic()
    msgs = topic.publish([b"hello", b"world!"], 5.0)
    assert [m.body for m in msgs] == [b"hello", b"world!"]
    assert len({m.id for m in msgs}) == 2
    assert all(len(m.id) == 16 for m in msgs)
    assert msgs[0].timestamp == msgs[1].timestamp > 0
    assert all(m.deliver_at == 0.0 and m.attempts == 0 for m in msgs)
    assert (topic.message_count, topic.message_bytes, topic.depth) == (2, 11, 2)
    [deferred] = topic.publish([b"later"], 5.0, defer=1.5)
    assert deferred.deliver_at == 6.5
    assert (topic.stream.next_offset, topic.stream.pushed) == (3, [2])


def test_publish_past_the_memory_bound_goes_to_the_log_oldest_first(tmp_path: Path) -> None:
    topic = logged_topic(tmp_path, mem_queue_size=2)
    topic.publish([b"a", b"b", b"c"], 0.0)
    assert (topic.depth, topic.backend_depth) == (3, 1)
    topic.publish([b"d"], 0.0)
    assert (topic.depth, topic.backend_depth) == (4, 2)
    assert topic.log is not None
    assert [m.body for _, m in topic.log.read_range(0, 10)] == [b"a", b"b"]


def test_publish_is_all_or_none_when_the_log_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = logged_topic(tmp_path, mem_queue_size=2)
    assert topic.log is not None
    real = topic.log.append_many

    def failing(*args: Any) -> int:
        raise BackendError("disk full")

    monkeypatch.setattr(topic.log, "append_many", failing)
    with pytest.raises(BackendError):
        topic.publish([b"a", b"b", b"c"], 0.0)
    assert (topic.depth, topic.message_count, topic.message_bytes) == (0, 0, 0)
    monkeypatch.setattr(topic.log, "append_many", real)
    topic.publish([b"a", b"b", b"c"], 0.0)
    assert (topic.depth, topic.backend_depth) == (3, 1)


def test_publishing_to_a_closed_topic_raises_topic_exiting() -> None:
    topic = make_topic()
    topic.close()
    with pytest.raises(TopicExiting):
        topic.publish([b"x"], 0.0)
    with pytest.raises(TopicExiting):
        topic.get_channel("c")


@pytest.mark.parametrize("size", [0, -1])  # nsqd v1.3.0 starts with -1: lmqd reads it as 0
def test_mem_queue_size_0_or_less_writes_every_message_at_once(tmp_path: Path, size: int) -> None:
    topic = logged_topic(tmp_path, mem_queue_size=size)
    topic.publish([b"a", b"b"], 0.0)
    assert (topic.depth, topic.backend_depth) == (2, 2)
    assert topic.log is not None
    assert [m.body for _, m in topic.log.read_range(0, 10)] == [b"a", b"b"]


def test_durable_topic_writes_every_message_at_once(tmp_path: Path) -> None:
    topic = logged_topic(tmp_path, durable=True)
    topic.publish([b"a", b"b"], 0.0)
    assert (topic.depth, topic.backend_depth) == (2, 2)
    assert topic.durable_queue is topic.stream


# -- the pump -----------------------------------------------------------------------------------


async def test_every_channel_gets_a_copy_sharing_id_and_body(
    autojump_clock: trio.abc.Clock,
) -> None:
    topic = make_topic()
    a, b = FakeClient(1, ready=10), FakeClient(2, ready=10)
    subscribe(topic, "ca", a)
    subscribe(topic, "cb", b)
    async with trio.open_nursery() as nursery:
        await nursery.start(topic.run)
        published = topic.publish([b"one", b"two"], trio.current_time())
        await a.wait_writes(1)
        await b.wait_writes(1)
        for got in (a.received, b.received):
            assert [m.id for m in got] == [m.id for m in published]
            assert all(x.body is y.body for x, y in zip(got, published, strict=True))
        assert all(x is not y for x, y in zip(a.received, b.received, strict=True))
        # The channel that read them last took the published objects themselves.
        originals = [
            x is y for got in (a.received, b.received) for x, y in zip(got, published, strict=True)
        ]
        assert originals.count(True) == 2
        assert len(topic.stream.tail) == 0
        assert topic.depth == 0
        assert topic.channels["ca"].message_count == 2
        assert topic.channels["cb"].message_count == 2
        topic.close()


async def test_a_topic_s_only_channel_takes_the_published_objects(
    autojump_clock: trio.abc.Clock,
) -> None:
    topic = make_topic()
    client = FakeClient(1, ready=1)
    subscribe(topic, "only", client)
    async with trio.open_nursery() as nursery:
        await nursery.start(topic.run)
        published = topic.publish([b"one", b"two"], trio.current_time())
        await client.wait_writes(1)
        assert client.received == published[:1]
        assert len(topic.stream.tail) == 1  # forgotten at once: nobody else can see it changed
        replay = topic.get_channel("replay", start_at=0)
        assert replay.depth == 1  # the tail has only what the other channel has not read
        topic.close()


async def test_topic_without_channels_keeps_its_backlog_for_the_first_channel(
    autojump_clock: trio.abc.Clock,
) -> None:
    topic = make_topic()
    async with trio.open_nursery() as nursery:
        await nursery.start(topic.run)
        topic.publish([b"m0", b"m1", b"m2"], 0.0)
        await trio.sleep(1.0)
        assert topic.depth == 3
        first, second = FakeClient(1, ready=10), FakeClient(2, ready=10)
        subscribe(topic, "first", first)
        await first.wait_writes(1)
        assert bodies(first.received) == [b"m0", b"m1", b"m2"]
        assert topic.depth == 0
        subscribe(topic, "second", second)
        topic.publish([b"m3"], trio.current_time())
        await second.wait_writes(1)
        assert bodies(second.received) == [b"m3"]
        await first.wait_writes(2)
        assert bodies(first.received)[-1] == b"m3"
        topic.close()


async def test_channels_read_the_log_then_memory_in_order(
    tmp_path: Path, autojump_clock: trio.abc.Clock
) -> None:
    topic = logged_topic(tmp_path, mem_queue_size=3)
    topic.publish([b"m%d" % i for i in range(10)], 0.0)
    assert topic.backend_depth == 7
    client = FakeClient(1, ready=100)
    other = FakeClient(2, ready=4)
    subscribe(topic, "c", client)
    subscribe(topic, "slow", other)
    async with trio.open_nursery() as nursery:
        await nursery.start(topic.run)
        assert bodies(await receive(client, 10)) == [b"m%d" % i for i in range(10)]
        assert bodies(await receive(other, 4)) == [b"m%d" % i for i in range(4)]
        slow = topic.channels["slow"]
        assert (slow.depth, slow.backend_depth) == (6, 3)
        topic.publish([b"m%d" % i for i in range(10, 14)], trio.current_time())
        # The slow channel holds the tail: past its bound the oldest go to the log, once.
        assert bodies(await receive(client, 14))[10:] == [b"m%d" % i for i in range(10, 14)]
        assert (slow.depth, slow.backend_depth) == (10, 7)
        topic.close()


async def test_pause_and_unpause_topic(autojump_clock: trio.abc.Clock) -> None:
    topic = make_topic()
    client = FakeClient(1, ready=10)
    subscribe(topic, "c", client)
    topic.pause()
    async with trio.open_nursery() as nursery:
        await nursery.start(topic.run)
        topic.publish([b"x", b"y"], 0.0)
        await trio.sleep(5.0)
        assert client.writes == []
        assert topic.depth == 2
        assert topic.statistics(trio.current_time()).paused
        late = FakeClient(2, ready=10)
        subscribe(topic, "late", late)  # created while paused: gets what the pause held
        topic.unpause()
        await client.wait_writes(1)
        await late.wait_writes(1)
        assert bodies(client.received) == bodies(late.received) == [b"x", b"y"]
        assert trio.current_time() == 5.0
        topic.close()


async def test_dpub_through_the_topic_is_delivered_at_its_time(
    autojump_clock: trio.abc.Clock,
) -> None:
    topic = make_topic()
    client = FakeClient(1, ready=10)
    ch = subscribe(topic, "c", client)
    idle = topic.get_channel("idle")
    async with trio.open_nursery() as nursery:
        await nursery.start(topic.run)
        topic.publish([b"later"], 0.0, defer=7.5)
        topic.publish([b"now"], 0.0)
        await client.wait_writes(1)
        assert bodies(client.received) == [b"now"]
        # Pushed to every channel's deferred queue when pumped; not part of their depth.
        assert (idle.depth, idle.deferred_count, idle.message_count) == (1, 1, 2)
        assert ch.deferred_count == 1
        await client.wait_writes(2)
        assert trio.current_time() == 7.5
        assert bodies(client.received) == [b"now", b"later"]
        topic.close()


async def test_channel_created_while_running_gets_its_timer(
    autojump_clock: trio.abc.Clock,
) -> None:
    topic = make_topic()
    client = FakeClient(1, ready=1, msg_timeout=10.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(topic.run)
        subscribe(topic, "late", client)
        topic.publish([b"x"], 0.0)
        await client.wait_writes(2)  # delivery, then redelivery after its 10 s timeout
        assert client.write_times == [0.0, 10.0]
        topic.close()
    assert trio.current_time() == 10.0


# -- replay ---------------------------------------------------------------------------------------


async def test_a_channel_created_at_an_offset_replays_the_log(
    tmp_path: Path, autojump_clock: trio.abc.Clock
) -> None:
    topic = logged_topic(tmp_path, mem_queue_size=0)
    first = FakeClient(1, ready=100)
    subscribe(topic, "first", first)
    async with trio.open_nursery() as nursery:
        await nursery.start(topic.run)
        topic.publish([b"m%d" % i for i in range(6)], 0.0)
        topic.publish([b"dpub"], 0.0, defer=2.0)
        assert bodies(await receive(first, 6)) == [b"m%d" % i for i in range(6)]
        latest = topic.get_channel("latest")
        assert latest.depth == 0  # nsqd: a new channel starts at the end
        replay = FakeClient(2, ready=100)
        ch = topic.get_channel("replay", start_at=2)
        replay.subscribe(ch)
        assert ch.depth == 5
        # From offset 2 on, the deferred message too (it was never pushed to this channel).
        got = await receive(replay, 5)
        assert bodies(got) == [b"m%d" % i for i in range(2, 6)] + [b"dpub"]
        assert [m.offset for m in got] == [2, 3, 4, 5, 6]
        assert trio.current_time() == 2.0  # the deferred one at its time
        topic.close()


# -- channels' life cycle -----------------------------------------------------------------------


async def test_deleting_a_channel_cancels_its_task(autojump_clock: trio.abc.Clock) -> None:
    topic = make_topic()
    client = FakeClient(1, ready=1)
    ch = subscribe(topic, "c", client)
    async with trio.open_nursery() as nursery:
        await nursery.start(topic.run)
        topic.publish([b"x"], 0.0)
        await client.wait_writes(1)
        topic.delete_channel("c")
        assert ch.exiting
        assert "c" not in topic.channels
        await trio.sleep(100.0)
        assert len(client.writes) == 1  # no timeout redelivery from a deleted channel
        assert ch.timeout_count == 0
        topic.close()
    with pytest.raises(KeyError):
        topic.delete_channel("c")


async def test_run_ends_on_close_and_delete(autojump_clock: trio.abc.Clock) -> None:
    for end in (Topic.close, Topic.delete):
        topic = make_topic()
        subscribe(topic, "c", FakeClient(1, ready=1))
        async with trio.open_nursery() as nursery:
            await nursery.start(topic.run)
            topic.publish([b"x"], 0.0)
            await trio.sleep(1.0)
            end(topic)
        assert topic.exiting


def test_ephemeral_channel_and_topic_are_deleted_with_their_last_user() -> None:
    deleted: list[Topic] = []
    topic = make_topic("t#ephemeral", deleted=deleted)
    a, b = FakeClient(1), FakeClient(2)
    ch1 = subscribe(topic, "c1#ephemeral", a)
    subscribe(topic, "c2", b)  # durable channel keeps the topic alive
    assert isinstance(ch1.sources.backend, DummyBackend)
    assert ch1.cursor is None  # nothing of an ephemeral topic is read from a log
    ch1.remove_consumer(a.sub, 0.0)  # type: ignore[arg-type]
    assert ch1.exiting
    assert "c1#ephemeral" not in topic.channels
    assert deleted == []
    b_channel = topic.channels["c2"]
    b_channel.remove_consumer(b.sub, 0.0)  # type: ignore[arg-type]
    assert "c2" in topic.channels  # not ephemeral: stays without clients
    topic.delete_channel("c2")
    assert deleted == [topic]
    assert topic.exiting
    topic.delete()  # the daemon may delete it again: idempotent


def test_ephemeral_topic_without_channels_ever_is_not_deleted() -> None:
    deleted: list[Topic] = []
    topic = make_topic("t#tmp", deleted=deleted)
    topic.publish([b"x"], 0.0)
    assert deleted == []
    assert not topic.exiting


def test_ephemeral_topic_drops_overflow() -> None:
    topic = make_topic("t#tmp", mem_queue_size=2)
    topic.publish([b"a", b"b", b"c"], 0.0)
    assert (topic.depth, topic.backend_depth, topic.dropped_count) == (2, 0, 1)
    assert topic.message_count == 3


async def test_ephemeral_channels_take_copies_from_the_pump(
    autojump_clock: trio.abc.Clock,
) -> None:
    topic = make_topic("t#tmp", mem_queue_size=1)
    a, b = FakeClient(1, ready=0), FakeClient(2, ready=5)
    subscribe(topic, "a", a)
    subscribe(topic, "b#tmp", b)
    async with trio.open_nursery() as nursery:
        await nursery.start(topic.run)
        for i in range(3):
            topic.publish([b"m%d" % i], trio.current_time())
            await trio.sleep(0.1)
        assert bodies(await receive(b, 3)) == [b"m0", b"m1", b"m2"]
        assert topic.channels["a"].depth == 3  # a memory backend past its bound: all kept
        topic.close()


def test_topic_empty_drops_only_what_it_has_not_handed_on(tmp_path: Path) -> None:
    topic = logged_topic(tmp_path, mem_queue_size=1)
    ch = topic.get_channel("c")
    ch.put_many(make_messages(2), 0.0)  # the channel's own store
    topic.publish([b"a", b"b"], 0.0)
    topic._pump_batch(0.0)  # handed to the channel
    topic.pause()
    topic.publish([b"c", b"d"], 0.0)
    assert (topic.depth, ch.depth) == (2, 4)
    topic.empty()
    assert (topic.depth, topic.backend_depth) == (0, 0)
    assert ch.depth == 4
    topic.unpause()
    topic.publish([b"e"], 0.0)
    topic._pump_batch(0.0)
    client = FakeClient(1, ready=10)
    client.subscribe(ch)
    ch.deliver(0.0)
    assert bodies(client.received) == [b"m0", b"m1", b"a", b"b", b"e"]


def test_close_writes_the_tail_and_channel_state_then_a_restart_resumes(tmp_path: Path) -> None:
    backends = Backends()
    topic = make_topic(log=open_log(tmp_path), backends=backends, mem_queue_size=10)
    ch = topic.get_channel("c")
    ch.put_many(make_messages(2), 0.0)
    topic.publish([b"a", b"b", b"c"], 0.0)
    topic._pump_batch(0.0)
    client = FakeClient(1, ready=1)
    client.subscribe(ch)
    ch.deliver(0.0)  # "m0" from its own store in flight
    topic.pause()
    topic.publish([b"held"], 0.0)
    topic.close()
    assert ch.exiting
    assert bodies(backends.made[("t", "c")].read_many(10)) == [b"m1", b"m0"]

    again = make_topic(log=open_log(tmp_path), mem_queue_size=10)
    assert again.depth == 1  # "held": still the topic's
    resumed = again.get_channel("c")
    assert resumed.depth == 3
    client = FakeClient(2, ready=10)
    client.subscribe(resumed)
    resumed.deliver(0.0)
    assert bodies(client.received) == [b"a", b"b", b"c"]
    again._pump_batch(0.0)
    resumed.deliver(0.0)
    assert bodies(client.received)[3:] == [b"held"]
    again.close()


def test_delete_drops_everything(tmp_path: Path) -> None:
    factory = Backends()
    topic = make_topic(log=open_log(tmp_path), backends=factory)
    ch = topic.get_channel("c")
    ch.put_many(make_messages(2), 0.0)
    topic.publish([b"a"], 0.0)
    topic.delete()
    assert topic.depth == 0
    assert topic.channels == {}
    assert ch.exiting and ch.depth == 0
    assert factory.made[("t", "c")].depth == 0
    assert list(tmp_path.iterdir()) == []


# -- statistics ---------------------------------------------------------------------------------


def test_topic_statistics_snapshot(tmp_path: Path) -> None:
    topic = logged_topic(tmp_path, mem_queue_size=1)
    zc = topic.get_channel("z")
    topic.get_channel("a")
    zc.add_consumer(FakeClient(7, ready=0))
    topic.pause()
    topic.publish([b"abc", b"de"], 0.0)
    s = topic.statistics(0.0)
    assert s.topic_name == "t"
    assert [c.channel_name for c in s.channels] == ["a", "z"]  # sorted by name
    assert (s.depth, s.backend_depth, s.message_count, s.message_bytes) == (2, 1, 2, 5)
    assert s.paused
    assert s.channels[1].client_count == 1
    assert s.channels[1].clients is not None
    assert topic.statistics(0.0, include_clients=False).channels[1].clients is None
    d = s.to_dict()
    assert list(d) == [
        "topic_name", "channels", "depth", "backend_depth", "message_count", "message_bytes",
        "paused", "e2e_processing_latency",
        "dead_letter_count", "expired_count", "max_attempts_dropped_count",  # lmq's, after
        "storage_damage", "reader_lost_count", "stored_bytes", "logical_bytes",
    ]  # fmt: skip
    assert d["stored_bytes"] == d["logical_bytes"] > 0  # nothing compressed: the same
    assert d["channels"][0]["clients"] == []
    assert d["e2e_processing_latency"] == {"count": 0, "percentiles": None}
    with pytest.raises(AttributeError):
        s.depth = 5  # type: ignore[misc]  # frozen snapshot


def test_metadata_entry_is_kept_until_something_in_it_changes() -> None:
    topic = make_topic("orders")
    first = topic.metadata_entry()
    assert first == TopicMetadata("orders", False, (), ())
    assert topic.metadata_entry() is first  # nothing changed: the same object
    archive = topic.get_channel("archive")
    topic.get_channel("tmp#ephemeral")
    entry = topic.metadata_entry()
    assert entry == TopicMetadata("orders", False, (ChannelMetadata("archive"),), ())
    archive.pause()
    assert topic.metadata_entry().channels == (ChannelMetadata("archive", True),)
    topic.pause()
    assert topic.metadata_entry().paused
    topic.paused = False  # as the restore sets it
    assert not topic.metadata_entry().paused
    topic.set_policy({"retention_ms": 1000})
    assert topic.metadata_entry().policy == (("retention_ms", 1000),)
    kept = topic.metadata_entry()
    archive.paused = True  # unchanged value: the entry stays
    assert topic.metadata_entry() is kept
    topic.delete_channel("archive")
    assert topic.metadata_entry().channels == ()

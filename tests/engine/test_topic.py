"""Topic behaviour: publishing, the pump's fan-out, channels' life cycle, ephemeral deletion.

Tests that need the pump run ``Topic.run`` on pytest-trio's ``autojump_clock`` and wait for the
fake subscribers' writes; nothing here sleeps on the real clock.
"""

from __future__ import annotations

import random

import pytest
import trio

from lmqd.engine.backend import BackendError, BackendQueue, DummyBackend, MemoryBackend
from lmqd.engine.channel import Channel
from lmqd.engine.topic import Topic, TopicExiting
from lmqd.message import GuidFactory
from lmqd.options import Options

from .engine_fakes import FailingBackend, FakeClient, bodies, make_messages


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
    backend: BackendQueue | None = None,
    deleted: list[Topic] | None = None,
    **options: object,
) -> Topic:
    if backend is None:
        backend = DummyBackend() if name.endswith(("#tmp", "#ephemeral")) else MemoryBackend()
    return Topic(
        name,
        Options.from_mapping(options),
        backend=backend,
        channel_backend_factory=Backends(),
        on_deleted_ephemeral=deleted.append if deleted is not None else None,
        guid=GuidFactory(1),
        rng=random.Random(99),
    )


def subscribe(topic: Topic, channel: str, client: FakeClient) -> Channel:
    ch = topic.get_channel(channel)
    client.subscribe(ch)
    return ch


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


def test_publish_overflow_goes_to_backend_in_order() -> None:
    topic = make_topic(mem_queue_size=2)
    topic.publish([b"a", b"b", b"c"], 0.0)
    assert (topic.depth, topic.backend_depth) == (3, 1)
    topic.publish([b"d"], 0.0)  # FIFO rule: the backend is not empty, so behind it
    assert (topic.depth, topic.backend_depth) == (4, 2)


def test_publish_is_all_or_none_when_the_backend_fails() -> None:
    backend = FailingBackend()
    topic = make_topic(backend=backend, mem_queue_size=2)
    with pytest.raises(BackendError):
        topic.publish([b"a", b"b", b"c"], 0.0)
    assert (topic.depth, topic.message_count, topic.message_bytes) == (0, 0, 0)
    backend.failing = False
    topic.publish([b"a", b"b", b"c"], 0.0)
    assert (topic.depth, topic.backend_depth) == (3, 1)


def test_publishing_to_a_closed_topic_raises_topic_exiting() -> None:
    topic = make_topic()
    topic.close()
    with pytest.raises(TopicExiting):
        topic.publish([b"x"], 0.0)
    with pytest.raises(TopicExiting):
        topic.get_channel("c")


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
        # The first channel gets the published objects themselves, the others copies.
        assert all(x is y for x, y in zip(a.received, published, strict=True))
        assert topic.depth == 0
        assert topic.channels["ca"].message_count == 2
        assert topic.channels["cb"].message_count == 2
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


async def test_pump_reads_memory_then_backend_in_order(autojump_clock: trio.abc.Clock) -> None:
    topic = make_topic(mem_queue_size=3)
    topic.publish([b"m%d" % i for i in range(10)], 0.0)
    assert topic.backend_depth == 7
    client = FakeClient(1, ready=100)
    subscribe(topic, "c", client)
    async with trio.open_nursery() as nursery:
        await nursery.start(topic.run)
        while len(client.received) < 10:
            await client.wait_writes(len(client.writes) + 1)
        assert bodies(client.received) == [b"m%d" % i for i in range(10)]
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
        assert topic.statistics().paused
        topic.unpause()
        await client.wait_writes(1)
        assert bodies(client.received) == [b"x", b"y"]
        assert trio.current_time() == 5.0
        topic.close()


async def test_dpub_through_the_topic_is_delivered_at_its_time(
    autojump_clock: trio.abc.Clock,
) -> None:
    topic = make_topic()
    client = FakeClient(1, ready=10)
    subscribe(topic, "c", client)
    async with trio.open_nursery() as nursery:
        await nursery.start(topic.run)
        topic.publish([b"later"], 0.0, defer=7.5)
        await client.wait_writes(1)
        assert trio.current_time() == 7.5
        assert bodies(client.received) == [b"later"]
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
    assert isinstance(ch1.backend, DummyBackend)
    ch1.remove_consumer(a.sub)
    assert ch1.exiting
    assert "c1#ephemeral" not in topic.channels
    assert deleted == []
    b_channel = topic.channels["c2"]
    b_channel.remove_consumer(b.sub)
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
    backend = DummyBackend()
    topic = make_topic("t#tmp", backend=backend, mem_queue_size=2)
    topic.publish([b"a", b"b", b"c"], 0.0)
    assert (topic.depth, topic.backend_depth, backend.dropped_count) == (2, 0, 1)
    assert topic.message_count == 3


def test_topic_empty_drops_its_own_queue_only() -> None:
    topic = make_topic(mem_queue_size=1)
    ch = topic.get_channel("c")
    ch.put_many(make_messages(2), 0.0)
    topic.publish([b"a", b"b"], 0.0)
    topic.empty()
    assert (topic.depth, topic.backend_depth) == (0, 0)
    assert ch.depth == 2


def test_close_flushes_topic_memory_and_channels_to_their_backends() -> None:
    backend = MemoryBackend()
    factory = Backends()
    topic = Topic(
        "t",
        Options(),
        backend=backend,
        channel_backend_factory=factory,
        guid=GuidFactory(1),
    )
    ch = topic.get_channel("c")
    ch.put_many(make_messages(2), 0.0)
    topic.publish([b"a"], 0.0)
    topic.close()
    assert backend.depth == 1
    assert factory.made[("t", "c")].depth == 2
    assert ch.exiting


def test_delete_drops_everything() -> None:
    factory = Backends()
    topic = Topic(
        "t",
        Options(),
        backend=MemoryBackend(),
        channel_backend_factory=factory,
        guid=GuidFactory(1),
    )
    ch = topic.get_channel("c")
    ch.put_many(make_messages(2), 0.0)
    topic.publish([b"a"], 0.0)
    topic.delete()
    assert topic.depth == 0
    assert topic.channels == {}
    assert ch.exiting and ch.depth == 0
    assert factory.made[("t", "c")].depth == 0


# -- statistics ---------------------------------------------------------------------------------


def test_topic_statistics_snapshot() -> None:
    topic = make_topic(mem_queue_size=1)
    zc = topic.get_channel("z")
    topic.get_channel("a")
    zc.add_consumer(FakeClient(7, ready=0))
    topic.publish([b"abc", b"de"], 0.0)
    s = topic.statistics()
    assert s.topic_name == "t"
    assert [c.channel_name for c in s.channels] == ["a", "z"]  # sorted by name
    assert (s.depth, s.backend_depth, s.message_count, s.message_bytes) == (2, 1, 2, 5)
    assert not s.paused
    assert s.channels[1].client_count == 1
    assert s.channels[1].clients is not None
    assert topic.statistics(include_clients=False).channels[1].clients is None
    d = s.to_dict()
    assert list(d) == [
        "topic_name", "channels", "depth", "backend_depth", "message_count", "message_bytes",
        "paused", "e2e_processing_latency",
    ]  # fmt: skip
    assert d["channels"][0]["clients"] == []
    assert d["e2e_processing_latency"] == {"count": 0, "percentiles": None}
    with pytest.raises(AttributeError):
        s.depth = 5  # type: ignore[misc]  # frozen snapshot

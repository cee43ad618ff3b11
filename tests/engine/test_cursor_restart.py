"""A channel's cursor across a restart and a crash: topic empty's skipped range, and a seek's
messages in flight (``--durable``).

Rules for this module: no trio run loop (the engine's plain-def entry points with ``now`` passed
in); real files on tmpfs through the daemon's own restore path (``lmqd.engine.stores``), as
``test_model``; a crash is a copy of the data directory taken after a sync (what the OS holds at
a kill -9), the engine then goes on in the copy; a graceful restart closes the topic and opens
it again in place.
"""

from __future__ import annotations

import random
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from lmqd.engine.stores import Stores, queues_to_open, restore_plan, stored_queue_names
from lmqd.engine.syncer import Syncer
from lmqd.engine.topic import Topic
from lmqd.message import GuidFactory, Message
from lmqd.options import Options
from lmqd.storage import AnchoredTimeBase, ChannelMetadata, Metadata, TopicMetadata, run_sync_jobs

from ..storage.storage_helpers import memory_dir
from .engine_fakes import FakeClient

WALL0_NS = 1_750_000_000 * 10**9
NOW = 1.0


class Engine:
    """One topic ``t`` opened the way the daemon opens it, over a data directory that a crash
    replaces by a copy."""

    def __init__(self, base: Path, *, durable: bool) -> None:
        self.base = base
        self.root = base / "g0"
        self.root.mkdir()
        self.generation = 0
        self.durable = durable
        self.guid = GuidFactory(1)
        self.clients: dict[str, FakeClient] = {}
        self.topic = self._open([])

    def _open(self, channels: list[str]) -> Topic:
        options = Options(
            data_path=str(self.root), durable=self.durable, mem_queue_size=0,
            max_bytes_per_file=400,
        )
        timebase = AnchoredTimeBase(0.0, WALL0_NS)
        syncer = Syncer(
            sync_every=10**9, sync_timeout=1.0, metadata_file=str(self.root / "lmqd.dat"),
            metadata=Metadata,
        )
        stores = Stores(options, syncer, hold_data_dir=lambda: timebase, on_health=lambda e: None)
        on_disk = stored_queue_names(str(self.root))
        plan = restore_plan(
            Metadata((TopicMetadata("t", False, tuple(ChannelMetadata(n) for n in channels)),)),
            on_disk,
        )
        opened, failed = stores.open_stored(queues_to_open(plan, on_disk))
        assert not failed
        stores.preopen(opened)
        topic = Topic(
            "t", options, log=stores.topic_log("t"),
            channel_backend_factory=stores.channel_backend,
            deferred_store_factory=stores.deferred_store,
            guid=self.guid, rng=random.Random(7), clock=lambda: NOW,
        )
        for name in channels:
            self.subscribe(topic, name)
        stores.close_unclaimed()
        return topic

    def subscribe(self, topic: Topic, name: str, ready: int = 0) -> FakeClient:
        client = FakeClient(len(self.clients) + 1, ready=ready)
        client.subscribe(topic.get_channel(name))
        self.clients[name] = client
        return client

    def pump(self) -> None:
        while self.topic.stream.depth:
            self.topic._pump_batch(NOW)

    def sync(self) -> None:
        topic = self.topic
        jobs = [job for c in topic.channels.values() for q in c.disk_queues
                if (job := q.prepare_sync()) is not None]
        if (job := topic.stream.prepare_sync()) is not None:
            jobs.append(job)
        assert all(error is None for error in run_sync_jobs(jobs))

    def restart(self) -> None:
        names = list(self.topic.channels)
        self.topic.close()
        self.clients.clear()
        self.topic = self._open(names)

    def crash(self) -> None:
        names = list(self.topic.channels)
        self.generation += 1
        copy = self.base / f"g{self.generation}"
        shutil.copytree(self.root, copy)
        self.topic.close()  # releases the old directory's files; the copy goes on
        shutil.rmtree(self.root)
        self.root = copy
        self.clients.clear()
        self.topic = self._open(names)

    def drain(self, name: str) -> list[Message]:
        """Every message channel ``name`` delivers now (RDY wide open), FIN'd."""
        channel = self.topic.channels[name]
        client = self.clients[name]
        client.ready_count = 10_000
        before = len(client.received)
        channel.deliver(NOW)
        got = client.received[before:]
        assert client.sub is not None
        channel.finish_many(client.sub, [m.id for m in got], NOW)
        return got

    def close(self) -> None:
        self.topic.close()


@pytest.fixture(params=[False, True], ids=["default", "durable"])
def engine(request: pytest.FixtureRequest) -> Iterator[Engine]:
    with memory_dir() as base:
        e = Engine(base, durable=request.param)
        try:
            yield e
        finally:
            e.close()


def publish(engine: Engine, *bodies: bytes) -> None:
    engine.topic.publish(list(bodies), NOW)


@pytest.mark.parametrize("how", ["restart", "crash"])
def test_topic_empty_with_a_lagging_channel_is_stepped_over_after_a_restart(
    engine: Engine, how: str
) -> None:
    topic = engine.topic
    engine.subscribe(topic, "a")
    publish(engine, b"kept1", b"kept2")
    engine.pump()  # handed to "a", which has not read them (RDY 0)
    topic.pause()
    publish(engine, b"gone1", b"gone2", b"gone3")
    topic.empty()  # drops the three the topic had not handed on
    topic.unpause()
    publish(engine, b"after")
    engine.pump()
    engine.sync()
    engine.restart() if how == "restart" else engine.crash()
    engine.pump()
    assert [m.body for m in engine.drain("a")] == [b"kept1", b"kept2", b"after"]


def test_a_skipped_range_is_forgotten_once_the_channel_passed_it(engine: Engine) -> None:
    topic = engine.topic
    engine.subscribe(topic, "a")
    publish(engine, b"kept")
    engine.pump()
    topic.pause()
    publish(engine, b"gone")
    topic.empty()
    topic.unpause()
    engine.pump()
    assert [m.body for m in engine.drain("a")] == [b"kept"]
    engine.sync()
    log = topic.stream.log
    assert log is not None
    cursor = log.cursor("a")
    assert cursor is not None and cursor.skips == []
    state = (next(engine.root.glob("**/t.lmq.log.json"))).read_text()
    assert '"skips"' not in state


def test_seek_in_durable_keeps_the_messages_in_flight_across_a_crash() -> None:
    with memory_dir() as base:
        engine = Engine(base, durable=True)
        try:
            client = engine.subscribe(engine.topic, "a", ready=10)
            publish(engine, b"m1", b"m2", b"m3")
            engine.pump()
            channel = engine.topic.channels["a"]
            channel.deliver(NOW)
            assert [m.body for m in client.received] == [b"m1", b"m2", b"m3"]
            assert client.sub is not None
            channel.finish(client.sub, client.received[0].id, NOW)  # m1 done; m2, m3 in flight
            channel.seek(engine.topic.stream.next_offset)  # jump to the end
            publish(engine, b"m4")
            engine.pump()
            engine.sync()
            engine.crash()
            engine.pump()
            got = engine.drain("a")
            assert sorted(m.body for m in got) == [b"m2", b"m3", b"m4"]
            # m2 and m3 were delivered before the crash: that delivery counts.
            assert {m.body: m.attempts for m in got if m.body != b"m4"} == {b"m2": 2, b"m3": 2}
        finally:
            engine.close()


def test_messages_in_flight_across_a_seek_still_settle_and_free_the_log() -> None:
    with memory_dir() as base:
        engine = Engine(base, durable=True)
        try:
            client = engine.subscribe(engine.topic, "a", ready=10)
            publish(engine, b"m1", b"m2")
            engine.pump()
            channel = engine.topic.channels["a"]
            channel.deliver(NOW)
            assert client.sub is not None
            channel.seek(0)  # a replay while m1, m2 are in flight: they come again
            channel.finish_many(client.sub, [m.id for m in client.received], NOW)
            replayed = engine.drain("a")
            assert [m.body for m in replayed] == [b"m1", b"m2"]
            log = engine.topic.stream.log
            assert log is not None
            cursor = log.cursor("a")
            assert cursor is not None
            assert (cursor.unsettled_count, cursor.low) == (0, engine.topic.stream.next_offset)
            engine.sync()
            engine.crash()
            engine.pump()
            assert engine.drain("a") == []  # everything was FIN'd: nothing comes back
        finally:
            engine.close()

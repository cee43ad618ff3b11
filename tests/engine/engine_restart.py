"""A topic opened the way the daemon opens it (``lmqd.engine.stores``' restore path) over a data
directory on tmpfs, restarted in place or crashed (a copy of the directory taken after a sync:
what the OS holds at a kill -9) by the engine tests of restarts. No trio run loop: the engine's
plain-def entry points with ``now`` passed in."""

from __future__ import annotations

import os
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lmqd.engine.context import EngineContext
from lmqd.engine.stores import Stores, queues_to_open, restore_plan, stored_queue_names
from lmqd.engine.syncer import Syncer
from lmqd.engine.topic import Topic
from lmqd.message import GuidFactory, Message
from lmqd.options import Options
from lmqd.storage import AnchoredTimeBase, ChannelMetadata, Metadata, TopicMetadata, run_sync_jobs

from .engine_fakes import FakeClient

WALL0_NS = 1_750_000_000 * 10**9
NOW = 1.0


def open_restored_topic(
    options: Options,
    channels: list[str],
    *,
    guid: GuidFactory,
    prepare: Callable[[Topic], None] | None = None,
    **context_parts: Any,
) -> Topic:
    """Topic ``t`` in ``options.data_path`` with ``channels``, restored as the service restores
    it (``lmqd.engine.stores``: the restore plan, the logs and queues opened first, then the
    topic and its channels; ``prepare`` runs between the two, where the service restores the
    policy). Stored deadlines use ``WALL0_NS`` as trio time 0."""
    root = options.data_path
    timebase = AnchoredTimeBase(0.0, WALL0_NS)
    syncer = Syncer(
        sync_every=10**9, sync_timeout=1.0, metadata_file=os.path.join(root, "lmqd.dat"),
        metadata=Metadata,
    )
    stores = Stores(options, syncer, hold_data_dir=lambda: timebase, on_health=lambda e: None)
    on_disk = stored_queue_names(root)
    plan = restore_plan(
        Metadata((TopicMetadata("t", False, tuple(ChannelMetadata(n) for n in channels)),)),
        on_disk,
    )
    opened, failed = stores.open_stored(queues_to_open(plan, on_disk))
    assert not failed
    stores.preopen(opened)
    ctx = EngineContext(
        options=options, stores=stores, guid=guid, rng=random.Random(7), **context_parts
    )
    topic = Topic(ctx, "t", log=stores.topic_log("t"))
    if prepare is not None:
        prepare(topic)
    for name in channels:
        topic.get_channel(name)
    stores.close_unclaimed()
    return topic


class Engine:
    """One topic ``t`` opened the way the daemon opens it, over a data directory that a crash
    replaces by a copy."""

    def __init__(self, base: Path, *, durable: bool, mem_queue_size: int = 0) -> None:
        self.base = base
        self.root = base / "g0"
        self.root.mkdir()
        self.generation = 0
        self.durable = durable
        self.mem_queue_size = mem_queue_size
        self.max_msg_size = 1024 * 1024
        """``--max-msg-size`` of the next open (a restart may lower it below stored bodies)."""
        self.guid = GuidFactory(1)
        self.clients: dict[str, FakeClient] = {}
        self.topic = self._open([])

    def _open(self, channels: list[str]) -> Topic:
        options = Options(
            data_path=str(self.root), durable=self.durable, mem_queue_size=self.mem_queue_size,
            max_bytes_per_file=400, max_msg_size=self.max_msg_size,
        )
        topic = open_restored_topic(options, channels, guid=self.guid, clock=lambda: NOW)
        for name in channels:
            self.subscribe(topic, name)
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

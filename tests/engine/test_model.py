"""Property tests: topics, channels as cursors and their stores, against a simple model.

Hypothesis drives random sequences of publish (some deferred) / pump / channel create and delete
/ deliver / FIN / REQ / time passing (timeouts, deferrals) / sync / graceful restart / process
crash (kill -9: every write reached the OS, in-memory state is gone), in default mode and with
``--durable``, with segments small enough to roll every few messages and memory tails of
0, 3 or 100 messages.

The model is nsqd's semantics: a message goes to the channels that exist when the topic hands
it on (the pump; a topic without channels keeps it for the first one), each channel delivers it
until it is FIN'd. It checks, at every delivery, that a channel only ever gets messages that
were handed to a channel of its name (after a crash, anything published before it: the topic
hands on again what it had handed on since its last sync, to the channels that exist then);
and at the end, after draining every channel (RDY open,
all time passed, everything FIN'd), that nothing owed was lost: in ``--durable`` across crashes
too, in default mode across graceful restarts (a crash there may lose what was in memory, as
nsqd).

Rules for this module: no trio run loop (the engine's plain-def entry points with ``now``
passed in); real files on tmpfs (``memory_dir``) through the daemon's own restore path
(``lmqd.engine.stores``); a crash is a copy of the data directory the engine then goes on in
(what the OS holds at a kill -9), and every log and queue is closed in the end, so no file
descriptor leaks; fake subscribers.
"""

from __future__ import annotations

import random
import shutil
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from lmqd.engine.channel import Channel
from lmqd.engine.context import EngineContext
from lmqd.engine.stores import Stores, queues_to_open, restore_plan, stored_queue_names
from lmqd.engine.syncer import Syncer
from lmqd.engine.topic import Topic
from lmqd.message import GuidFactory
from lmqd.options import Options
from lmqd.storage import AnchoredTimeBase, ChannelMetadata, Metadata, TopicMetadata, run_sync_jobs

from ..storage.storage_helpers import memory_dir
from .engine_fakes import FakeClient

WALL0_NS = 1_750_000_000 * 10**9
NAMES = ("a", "b", "c")
TIMEOUT_S = 30.0
"""Every client's msg timeout: time steps are shorter and longer than it."""


class ModelChannel:
    def __init__(self) -> None:
        self.owed: set[bytes] = set()
        """Handed to this channel and not FIN'd."""


class EngineMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self._stack = ExitStack()
        self.base: Path = self._stack.enter_context(memory_dir())
        self.root = self.base / "g0"
        self.root.mkdir()
        self.generation = 0
        self.now = 0.0
        self.counter = 0
        self.durable = False
        self.mem = 0
        self.unpumped: list[bytes] = []
        self.channels: dict[str, ModelChannel] = {}
        self.history: dict[str, set[bytes]] = {name: set() for name in NAMES}
        """Every message ever handed to a channel of this name (any incarnation)."""
        self.lossy = False
        """A crash in default mode happened: messages in memory may be gone (nsqd)."""
        self.published: set[bytes] = set()
        self.paused = False
        self.clients: dict[str, FakeClient] = {}
        self.client_ids = 0
        self.topic: Topic | None = None
        self.guid = GuidFactory(1)
        """One for the machine's life, as a daemon's: ids stay unique across its restarts."""

    # -- the engine, opened the way the daemon opens it --------------------------------------

    def _options(self) -> Options:
        return Options(
            data_path=str(self.root),
            durable=self.durable,
            mem_queue_size=self.mem,
            max_bytes_per_file=400,
            msg_timeout=TIMEOUT_S,
        )

    def _open(self, names: list[str]) -> None:
        options = self._options()
        timebase = AnchoredTimeBase(0.0, WALL0_NS)
        syncer = Syncer(
            sync_every=10**9, sync_timeout=1.0, metadata_file=str(self.root / "lmqd.dat"),
            metadata=Metadata,
        )
        stores = Stores(options, syncer, hold_data_dir=lambda: timebase, on_health=lambda e: None)
        on_disk = stored_queue_names(str(self.root))
        plan = restore_plan(
            Metadata((TopicMetadata("t", self.paused, tuple(ChannelMetadata(n) for n in names)),)),
            on_disk,
        )
        opened, failed = stores.open_stored(queues_to_open(plan, on_disk))
        assert not failed
        stores.preopen(opened)
        ctx = EngineContext(
            options=options, stores=stores, guid=self.guid, rng=random.Random(7),
            clock=lambda: self.now,
        )  # fmt: skip
        topic = Topic(ctx, "t", log=stores.topic_log("t"))
        topic.paused = self.paused
        for channel in plan[0].channels:
            self._attach(topic.get_channel(channel.name))
        for name in topic.stored_channel_names():  # what the service restores from the log
            if name not in topic.channels:
                self._attach(topic.get_channel(name))
                self.channels.setdefault(name, ModelChannel())
        stores.close_unclaimed()
        self.topic = topic

    def _attach(self, channel: Channel) -> None:
        self.client_ids += 1
        client = FakeClient(self.client_ids, ready=0, msg_timeout=TIMEOUT_S)
        client.subscribe(channel)
        self.clients[channel.name] = client

    @property
    def t(self) -> Topic:
        assert self.topic is not None
        return self.topic

    def _check(self, name: str, got: list[Any]) -> None:
        for m in got:
            assert m.body in self.history[name], f"{name} got {m.body!r}, never handed to it"

    # -- rules -----------------------------------------------------------------------------

    @initialize(durable=st.booleans(), mem=st.sampled_from([0, 3, 100]))
    def setup(self, durable: bool, mem: int) -> None:
        self.durable = durable
        self.mem = mem
        self._open([])

    @rule(count=st.integers(1, 4), defer=st.sampled_from([0.0, 0.0, 0.0, 5.0, 100.0]))
    def publish(self, count: int, defer: float) -> None:
        bodies = []
        for _ in range(count):
            self.counter += 1
            bodies.append(b"m%d" % self.counter)
        self.t.publish(bodies, self.now, defer)
        self.unpumped += bodies
        self.published.update(bodies)

    @rule()
    def pump(self) -> None:
        topic = self.t
        if self.paused or not topic.channels:
            return
        while topic.stream.depth:
            topic._pump_batch(self.now)
        for name, model in self.channels.items():
            model.owed.update(self.unpumped)
            self.history[name].update(self.unpumped)
        self.unpumped = []
        for name, client in self.clients.items():
            self._check(name, client.received)

    @rule(paused=st.booleans())
    def pause(self, paused: bool) -> None:
        self.paused = paused
        if paused:
            self.t.pause()
        else:
            self.t.unpause()

    @rule(name=st.sampled_from(NAMES))
    def create_channel(self, name: str) -> None:
        if name in self.channels:
            return
        self._attach(self.t.get_channel(name))
        self.channels[name] = ModelChannel()

    @rule(name=st.sampled_from(NAMES))
    def delete_channel(self, name: str) -> None:
        if name not in self.channels:
            return
        self.t.delete_channel(name)
        del self.channels[name]
        del self.clients[name]

    @rule(name=st.sampled_from(NAMES), rdy=st.integers(0, 6))
    def deliver(self, name: str, rdy: int) -> None:
        client = self.clients.get(name)
        if client is None:
            return
        before = len(client.received)
        client.ready_count = rdy
        self.t.channels[name].deliver(self.now)
        self._check(name, client.received[before:])

    @rule(name=st.sampled_from(NAMES), pick=st.integers(0, 5), requeue=st.sampled_from(
        [None, None, 0.0, 2.0]))
    def settle(self, name: str, pick: int, requeue: float | None) -> None:
        client = self.clients.get(name)
        if client is None or client.sub is None:
            return
        channel = self.t.channels[name]
        mine = [m for m in channel.in_flight if m.client_id == client.id]
        if not mine:
            return
        m = mine[pick % len(mine)]
        if requeue is None:
            channel.finish(client.sub, m.id, self.now)
            self.channels[name].owed.discard(m.body)
        else:
            channel.requeue(client.sub, m.id, requeue, self.now)

    @rule(dt=st.sampled_from([0.5, 3.0, TIMEOUT_S + 1]))
    def tick(self, dt: float) -> None:
        self.now += dt
        for channel in self.t.channels.values():
            channel.process_due(self.now)

    @rule()
    def sync(self) -> None:
        topic = self.t
        jobs = [job for c in topic.channels.values() for q in c.disk_queues
                if (job := q.prepare_sync()) is not None]
        job = topic.stream.prepare_sync()
        if job is not None:
            jobs.append(job)
        assert all(error is None for error in run_sync_jobs(jobs))

    @rule()
    def restart(self) -> None:
        self.t.close()
        self.clients.clear()
        self._open(list(self.channels))

    @precondition(lambda self: self.topic is not None)
    @rule()
    def crash(self) -> None:
        # kill -9: a copy of the data directory now is what the OS holds (every write, no
        # close-time sync); the engine goes on in the copy, memory gone. The old one is closed
        # in its own directory only so that its files are released.
        self.generation += 1
        copy = self.base / f"g{self.generation}"
        shutil.copytree(self.root, copy)
        self.t.close()
        shutil.rmtree(self.root)
        self.root = copy
        if not self.durable:
            self.lossy = True
        # What the topic had handed on since the last sync it hands on again (at-least-once),
        # to the channels that exist then, some of which may be newer than the message.
        for name in NAMES:
            self.history[name] |= self.published
        self.topic = None
        self.clients.clear()
        self._open(list(self.channels))

    # -- the end ---------------------------------------------------------------------------

    def teardown(self) -> None:
        try:
            if self.topic is not None:
                self._drain()
                self.t.close()
        finally:
            self._stack.close()

    def _drain(self) -> None:
        topic = self.t
        topic.unpause()
        self.paused = False
        self.pump()
        received: dict[str, set[bytes]] = {name: set() for name in self.channels}
        for _ in range(50):
            progress = False
            self.now += 1000.0  # past every deferral and timeout
            for name, channel in topic.channels.items():
                channel.process_due(self.now)
                client = self.clients[name]
                client.ready_count = 10_000
                before = len(client.received)
                channel.deliver(self.now)
                got = client.received[before:]
                self._check(name, got)
                if got:
                    progress = True
                    assert client.sub is not None
                    channel.finish_many(client.sub, [m.id for m in got], self.now)
                    received[name].update(m.body for m in got)
            if not progress:
                break
        for name, model in self.channels.items():
            channel = topic.channels[name]
            assert (channel.depth, channel.in_flight_count, channel.deferred_count) == (0, 0, 0)
            if not self.lossy:
                missing = model.owed - received[name]
                assert not missing, f"channel {name} lost {sorted(missing)[:5]}"


EngineMachine.TestCase.settings = settings(
    max_examples=150,  # ~5 s; 500 examples (~15 s) found nothing more while this was written
    stateful_step_count=80,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_engine_model = EngineMachine.TestCase

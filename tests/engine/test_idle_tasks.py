"""Idle topics and channels hold no task: tasks start with work and end when it is done.

Rules for this module:
- Every test runs on pytest-trio's ``autojump_clock`` (virtual time starts at 0.0) and asserts
  exact virtual times; nothing sleeps on the real clock.
- A task that finds nothing to do lingers (``PUMP_IDLE_S``, ``TASK_IDLE_S``) before it ends.
- Topics are attached to the test's own nursery (``Topic.attach``, what the broker does with the
  service's nursery), so ``nursery.child_tasks`` is exactly the tasks the topic and its
  channels run at that moment.
- A whole broker over ``tmp_path`` (the daemon's real paths: fresh topic logs, lazily opened
  channel stores) checks what tens of idle topics and channels cost in tasks and objects.
"""

from __future__ import annotations

import gc
import random
from pathlib import Path

import trio
import trio.testing

from lmqd.broker import Broker
from lmqd.engine.backend import BackendQueue, MemoryBackend
from lmqd.engine.channel import TASK_IDLE_S
from lmqd.engine.topic import PUMP_IDLE_S, Topic
from lmqd.message import GuidFactory
from lmqd.options import Options
from lmqd.storage import AnchoredTimeBase

from .engine_fakes import FakeClient, engine

MSG_TIMEOUT = 60.0  # FakeClient's default msg_timeout


def memory_backend(topic: str, channel: str) -> BackendQueue:
    return MemoryBackend()


def make_topic(**options: object) -> Topic:
    ctx = engine(Options.from_mapping(options), guid=GuidFactory(1), rng=random.Random(7))
    return Topic(ctx, "t")


async def settle() -> None:
    await trio.testing.wait_all_tasks_blocked()


async def test_idle_topic_and_channels_hold_no_task(autojump_clock: trio.abc.Clock) -> None:
    topic = make_topic()
    async with trio.open_nursery() as nursery:
        topic.attach(nursery)
        channels = [topic.get_channel(f"c{i}") for i in range(3)]
        client = FakeClient(1, ready=5)
        client.subscribe(channels[0])
        await settle()
        assert nursery.child_tasks == frozenset()
        topic.close()
    assert trio.current_time() == 0.0


async def test_message_starts_tasks_and_they_end_when_idle(autojump_clock: trio.abc.Clock) -> None:
    topic = make_topic()
    async with trio.open_nursery() as nursery:
        topic.attach(nursery)
        channel = topic.get_channel("c")
        client = FakeClient(1, ready=1)
        client.subscribe(channel)
        topic.publish([b"one"], trio.current_time())
        await client.wait_writes(1)
        assert client.write_times == [0.0]
        names = sorted(task.name for task in nursery.child_tasks)
        assert names == ["channel t:c", "pump t"]
        [m] = client.writes[0]
        await trio.sleep(1.0)
        channel.finish(client.sub, m.id, trio.current_time())  # type: ignore[arg-type]
        # The pump ends PUMP_IDLE_S after its last batch.
        await trio.sleep_until(PUMP_IDLE_S + 0.5)
        await settle()
        assert sorted(task.name for task in nursery.child_tasks) == ["channel t:c"]
        # The channel's task wakes at the in-flight deadline, finds nothing due and, its last
        # delivery more than TASK_IDLE_S ago, ends.
        await trio.sleep_until(MSG_TIMEOUT - 0.5)
        await settle()
        assert sorted(task.name for task in nursery.child_tasks) == ["channel t:c"]
        await trio.sleep_until(MSG_TIMEOUT + 0.5)
        await settle()
        assert nursery.child_tasks == frozenset()
        assert channel.timeout_count == 0
        # The next message starts both again, and delivery is as before.
        topic.publish([b"two"], trio.current_time())
        await client.wait_writes(2)
        assert client.write_times == [0.0, MSG_TIMEOUT + 0.5]
        assert len(nursery.child_tasks) == 2
        topic.close()
    assert nursery.child_tasks == frozenset()


async def test_steady_traffic_keeps_the_same_tasks(autojump_clock: trio.abc.Clock) -> None:
    """A topic published to more often than PUMP_IDLE_S, with its messages FIN'd at once, keeps
    one pump task and one channel task: a publish wakes them, it does not start a task.

    Messages come every 3 s: never at the same virtual time as a task's idle deadline (10 s
    after a delivery), where the order of the wake-ups would decide whether the channel's task
    sees the new message in flight (and then sleeps until its msg timeout)."""
    interval = 3.0
    topic = make_topic()
    async with trio.open_nursery() as nursery:
        topic.attach(nursery)
        channel = topic.get_channel("c")
        client = FakeClient(1, ready=10)
        client.subscribe(channel)
        tasks: frozenset[trio.lowlevel.Task] | None = None
        for i in range(30):
            topic.publish([b"m%d" % i], trio.current_time())
            await client.wait_writes(i + 1)
            [m] = client.writes[i]
            channel.finish(client.sub, m.id, trio.current_time())  # type: ignore[arg-type]
            await settle()
            if tasks is None:
                tasks = nursery.child_tasks
            assert nursery.child_tasks == tasks
            await trio.sleep(interval)
        assert client.write_times == [i * interval for i in range(30)]
        assert tasks is not None and len(tasks) == 2
        # Both end once idle for their time after the last message.
        last = 29 * interval
        assert PUMP_IDLE_S == TASK_IDLE_S
        await trio.sleep_until(last + PUMP_IDLE_S - 0.1)
        assert nursery.child_tasks == tasks
        await trio.sleep_until(last + PUMP_IDLE_S + 0.1)
        await settle()
        assert nursery.child_tasks == frozenset()
        topic.close()


async def test_timeout_redelivers_at_exactly_60s_with_lazy_tasks(
    autojump_clock: trio.abc.Clock,
) -> None:
    topic = make_topic()
    async with trio.open_nursery() as nursery:
        topic.attach(nursery)
        client = FakeClient(1, ready=1)
        client.subscribe(topic.get_channel("c"))
        await trio.sleep(3.0)
        topic.publish([b"x"], trio.current_time())
        await client.wait_writes(2)
        assert client.write_times == [3.0, 3.0 + MSG_TIMEOUT]
        assert client.writes[1][0].attempts == 2
        topic.close()


async def test_deferred_message_on_an_idle_channel_is_due_at_exactly_its_time(
    autojump_clock: trio.abc.Clock,
) -> None:
    topic = make_topic()
    async with trio.open_nursery() as nursery:
        topic.attach(nursery)
        channel = topic.get_channel("c")
        client = FakeClient(1, ready=1)
        client.subscribe(channel)
        await settle()
        assert nursery.child_tasks == frozenset()
        topic.publish([b"later"], trio.current_time(), defer=5.0)  # DPUB 5000
        await client.wait_writes(1)
        assert client.write_times == [5.0]
        # REQ 2000 of an idle channel's only message: its task wakes at exactly 7.0.
        [m] = client.writes[0]
        channel.requeue(client.sub, m.id, 2.0, trio.current_time())  # type: ignore[arg-type]
        await client.wait_writes(2)
        assert client.write_times == [5.0, 7.0]
        topic.close()


async def test_consumer_ready_with_a_backlog_starts_the_channel_task(
    autojump_clock: trio.abc.Clock,
) -> None:
    topic = make_topic()
    async with trio.open_nursery() as nursery:
        topic.attach(nursery)
        channel = topic.get_channel("c")
        client = FakeClient(1, ready=0)
        client.subscribe(channel)
        topic.publish([b"a", b"b"], trio.current_time())
        await trio.sleep(PUMP_IDLE_S + 1.0)  # the pump handed them on and ended
        await settle()
        assert nursery.child_tasks == frozenset()
        assert client.writes == []
        client.ready_count = 2
        channel.consumer_ready()  # RDY 2
        await client.wait_writes(1)
        assert client.write_times == [PUMP_IDLE_S + 1.0]
        assert sorted(m.body for m in client.writes[0]) == [b"a", b"b"]
        topic.close()


async def test_delete_ends_running_tasks(autojump_clock: trio.abc.Clock) -> None:
    topic = make_topic()
    async with trio.open_nursery() as nursery:
        topic.attach(nursery)
        client = FakeClient(1, ready=1)
        client.subscribe(topic.get_channel("c"))
        topic.publish([b"x"], trio.current_time())
        await client.wait_writes(1)
        assert len(nursery.child_tasks) == 2
        topic.delete()
        await settle()
        assert nursery.child_tasks == frozenset()
    assert trio.current_time() == 0.0


async def test_idle_topics_through_the_broker_cost_no_task_and_few_objects(
    autojump_clock: trio.abc.Clock, tmp_path: Path
) -> None:
    timebase = AnchoredTimeBase.now(0.0)
    broker = Broker(Options(data_path=str(tmp_path)), hold_data_dir=lambda: timebase)
    broker.stores.note_on_disk([])  # as the service's start-up scan: new names get fresh logs
    count = 50
    async with trio.open_nursery() as nursery:
        broker.attach(nursery)
        await nursery.start(broker.syncer.run)
        broker.get_topic("warm-up").get_channel("c")
        await settle()
        tasks = set(nursery.child_tasks)
        gc.collect()
        before = len(gc.get_objects())
        for i in range(count):
            broker.get_topic(f"idle-{i}").get_channel("c")
        await settle()
        gc.collect()
        per_pair = (len(gc.get_objects()) - before) / count
        assert set(nursery.child_tasks) == tasks  # the syncer's task only
        # An idle topic with one idle channel was ~146 GC-tracked objects with their tasks
        # (docs/benchmarks.md, issue 18); without tasks and with shared callbacks it is ~65.
        assert per_pair < 80, per_pair
        nursery.cancel_scope.cancel()
    broker.attach(None)
    broker.close_topics()

"""lmq's per-message fields across a restart: dedup ids and the dedup window rebuilt from the
log (``Topic.recover_dedup``), a stored message's own TTL screened from the start.

Rules for this module:
- A real ``Topic`` opened the way the daemon opens it (``lmqd.engine.stores``: its log, the
  channels' own and deferred stores) over a data directory in ``tmp_path``, with fake
  subscribers, run on pytest-trio's ``autojump_clock``; every time asserted is an exact
  virtual time.
- Message timestamps follow the virtual clock (``wall``: ``WALL0_NS`` + trio time, the topic's
  wall clock and the stores' time base), so "5 s old" means exactly that, across restarts too.
- A crash (``kill -9``) is a copy of the data directory taken while the topic is open (what the
  OS holds); a restart closes the topic (what SIGTERM does) and opens it again. Opening then
  restores the policy and calls ``recover_dedup``, in the service's order.
- Each test body that awaits runs under ``trio.fail_after``.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import trio
import trio.testing

from lmqd.engine.policy import PolicyValue
from lmqd.engine.topic import Topic
from lmqd.message import GuidFactory
from lmqd.message_ext import MessageExt
from lmqd.options import Options

from .engine_fakes import FakeClient
from .engine_restart import WALL0_NS, open_restored_topic

TIMEOUT = 3600.0
"""Virtual seconds (the autojump clock): a test that hangs jumps there and fails at once."""


def wall() -> int:
    return WALL0_NS + round(trio.current_time() * 1e9)


class Node:
    """Topic ``t`` of one daemon's data directory, opened, crashed and restarted."""

    def __init__(self, root: Path, policy: dict[str, PolicyValue] | None = None, **options: Any):
        self.root = root
        self.flags = options
        self.policy = policy or {}
        self.guid = GuidFactory(1)
        self.topic = self._open([])

    def _open(self, channels: list[str]) -> Topic:
        self.root.mkdir(exist_ok=True)
        options = Options.from_mapping({"data_path": str(self.root), **self.flags})

        def prepare(topic: Topic) -> None:
            # The service's order: the policy restored, then the dedup windows rebuilt.
            if self.policy:
                topic.set_policy(self.policy)
            topic.recover_dedup(trio.current_time())

        return open_restored_topic(
            options, channels, guid=self.guid, prepare=prepare, wall_clock=wall
        )

    def restart(self) -> Topic:
        names = list(self.topic.channels)
        self.topic.close()
        self.topic = self._open(names)
        return self.topic

    def crash(self) -> Topic:
        names = list(self.topic.channels)
        copy = self.root.with_name(self.root.name + "-crash")
        shutil.copytree(self.root, copy)
        self.topic.close()  # releases the old directory's files; the copy goes on
        shutil.rmtree(self.root)
        self.root = copy
        self.topic = self._open(names)
        return self.topic


def publish_id(topic: Topic, body: bytes, dedup_id: bytes) -> list[bytes]:
    """Publish ``body`` with ``dedup_id`` now; the bodies enqueued ([] for a duplicate)."""
    got = topic.publish([body], trio.current_time(), exts=[MessageExt(dedup_id=dedup_id)])
    return [m.body for m in got]


async def sleep_until(t: float) -> None:
    await trio.sleep_until(t)
    assert trio.current_time() == t


# -- dedup ids --------------------------------------------------------------------------------


async def test_dedup_ids_survive_a_crash_and_expire_when_they_would_have(
    tmp_path: Path, autojump_clock: trio.abc.Clock
) -> None:
    with trio.fail_after(TIMEOUT):
        node = Node(tmp_path / "d", durable=True)
        assert publish_id(node.topic, b"a-1", b"a") == [b"a-1"]  # t=0
        await sleep_until(200)
        assert publish_id(node.topic, b"b-1", b"b") == [b"b-1"]
        await sleep_until(250)
        topic = node.crash()
        # The default window, 300 s, runs from each id's first publish, not from the restart.
        assert publish_id(topic, b"a-2", b"a") == []
        assert publish_id(topic, b"b-2", b"b") == []
        await sleep_until(299.5)
        assert publish_id(topic, b"a-3", b"a") == []
        await sleep_until(300)
        assert publish_id(topic, b"a-4", b"a") == [b"a-4"]
        await sleep_until(499.5)
        assert publish_id(topic, b"b-3", b"b") == []
        await sleep_until(500)
        assert publish_id(topic, b"b-4", b"b") == [b"b-4"]
        assert topic.publish_counters.deduplicated == 4
        topic.close()


async def test_ids_consumed_before_the_crash_are_still_remembered(
    tmp_path: Path, autojump_clock: trio.abc.Clock
) -> None:
    """``--durable``: every message is in the log before its OK, and the log keeps the
    segments of the window even once every channel has passed them (``keep_recent_ms``)."""
    with trio.fail_after(TIMEOUT):
        node = Node(tmp_path / "d", durable=True, max_bytes_per_file=300)
        channel = node.topic.get_channel("c")
        client = FakeClient(1, ready=100)
        client.subscribe(channel)
        for n in range(20):
            assert publish_id(node.topic, b"body-%d" % n, b"id-%d" % n) == [b"body-%d" % n]
            node.topic._pump_batch(trio.current_time())
            await trio.sleep(1)
        assert len(client.received) == 20
        for m in client.received:
            channel.finish(client.sub, m.id, trio.current_time())  # type: ignore[arg-type]
        node.topic.stream.prepare_sync().run()  # type: ignore[union-attr]
        log_ = node.topic.log
        assert log_ is not None and log_.segment_count > 5  # every one of them passed, kept
        topic = node.crash()  # t=20
        assert [publish_id(topic, b"again-%d" % n, b"id-%d" % n) for n in range(20)] == [[]] * 20
        assert publish_id(topic, b"new", b"id-new") == [b"new"]
        topic.close()


async def test_the_policy_window_and_the_body_window_are_rebuilt(
    tmp_path: Path, autojump_clock: trio.abc.Clock
) -> None:
    with trio.fail_after(TIMEOUT):
        node = Node(tmp_path / "d", {"dedup_window_ms": 10_000}, durable=True)
        now = trio.current_time()
        assert [m.body for m in node.topic.publish([b"x"], now)] == [b"x"]  # t=0
        await sleep_until(3)
        assert publish_id(node.topic, b"y", b"i") == [b"y"]
        await sleep_until(4)
        topic = node.restart()
        assert topic.publish([b"x"], trio.current_time()) == []  # the body, 4 s old
        assert publish_id(topic, b"z", b"i") == []  # the id: the policy's 10 s, not 300
        await sleep_until(9.5)
        assert topic.publish([b"x"], trio.current_time()) == []
        await sleep_until(10)
        assert [m.body for m in topic.publish([b"x"], trio.current_time())] == [b"x"]
        await sleep_until(12.5)
        assert publish_id(topic, b"z", b"i") == []
        await sleep_until(13)
        assert publish_id(topic, b"z", b"i") == [b"z"]
        topic.close()


async def test_default_mode_remembers_only_what_was_on_disk(
    tmp_path: Path, autojump_clock: trio.abc.Clock
) -> None:
    """Without ``--durable`` the log holds the backlog a shutdown wrote (and what overflowed
    ``--mem-queue-size``); a message every channel read from memory was never written
    (nsqd), so its id is not remembered after a restart (docs/durability.md)."""
    with trio.fail_after(TIMEOUT):
        node = Node(tmp_path / "d", mem_queue_size=100)
        channel = node.topic.get_channel("c")
        client = FakeClient(1, ready=1)
        client.subscribe(channel)
        assert publish_id(node.topic, b"read", b"r") == [b"read"]
        node.topic._pump_batch(trio.current_time())
        [m] = client.received
        channel.finish(client.sub, m.id, trio.current_time())  # type: ignore[arg-type]
        client.ready_count = 0
        assert publish_id(node.topic, b"waiting", b"w") == [b"waiting"]
        await sleep_until(1)
        topic = node.restart()
        assert publish_id(topic, b"waiting-2", b"w") == []
        assert publish_id(topic, b"read-2", b"r") == [b"read-2"]
        topic.close()


async def test_a_topic_without_ids_has_no_id_window_after_a_restart(
    tmp_path: Path, autojump_clock: trio.abc.Clock
) -> None:
    node = Node(tmp_path / "d", durable=True)
    node.topic.publish([b"a", b"b"], trio.current_time(), exts=[MessageExt(priority=1), None])
    topic = node.restart()
    assert topic.publishing.id_window is None and topic.gate is None
    log_ = topic.log
    assert log_ is not None and log_.keep_recent_ms is None  # nothing kept longer
    topic.close()


# -- a stored message's own TTL -------------------------------------------------------------------


async def test_a_stored_messages_own_ttl_holds_after_a_restart(
    tmp_path: Path, autojump_clock: trio.abc.Clock
) -> None:
    """In the log (the backlog a shutdown wrote)."""
    with trio.fail_after(TIMEOUT):
        node = Node(tmp_path / "d", mem_queue_size=100)
        node.topic.get_channel("c")
        node.topic.publish(
            [b"short", b"plain", b"long"], trio.current_time(),
            exts=[MessageExt(ttl_ms=2000), None, MessageExt(ttl_ms=60_000)],
        )  # fmt: skip
        await sleep_until(1)
        topic = node.restart()
        assert topic.message_ttls
        await sleep_until(3)  # "short" is 3 s old: past its own 2 s
        async with trio.open_nursery() as nursery:
            await nursery.start(topic.run)
            channel = topic.channels["c"]
            client = FakeClient(1, ready=10)
            client.subscribe(channel)
            await trio.testing.wait_all_tasks_blocked()
            assert sorted(m.body for m in client.received) == [b"long", b"plain"]
            assert client.write_times == [3.0]
            assert channel.expired_count == 1
            topic.close()


async def test_an_own_ttl_in_a_channels_own_store_holds_after_a_restart(
    tmp_path: Path, autojump_clock: trio.abc.Clock
) -> None:
    """In flight at shutdown: the channel's own store has it, the log never had it."""
    with trio.fail_after(TIMEOUT):
        node = Node(tmp_path / "d", mem_queue_size=100)
        channel = node.topic.get_channel("c")
        client = FakeClient(1, ready=10)
        client.subscribe(channel)
        node.topic.publish([b"short", b"plain"], trio.current_time(),
                           exts=[MessageExt(ttl_ms=2000), None])  # fmt: skip
        node.topic._pump_batch(trio.current_time())
        assert len(client.received) == 2  # in flight, never FIN'd
        await sleep_until(1)
        topic = node.restart()
        assert not topic.message_ttls  # not in the log: read from memory, never written
        await sleep_until(3)
        async with trio.open_nursery() as nursery:
            await nursery.start(topic.run)
            channel = topic.channels["c"]
            client = FakeClient(2, ready=10)
            client.subscribe(channel)
            await trio.testing.wait_all_tasks_blocked()
            assert [m.body for m in client.received] == [b"plain"]
            assert channel.expired_count == 1
            topic.close()


async def test_an_own_ttl_in_a_channels_deferred_store_holds_after_a_restart(
    tmp_path: Path, autojump_clock: trio.abc.Clock
) -> None:
    with trio.fail_after(TIMEOUT):
        node = Node(tmp_path / "d", mem_queue_size=100)
        channel = node.topic.get_channel("c")
        client = FakeClient(1, ready=10)
        client.subscribe(channel)
        node.topic.publish([b"later", b"later-plain"], trio.current_time(), defer=1.0,
                           exts=[MessageExt(ttl_ms=2000), None])  # fmt: skip
        node.topic.publish([b"now"], trio.current_time())
        node.topic._pump_batch(trio.current_time())
        assert channel.deferred_count == 2
        [m] = client.received
        channel.finish(client.sub, m.id, trio.current_time())  # type: ignore[arg-type]
        await sleep_until(0.5)
        topic = node.restart()
        assert not topic.message_ttls  # the cursor passed them: never written to the log
        await sleep_until(3)  # due at 1, 3 s old at 3: past its own 2 s
        async with trio.open_nursery() as nursery:
            await nursery.start(topic.run)
            channel = topic.channels["c"]
            client = FakeClient(1, ready=10)
            client.subscribe(channel)
            await trio.testing.wait_all_tasks_blocked()
            assert [m.body for m in client.received] == [b"later-plain"]
            assert channel.expired_count == 1
            topic.close()


async def test_stored_messages_without_a_ttl_cost_no_screening(
    tmp_path: Path, autojump_clock: trio.abc.Clock
) -> None:
    node = Node(tmp_path / "d", mem_queue_size=100)
    channel = node.topic.get_channel("c")
    client = FakeClient(1, ready=1)
    client.subscribe(channel)
    node.topic.publish([b"a", b"b"], trio.current_time(),
                       exts=[MessageExt(priority=3, dedup_id=b"x"), None])  # fmt: skip
    node.topic._pump_batch(trio.current_time())
    topic = node.restart()  # one in the channel's own store, one in the log
    assert not topic.message_ttls
    assert not topic.channels["c"].retry.screening
    topic.close()

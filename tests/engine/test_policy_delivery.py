"""Channel policies at work: max attempts, dead letters, backoff and the topic's TTL.

Rules for this module:
- A real ``Topic`` (memory tail, or a ``TopicLog`` in ``tmp_path``) with fake subscribers, run on
  pytest-trio's ``autojump_clock``; every time asserted is an exact virtual time.
- Message timestamps and the TTL checks follow the virtual clock (``wall``: ``WALL0_NS`` + trio
  time, injected as the topic's wall clock), so "5 s old" means exactly that.
- The dead-letter topic is a recording sink (the broker's is exercised by the HTTP and interop
  tests); its failures are switched on by hand.
- Each test body runs under ``trio.fail_after``.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import trio
import trio.testing

from lmqd.engine.backend import BackendError, Syncable
from lmqd.engine.channel import Channel
from lmqd.engine.context import DeadLetterSource, NoEvents
from lmqd.engine.retry import DEAD_LETTER_RETRY_S, SCREEN_BUDGET, SCREEN_CHUNK
from lmqd.engine.topic import Topic
from lmqd.message import GuidFactory, Message
from lmqd.message_ext import MessageExt
from lmqd.options import Options
from lmqd.storage import AnchoredTimeBase, TopicLog

from .engine_fakes import FakeClient, engine

WALL0_NS = 1_750_000_000 * 10**9
TIMEOUT = 3600.0
"""Virtual seconds (the autojump clock): a test that hangs jumps there and fails at once."""


def wall() -> int:
    return WALL0_NS + round(trio.current_time() * 1e9)


class DeadLetters(NoEvents):
    """The engine's events with a dead-letter topic that records ``(time, topic, channel,
    copies, reason)``."""

    takes_dead_letters = True

    def __init__(self) -> None:
        self.got: list[tuple[float, str, str, list[Message], str]] = []
        self.failing = False

    def dead_letter(
        self, channel: DeadLetterSource, messages: Sequence[Message], reason: str
    ) -> Syncable | None:
        if self.failing:
            raise BackendError("disk full")
        copies = [Message(m.id, m.body, m.timestamp, m.attempts) for m in messages]
        self.got.append((trio.current_time(), channel.topic_name, channel.name, copies, reason))
        return None

    @property
    def messages(self) -> list[Message]:
        return [m for *_, batch, _ in self.got for m in batch]


class Client(FakeClient):
    """A ``FakeClient`` that also notes each delivery's body and attempts as sent (the message
    objects themselves change with later deliveries)."""

    def __init__(self, client_id: int, **kwargs: Any) -> None:
        super().__init__(client_id, **kwargs)
        self.seen: list[tuple[bytes, int]] = []

    def write_messages(self, messages: Sequence[Message]) -> None:
        self.seen += [(m.body, m.attempts) for m in messages]
        super().write_messages(messages)


def make_topic(
    path: Path | None = None, *, sink: DeadLetters | None = None, **options: Any
) -> Topic:
    log = (
        TopicLog("t", path, timebase=AnchoredTimeBase(0.0, WALL0_NS), max_bytes_per_file=4096)
        if path is not None
        else None
    )
    ctx = engine(
        Options.from_mapping(options),
        guid=GuidFactory(1),
        rng=random.Random(3),
        wall_clock=wall,
        events=sink if sink is not None else NoEvents(),
    )
    return Topic(ctx, "t", log=log)


async def settle() -> None:
    await trio.testing.wait_all_tasks_blocked()


async def req_everything(channel: Channel, client: FakeClient, rounds: int) -> None:
    """Answer every delivery with ``REQ 0`` (an unmodified consumer that fails everything)."""
    done = 0
    for _ in range(rounds):
        await settle()
        for batch in client.writes[done:]:
            for m in batch:
                assert client.sub is not None
                channel.requeue(client.sub, m.id, 0.0, trio.current_time())
        done = len(client.writes)
        await trio.sleep(0.001)


# -- max attempts -------------------------------------------------------------------------------


async def test_each_message_is_seen_max_attempts_times_then_dropped(
    autojump_clock: trio.abc.Clock,
) -> None:
    with trio.fail_after(TIMEOUT):
        topic = make_topic(max_attempts=3)
        async with trio.open_nursery() as nursery:
            await nursery.start(topic.run)
            channel = topic.get_channel("c")
            client = Client(1, ready=10)
            client.subscribe(channel)
            topic.publish([b"a", b"b"], trio.current_time())
            await req_everything(channel, client, 10)
            assert sorted(client.seen) == [
                (b"a", 1), (b"a", 2), (b"a", 3), (b"b", 1), (b"b", 2), (b"b", 3),
            ]  # fmt: skip
            assert channel.max_attempts_dropped_count == 2
            assert (channel.dead_letter_count, channel.expired_count) == (0, 0)
            stats = channel.statistics(trio.current_time())
            assert (stats.max_attempts_dropped_count, stats.depth, stats.in_flight_count) == (
                2, 0, 0,
            )
            assert topic.statistics(trio.current_time()).max_attempts_dropped_count == 2
            topic.close()


async def test_out_of_attempts_goes_to_the_dead_letter_topic_with_its_attempts(
    autojump_clock: trio.abc.Clock,
) -> None:
    with trio.fail_after(TIMEOUT):
        sink = DeadLetters()
        topic = make_topic(sink=sink, max_attempts=2, dead_letter_topic="t.dead")
        async with trio.open_nursery() as nursery:
            await nursery.start(topic.run)
            channel = topic.get_channel("c")
            client = Client(1, ready=10)
            client.subscribe(channel)
            [published] = topic.publish([b"body"], trio.current_time())
            await req_everything(channel, client, 5)
            assert client.seen == [(b"body", 1), (b"body", 2)]
            [(_, source_topic, source_channel, [dead], reason)] = sink.got
            assert (source_topic, source_channel, reason) == ("t", "c", "max_attempts")
            assert (dead.id, dead.body, dead.timestamp, dead.attempts) == (
                published.id, b"body", published.timestamp, 2,
            )
            assert (channel.dead_letter_count, channel.max_attempts_dropped_count) == (1, 0)
            topic.close()


async def test_timeouts_count_as_attempts_at_exact_times(autojump_clock: trio.abc.Clock) -> None:
    with trio.fail_after(TIMEOUT):
        sink = DeadLetters()
        topic = make_topic(sink=sink)
        async with trio.open_nursery() as nursery:
            await nursery.start(topic.run)
            channel = topic.get_channel("c")
            channel.set_policy({"max_attempts": 2, "dead_letter_topic": "t.dead"})
            client = Client(1, ready=1, msg_timeout=10.0)
            client.subscribe(channel)
            topic.publish([b"slow"], trio.current_time())
            await trio.sleep(100)
            assert client.write_times == [0.0, 10.0]
            [(when, _, _, [dead], reason)] = sink.got
            assert (when, reason, dead.attempts) == (20.0, "max_attempts", 2)
            assert channel.timeout_count == 2
            topic.close()


async def test_a_consumer_leaving_does_not_redeliver_a_message_out_of_attempts(
    autojump_clock: trio.abc.Clock,
) -> None:
    with trio.fail_after(TIMEOUT):
        topic = make_topic(max_attempts=1)
        async with trio.open_nursery() as nursery:
            await nursery.start(topic.run)
            channel = topic.get_channel("c")
            client = Client(1, ready=1)
            sub = client.subscribe(channel)
            topic.publish([b"x"], trio.current_time())
            await settle()
            assert len(client.received) == 1
            channel.remove_consumer(sub, trio.current_time())
            other = Client(2, ready=1)
            other.subscribe(channel)
            await settle()
            assert other.received == []
            assert channel.max_attempts_dropped_count == 1
            topic.close()


async def test_a_failing_dead_letter_topic_keeps_the_message_and_retries(
    autojump_clock: trio.abc.Clock,
) -> None:
    with trio.fail_after(TIMEOUT):
        sink = DeadLetters()
        sink.failing = True
        topic = make_topic(sink=sink, max_attempts=1, dead_letter_topic="t.dead")
        async with trio.open_nursery() as nursery:
            await nursery.start(topic.run)
            channel = topic.get_channel("c")
            client = Client(1, ready=1)
            client.subscribe(channel)
            topic.publish([b"x"], trio.current_time())
            await req_everything(channel, client, 1)
            assert channel.deferred_count == 1  # held, retried in DEAD_LETTER_RETRY_S
            assert channel.dead_letter_count == 0
            sink.failing = False
            await trio.sleep(DEAD_LETTER_RETRY_S)
            await settle()
            [(when, *_)] = sink.got
            assert when == DEAD_LETTER_RETRY_S  # failed at the REQ at t=0, retried once
            assert (channel.dead_letter_count, channel.deferred_count) == (1, 0)
            assert len(client.received) == 1
            topic.close()


# -- backoff ------------------------------------------------------------------------------------


async def test_backoff_doubles_up_to_its_cap_at_exact_times(
    autojump_clock: trio.abc.Clock,
) -> None:
    with trio.fail_after(TIMEOUT):
        topic = make_topic(backoff_ms=1000, backoff_max_ms=4000, max_attempts=5)
        async with trio.open_nursery() as nursery:
            await nursery.start(topic.run)
            channel = topic.get_channel("c")
            client = Client(1, ready=1)
            client.subscribe(channel)
            topic.publish([b"x"], trio.current_time())
            for k in range(1, 6):
                await client.wait_writes(k)
                [m] = client.writes[-1]
                channel.requeue(client.sub, m.id, 0.0, trio.current_time())  # type: ignore[arg-type]
            await trio.sleep(100)
            # Delays 1, 2, 4, then capped at 4; the fifth REQ is out of attempts.
            assert client.write_times == [0.0, 1.0, 3.0, 7.0, 11.0]
            assert channel.max_attempts_dropped_count == 1
            topic.close()


async def test_backoff_delays_grow_within_the_jitter(autojump_clock: trio.abc.Clock) -> None:
    with trio.fail_after(TIMEOUT):
        topic = make_topic(backoff_ms=1000, backoff_jitter=0.5)
        async with trio.open_nursery() as nursery:
            await nursery.start(topic.run)
            channel = topic.get_channel("c")
            client = Client(1, ready=1)
            client.subscribe(channel)
            topic.publish([b"x"], trio.current_time())
            for _ in range(6):
                await settle()
                [m] = client.writes[-1]
                channel.requeue(client.sub, m.id, 0.0, trio.current_time())  # type: ignore[arg-type]
                await client.wait_writes(len(client.writes) + 1)
            times = [t for t in client.write_times if t is not None]
            delays = [b - a for a, b in itertools.pairwise(times)]
            assert len(delays) == 6
            for attempt, delay in enumerate(delays, 1):
                base = 2 ** (attempt - 1)
                assert base * 0.5 <= delay <= base, (attempt, delay)
            assert len(set(delays)) == 6  # jittered: no two alike
            topic.close()


async def test_an_explicit_req_delay_is_honoured_and_timeouts_back_off(
    autojump_clock: trio.abc.Clock,
) -> None:
    with trio.fail_after(TIMEOUT):
        topic = make_topic(backoff_ms=1000)
        async with trio.open_nursery() as nursery:
            await nursery.start(topic.run)
            channel = topic.get_channel("c")
            client = Client(1, ready=1, msg_timeout=10.0)
            client.subscribe(channel)
            topic.publish([b"x"], trio.current_time())
            await settle()
            [m] = client.writes[0]
            channel.requeue(client.sub, m.id, 2.5, 0.0)  # type: ignore[arg-type]  # REQ <id> 2500
            await client.wait_writes(2)
            assert trio.current_time() == 2.5
            # Now let it time out twice: at 12.5 (+2 s backoff for attempt 2) and at 24.5 (+4 s).
            await client.wait_writes(4)
            assert client.write_times == [0.0, 2.5, 14.5, 28.5]
            topic.close()


# -- TTL ----------------------------------------------------------------------------------------


async def test_ttl_drops_what_was_not_delivered_in_time(autojump_clock: trio.abc.Clock) -> None:
    with trio.fail_after(TIMEOUT):
        topic = make_topic()
        topic.set_policy({"ttl_ms": 5000})
        async with trio.open_nursery() as nursery:
            await nursery.start(topic.run)
            channel = topic.get_channel("c")
            topic.publish([b"old"], trio.current_time())
            await trio.sleep(4)
            topic.publish([b"new"], trio.current_time())
            await trio.sleep(1)  # "old" is exactly 5 s old: not expired yet
            client = Client(1, ready=1)
            client.subscribe(channel)
            await settle()
            assert [m.body for m in client.received] == [b"old"]
            await trio.sleep(4.001)  # "new" is now 5.001 s old; "old" still in flight
            channel.finish(client.sub, client.received[0].id, trio.current_time())  # type: ignore[arg-type]
            other = topic.get_channel("d")  # a new channel reads from now on: nothing expired
            topic.publish([b"newest"], trio.current_time())
            await settle()
            assert [m.body for m in client.received] == [b"old", b"newest"]
            assert client.write_times == [5.0, 5.0 + 4.001]
            assert channel.expired_count == 1
            assert other.expired_count == 0
            assert topic.statistics(trio.current_time()).expired_count == 1
            topic.close()


async def test_ttl_dead_letters_to_the_channels_dead_letter_topic(
    autojump_clock: trio.abc.Clock,
) -> None:
    with trio.fail_after(TIMEOUT):
        sink = DeadLetters()
        topic = make_topic(sink=sink, ttl_ms=1000)  # the daemon's default TTL
        async with trio.open_nursery() as nursery:
            await nursery.start(topic.run)
            channel = topic.get_channel("c")
            channel.set_policy({"dead_letter_topic": "t.dead"})
            [published] = topic.publish([b"late"], trio.current_time())
            await trio.sleep(2)
            client = Client(1, ready=1)
            client.subscribe(channel)
            await settle()
            assert client.received == []
            [(when, _, _, [dead], reason)] = sink.got
            assert (when, reason, dead.id, dead.attempts) == (2.0, "expired", published.id, 0)
            assert (channel.expired_count, channel.dead_letter_count) == (1, 1)
            topic.close()


async def test_a_queue_full_of_expired_messages_does_not_hold_delivery_back(
    autojump_clock: trio.abc.Clock,
) -> None:
    with trio.fail_after(TIMEOUT):
        sink = DeadLetters()
        count = 2 * SCREEN_BUDGET + 100
        topic = make_topic(sink=sink, ttl_ms=5000, mem_queue_size=count + 10)
        async with trio.open_nursery() as nursery:
            await nursery.start(topic.run)
            channel = topic.get_channel("c")
            channel.set_policy({"dead_letter_topic": "t.dead"})
            topic.publish([b"old"] * count, trio.current_time())
            await trio.sleep(9)
            topic.publish([b"live"], trio.current_time())
            await trio.sleep(1)
            client = Client(1, ready=1)
            client.subscribe(channel)
            channel.deliver(trio.current_time())  # one round: bounded work
            # Chunks of SCREEN_CHUNK after the first take (of the room: 1) found one expired.
            assert channel.dead_letter_count == 1 + SCREEN_BUDGET // SCREEN_CHUNK * SCREEN_CHUNK
            assert len(sink.got) == 1 + SCREEN_BUDGET // SCREEN_CHUNK  # one publish per chunk
            assert client.received == []
            await settle()  # the channel's task goes on, round after round, at the same time
            assert [m.body for m in client.received] == [b"live"]
            assert client.write_times == [10.0]
            assert channel.dead_letter_count == channel.expired_count == count
            topic.close()


async def test_ttl_skips_an_expired_backlog_on_disk(
    tmp_path: Path, autojump_clock: trio.abc.Clock
) -> None:
    with trio.fail_after(TIMEOUT):
        topic = make_topic(tmp_path, mem_queue_size=0, ttl_ms=5000)
        async with trio.open_nursery() as nursery:
            await nursery.start(topic.run)
            channel = topic.get_channel("c")
            for _ in range(100):
                topic.publish([b"old-%d" % k for k in range(10)], trio.current_time())
            await trio.sleep(9)
            topic.publish([b"new-%d" % k for k in range(5)], trio.current_time())
            assert topic.log is not None
            assert topic.log.segment_count > 5  # the backlog spans many segments
            await trio.sleep(1)
            client = Client(1, ready=100)
            client.subscribe(channel)
            await settle()
            assert sorted(m.body for m in client.received) == [b"new-%d" % k for k in range(5)]
            assert client.write_times == [10.0]
            assert channel.expired_count == 1000
            topic.close()


async def test_ttl_dead_letters_an_expired_backlog_on_disk(
    tmp_path: Path, autojump_clock: trio.abc.Clock
) -> None:
    with trio.fail_after(TIMEOUT):
        sink = DeadLetters()
        topic = make_topic(tmp_path, sink=sink, mem_queue_size=0, ttl_ms=5000)
        async with trio.open_nursery() as nursery:
            await nursery.start(topic.run)
            channel = topic.get_channel("c")
            channel.set_policy({"dead_letter_topic": "t.dead"})
            old = topic.publish([b"old-%d" % k for k in range(300)], trio.current_time())
            await trio.sleep(9)
            topic.publish([b"new-%d" % k for k in range(3)], trio.current_time())
            await trio.sleep(1)
            client = Client(1, ready=50)
            client.subscribe(channel)
            await settle()
            # Read from the log (not skipped: each is published to the dead-letter topic).
            assert sorted(m.body for m in client.received) == [b"new-0", b"new-1", b"new-2"]
            assert client.write_times == [10.0]
            assert {m.id for m in sink.messages} == {m.id for m in old}
            assert {reason for *_, reason in sink.got} == {"expired"}
            assert channel.expired_count == channel.dead_letter_count == 300
            topic.close()


async def test_ttl_holds_across_a_restart(tmp_path: Path, autojump_clock: trio.abc.Clock) -> None:
    with trio.fail_after(TIMEOUT):
        topic = make_topic(tmp_path, ttl_ms=5000)
        async with trio.open_nursery() as nursery:
            await nursery.start(topic.run)
            topic.get_channel("c")
            topic.publish([b"old-1", b"old-2", b"old-3"], trio.current_time())
            await trio.sleep(8)
            topic.publish([b"new-1", b"new-2"], trio.current_time())
            topic.close()  # the memory tail goes to the log, the cursor is saved
        again = make_topic(tmp_path, ttl_ms=5000)
        async with trio.open_nursery() as nursery:
            await nursery.start(again.run)
            channel = again.get_channel("c")
            await trio.sleep(1)  # t=9: the first three are 9 s old, the others 1 s
            client = Client(1, ready=10)
            client.subscribe(channel)
            await settle()
            assert sorted(m.body for m in client.received) == [b"new-1", b"new-2"]
            assert channel.expired_count == 3
            again.close()


# -- a message's own TTL (lmq's extension) --------------------------------------------------------


async def test_a_messages_own_ttl_and_the_topics_the_shorter_wins(
    autojump_clock: trio.abc.Clock,
) -> None:
    with trio.fail_after(TIMEOUT):
        topic = make_topic()
        topic.set_policy({"ttl_ms": 10_000})
        async with trio.open_nursery() as nursery:
            await nursery.start(topic.run)
            channel = topic.get_channel("c")
            now = trio.current_time()
            topic.publish([b"plain"], now)  # the topic's 10 s
            topic.publish([b"short", b"long"], now,
                          exts=[MessageExt(ttl_ms=2000), MessageExt(ttl_ms=60_000)])  # fmt: skip
            await trio.sleep(3)  # "short" is 3 s old: past its own 2 s
            client = Client(1, ready=10)
            client.subscribe(channel)
            await settle()
            assert sorted(m.body for m in client.received) == [b"long", b"plain"]
            assert channel.expired_count == 1
            for m in list(client.received):
                channel.finish(client.sub, m.id, trio.current_time())  # type: ignore[arg-type]
            topic.publish([b"long2"], trio.current_time(), exts=[MessageExt(ttl_ms=60_000)])
            client.ready_count = 0
            await trio.sleep(11)  # past the topic's 10 s: the shorter wins over the 60 s
            client.ready_count = 10
            channel.consumer_ready()
            await settle()
            assert sorted(m.body for m in client.received) == [b"long", b"plain"]
            assert channel.expired_count == 2
            topic.close()


async def test_without_message_ttls_nothing_is_screened(autojump_clock: trio.abc.Clock) -> None:
    topic = make_topic()
    channel = topic.get_channel("c")
    assert not channel.retry.screening
    topic.publish([b"x"], trio.current_time(), exts=[MessageExt(priority=3)])
    assert not channel.retry.screening  # a priority is no TTL
    topic.publish([b"y"], trio.current_time(), exts=[MessageExt(ttl_ms=1)])
    assert channel.retry.screening and topic.get_channel("d").retry.screening
    topic.close()

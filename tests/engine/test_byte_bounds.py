"""Delivery rounds bounded in bytes: a consumer gets no more than its byte room plus one message.

Rules for this module (STYLE.md): the channel (or its topic) through its public interface with
``FakeClient``s that model an output buffer (``output_limit``; ``drain`` empties it); timer
tests on the ``autojump_clock`` with exact virtual times; restarts through the daemon's own
restore path on tmpfs (``engine_restart.Engine``, plain-def entry points). Bodies share one
``bytes`` object per size, so big messages cost no memory here.
"""

from __future__ import annotations

import random

import pytest
import trio
import trio.testing

from lmqd.engine.backend import MemoryBackend
from lmqd.engine.bytemarks import MARK_EVERY, ByteMarks
from lmqd.engine.channel import Channel
from lmqd.engine.topic import Topic
from lmqd.message import Message
from lmqd.message_ext import MessageExt
from lmqd.options import Options
from lmqd.units import KiB

from ..storage.storage_helpers import memory_dir
from .engine_fakes import FakeClient, engine, lone_channel
from .engine_restart import NOW, Engine

BIG = 64 * KiB
ROOM = 4 * BIG  # the fake's output limit: four big messages


def make_channel(**options: object) -> Channel:
    return lone_channel(Options.from_mapping(options), rng=random.Random(7))


def big_messages(count: int, size: int = BIG) -> list[Message]:
    body = b"b" * size
    return [Message(b"%016x" % i, body, 0) for i in range(count)]


def ids(messages: list[Message]) -> list[bytes]:
    return [m.id for m in messages]


def test_a_stuck_consumer_with_a_big_rdy_holds_only_its_byte_room() -> None:
    ch = make_channel()
    client = FakeClient(1, ready=300, output_limit=ROOM)
    client.subscribe(ch)
    messages = big_messages(300)
    ch.put_many(messages, 0.0)
    ch.deliver(0.0)
    # Bodies before each message below the room: 0, 1, 2 and 3 x BIG; the fifth would start at
    # the room. Messages not sent are not in flight: they stay in the channel, in order.
    assert [ids(w) for w in client.writes] == [ids(messages[:4])]
    assert client.in_flight_count == 4 and ch.in_flight_count == 4
    assert ch.in_flight.ref_bytes == 4 * BIG  # what the in-flight heap counts for compaction
    assert ch.depth == 296
    ch.deliver(0.0)  # no room: nothing more, however big its RDY window
    assert len(client.writes) == 1
    client.drain()
    ch.deliver(0.0)
    assert ids(client.writes[1]) == ids(messages[4:8])
    assert [m.attempts for m in client.writes[1]] == [1, 1, 1, 1]
    assert client.in_flight_count == 8 and ch.depth == 292


def test_small_messages_fill_the_rdy_window_in_one_write() -> None:
    ch = make_channel()
    client = FakeClient(1, ready=300, output_limit=ROOM)
    client.subscribe(ch)
    ch.put_many(big_messages(500, size=100), 0.0)
    ch.deliver(0.0)
    assert [len(w) for w in client.writes] == [300]  # 30 kB: far below the room
    assert ch.in_flight.ref_bytes == 300 * 100


def test_what_one_consumer_has_no_room_for_goes_to_the_others_in_the_same_round() -> None:
    ch = make_channel()
    small = FakeClient(1, ready=100, output_limit=ROOM)
    roomy = FakeClient(2, ready=100)
    small.subscribe(ch)
    roomy.subscribe(ch)
    messages = big_messages(20)
    ch.put_many(messages, 0.0)
    ch.deliver(0.0)
    assert small.in_flight_count == 4
    assert roomy.in_flight_count == 16
    assert ch.depth == 0
    delivered = [m for w in small.writes + roomy.writes for m in w]
    assert sorted(ids(delivered)) == ids(messages)  # each exactly once


def test_a_message_bigger_than_the_room_is_still_delivered_alone() -> None:
    ch = make_channel()
    client = FakeClient(1, ready=10, output_limit=BIG // 2)
    client.subscribe(ch)
    ch.put_many(big_messages(3), 0.0)
    ch.deliver(0.0)
    assert [len(w) for w in client.writes] == [1]
    assert ch.depth == 2


async def test_timeouts_of_capped_deliveries_requeue_and_wait_for_room(
    autojump_clock: trio.abc.Clock,
) -> None:
    ch = make_channel()
    client = FakeClient(1, ready=300, msg_timeout=2.0, output_limit=ROOM)
    client.subscribe(ch)
    messages = big_messages(10)
    async with trio.open_nursery() as nursery:
        await nursery.start(ch.run)
        ch.put_many(messages, 0.0)
        ch.deliver(0.0)
        assert client.in_flight_count == 4
        # The four time out at exactly 2 s (the msg timeout) and go back to the queue; the
        # consumer's output is still full, so nothing is delivered again.
        await trio.sleep(1.9)
        assert ch.timeout_count == 0
        await trio.sleep(0.1)
        await trio.testing.wait_all_tasks_blocked()
        assert trio.current_time() == 2.0
        assert ch.timeout_count == 4
        assert client.in_flight_count == 0 and ch.in_flight_count == 0
        assert ch.depth == 10
        assert len(client.writes) == 1
        # Its writer drained at 3 s: the next round (at once) sends four more, from the head.
        await trio.sleep(1.0)
        client.drain()
        ch.consumer_ready()
        await client.wait_writes(2)
        assert trio.current_time() == 3.0
        assert ids(client.writes[1]) == ids(messages[4:8])
        assert client.in_flight_count == 4
        ch.close()


# -- rounds that skip summing their bodies ------------------------------------------------------
# A round sums its bodies only when it may come near a room: what it read from its cursor is
# bounded by the topic stream's byte marks (``lmqd.engine.bytemarks``), the rest is summed. These
# tests fail if a way in is taken for small when it is not (an earlier run's messages, a
# channel's own stores, pushed ones): the round would pass the room.


def test_big_messages_after_small_ones_are_held_to_the_room() -> None:
    ch = make_channel()
    client = FakeClient(1, ready=300, output_limit=ROOM)
    client.subscribe(ch)
    ch.put_many(big_messages(100, size=100), 0.0)
    ch.deliver(0.0)
    assert [len(w) for w in client.writes] == [100]
    client.drain()
    big = big_messages(10)
    for m in big:
        m.id = b"big" + m.id[3:]
    ch.put_many(big, 0.0)
    ch.deliver(0.0)
    assert [len(w) for w in client.writes] == [100, 4]
    assert ids(client.writes[1]) == ids(big[:4])


def test_a_requeued_big_message_is_still_held_to_the_room() -> None:
    ch = make_channel()
    client = FakeClient(1, ready=300, output_limit=ROOM)
    sub = client.subscribe(ch)
    messages = big_messages(8)
    ch.put_many(messages, 0.0)
    ch.deliver(0.0)
    assert client.in_flight_count == 4
    for m in client.writes[0]:
        ch.requeue(sub, m.id, 0.0, 0.0)
    client.drain()
    ch.deliver(0.0)
    assert [len(w) for w in client.writes] == [4, 4]
    assert {m.attempts for m in client.writes[1]} <= {1, 2}


def test_big_messages_an_earlier_run_left_in_the_channels_store_are_held_to_the_room() -> None:
    stored = MemoryBackend()  # what a restart finds in the channel's own store
    stored.put_many(big_messages(10))
    # This run's --max-msg-size is below what the earlier run stored: only the bodies read
    # tell how big they are.
    options = Options(max_msg_size=1 * KiB)
    ch = lone_channel(options, backend=stored, rng=random.Random(7))
    client = FakeClient(1, ready=300, output_limit=ROOM)
    client.subscribe(ch)
    ch.deliver(0.0)
    assert [len(w) for w in client.writes] == [4]
    assert ch.depth == 6


def test_a_topics_big_messages_reach_a_consumer_within_its_room() -> None:
    topic = Topic(engine(), "t")
    channel = topic.get_channel("c")
    client = FakeClient(1, ready=300, output_limit=ROOM)
    client.subscribe(channel)
    topic.publish([b"s" * 100] * 50, 0.0)
    topic._pump_batch(0.0)
    assert [len(w) for w in client.writes] == [50]
    client.drain()
    topic.publish([b"b" * BIG] * 10, 0.0)  # read by the channel's cursor from the stream
    topic._pump_batch(0.0)
    assert [len(w) for w in client.writes] == [50, 4]
    topic.close()


def test_big_messages_with_a_priority_are_held_to_the_room() -> None:
    topic = Topic(engine(), "t")
    channel = topic.get_channel("c")
    client = FakeClient(1, ready=300, output_limit=ROOM)
    client.subscribe(channel)
    topic.publish([b"s" * 100] * 50, 0.0)
    topic._pump_batch(0.0)
    client.drain()
    # Pushed by the pump into the channel's priority lanes, never read by its cursor.
    topic.publish([b"b" * BIG] * 10, 0.0, exts=[MessageExt(priority=3)] * 10)
    topic._pump_batch(0.0)
    assert [len(w) for w in client.writes] == [50, 4]
    topic.close()


MODES = pytest.mark.parametrize("durable", [False, True], ids=["default", "durable"])


def restarted_with_a_lower_max_msg_size(engine: Engine) -> FakeClient:
    """Restart ``engine`` with ``--max-msg-size`` far below the 1 KiB bodies it holds (so the
    first round takes all it can), and make channel ``c``'s consumer ready with room for four
    of them."""
    engine.sync()
    engine.max_msg_size = 10
    engine.restart()
    client = engine.clients["c"]
    client.output_limit = 4 * KiB
    client.ready_count = 300
    return client


@MODES
def test_an_earlier_runs_big_messages_in_the_topic_log_are_held_to_the_room(
    durable: bool,
) -> None:
    with memory_dir() as base:
        engine = Engine(base, durable=durable)
        try:
            engine.subscribe(engine.topic, "c")
            engine.topic.publish([b"b" * KiB] * 100, NOW)  # more than MARK_EVERY
            engine.pump()  # handed to "c", which has not read them (RDY 0)
            client = restarted_with_a_lower_max_msg_size(engine)
            engine.topic.channels["c"].deliver(NOW)
            # Read from the log below what this run took: summed, so cut to the room.
            assert [len(w) for w in client.writes] == [4]
        finally:
            engine.close()


@MODES
def test_an_earlier_runs_requeued_big_messages_are_held_to_the_room(durable: bool) -> None:
    with memory_dir() as base:
        engine = Engine(base, durable=durable)
        try:
            engine.subscribe(engine.topic, "c", ready=300)
            engine.topic.publish([b"b" * KiB] * 10, NOW)
            engine.pump()
            channel = engine.topic.channels["c"]
            sub = engine.clients["c"].sub
            assert sub is not None
            for m in engine.clients["c"].received:
                channel.requeue(sub, m.id, 0.0, NOW)  # into the channel's own store, on disk
            client = restarted_with_a_lower_max_msg_size(engine)
            channel = engine.topic.channels["c"]
            engine.pump()
            channel.deliver(NOW)
            assert [len(w) for w in client.writes] == [4]
        finally:
            engine.close()


@MODES
def test_an_earlier_runs_big_messages_with_a_priority_are_held_to_the_room(
    durable: bool,
) -> None:
    with memory_dir() as base:
        engine = Engine(base, durable=durable)
        try:
            engine.subscribe(engine.topic, "c")
            engine.topic.publish([b"b" * KiB] * 10, NOW, exts=[MessageExt(priority=2)] * 10)
            engine.pump()  # pushed into "c"'s lanes (their stores, with --mem-queue-size 0)
            client = restarted_with_a_lower_max_msg_size(engine)
            engine.pump()
            engine.topic.channels["c"].deliver(NOW)
            assert [len(w) for w in client.writes] == [4]
        finally:
            engine.close()


def test_an_earlier_runs_deferred_big_messages_are_held_to_the_room() -> None:
    with memory_dir() as base:
        engine = Engine(base, durable=True)
        try:
            engine.subscribe(engine.topic, "c")
            engine.topic.publish([b"b" * KiB] * 10, NOW, defer=5.0)
            engine.pump()  # pushed into "c"'s deferred store
            client = restarted_with_a_lower_max_msg_size(engine)
            engine.pump()
            channel = engine.topic.channels["c"]
            channel.process_due(NOW + 5.0)
            channel.deliver(NOW + 5.0)
            assert [len(w) for w in client.writes] == [4]
        finally:
            engine.close()


def test_a_round_bounded_by_the_marks_gives_the_in_flight_heap_an_upper_bound() -> None:
    topic = Topic(engine(), "t")
    channel = topic.get_channel("c")
    client = FakeClient(1, ready=100)
    client.subscribe(channel)
    sizes = [100 + (i % 7) * 10 for i in range(300)]
    for start in range(0, 300, 10):  # MPUBs of 10
        topic.publish([b"m" * n for n in sizes[start : start + 10]], 0.0)
    topic._pump_batch(0.0)
    assert [len(w) for w in client.writes] == [100]
    # Never below the bodies' bytes (the heap must not rebuild late), above by what lies
    # between the round's end and the next mark at most.
    assert sum(sizes[:100]) <= channel.in_flight.ref_bytes <= sum(sizes[: 100 + 2 * MARK_EVERY])
    topic.close()


def test_a_round_is_cut_to_the_room_between_marks() -> None:
    # 100 messages of 100 bytes: the marks bound a read of them by at most two stretches of
    # MARK_EVERY; a room just above their bytes is not enough to skip the sum, and the exact
    # sum then lets them all through.
    topic = Topic(engine(), "t")
    channel = topic.get_channel("c")
    client = FakeClient(1, ready=1000, output_limit=100 * 100 + 1)
    client.subscribe(channel)
    for _ in range(10):
        topic.publish([b"s" * 100] * 10, 0.0)
    topic._pump_batch(0.0)
    assert [len(w) for w in client.writes] == [100]
    client.drain()
    client.output_limit = 250
    topic.publish([b"s" * 100] * 10, 0.0)
    topic._pump_batch(0.0)
    assert [len(w) for w in client.writes] == [100, 3]  # 0, 100, 200 below 250
    topic.close()


def test_byte_marks_bound_any_range_from_above() -> None:
    marks = ByteMarks(10)
    sizes: dict[int, int] = {}
    offset = 10
    rng = random.Random(3)
    for _ in range(200):
        batch = [rng.randrange(1, 500) for _ in range(rng.choice([1, 1, 5, 100]))]
        for size in batch:
            sizes[offset] = size
            offset += 1
        marks.note(offset, sum(batch))
    assert len(marks) < offset // MARK_EVERY + 2  # a mark per MARK_EVERY offsets, at most
    for _ in range(500):
        start = rng.randrange(10, offset)
        end = rng.randrange(start, offset + 1)
        exact = sum(sizes[o] for o in range(start, end))
        bound = marks.bound(start, marks.bytes_before(start), end)
        if end - start < MARK_EVERY:
            assert bound is None  # cheaper summed than bounded loosely
        else:
            assert bound is not None and exact <= bound
    # From the first mark to the end: exact.
    assert marks.bound(10, marks.bytes_before(10), offset) == sum(sizes.values())
    assert marks.bytes_before(9) is None  # before this run: unknown
    before = marks.bytes_before(4000)
    marks.forget_below(5000)  # what a read to 5000 may do: the bound asked before still holds
    bound = marks.bound(4000, before, 5000)
    assert bound is not None and bound >= sum(sizes[o] for o in range(4000, 5000))
    assert marks.bytes_before(4000) is None  # its marks were dropped: unknown

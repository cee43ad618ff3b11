"""Delivery rounds bounded in bytes: a consumer gets no more than its byte room plus one message.

Rules for this module (STYLE.md): the channel through its public interface with ``FakeClient``s
that model an output buffer (``output_limit``; ``drain`` empties it); timer tests on the
``autojump_clock`` with exact virtual times. Bodies share one ``bytes`` object per size, so big
messages cost no memory here.
"""

from __future__ import annotations

import random

import trio
import trio.testing

from lmqd.engine.backend import MemoryBackend
from lmqd.engine.channel import Channel
from lmqd.message import Message
from lmqd.options import Options
from lmqd.units import KiB

from .engine_fakes import FakeClient

BIG = 64 * KiB
ROOM = 4 * BIG  # the fake's output limit: four big messages


def make_channel(**options: object) -> Channel:
    return Channel(
        "t", "c", Options.from_mapping(options), backend=MemoryBackend(), rng=random.Random(7)
    )


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

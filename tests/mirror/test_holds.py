"""A mirror's hold on a primary's topic stream (``lmqd.engine.holds``) and a mirror's copy
(``lmqd.engine.replica``): the engine's side, without a network.

Rules for this module:
- ``Topic`` with a real ``TopicLog`` in ``tmp_path`` and ``FakeClient`` consumers; the tests run
  the topic in a nursery of their own (its pump and the channel's timer) on the autojump clock.
- What a mirror would fetch is what ``TopicStream.read_entries`` returns: the test reads it as
  ``/mirror/fetch`` does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from lmqd.engine.holds import (
    MirrorHold,
    forget_offsets,
    note_offsets,
    restored_holds,
    unfinished_offsets,
)
from lmqd.engine.replica import (
    PlainRun,
    advance_copy,
    follow_channel,
    promote_topic,
    restore_unfinished,
    store_copies,
)
from lmqd.engine.topic import Topic
from lmqd.message import Message
from lmqd.options import Options
from lmqd.storage import AnchoredTimeBase, TopicLog
from tests.engine.engine_fakes import FakeClient, engine

TIMEBASE = AnchoredTimeBase(0.0, 1_750_000_000 * 10**9)


def make_topic(path: Path, name: str = "t", **options: Any) -> Topic:
    log = TopicLog(name, path, timebase=TIMEBASE)
    return Topic(engine(Options.from_mapping(options)), name, log=log)


async def consume(topic: Topic, client: FakeClient, count: int) -> list[Message]:
    """Wait for ``count`` deliveries to ``client`` in all and FIN them."""
    while len(client.received) < count:
        await client.wait_writes(len(client.writes) + 1)
    channel = topic.channels["c"]
    assert client.sub is not None
    channel.finish_many(client.sub, [m.id for m in client.received], trio.current_time())
    return client.received


@pytest.mark.parametrize("held", [True, False], ids=["held", "not held"])
async def test_a_hold_keeps_what_the_channels_read_from_memory(tmp_path: Path, held: bool) -> None:
    topic = make_topic(tmp_path, mem_queue_size=1000)
    hold = MirrorHold(topic.stream, "m1") if held else None
    client = FakeClient(1, ready=100)
    async with trio.open_nursery() as nursery:
        topic.attach(nursery)
        client.subscribe(topic.get_channel("c"))
        topic.publish([b"a%d" % i for i in range(10)], trio.current_time())
        received = await consume(topic, client, 10)
        entries, following = topic.stream.read_entries(0, 100)
        if hold is None:
            # Nobody asks: no loop sets the offsets, and memory forgets what every channel read.
            assert [m.offset for m in received] == [-1] * 10
            assert entries == []
        else:
            # Read from memory, they know their offsets (a mirror is told what is unfinished so).
            assert [m.offset for m in received] == list(range(10))
            assert [(o, m.body) for o, m in entries] == [(i, b"a%d" % i) for i in range(10)]
            assert following == 10
            hold.acknowledge(6)
            assert topic.stream.tail.start == 6  # the mirror has 0..5: memory forgets them
            hold.acknowledge(10)
            assert len(topic.stream.tail) == 0
        topic.close()
        nursery.cancel_scope.cancel()


def test_release_past_the_limit_and_empty(tmp_path: Path) -> None:
    topic = make_topic(tmp_path, mem_queue_size=1000)
    topic.publish([b"x"] * 50, 0.0)
    hold = MirrorHold(topic.stream, "m1", at=0)
    assert hold.lag == 50
    assert hold.release(0) == 0  # no bound
    assert hold.release(30) == 20
    assert (hold.position, hold.released, hold.lag) == (20, 20, 30)
    assert hold.release(30) == 0
    # Topic empty: the hold keeps what it has not copied for the mirror (the primary's
    # channels step over it, and the mirror's, following them, too).
    topic.empty()
    entries, _ = topic.stream.read_entries(0, 100)
    assert [o for o, _ in entries] == list(range(20, 50))
    assert hold.position == 20


def test_holds_survive_a_restart_with_their_position(tmp_path: Path) -> None:
    topic = make_topic(tmp_path, mem_queue_size=0)
    topic.publish([b"x"] * 20, 0.0)
    hold = MirrorHold(topic.stream, "mirror-a", at=0)
    hold.acknowledge(12)
    topic.close()
    again = make_topic(tmp_path, mem_queue_size=0)
    assert restored_holds(again.stream) == ["mirror-a"]
    restored = MirrorHold(again.stream, "mirror-a")
    assert (restored.position, restored.since) == (12, 12)
    assert again.stored_channel_names() == []  # a hold is not a channel
    restored.delete()
    assert restored_holds(again.stream) == []


def test_a_new_hold_vouches_from_the_memory_tail_on(tmp_path: Path) -> None:
    topic = make_topic(tmp_path, mem_queue_size=1000)
    topic.publish([b"x"] * 10, 0.0)
    topic.stream.tail.drop_front(4)  # read by every channel before the mirror came
    hold = MirrorHold(topic.stream, "m1")
    assert (hold.position, hold.since) == (4, 4)


def test_unfinished_offsets() -> None:
    known = Message(b"a" * 16, b"", 0, offset=7)
    stored = Message(b"b" * 16, b"", 0)
    assert unfinished_offsets([known, stored, Message(b"c" * 16, b"", 0, offset=3)]) == (
        [3, 7], [b"b" * 16],
    )
    # Noted offsets: what the channel keeps in its stores (on disk, or read back without one).
    notes = {b"b" * 16: 5, b"d" * 16: 9}
    assert unfinished_offsets([known, stored], notes) == ([5, 7, 9], [])


def test_offsets_noted_only_while_held_and_forgotten_when_done(tmp_path: Path) -> None:
    topic = make_topic(tmp_path)
    messages = [Message(b"%016d" % i, b"x", 0, offset=i) for i in range(3)]
    notes: dict[bytes, int] = {}
    note_offsets(notes, topic.stream, messages)
    assert notes == {}  # no mirror: nothing kept
    MirrorHold(topic.stream, "m1")
    note_offsets(notes, topic.stream, [*messages, Message(b"u" * 16, b"", 0)])
    assert notes == {m.id: m.offset for m in messages}
    forget_offsets(notes, messages[:2])
    assert notes == {messages[2].id: 2}


# -- the mirror's side -------------------------------------------------------------------------


def test_copies_are_stored_at_their_offsets_gaps_kept(tmp_path: Path) -> None:
    topic = make_topic(tmp_path)
    topic.following = True
    copies: list[Any] = [(0, Message(b"0" * 16, b"a", 1)), (1, Message(b"1" * 16, b"b", 2)),
                         (5, Message(b"5" * 16, b"c", 3, deliver_at=30.0))]  # fmt: skip
    assert store_copies(topic, copies) == 3
    assert store_copies(topic, copies) == 0  # stored already: never twice
    assert store_copies(topic, [PlainRun(4, [b"4" * 16, b"5" * 16, b"6" * 16],
                                         [b"d", b"e", b"f"], 4)]) == 1  # only 6 is new
    advance_copy(topic, 9)
    stream = topic.stream
    assert stream.next_offset == 9
    entries, _ = stream.read_entries(0, 100)
    key = [(o, m.id, m.timestamp) for o, m in copies] + [(6, b"6" * 16, 4)]
    assert [(o, m.id, m.timestamp) for o, m in entries] == key
    assert entries[2][1].deliver_at == pytest.approx(30.0)
    assert entries[3][1].body == b"f"
    assert stream.pushed == [5]
    topic.close()
    again = make_topic(tmp_path)
    assert again.stream.next_offset == 9


async def test_a_promoted_copy_delivers_what_the_primary_had_not_finished(tmp_path: Path) -> None:
    topic = make_topic(tmp_path)
    topic.following = True
    store_copies(topic, [(k, Message(b"%016d" % k, b"m%d" % k, k)) for k in range(10)])
    channel = topic.get_channel("c")
    # The primary's channel read up to 8 and holds 2 and 5 unfinished; 8 and 9 it never read.
    follow_channel(channel, 8, ())
    assert channel.depth == 0  # the copy's pump has not handed anything on: pumped is 0
    topic.stream.pumped = 10
    assert channel.depth == 2
    client = FakeClient(1, ready=100)
    async with trio.open_nursery() as nursery:
        topic.attach(nursery)
        client.subscribe(channel)
        assert restore_unfinished(channel, [2, 5], trio.current_time()) == 2
        promote_topic(topic)
        received = await consume(topic, client, 4)
        assert sorted(m.body for m in received) == [b"m2", b"m5", b"m8", b"m9"]
        topic.close()
        nursery.cancel_scope.cancel()

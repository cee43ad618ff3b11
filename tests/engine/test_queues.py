"""InFlightQueue and DeferredQueue on their own: ordering, lazy deletion, compaction.

Pure data structures: synchronous tests, times passed in as plain floats.
"""

from __future__ import annotations

import math
import random

import pytest

from lmqd.engine.deferred import DeferredQueue
from lmqd.engine.inflight import (
    COMPACT_FLOOR,
    COMPACT_FLOOR_BYTES,
    COMPACT_RATIO,
    InFlightQueue,
    NotInFlight,
    NotOwner,
)
from lmqd.message import Message

from .engine_fakes import make_messages


def _in_flight(messages: list[Message], deadlines: list[float]) -> InFlightQueue:
    q = InFlightQueue()
    for m, d in zip(messages, deadlines, strict=True):
        m.deadline = d
        q.push_many((m,), m.deadline)
    return q


def test_inflight_pop_due_in_deadline_order() -> None:
    msgs = make_messages(4)
    q = _in_flight(msgs, [30.0, 10.0, 20.0, 40.0])
    assert len(q) == 4
    assert q.next_deadline() == 10.0
    assert q.pop_due(9.999) == []
    assert q.pop_due(20.0) == [msgs[1], msgs[2]]
    assert len(q) == 2
    assert msgs[1].id not in q
    assert q.next_deadline() == 30.0


def test_inflight_removed_entries_are_skipped() -> None:
    msgs = make_messages(3)
    q = _in_flight(msgs, [1.0, 2.0, 3.0])
    assert q.remove(msgs[0].id) is msgs[0]
    assert q.get(msgs[0].id) is None
    # The stale head entry no longer decides the next wakeup.
    assert q.next_deadline() == 2.0
    assert q.pop_due(10.0) == [msgs[1], msgs[2]]
    assert q.next_deadline() == math.inf


def test_inflight_set_deadline_makes_old_entry_stale() -> None:
    msgs = make_messages(2)
    q = _in_flight(msgs, [5.0, 6.0])
    q.set_deadline(msgs[0], 50.0)
    assert msgs[0].deadline == 50.0
    assert q.next_deadline() == 6.0
    assert q.pop_due(49.0) == [msgs[1]]
    assert q.pop_due(50.0) == [msgs[0]]
    assert len(q) == 0


def test_inflight_same_message_pushed_twice_comes_out_once() -> None:
    # REQ 0 and redelivery in the same instant leave two identical heap entries.
    [m] = make_messages(1)
    q = _in_flight([m], [7.0])
    q.remove(m.id)
    q.push_many((m,), m.deadline)
    assert q.pop_due(7.0) == [m]
    assert q.pop_due(100.0) == []


def test_inflight_compaction_keeps_heap_bounded_under_fin_churn() -> None:
    q = InFlightQueue()
    live: list[Message] = []
    peak = 0
    peak_entries = 0
    rng = random.Random(7)
    # Keep ~100 messages in flight while 20 000 are delivered and finished (out of order).
    for i in range(20_000):
        [m] = make_messages(1, start=i)
        m.deadline = 60.0 + i * 0.001
        q.push_many((m,), m.deadline)
        live.append(m)
        if len(live) > 100:
            victim = live.pop(rng.randrange(len(live)))
            q.remove(victim.id)
        peak = max(peak, q.ref_count)
        peak_entries = max(peak_entries, q.heap_size)
    assert len(q) == 100
    # Without compaction the heap would reference all 20 000 messages.
    assert peak <= COMPACT_RATIO * 101 + COMPACT_FLOOR + 1
    assert peak_entries <= peak
    assert sorted(m.id for m in q.pop_due(math.inf)) == sorted(m.id for m in live)


def test_finished_big_messages_are_not_kept_alive_past_the_byte_floor() -> None:
    # 300 messages of 1 MiB (one shared body: only lengths count here), each finished right
    # after delivery, one in flight at a time: fewer than the count floor, so only the byte
    # rule lets the heap drop the finished ones before their 60 s deadline.
    q = InFlightQueue()
    body = b"x" * (1024 * 1024)
    peak = 0
    for i in range(300):
        m = Message(b"%016d" % i, body, 0)
        q.start_many([m], 1, 0.0, 60.0 + i)
        peak = max(peak, q.ref_bytes)
        q.remove(m.id)
    assert COMPACT_FLOOR > 300  # the count rule alone would keep all 300 (300 MiB)
    assert peak <= COMPACT_RATIO * len(body) + COMPACT_FLOOR_BYTES + len(body)
    assert q.ref_bytes <= COMPACT_RATIO * len(body) + COMPACT_FLOOR_BYTES  # 19 MiB, not 300
    assert q.pop_due(math.inf) == []


def test_inflight_touch_churn_is_bounded_too() -> None:
    [m] = make_messages(1)
    q = _in_flight([m], [1.0])
    for i in range(10_000):
        q.set_deadline(m, 2.0 + i)
        assert q.ref_count <= COMPACT_RATIO * 1 + COMPACT_FLOOR + 1
    assert q.next_deadline() == 2.0 + 9_999


def test_inflight_clear_returns_delivery_order() -> None:
    msgs = make_messages(3)
    q = _in_flight(msgs, [3.0, 1.0, 2.0])
    assert q.clear() == msgs
    assert len(q) == 0
    assert q.heap_size == 0
    assert q.next_deadline() == math.inf


def test_deferred_due_order_with_ties_in_insertion_order() -> None:
    q = DeferredQueue()
    msgs = make_messages(5)
    for m, at in zip(msgs, [3.0, 1.0, 3.0, 2.0, 1.0], strict=True):
        m.deliver_at = at
        q.push(m)
    assert len(q) == 5
    assert q.next_deadline() == 1.0
    assert q.pop_due(0.5) == []
    assert q.pop_due(2.0) == [msgs[1], msgs[4], msgs[3]]
    assert q.next_deadline() == 3.0
    assert q.clear() == [msgs[0], msgs[2]]
    assert len(q) == 0
    assert q.next_deadline() == math.inf


def test_inflight_batch_entry_with_finished_and_touched_members() -> None:
    a, b, c = msgs = make_messages(3)
    q = InFlightQueue()
    for m in msgs:
        m.deadline = 10.0
    q.push_many(msgs, 10.0)
    assert q.heap_size == 1  # one entry for the delivery batch
    q.remove(a.id)
    q.set_deadline(b, 20.0)
    assert q.next_deadline() == 10.0  # c is still due at 10
    assert q.pop_due(10.0) == [c]
    assert q.next_deadline() == 20.0
    assert q.pop_due(20.0) == [b]
    assert len(q) == 0


def test_inflight_next_deadline_skips_fully_finished_batches() -> None:
    first = make_messages(3)
    later = make_messages(1, start=3)
    q = InFlightQueue()
    for m in first:
        m.deadline = 5.0
    q.push_many(first, 5.0)
    later[0].deadline = 8.0
    q.push_many(later, 8.0)
    for m in first:
        q.remove(m.id)
    assert q.next_deadline() == 8.0
    assert q.heap_size == 1
    assert q.ref_count == 1


def test_inflight_remove_owned() -> None:
    [m] = make_messages(1)
    m.client_id = 7
    m.deadline = 1.0
    q = InFlightQueue()
    q.push_many((m,), m.deadline)
    with pytest.raises(NotOwner):
        q.remove_owned(m.id, 8)
    assert m.id in q
    assert q.remove_owned(m.id, 7) is m
    with pytest.raises(NotInFlight):
        q.remove_owned(m.id, 7)


def test_inflight_start_many_stamps_and_tracks() -> None:
    msgs = make_messages(3)
    msgs[0].attempts = 4
    q = InFlightQueue()
    q.start_many(msgs, 9, 2.0, 62.0)
    assert [m.attempts for m in msgs] == [5, 1, 1]
    assert all((m.client_id, m.delivered_at, m.deadline) == (9, 2.0, 62.0) for m in msgs)
    assert len(q) == 3
    assert q.next_deadline() == 62.0
    assert q.pop_due(62.0) == msgs

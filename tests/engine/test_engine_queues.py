"""InFlightQueue and DeferredQueue on their own: ordering, lazy deletion, compaction.

Pure data structures: synchronous tests, times passed in as plain floats.
"""

from __future__ import annotations

import math
import random

from engine_fakes import make_messages

from lmqd.deferred import DeferredQueue
from lmqd.inflight import InFlightQueue
from lmqd.message import Message


def _in_flight(messages: list[Message], deadlines: list[float]) -> InFlightQueue:
    q = InFlightQueue()
    for m, d in zip(messages, deadlines, strict=True):
        m.deadline = d
        q.push(m)
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
    q.push(m)
    assert q.pop_due(7.0) == [m]
    assert q.pop_due(100.0) == []


def test_inflight_compaction_keeps_heap_bounded_under_fin_churn() -> None:
    q = InFlightQueue()
    live: list[Message] = []
    peak = 0
    rng = random.Random(7)
    # Keep ~100 messages in flight while 20 000 are delivered and finished (out of order).
    for i in range(20_000):
        [m] = make_messages(1, start=i)
        m.deadline = 60.0 + i * 0.001
        q.push(m)
        live.append(m)
        if len(live) > 100:
            victim = live.pop(rng.randrange(len(live)))
            q.remove(victim.id)
        peak = max(peak, q.heap_size)
    assert len(q) == 100
    # Without compaction the heap would hold all 20 000 entries.
    assert peak <= 3 * 101 + 64 + 1
    assert sorted(m.id for m in q.pop_due(math.inf)) == sorted(m.id for m in live)


def test_inflight_touch_churn_is_bounded_too() -> None:
    [m] = make_messages(1)
    q = _in_flight([m], [1.0])
    for i in range(10_000):
        q.set_deadline(m, 2.0 + i)
        assert q.heap_size <= 3 * 1 + 64 + 1
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

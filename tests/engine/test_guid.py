"""GuidFactory: nsqd's id layout (tick, node id, sequence), as 16 lowercase hex bytes."""

from __future__ import annotations

import pytest

from lmqd import message
from lmqd.message import GuidFactory

TICK_NS = 1 << 20  # the factory's clock tick: UnixNano >> 20


def _expected(tick: int, node: int, seq: int) -> bytes:
    return b"%016x" % ((tick << 22) | (node << 12) | seq)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    now = [(message._TWEPOCH + 1000) * TICK_NS]
    monkeypatch.setattr(message.time, "time_ns", lambda: now[0])
    return now


def test_ids_follow_nsqd_layout(clock: list[int]) -> None:
    ids = GuidFactory(7).new_ids(3)
    assert ids == [_expected(1000, 7, s) for s in range(3)]


def test_a_burst_past_the_sequence_borrows_the_next_tick(clock: list[int]) -> None:
    factory = GuidFactory(1)
    first = factory.new_ids(4000)
    second = factory.new_ids(200)  # same clock tick: 96 left in it, then tick 1001
    assert first == [_expected(1000, 1, s) for s in range(4000)]
    assert second == [_expected(1000, 1, s) for s in range(4000, 4096)] + [
        _expected(1001, 1, s) for s in range(104)
    ]
    # The clock reaches the borrowed tick: ids go on after what was borrowed.
    clock[0] += TICK_NS
    assert factory.new_ids(1) == [_expected(1001, 1, 104)]
    clock[0] += TICK_NS
    assert factory.new_ids(1) == [_expected(1002, 1, 0)]


def test_many_ticks_in_one_call_stay_unique_and_increasing(clock: list[int]) -> None:
    ids = GuidFactory(1023).new_ids(10_000)
    assert len(set(ids)) == 10_000
    assert ids == sorted(ids)
    assert all(len(i) == 16 and i == i.lower() for i in ids)
    assert GuidFactory(0).new_ids(0) == []


def test_node_id_must_fit() -> None:
    with pytest.raises(ValueError, match=r"\[0,1024\)"):
        GuidFactory(1024)

"""``Salvage``: a shutdown's writes keep the prefix that fits, retry within one shared budget,
and count what nothing else keeps.

Rules for this module: plain ``def`` tests; ``Disk`` stands for a queue on a disk with room for
``room`` more messages (a chunk is stored whole or refused, as the storage writer does); the
pause is recorded, never slept.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from lmqd.engine.backend import BackendError
from lmqd.engine.salvage import Salvage
from lmqd.message import Message

from .engine_fakes import bodies, make_messages


class Disk:
    def __init__(self, room: int) -> None:
        self.room = room
        self.stored: list[Message] = []
        self.calls = 0
        self.failures = 0

    def write(self, chunk: Sequence[Message], index: int) -> None:
        self.calls += 1
        assert index == len(self.stored)  # front to back, never a message twice
        if len(chunk) > self.room:
            self.failures += 1
            raise BackendError("write failed: [Errno 28] No space left on device")
        self.room -= len(chunk)
        self.stored += chunk


def salvage(pauses: list[float], retries: int = 3) -> Salvage:
    return Salvage(retries=retries, pause_s=0.2, sleep=pauses.append)


def test_everything_that_fits_is_written_in_one_call() -> None:
    pauses: list[float] = []
    s = salvage(pauses)
    disk = Disk(room=1000)
    messages = make_messages(100)
    assert s.write("TOPIC(t)", "t", disk.write, messages) == 100
    assert disk.calls == 1 and bodies(disk.stored) == bodies(messages)
    assert s.lost == {} and s.lost_count == 0 and pauses == []


def test_a_full_disk_keeps_the_prefix_that_fits_and_counts_the_rest() -> None:
    pauses: list[float] = []
    s = salvage(pauses, retries=0)
    disk = Disk(room=37)
    messages = make_messages(100)
    assert s.write("TOPIC(t)", "t", disk.write, messages) == 37
    assert bodies(disk.stored) == bodies(messages[:37])  # in order, nothing skipped
    assert s.lost == {"t": 63} and s.lost_count == 63
    # Halving: a logarithmic number of refused writes, not one per message.
    assert disk.failures <= 2 * math.ceil(math.log2(100)) + 1
    assert pauses == []


def test_retries_share_one_budget_across_queues_and_succeed_when_space_returns() -> None:
    pauses: list[float] = []
    s = salvage(pauses, retries=3)
    first = Disk(room=0)
    messages = make_messages(4)

    def write_once_space_returns(chunk: Sequence[Message], index: int) -> None:
        if len(pauses) == 2:  # space freed during the second pause
            first.room = 100
        first.write(chunk, index)

    assert s.write("TOPIC(a)", "a", write_once_space_returns, messages) == 4
    assert pauses == [0.2, 0.2] and s.lost == {}
    second = Disk(room=0)
    assert s.write("CHANNEL(b:c)", "b:c", second.write, messages) == 0
    assert pauses == [0.2, 0.2, 0.2]  # one retry left for every queue after the first
    third = Disk(room=0)
    assert s.write("TOPIC(d)", "d", third.write, messages) == 0
    assert len(pauses) == 3
    assert s.lost == {"b:c": 4, "d": 4} and s.lost_count == 8


def test_messages_kept_elsewhere_are_not_counted_lost() -> None:
    s = salvage([], retries=0)
    assert s.write("CHANNEL(t:c)", "t:c", Disk(room=2).write, make_messages(5),
                   kept_elsewhere=True) == 2
    assert s.lost == {} and s.lost_count == 0


def test_write_prefix_counts_nothing() -> None:
    s = salvage([], retries=0)
    written, error = s.write_prefix("CHANNEL(t:c)", Disk(room=3).write, make_messages(5))
    assert written == 3 and isinstance(error, BackendError)
    assert s.lost == {}

"""``SpillQueue``: memory first, the overflow in the backend, and the one failure policy.

Rules for this module: plain ``def`` tests on in-memory backends (``FailingBackend`` stands for a
full disk); no trio.
"""

from __future__ import annotations

import pytest

from lmqd.engine.backend import BackendError, MemoryBackend
from lmqd.engine.spill import SpillQueue

from .engine_fakes import FailingBackend, bodies, make_messages


def test_memory_up_to_the_limit_then_the_backend_in_order() -> None:
    backend = MemoryBackend()
    writes: list[int] = []
    queue = SpillQueue(backend, 3, lambda b: writes.append(b.depth))
    queue.put_many(make_messages(5))
    assert queue.memory_count == 3 and backend.depth == 2 and len(queue) == 5
    assert queue.wrote_backend and writes == [2]
    assert bodies(queue.take(4)) == [b"m0", b"m1", b"m2", b"m3"]
    assert bodies(queue.take(10)) == [b"m4"]


def test_fifo_rule_new_messages_follow_the_backlog_to_the_backend() -> None:
    backend = MemoryBackend()
    queue = SpillQueue(backend, 2, None)
    queue.put_many(make_messages(3))  # m0 m1 in memory, m2 in the backend
    assert bodies(queue.take_memory(2)) == [b"m0", b"m1"]
    queue.put_many(make_messages(1, start=3))  # memory has room, but the backend is not empty
    assert queue.memory_count == 0
    assert bodies(queue.take(5)) == [b"m2", b"m3"]


def test_put_many_is_all_or_none() -> None:
    backend = FailingBackend()
    queue = SpillQueue(backend, 2, None)
    with pytest.raises(BackendError):
        queue.put_many(make_messages(3))  # 2 would fit in memory: none are queued
    assert len(queue) == 0


def test_put_many_or_hold_never_loses_what_the_backend_refuses() -> None:
    backend = FailingBackend()
    queue = SpillQueue(backend, 2, None)
    error = queue.put_many_or_hold(make_messages(5))
    assert isinstance(error, BackendError)
    assert queue.memory_count == 5  # past the limit: held, not dropped
    backend.failing = False
    assert queue.put_many_or_hold(make_messages(1, start=5)) is None
    assert queue.wrote_backend and backend.depth == 1


def test_hold_and_requeue_front() -> None:
    queue = SpillQueue(MemoryBackend(), 0, None)
    queue.hold(make_messages(2))
    assert queue.memory_count == 2  # whatever the limit
    first = queue.take_memory(2)
    queue.requeue_front(first)
    assert bodies(queue.memory()) == [b"m0", b"m1"]
    queue.empty()
    assert len(queue) == 0

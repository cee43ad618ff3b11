"""I/O failures: a failed write stores nothing of its batch, loses nothing stored, and passes.

Failures are injected by wrapping ``os.pwrite``/``os.open``/``os.fsync``/``os.ftruncate`` so that
chosen calls raise the ``OSError`` a full or failing disk gives; all other calls go through.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from lmqd.engine.backend import BackendError
from lmqd.storage.record import BATCH_OF_ONE_OVERHEAD, SEGMENT_HEADER_SIZE

from .storage_helpers import drain, keys, make_messages, open_queue, put_each, segment_paths

BODY = 30
RECORD = BATCH_OF_ONE_OVERHEAD + BODY
"""A message in a batch record of its own (``put_each``)."""


def _disk_full() -> OSError:
    return OSError(errno.ENOSPC, "No space left on device")


class FailingPwrite:
    """``os.pwrite`` that writes part of the data, then fails, while ``armed``."""

    def __init__(self, real: Callable[..., int]) -> None:
        self.real = real
        self.armed = False
        self.calls = 0

    def __call__(self, fd: int, data: Any, offset: int) -> int:
        if not self.armed:
            return self.real(fd, data, offset)
        self.calls += 1
        if self.calls == 1 and len(data) > 1:
            return self.real(fd, bytes(data[: len(data) // 2]), offset)  # a short write first
        raise _disk_full()


def test_failed_write_stores_none_of_the_batch_and_the_queue_recovers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    q = open_queue(tmp_path)
    before = make_messages(3, body_size=BODY)
    q.put_many(before)
    (segment,) = segment_paths(tmp_path)
    size = segment.stat().st_size
    failing = FailingPwrite(os.pwrite)
    monkeypatch.setattr(os, "pwrite", failing)
    failing.armed = True
    with pytest.raises(BackendError, match="No space left"):
        q.put_many(make_messages(5, start=10, body_size=BODY))
    assert failing.calls == 2
    assert q.depth == 3
    assert segment.stat().st_size == size  # the half-written bytes were truncated away
    assert keys(q.read_many(1)) == keys(before[:1])
    failing.armed = False  # space again
    after = make_messages(2, start=20, body_size=BODY)
    q.put_many(after)
    assert keys(drain(q)) == keys(before[1:] + after)
    q.close()
    q = open_queue(tmp_path)
    assert q.depth == 0 and q.corrupt_count == 0
    q.close()


def test_failed_roll_undoes_the_part_written_to_the_old_segment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    max_bytes = SEGMENT_HEADER_SIZE + 3 * RECORD
    q = open_queue(tmp_path, max_bytes_per_file=max_bytes)
    first = make_messages(2, body_size=BODY)
    q.put_many(first)
    (segment,) = segment_paths(tmp_path)
    size = segment.stat().st_size
    real_open = os.open

    def open_no_new_segments(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if flags & os.O_CREAT and str(path).endswith(".dat"):
            raise _disk_full()
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", open_no_new_segments)
    # Needs segment 0's last slot and two more segments: none of it may stay.
    with pytest.raises(BackendError):
        q.put_many(make_messages(5, start=10, body_size=BODY))
    assert segment_paths(tmp_path) == [segment]
    assert segment.stat().st_size == size
    assert q.depth == 2
    monkeypatch.setattr(os, "open", real_open)
    more = make_messages(5, start=20, body_size=BODY)
    q.put_many(more)
    assert len(segment_paths(tmp_path)) == 3
    q.close()
    q = open_queue(tmp_path, max_bytes_per_file=max_bytes)
    assert keys(drain(q)) == keys(first + more)
    q.close()


def test_failure_in_a_later_new_segment_removes_the_earlier_new_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    max_bytes = SEGMENT_HEADER_SIZE + 2 * RECORD
    q = open_queue(tmp_path, max_bytes_per_file=max_bytes)
    first = make_messages(2, body_size=BODY)
    q.put_many(first)  # segment 0 is full
    real_open = os.open

    def fail_third_segment(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if str(path).endswith("000002.dat"):
            raise _disk_full()
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", fail_third_segment)
    with pytest.raises(BackendError):
        q.put_many(make_messages(4, start=10, body_size=BODY))  # segments 1 and 2
    assert len(segment_paths(tmp_path)) == 1
    monkeypatch.setattr(os, "open", real_open)
    q.put_many(make_messages(1, start=30, body_size=BODY))
    assert keys(drain(q)) == keys(first + make_messages(1, start=30, body_size=BODY))
    q.close()


def test_a_failed_write_that_cannot_be_truncated_blocks_writes_until_it_can(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    q = open_queue(tmp_path)
    before = make_messages(2, body_size=BODY)
    q.put_many(before)
    (segment,) = segment_paths(tmp_path)
    size = segment.stat().st_size
    failing = FailingPwrite(os.pwrite)
    monkeypatch.setattr(os, "pwrite", failing)
    real_ftruncate = os.ftruncate

    def no_truncate(fd: int, length: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "ftruncate", no_truncate)
    failing.armed = True
    with pytest.raises(BackendError):
        q.put_many(make_messages(10, start=10, body_size=BODY))
    failing.armed = False
    # Half of the failed batch (complete records among it) is still in the file: nothing may be
    # appended after it, or a crash would resurrect those records.
    assert segment.stat().st_size > size
    with pytest.raises(BackendError, match="Input/output"):
        q.put_many(make_messages(1, start=30, body_size=BODY))
    assert keys(q.read_many(5)) == keys(before)
    monkeypatch.setattr(os, "ftruncate", real_ftruncate)
    after = make_messages(1, start=40, body_size=BODY)
    q.put_many(after)
    assert segment.stat().st_size == size + RECORD
    assert keys(q.read_many(5)) == keys(after)
    q.close()
    q = open_queue(tmp_path)
    assert q.depth == 0 and q.corrupt_count == 0
    q.close()


def test_failed_fsync_keeps_the_old_positions_and_the_queue_working(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    q = open_queue(tmp_path)
    msgs = make_messages(4)
    q.put_many(msgs)
    q.sync()
    positions = tmp_path / "t%3Ac.lmq.pos.json"
    synced = positions.read_bytes()
    q.read_many(2)
    job = q.prepare_sync()
    assert job is not None

    def eio(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    q.put_many(make_messages(1, start=4))
    job = q.prepare_sync()
    assert job is not None
    monkeypatch.setattr(os, "fsync", eio)
    with pytest.raises(OSError, match="Input/output"):
        job.run()
    assert positions.read_bytes() == synced  # nothing claims the unsynced write is durable
    monkeypatch.undo()
    q.put_many(make_messages(1, start=5))
    q.sync()
    assert positions.read_bytes() != synced
    assert keys(drain(q)) == keys(msgs[2:] + make_messages(2, start=4))
    q.close()


def _fail_set_aside(monkeypatch: pytest.MonkeyPatch) -> None:
    real_open = os.open

    def open_no_room_for_copies(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if ".bad-" in str(path):
            raise _disk_full()
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", open_no_room_for_copies)


def _flip(segment: Path, offset: int) -> None:
    with open(segment, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x20]))


def test_open_fails_rather_than_skip_what_it_cannot_set_aside(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    q = open_queue(tmp_path)
    msgs = make_messages(3, body_size=BODY)
    put_each(q, msgs)
    q.close()
    (segment,) = segment_paths(tmp_path)
    _flip(segment, SEGMENT_HEADER_SIZE + RECORD + 50)
    damaged = segment.read_bytes()
    _fail_set_aside(monkeypatch)
    with pytest.raises(OSError, match="No space left"):
        open_queue(tmp_path)
    assert segment.read_bytes() == damaged
    monkeypatch.undo()
    q = open_queue(tmp_path)
    assert q.corrupt_count == 1
    assert keys(drain(q)) == keys([msgs[0], msgs[2]])
    q.close()


def test_reading_stops_at_a_bad_record_it_cannot_set_aside(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    q = open_queue(tmp_path, write_cache=0)
    msgs = make_messages(3, body_size=BODY)
    put_each(q, msgs)
    (segment,) = segment_paths(tmp_path)
    _flip(segment, SEGMENT_HEADER_SIZE + RECORD + 50)  # damaged after start-up
    _fail_set_aside(monkeypatch)
    assert keys(q.read_many(10)) == keys(msgs[:1])
    assert q.read_many(10) == []
    assert q.depth == 2
    monkeypatch.undo()
    assert keys(q.read_many(10)) == keys(msgs[2:])
    assert (q.corrupt_count, q.depth) == (1, 0)
    q.close()

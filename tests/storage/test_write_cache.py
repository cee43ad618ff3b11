"""DiskQueue's write-through cache: a reader that keeps up gets the written objects back.

The records are on disk all the same; these tests check that the cache returns exactly what
reading the files would (order, positions across close/reopen, depth), and that it gives way to
the files whenever the reader falls behind or the queue changes under it.
"""

from __future__ import annotations

from collections import deque
from pathlib import Path

from lmqd.storage.record import BATCH_ENTRY_SIZE, BATCH_OVERHEAD, SEGMENT_HEADER_SIZE
from lmqd.storage.scan import scan_records

from .storage_helpers import keys, make_messages, open_queue, segment_paths

BODY = 30


def _record_bytes(count: int) -> int:
    return BATCH_OVERHEAD + count * (BATCH_ENTRY_SIZE + BODY)


def test_a_reader_that_keeps_up_gets_the_objects_written(tmp_path: Path) -> None:
    q = open_queue(tmp_path)
    msgs = make_messages(10, body_size=BODY)
    q.put_many(msgs[:6])
    first = q.read_many(4)  # part of a cached record: the rest stays pending
    q.put_many(msgs[6:])
    rest = q.read_many(10)
    assert all(a is b for a, b in zip(first + rest, msgs, strict=True))
    assert q.depth == 0
    q.close()
    # Everything was written all the same, and the read position is past it.
    data = segment_paths(tmp_path)[0].read_bytes()
    assert scan_records(data, SEGMENT_HEADER_SIZE, len(data)).records == 10
    q = open_queue(tmp_path)
    assert (q.depth, q.read_many(5)) == (0, [])
    q.close()


def test_any_sequence_of_messages_is_cached(tmp_path: Path) -> None:
    q = open_queue(tmp_path)
    msgs = make_messages(6, body_size=BODY)
    q.put_many(tuple(msgs[:3]))
    q.put_many(deque(msgs[3:]))
    assert all(a is b for a, b in zip(q.read_many(6), msgs, strict=True))
    q.close()


def test_a_partly_read_cached_record_resumes_exactly_after_reopening(tmp_path: Path) -> None:
    q = open_queue(tmp_path)
    msgs = make_messages(5, body_size=BODY)
    q.put_many(msgs)
    assert q.read_many(2) == msgs[:2]
    q.close()
    q = open_queue(tmp_path)
    assert keys(q.read_many(10)) == keys(msgs[2:])  # no duplicate, nothing lost
    q.close()


def test_a_reader_that_falls_behind_reads_the_files_then_the_cache_again(tmp_path: Path) -> None:
    q = open_queue(tmp_path, write_cache=2 * _record_bytes(3))
    msgs = make_messages(15, body_size=BODY)
    for i in range(0, 12, 3):
        q.put_many(msgs[i : i + 3])  # the third record does not fit: the cache closes
    got = q.read_many(12)
    assert keys(got) == keys(msgs[:12])
    assert [a is b for a, b in zip(got, msgs, strict=False)] == [True] * 6 + [False] * 6
    q.put_many(msgs[12:])  # caught up: the cache takes records again
    last = q.read_many(5)
    assert all(a is b for a, b in zip(last, msgs[12:], strict=True))
    q.close()


def test_the_cache_gives_way_when_the_queue_is_emptied(tmp_path: Path) -> None:
    q = open_queue(tmp_path)
    msgs = make_messages(6, body_size=BODY)
    q.put_many(msgs[:3])
    q.empty()
    assert (q.depth, q.read_many(5)) == (0, [])
    q.put_many(msgs[3:])
    assert q.read_many(5) == msgs[3:]
    q.close()


def test_acknowledgement_mode_reads_the_files(tmp_path: Path) -> None:
    q = open_queue(tmp_path, ack_mode=True)
    msgs = make_messages(3, body_size=BODY)
    q.put_many(msgs)
    got = q.read_many(3)
    assert keys(got) == keys(msgs)
    assert not any(a is b for a, b in zip(got, msgs, strict=True))  # StoredMessages with tokens
    q.close()

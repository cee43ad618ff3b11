"""TopicLog: offsets, cursors, the time index, read_range, retention, recovery, adoption.

Rules for this module: no trio; real files under ``tmp_path`` (or tmpfs, ``scratch``, for the
large log); everything through ``TopicLog``'s and ``Cursor``'s public methods, and the files
on disk where the format or a crash is the point. Crashes are copies of the data directory
taken while the log is open (what a kill -9 leaves), edited where a test needs torn or damaged
bytes. The random sequences are in ``test_log_model.py``.
"""

from __future__ import annotations

import json
import logging
import os
import random
import struct
from pathlib import Path
from typing import Any

import pytest
from crc32c import crc32c

from lmqd.message import Message
from lmqd.message_ext import MessageExt
from lmqd.storage.decoder import decode_any
from lmqd.storage.errors import BackendError
from lmqd.storage.log import TopicLog
from lmqd.storage.log_index import INDEX_INTERVAL
from lmqd.storage.record import (
    BATCH_ENTRY,
    LOG_READABLE_VERSIONS,
    LOG_RECORD_TYPES,
    MAX_BATCH_BYTES,
    OFFSET_BATCH_HEADER,
    OFFSET_BATCH_OVERHEAD,
    SEGMENT_HEADER_SIZE,
    TYPE_OFFSET_BATCH,
    UnsupportedVersion,
    decode_segment_header,
)

from .log_helpers import (
    STATE,
    edit_state_file,
    entry_keys,
    expected,
    open_log,
    read_all,
    segment_files,
    stamped,
)
from .storage_helpers import WALL_EPOCH_NS, FakeTimeBase, crash_copy, key, open_queue

SMALL = 1200
"""Segment size for tests that want many segments: ~20 messages of 8 bytes each."""


# -- appending, offsets, reading --------------------------------------------------------------


def test_offsets_follow_each_other_and_continue_after_a_restart(tmp_path: Path) -> None:
    log = open_log(tmp_path, max_bytes_per_file=SMALL)
    msgs = stamped(100)
    assert log.append_many(msgs[:1]) == 0
    assert log.append_many(msgs[1:40]) == 1
    assert log.append_many([]) == 40
    assert log.append_many(msgs[40:]) == 40
    assert log.next_offset == 100 and log.segment_count > 3
    log.close()
    log = open_log(tmp_path, max_bytes_per_file=SMALL)
    assert (log.next_offset, log.earliest_offset, log.corrupt_count) == (100, 0, 0)
    assert log.append_many(stamped(5, start=100)) == 100
    assert entry_keys(log.read_range(0, 1000)) == expected(0, msgs + stamped(5, start=100))
    log.close()


@pytest.mark.parametrize("batch", [1, 3, 7, 64])
def test_a_cursor_reads_every_message_in_order_whatever_its_batch(
    tmp_path: Path, batch: int
) -> None:
    log = open_log(tmp_path, max_bytes_per_file=SMALL, cache_bytes=0)
    msgs = stamped(90)
    for start in range(0, 90, 13):
        log.append_many(msgs[start : start + 13])
    cursor = log.create_cursor("c", "earliest")
    assert entry_keys(read_all(cursor, batch)) == expected(0, msgs)
    assert (cursor.position, cursor.lag, cursor.unsettled_count) == (90, 0, 90)
    log.close()


def test_cursors_read_independently_from_where_they_were_created(tmp_path: Path) -> None:
    log = open_log(tmp_path, max_bytes_per_file=SMALL)
    msgs = stamped(60)
    log.append_many(msgs[:30])
    early = log.create_cursor("early", "earliest")
    late = log.create_cursor("late", "latest")
    middle = log.create_cursor("middle", 17)
    log.append_many(msgs[30:])
    assert entry_keys(early.read_many(5)) == expected(0, msgs[:5])
    assert entry_keys(read_all(late)) == expected(30, msgs[30:])
    assert entry_keys(read_all(middle)) == expected(17, msgs[17:])
    assert entry_keys(read_all(early)) == expected(5, msgs[5:])
    assert sorted(log.cursors) == ["early", "late", "middle"]
    log.close()


def test_cursors_that_keep_up_share_the_appended_message_objects(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    a = log.create_cursor("a")
    b = log.create_cursor("b")
    msgs = stamped(50)
    log.append_many(msgs)
    got_a = read_all(a)
    got_b = read_all(b)
    assert all(m is orig for (_, m), orig in zip(got_a, msgs, strict=True))
    assert all(m is orig for (_, m), orig in zip(got_b, msgs, strict=True))
    log.close()


def test_a_cursor_behind_the_cache_decodes_the_files(tmp_path: Path) -> None:
    log = open_log(tmp_path, cache_bytes=2000)
    msgs = stamped(200)
    for start in range(0, 200, 10):
        log.append_many(msgs[start : start + 10])
    cursor = log.create_cursor("c", "earliest")
    got = read_all(cursor, 7)
    assert entry_keys(got) == expected(0, msgs)
    assert got[0][1] is not msgs[0]  # read back from disk
    assert got[-1][1] is msgs[-1]  # the newest records are still cached
    log.close()


def test_deferral_and_attempts_survive_a_restart(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    msgs = stamped(3)
    msgs[1].deliver_at = 12.5
    msgs[2].attempts = 70_000  # saturates at the field's width
    log.append_many(msgs)
    log.close()
    # A new process whose trio clock started 2 s later on the wall clock.
    log = open_log(tmp_path, timebase=FakeTimeBase(WALL_EPOCH_NS + 2 * 10**9))
    got = [m for _, m in log.read_range(0, 10)]
    assert [m.deliver_at for m in got] == [0.0, 10.5, 0.0]
    assert [m.attempts for m in got] == [0, 1, 0xFFFF]
    log.close()


def test_read_range_reads_without_consuming(tmp_path: Path) -> None:
    log = open_log(tmp_path, max_bytes_per_file=SMALL)
    msgs = stamped(80)
    log.append_many(msgs)
    cursor = log.create_cursor("c", "earliest")
    assert entry_keys(log.read_range(10, 5)) == expected(10, msgs[10:15])
    assert entry_keys(log.read_range(70, end_offset=75)) == expected(70, msgs[70:75])
    assert entry_keys(log.read_range(70, 2, end_offset=75)) == expected(70, msgs[70:72])
    assert entry_keys(log.read_range(-5, 3)) == expected(0, msgs[:3])
    assert log.read_range(80, 10) == [] and log.read_range(10**9, 10) == []
    assert log.read_range(30, end_offset=30) == []
    with pytest.raises(ValueError, match="max_count or end_offset"):
        log.read_range(0)
    assert cursor.position == 0 and entry_keys(cursor.read_many(1)) == expected(0, msgs[:1])
    log.close()


def test_a_tool_s_reader_keeps_its_place_and_survives_deletions_under_it(
    tmp_path: Path,
) -> None:
    log = open_log(tmp_path, max_bytes_per_file=SMALL, cache_bytes=0)
    msgs = stamped(100)
    for start in range(0, 100, 25):
        log.append_many(msgs[start : start + 25])
    reader = log.open_reader(7)
    got = reader.read_many(10) + reader.read_many(10)
    assert entry_keys(got) == expected(7, msgs[7:27]) and reader.position == 27
    cursor = log.create_cursor("c", 60)
    log.sync()  # the segments wholly before offset 60 go
    first = log.earliest_offset
    assert 27 < first <= 60
    assert entry_keys(reader.read_many(5)) == expected(first, msgs[first : first + 5])
    assert entry_keys(read_all(cursor)) == expected(60, msgs[60:])
    reader.close()
    log.close()


def test_a_failed_write_stores_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = open_log(tmp_path, max_bytes_per_file=SMALL)
    log.append_many(stamped(5))

    def disk_full(fd: int, data: bytes | bytearray, offset: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("lmqd.storage.writer.pwrite_all", disk_full)
    with pytest.raises(BackendError, match=r"TOPICLOG\(t\): write failed"):
        log.append_many(stamped(50, start=5))
    monkeypatch.undo()
    assert log.next_offset == 5
    assert log.append_many(stamped(2, start=5)) == 5
    assert entry_keys(log.read_range(0, 100)) == expected(0, stamped(7))
    log.close()
    with pytest.raises(BackendError, match="closed"):
        log.append_many(stamped(1))
    assert log.read_range(0, 10) == []


# -- the time index ---------------------------------------------------------------------------


def _first_at_or_after(stamps: list[int], ts: int) -> int:
    return next((i for i, s in enumerate(stamps) if s >= ts), len(stamps))


def test_appending_at_a_later_offset_leaves_a_gap_every_reader_steps_over(
    tmp_path: Path,
) -> None:
    log = open_log(tmp_path, max_bytes_per_file=SMALL)
    cursor = log.create_cursor("c")
    first, second, third = stamped(3), stamped(4, start=3), stamped(30, start=7)
    assert log.append_many(first) == 0
    assert read_all(cursor) == list(zip(range(3), first, strict=True))  # the cache's objects
    assert log.append_many(second, 10) == 10  # offsets 3..9 were never written
    log.advance_to(40)  # nor are 14..39
    log.advance_to(20)  # never backwards
    assert log.next_offset == 40
    assert log.append_many(third, 50) == 50
    with pytest.raises(ValueError, match="was given already"):
        log.append_many(stamped(1), 49)
    got = read_all(cursor)
    assert [o for o, _ in got] == [*range(10, 14), *range(50, 80)]
    assert got[0][1] is second[0]  # a gap in the cache is stepped over in the cache
    assert entry_keys(log.read_range(0, end_offset=100)) == (
        expected(0, first) + expected(10, second) + expected(50, third)
    )
    assert entry_keys(log.read_range(5, 3)) == expected(10, second[:3])
    log.close()
    again = open_log(tmp_path, max_bytes_per_file=SMALL)
    assert again.next_offset == 80
    assert entry_keys(read_all(again.create_cursor("d", "earliest"))) == (
        expected(0, first) + expected(10, second) + expected(50, third)
    )
    again.advance_to(90)
    again.close()
    assert open_log(tmp_path).next_offset == 90


def test_a_cursor_reads_up_to_a_limit_and_skips_forward_keeping_the_unsettled(
    tmp_path: Path,
) -> None:
    log = open_log(tmp_path, max_bytes_per_file=SMALL)
    msgs = stamped(40)
    log.append_many(msgs)
    cursor = log.create_cursor("c", "earliest")
    assert [o for o, _ in cursor.read_many(100, until=5)] == [0, 1, 2, 3, 4]
    assert cursor.skip_to(30) == 30
    assert cursor.skip_to(10) == 30  # never backwards
    assert (cursor.low, cursor.unsettled_count) == (0, 5)
    assert [o for o, _ in cursor.read_many(3)] == [30, 31, 32]
    cursor.settle_many([0, 1, 2, 3, 4])
    assert cursor.low == 30
    assert cursor.skip_to(1000) == 40  # clamped to the end


def test_pushed_offsets_are_found_from_the_entries_and_option_blocks(tmp_path: Path) -> None:
    log = open_log(tmp_path, max_bytes_per_file=SMALL)
    msgs = stamped(60)
    for i in (3, 17, 41):
        msgs[i].deliver_at = 5.0
    for i, priority in ((18, 9), (30, 1), (59, 4)):
        msgs[i].ext = MessageExt(priority=priority, headers=(("k", "v"),))
    msgs[20].ext = MessageExt(headers=(("k", "v"),))  # an extension without a priority
    msgs[21].ext = MessageExt(ttl_ms=5)
    log.append_many(msgs[:30])
    log.append_many(msgs[30:])
    assert log.pushed_offsets(0, 60) == [3, 17, 18, 30, 41, 59]
    assert log.pushed_offsets(4, 42) == [17, 18, 30, 41]
    assert log.pushed_offsets(18, 19) == [18]
    assert log.pushed_offsets(42, 59) == []
    assert log.pushed_offsets(30, 30) == []
    log.close()
    log = open_log(tmp_path, max_bytes_per_file=SMALL)  # read from the files, not the cache
    assert log.pushed_offsets(0, 60) == [3, 17, 18, 30, 41, 59]
    log.close()


def test_offset_for_time_finds_the_first_message_at_or_after_a_time(tmp_path: Path) -> None:
    rng = random.Random(7)
    stamps = []
    ts = WALL_EPOCH_NS
    for _ in range(3000):
        ts += rng.choice([0, 1000, 1000, 1000, 50_000, -30_000])  # the clock steps back too
        stamps.append(ts)
    msgs = stamped(3000, body_size=40, stamps=stamps)
    log = open_log(tmp_path, max_bytes_per_file=100_000)
    at = 0
    while at < len(msgs):
        size = rng.choice([1, 5, 40, 300])
        log.append_many(msgs[at : at + size])
        at += size
    probes = [WALL_EPOCH_NS - 1, min(stamps), max(stamps), max(stamps) + 1]
    probes += [rng.randrange(min(stamps), max(stamps)) for _ in range(150)]
    probes += [stamps[i] for i in rng.sample(range(3000), 50)]
    for probe in probes:
        assert log.offset_for_time(probe) == _first_at_or_after(stamps, probe), probe
    log.close()
    log = open_log(tmp_path, max_bytes_per_file=100_000)  # the index rebuilt by recovery
    for probe in probes:
        assert log.offset_for_time(probe) == _first_at_or_after(stamps, probe), probe
    log.close()


def test_a_cursor_can_start_at_a_time(tmp_path: Path) -> None:
    log = open_log(tmp_path, max_bytes_per_file=SMALL)
    msgs = stamped(50)
    log.append_many(msgs)
    cursor = log.create_cursor("c", log.offset_for_time(msgs[33].timestamp - 1))
    assert entry_keys(read_all(cursor)) == expected(33, msgs[33:])
    log.close()


def test_seeks_read_one_index_span_however_large_the_log(
    scratch: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Proof that offset_for_time and read_range are binary searches plus one span's read: the
    bytes read per lookup stay under a span, a record and one read-ahead, in a 15 MB log."""
    count, batch = 300_000, 500
    log = open_log(scratch, max_bytes_per_file=4 * 1024 * 1024)
    body = b"x" * 16
    for start in range(0, count, batch):
        log.append_many(
            [
                Message(b"%016x" % i, body, WALL_EPOCH_NS + i * 1000)
                for i in range(start, start + batch)
            ]
        )
    log.close()
    log = open_log(scratch, max_bytes_per_file=4 * 1024 * 1024, read_ahead=4096)
    total = sum(p.stat().st_size for p in segment_files(scratch))
    assert total > 15_000_000
    read = 0
    real_pread = os.pread

    def counting_pread(fd: int, size: int, offset: int) -> bytes:
        nonlocal read
        data = real_pread(fd, size, offset)
        read += len(data)
        return data

    monkeypatch.setattr(os, "pread", counting_pread)
    bound = INDEX_INTERVAL + MAX_BATCH_BYTES + 4096
    rng = random.Random(3)
    for _ in range(40):
        target = rng.randrange(count)
        read = 0
        assert log.offset_for_time(WALL_EPOCH_NS + target * 1000 - 1) == target
        assert read < bound
        read = 0
        (offset, message), *_ = log.read_range(target, 3)
        assert (offset, message.id) == (target, b"%016x" % target)
        assert read < bound
    log.close()


# -- cursors: settling, seeking, persistence ---------------------------------------------------


def test_unsettled_messages_are_read_again_after_a_restart(tmp_path: Path) -> None:
    log = open_log(tmp_path, max_bytes_per_file=SMALL)
    msgs = stamped(30)
    log.append_many(msgs)
    cursor = log.create_cursor("c", "earliest")
    cursor.read_many(12)
    assert cursor.settle_many([0, 1, 2, 5, 6, 99]) == 5
    assert (cursor.low, cursor.position, cursor.unsettled_count) == (3, 12, 7)
    assert cursor.settle(3) and cursor.settle(4) and not cursor.settle(4)
    assert cursor.low == 7
    log.close()
    log = open_log(tmp_path, max_bytes_per_file=SMALL)
    restored = log.cursor("c")
    assert restored is not None and (restored.position, restored.low) == (7, 7)
    assert restored.read_before == 12  # 7..11 were read before: redeliveries now
    assert entry_keys(read_all(restored)) == expected(7, msgs[7:])
    log.close()
    again = open_log(tmp_path, max_bytes_per_file=SMALL)
    restored = again.cursor("c")
    assert restored is not None and (restored.low, restored.read_before) == (7, 30)
    again.close()


def test_a_seek_back_replays_rather_than_redelivers(tmp_path: Path) -> None:
    """A cursor created at the end and moved back reads first deliveries; after a restart, a
    seek below the persisted read position ends the redelivery count there."""
    log = open_log(tmp_path, max_bytes_per_file=SMALL)
    log.append_many(stamped(30))
    cursor = log.create_cursor("c", "latest")
    assert cursor.read_before == 30
    assert cursor.seek(0) == 0 and cursor.read_before == 0
    cursor.read_many(12)
    cursor.settle_many(list(range(7)))
    log.close()
    log = open_log(tmp_path, max_bytes_per_file=SMALL)
    restored = log.cursor("c")
    assert restored is not None and (restored.low, restored.read_before) == (7, 12)
    assert restored.seek(9) == 9 and restored.read_before == 9
    assert restored.seek(20) == 20 and restored.read_before == 9
    log.close()


def test_settled_reads_move_the_mark_with_the_position(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.append_many(stamped(10))
    cursor = log.create_cursor("c", "earliest")
    cursor.read_many(4, settle=True)
    assert (cursor.low, cursor.unsettled_count) == (4, 0)
    log.close()
    log = open_log(tmp_path)
    assert log.cursor("c") is not None and log.cursor("c").position == 4  # type: ignore[union-attr]
    log.close()


def test_seek_moves_within_the_log_and_forgets_the_unsettled(tmp_path: Path) -> None:
    log = open_log(tmp_path, max_bytes_per_file=SMALL)
    msgs = stamped(60)
    for start in range(0, 60, 7):
        log.append_many(msgs[start : start + 7])
    cursor = log.create_cursor("c", "earliest")
    cursor.read_many(20)
    assert cursor.seek(45) == 45 and (cursor.low, cursor.unsettled_count) == (45, 0)
    assert entry_keys(cursor.read_many(2)) == expected(45, msgs[45:47])
    assert cursor.seek(3) == 3  # backwards, into the middle of a batch
    assert entry_keys(cursor.read_many(3)) == expected(3, msgs[3:6])
    assert cursor.seek(-10) == 0 and cursor.seek(10**9) == 60
    assert cursor.read_many(5) == []
    log.append_many(stamped(1, start=60))
    assert entry_keys(cursor.read_many(5)) == expected(60, stamped(1, start=60))
    log.close()


def test_cursors_are_created_deleted_and_persisted(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.append_many(stamped(10))
    keep = log.create_cursor("keep", 4)
    gone = log.create_cursor("gone")
    with pytest.raises(ValueError, match="exists"):
        log.create_cursor("keep")
    assert log.delete_cursor("gone") and not log.delete_cursor("gone")
    assert gone.deleted and gone.read_many(5) == [] and log.cursor("gone") is None
    assert keep.position == 4
    log.close()
    doc = json.loads((tmp_path / STATE).read_text())
    assert doc["cursors"] == {"keep": 4} and doc["next_offset"] == 10
    log = open_log(tmp_path)
    assert list(log.cursors) == ["keep"]
    log.close()


# -- deletion and retention ---------------------------------------------------------------------


def _full_log(path: Path, count: int = 100, **kwargs: Any) -> tuple[list[Message], TopicLog]:
    log = open_log(path, max_bytes_per_file=SMALL, **kwargs)
    msgs = stamped(count)
    for start in range(0, count, 5):
        log.append_many(msgs[start : start + 5])
    return msgs, log


def test_segments_go_once_every_cursor_passed_them_and_only_in_a_sync(tmp_path: Path) -> None:
    log = open_log(tmp_path, max_bytes_per_file=SMALL)
    msgs = stamped(100)
    fast = log.create_cursor("fast")
    slow = log.create_cursor("slow")
    for start in range(0, 100, 5):
        log.append_many(msgs[start : start + 5])
    files = segment_files(tmp_path)
    read_all(fast, settle=True)
    log.sync()
    assert segment_files(tmp_path) == files  # the slow cursor holds them all
    slow.read_many(50, settle=True)
    before = log.bytes_on_disk
    job = log.prepare_sync()
    assert job is not None
    assert log.earliest_offset > 0 and log.bytes_on_disk < before
    assert segment_files(tmp_path) == files  # unlinked only once the marks are durable
    job.run()
    left = segment_files(tmp_path)
    assert 1 < len(left) < len(files) and left == files[-len(left) :]
    assert json.loads((tmp_path / STATE).read_text())["cursors"] == {"fast": 100, "slow": 50}
    assert log.earliest_offset <= 50
    assert entry_keys(read_all(slow, settle=True)) == expected(50, msgs[50:])
    log.sync()
    assert len(segment_files(tmp_path)) == 1  # the write segment always stays
    assert log.earliest_offset <= 100 and log.next_offset == 100
    log.close()
    log = open_log(tmp_path, max_bytes_per_file=SMALL)
    assert log.next_offset == 100 and log.append_many(stamped(1)) == 100
    log.close()


def test_a_log_without_cursors_keeps_every_segment(tmp_path: Path) -> None:
    _, log = _full_log(tmp_path)
    files = segment_files(tmp_path)
    log.sync()
    assert segment_files(tmp_path) == files
    log.close()


def test_deleting_a_cursor_lets_the_others_release_segments(tmp_path: Path) -> None:
    log = open_log(tmp_path, max_bytes_per_file=SMALL)
    log.create_cursor("idle")
    reader = log.create_cursor("reader")
    log.append_many(stamped(100))
    read_all(reader, settle=True)
    log.sync()
    many = len(segment_files(tmp_path))
    log.delete_cursor("idle")
    log.sync()
    assert len(segment_files(tmp_path)) == 1 < many
    log.close()


def test_time_retention_keeps_passed_segments_until_they_are_old(tmp_path: Path) -> None:
    msgs, log = _full_log(tmp_path, retention_ms=10)
    cursor = log.create_cursor("c", "earliest")
    read_all(cursor, settle=True)
    files = segment_files(tmp_path)
    newest = msgs[-1].timestamp
    log.sync(now_ns=newest)
    assert segment_files(tmp_path) == files
    # Message i has timestamp epoch + i us: 10 ms later only the last message's segment is young.
    log.sync(now_ns=msgs[0].timestamp + 10 * 10**6 + 50 * 1000)
    left = segment_files(tmp_path)
    assert 1 < len(left) < len(files)
    assert log.earliest_offset <= 50
    log.sync(now_ns=newest + 10**9)
    assert len(segment_files(tmp_path)) == 1
    log.close()


def test_an_expired_write_segment_is_replaced_by_an_empty_one(tmp_path: Path) -> None:
    # An idle topic: every cursor passed everything and even the newest message is older than
    # the retention. Kafka rolls its active segment to delete it; so does the log.
    msgs, log = _full_log(tmp_path, count=3, retention_ms=10)
    cursor = log.create_cursor("c", "earliest")
    read_all(cursor, settle=True)
    (write,) = segment_files(tmp_path)
    expiry = msgs[-1].timestamp + 10 * 10**6
    assert not log.retire_due(expiry - 1)
    log.sync(now_ns=expiry - 1)
    assert segment_files(tmp_path) == [write]
    assert log.retire_due(expiry)
    log.sync(now_ns=expiry)
    (fresh,) = segment_files(tmp_path)
    assert fresh != write and log.read_range(0, 10) == []
    assert (log.earliest_offset, log.next_offset) == (3, 3)
    assert not log.retire_due(expiry + 10**12)  # an empty write segment has nothing to expire
    assert log.append_many(stamped(1)) == 3
    log.close()
    log = open_log(tmp_path, max_bytes_per_file=SMALL)  # a restart finds the offsets as they were
    assert (log.earliest_offset, log.next_offset, log.cursor("c").position) == (3, 4, 3)  # type: ignore[union-attr]
    log.close()


def test_size_retention_never_takes_the_write_segment(tmp_path: Path) -> None:
    _, log = _full_log(tmp_path, count=3, retention_bytes=1)
    read_all(log.create_cursor("c", "earliest"), settle=True)
    files = segment_files(tmp_path)
    log.sync()
    assert segment_files(tmp_path) == files and not log.retire_due()
    log.close()


def test_size_retention_keeps_the_newest_segments(tmp_path: Path) -> None:
    msgs, log = _full_log(tmp_path, retention_bytes=3 * SMALL)
    cursor = log.create_cursor("c", "earliest")
    read_all(cursor, settle=True)
    log.sync()
    left = segment_files(tmp_path)
    assert sum(p.stat().st_size for p in left) <= 3 * SMALL
    assert len(left) >= 3
    first = log.earliest_offset
    assert entry_keys(log.read_range(first, 1000)) == expected(first, msgs[first:])
    log.retention_bytes = None
    log.sync()
    assert len(segment_files(tmp_path)) == 1
    log.close()


def test_with_both_limits_the_first_one_reached_releases(tmp_path: Path) -> None:
    msgs, log = _full_log(tmp_path, retention_ms=60_000, retention_bytes=2 * SMALL)
    cursor = log.create_cursor("c", "earliest")
    read_all(cursor, settle=True)
    log.sync(now_ns=msgs[-1].timestamp)
    assert sum(p.stat().st_size for p in segment_files(tmp_path)) <= 2 * SMALL
    log.close()


# -- recovery -----------------------------------------------------------------------------------


def test_a_torn_tail_is_cut_and_offsets_continue_after_the_last_whole_record(
    tmp_path: Path,
) -> None:
    log = open_log(tmp_path / "a")
    msgs = stamped(30)
    log.append_many(msgs[:10])
    log.sync()
    log.append_many(msgs[10:20])
    log.append_many(msgs[20:30])
    crash = crash_copy(tmp_path / "a", tmp_path / "b")
    log.close()
    (seg,) = segment_files(crash)
    seg.write_bytes(seg.read_bytes()[:-7])  # the last batch never fully reached the disk
    log = open_log(crash)
    assert log.torn_bytes > 0 and log.corrupt_count == 0
    assert log.next_offset == 20
    assert entry_keys(log.read_range(0, 100)) == expected(0, msgs[:20])
    assert log.append_many(msgs[20:21]) == 20
    log.close()


def test_damage_in_the_middle_is_set_aside_and_later_offsets_are_kept(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    msgs = stamped(30)
    for start in (0, 10, 20):
        log.append_many(msgs[start : start + 10])
    log.close()
    (seg,) = segment_files(tmp_path)
    data = bytearray(seg.read_bytes())
    record = (len(data) - SEGMENT_HEADER_SIZE) // 3
    data[SEGMENT_HEADER_SIZE + record + 100] ^= 0xFF  # a flipped bit in the second batch
    seg.write_bytes(bytes(data))
    log = open_log(tmp_path)
    assert log.corrupt_count == 1
    assert (tmp_path / f"{seg.name}.bad-{SEGMENT_HEADER_SIZE + record}").exists()
    assert entry_keys(log.read_range(0, 100)) == expected(0, msgs[:10]) + expected(20, msgs[20:])
    assert log.next_offset == 30
    cursor = log.create_cursor("c", 5)
    assert [offset for offset, _ in read_all(cursor, 3)] == [*range(5, 10), *range(20, 30)]
    log.close()


def test_damage_found_while_reading_is_set_aside_once_for_every_cursor(tmp_path: Path) -> None:
    log = open_log(tmp_path, cache_bytes=0)
    msgs = stamped(30)
    a = log.create_cursor("a")
    b = log.create_cursor("b")
    for start in (0, 10, 20):
        log.append_many(msgs[start : start + 10])
    (seg,) = segment_files(tmp_path)
    data = bytearray(seg.read_bytes())
    record = (len(data) - SEGMENT_HEADER_SIZE) // 3
    with open(seg, "r+b") as f:  # the disk rots under the running log
        f.seek(SEGMENT_HEADER_SIZE + record + 60)
        f.write(bytes([data[SEGMENT_HEADER_SIZE + record + 60] ^ 0x01]))
    want = expected(0, msgs[:10]) + expected(20, msgs[20:])
    assert entry_keys(read_all(a, 4)) == want
    assert log.corrupt_count == 1
    assert entry_keys(read_all(b, 25)) == want
    assert log.corrupt_count == 1
    log.close()


def _edit_state(path: Path, **changes: object) -> None:
    edit_state_file(path / STATE, **changes)


def test_cursor_marks_outside_the_log_are_rebuilt_inside_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log = open_log(tmp_path, max_bytes_per_file=SMALL)
    log.append_many(stamped(100))
    reader = log.create_cursor("reader")
    log.create_cursor("other")
    reader.seek(60)
    log.delete_cursor("other")
    log.close()
    earliest = open_log(tmp_path, max_bytes_per_file=SMALL)
    first = earliest.earliest_offset
    earliest.close()
    assert 0 < first <= 60
    _edit_state(tmp_path, cursors={"reader": 0, "ahead": 10**6})
    with caplog.at_level(logging.WARNING, logger="lmqd.storage"):
        log = open_log(tmp_path, max_bytes_per_file=SMALL)
    assert log.cursor("reader").position == first  # type: ignore[union-attr]
    # A mark past the end cannot be true: read again from the earliest rather than skip.
    assert log.cursor("ahead").position == first  # type: ignore[union-attr]
    assert "TOPICLOG(t): cursor reader was at offset 0, before the first one on disk" in caplog.text
    assert "TOPICLOG(t): cursor ahead was at offset 1000000, past the log's end 100" in caplog.text
    assert log.damage.rebuilt_count == 1
    log.close()


def test_a_missing_state_file_keeps_the_offsets_and_restores_no_cursor(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.append_many(stamped(10))
    log.create_cursor("c", 3)
    log.close()
    (tmp_path / STATE).unlink()
    log = open_log(tmp_path)
    assert log.rebuilt_state and log.cursors == {} and log.next_offset == 10
    assert log.adopted_offset is None
    log.close()


def test_a_damaged_state_file_is_set_aside(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.append_many(stamped(10))
    log.close()
    (tmp_path / STATE).write_text('{"version": 1, "name": "t", "next_offset": -4}')
    log = open_log(tmp_path)
    assert log.rebuilt_state and log.next_offset == 10
    assert (tmp_path / f"{STATE}.bad").exists()
    log.close()


def test_a_segment_created_just_before_a_crash_gets_its_header(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.append_many(stamped(10))
    log.close()
    torn = tmp_path / "t.lmq.000001.dat"
    torn.write_bytes(b"\x89LMQ")  # the crash came while the header was being written
    log = open_log(tmp_path)
    assert (log.next_offset, log.corrupt_count) == (10, 0) and log.torn_bytes == 4
    assert log.append_many(stamped(2, start=10)) == 10
    log.close()
    header = decode_segment_header(torn.read_bytes()[:SEGMENT_HEADER_SIZE], LOG_READABLE_VERSIONS)
    assert (header.version, header.segment, header.base_offset) == (3, 1, 10)
    log = open_log(tmp_path)
    assert entry_keys(log.read_range(0, 100)) == expected(0, stamped(12))
    log.close()


def test_a_segment_of_a_newer_format_is_left_untouched(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.append_many(stamped(5))
    log.close()
    (seg,) = segment_files(tmp_path)
    data = bytearray(seg.read_bytes())
    data[8:10] = b"\x00\x09"
    data[28:32] = struct.pack(">I", crc32c(bytes(data[:28])))
    seg.write_bytes(bytes(data))
    log = open_log(tmp_path)
    assert log.read_range(0, 10) == [] and log.next_offset == 5  # the state file's
    assert log.append_many(stamped(1, start=5)) == 5
    log.close()
    assert seg.read_bytes() == bytes(data) and len(segment_files(tmp_path)) == 2


def test_the_state_file_keeps_offsets_that_no_segment_holds_any_more(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.append_many(stamped(10))
    log.close()
    _edit_state(tmp_path, next_offset=500)  # offsets 10..499 were given and deleted since
    log = open_log(tmp_path)
    assert log.append_many(stamped(1)) == 500
    log.close()


# -- adopting a topic's disk queue, the format ---------------------------------------------------


def test_a_topic_s_disk_queue_is_adopted_with_offsets_and_its_read_position(
    tmp_path: Path,
) -> None:
    queue = open_queue(tmp_path, name="t", max_bytes_per_file=SMALL)
    msgs = stamped(40)
    for start in range(0, 40, 8):
        queue.put_many(msgs[start : start + 8])
    assert len(queue.read_many(13)) == 13  # the topic had handed 13 messages to its channels
    queue.close()
    log = open_log(tmp_path, max_bytes_per_file=SMALL)
    assert (log.adopted_offset, log.next_offset, log.rebuilt_state) == (13, 40, False)
    assert entry_keys(log.read_range(0, 100)) == expected(0, msgs)
    cursor = log.create_cursor("existing", log.adopted_offset or 0)
    assert entry_keys(cursor.read_many(17, settle=True)) == expected(13, msgs[13:30])
    assert log.append_many(stamped(2, start=40)) == 40
    log.close()
    header = segment_files(tmp_path)[-1].read_bytes()[:SEGMENT_HEADER_SIZE]
    assert decode_segment_header(header, LOG_READABLE_VERSIONS).base_offset == 40
    log = open_log(tmp_path, max_bytes_per_file=SMALL)  # the same offsets at every start
    assert log.adopted_offset == 13 and log.cursor("existing").position == 30  # type: ignore[union-attr]
    first = log.earliest_offset
    assert 13 < first <= 30  # the queue's segments wholly before the cursor are gone
    everything = msgs + stamped(2, start=40)
    assert entry_keys(log.read_range(first, 100)) == expected(first, everything[first:])
    log.close()


def test_the_base_offset_in_a_segment_header_keeps_offsets_when_nothing_else_does(
    tmp_path: Path,
) -> None:
    queue = open_queue(tmp_path, name="t")
    queue.put_many(stamped(3))
    queue.close()
    log = open_log(tmp_path)  # adopts the queue's segment, starts a version-3 one at offset 3
    log.close()
    old, _ = segment_files(tmp_path)
    old.unlink()
    (tmp_path / STATE).unlink()
    log = open_log(tmp_path)
    assert (log.next_offset, log.earliest_offset) == (3, 3)
    assert log.append_many(stamped(1, start=3)) == 3
    log.close()


def test_offset_batches_are_laid_out_as_documented(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    msgs = stamped(2, body_size=5)
    log.append_many(stamped(3))
    log.append_many(msgs)
    log.close()
    data = segment_files(tmp_path)[0].read_bytes()
    header = decode_segment_header(data[:SEGMENT_HEADER_SIZE], LOG_READABLE_VERSIONS)
    assert (header.version, header.segment, header.base_offset) == (3, 0, 0)
    assert data[8:10] == b"\x00\x03" and data[20:28] == struct.pack(">Q", 0)
    with pytest.raises(UnsupportedVersion):
        decode_segment_header(data[:SEGMENT_HEADER_SIZE])  # a disk queue leaves it alone
    at = SEGMENT_HEADER_SIZE + OFFSET_BATCH_OVERHEAD + 3 * (BATCH_ENTRY.size + 8)
    length, kind, flags, count, first = OFFSET_BATCH_HEADER.unpack_from(data, at)
    assert (kind, flags, count, first) == (TYPE_OFFSET_BATCH, 0, 2, 3) and chr(kind) == "O"
    assert length == OFFSET_BATCH_OVERHEAD - 4 + 2 * (BATCH_ENTRY.size + 5)
    assert BATCH_ENTRY.unpack_from(data, at + 18)[:3] == (5, msgs[0].id, msgs[0].timestamp)
    end = at + 4 + length
    assert struct.unpack(">I", data[end - 4 : end])[0] == crc32c(data[at + 4 : end - 4])
    records, stop = decode_any(data, at, LOG_RECORD_TYPES)
    assert stop == end == len(data)
    assert [(r.id, r.body, r.timestamp) for r in records] == [key(m)[:3] for m in msgs]
    with pytest.raises(ValueError):
        decode_any(data, at)  # not a record type of a disk queue's segments


def test_delete_removes_the_log_s_files(tmp_path: Path) -> None:
    log = open_log(tmp_path, max_bytes_per_file=SMALL)
    log.append_many(stamped(50))
    log.create_cursor("c")
    log.sync()
    log.delete()
    assert list(tmp_path.iterdir()) == []
    assert log.closed and log.cursors == {}


def test_a_fresh_log_creates_no_file_until_its_first_message(tmp_path: Path) -> None:
    log = open_log(tmp_path, fresh=True)
    cursor = log.create_cursor("c", "earliest")
    assert log.prepare_sync() is None  # nothing to persist: no message, no file
    assert list(tmp_path.iterdir()) == []
    assert (log.next_offset, log.earliest_offset, log.bytes_on_disk) == (0, 0, 0)
    assert read_all(cursor) == []
    msgs = stamped(5)
    assert log.append_many(msgs) == 0
    assert len(segment_files(tmp_path)) == 1
    assert entry_keys(read_all(cursor)) == expected(0, msgs)
    log.sync()
    assert (tmp_path / STATE).exists()
    log.close()
    again = open_log(tmp_path)
    assert not again.rebuilt_state and again.damage.rebuilt_count == 0
    restored = again.cursor("c")
    assert restored is not None
    assert entry_keys(read_all(restored)) == expected(0, msgs)
    again.close()


def test_a_fresh_log_closed_or_deleted_before_any_message_leaves_no_file(tmp_path: Path) -> None:
    log = open_log(tmp_path, fresh=True)
    log.create_cursor("c")
    log.close()
    log = open_log(tmp_path / "other", fresh=True)
    log.delete()
    assert list(tmp_path.iterdir()) == []


def test_a_fresh_log_that_cannot_create_its_file_refuses_the_append_whole(tmp_path: Path) -> None:
    log = open_log(tmp_path, fresh=True)
    cursor = log.create_cursor("c", "earliest")
    blocker = tmp_path / "t.lmq.000000.dat"
    blocker.mkdir()  # the segment's name is taken: creating it fails
    with pytest.raises(BackendError):
        log.append_many(stamped(3))
    assert (log.next_offset, log.bytes_on_disk) == (0, 0)
    assert read_all(cursor) == []
    blocker.rmdir()
    msgs = stamped(2)
    assert log.append_many(msgs) == 0  # the next append creates it
    assert entry_keys(read_all(cursor)) == expected(0, msgs)
    log.close()

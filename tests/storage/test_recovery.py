"""Start-up recovery and damaged files, each case as docs/storage.md ("Recovery") describes.

Damage is done to real files under ``tmp_path``: truncation, flipped bytes, deleted segments,
garbage positions files. "Crash" states are copies of the data directory taken while the queue is
still open (``crash_copy``): what the OS holds, without the close-time sync.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path

import pytest
from crc32c import crc32c
from hypothesis import given, settings
from hypothesis import strategies as st

from lmqd.message import Message
from lmqd.storage.record import (
    BATCH_ENTRY,
    BATCH_ENTRY_SIZE,
    BATCH_HEADER,
    BATCH_HEADER_SIZE,
    BATCH_OF_ONE_OVERHEAD,
    SEGMENT_HEADER_SIZE,
    encode_segment_header,
)

from .storage_helpers import (
    bad_files,
    crash_copy,
    drain,
    keys,
    make_messages,
    memory_dir,
    open_queue,
    put_each,
    segment_paths,
)

BODY = 30
RECORD = BATCH_OF_ONE_OVERHEAD + BODY
"""A message in a batch record of its own (``put_each``): these tests damage whole records."""
POSITIONS = "t%3Ac.lmq.pos.json"


def _record_offset(index: int) -> int:
    return SEGMENT_HEADER_SIZE + index * RECORD


def _five_records(path: Path, *, sync_last: bool) -> list[Message]:
    """A queue in ``path`` with five records in one segment, left open "crashed"."""
    msgs = make_messages(5, body_size=BODY)
    q = open_queue(path / "live")
    put_each(q, msgs[:4])
    q.sync()
    put_each(q, msgs[4:])
    if sync_last:
        q.sync()
    crash_copy(path / "live", path / "base")
    q.close()
    return msgs


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_torn_tail_at_every_offset_of_the_last_record_is_truncated(scratch: Path) -> None:
    tmp_path = scratch
    msgs = _five_records(tmp_path, sync_last=False)
    (segment,) = segment_paths(tmp_path / "base")
    full = segment.stat().st_size
    assert full == _record_offset(5)
    for kept in range(RECORD):
        d = _copy(tmp_path / "base", tmp_path / f"cut{kept}")
        os.truncate(segment_paths(d)[0], _record_offset(4) + kept)
        q = open_queue(d)
        assert q.depth == 4, kept
        assert (q.torn_bytes, q.corrupt_count) == (kept, 0)
        assert keys(drain(q)) == keys(msgs[:4])
        assert bad_files(d) == []
        # Appending continues right after the last good record.
        extra = make_messages(1, start=99, body_size=BODY)
        q.put_many(extra)
        q.close()
        q = open_queue(d)
        assert keys(drain(q)) == keys(extra)
        q.close()
        shutil.rmtree(d)


def test_partial_record_below_the_synced_position_is_set_aside(scratch: Path) -> None:
    tmp_path = scratch
    msgs = _five_records(tmp_path, sync_last=True)
    for kept in range(1, RECORD):
        d = _copy(tmp_path / "base", tmp_path / f"cut{kept}")
        segment = segment_paths(d)[0]
        original = segment.read_bytes()
        os.truncate(segment, _record_offset(4) + kept)
        q = open_queue(d)
        assert (q.corrupt_count, q.corrupt_bytes, q.torn_bytes) == (1, kept, 0), kept
        assert keys(drain(q)) == keys(msgs[:4])
        (aside,) = bad_files(d)
        assert aside.name == f"{segment.name}.bad-{_record_offset(4)}"
        assert aside.read_bytes() == original[_record_offset(4) : _record_offset(4) + kept]
        q.close()
        shutil.rmtree(d)


def test_flipped_byte_anywhere_in_a_middle_record_sets_just_that_record_aside(
    scratch: Path,
) -> None:
    tmp_path = scratch
    msgs = _five_records(tmp_path, sync_last=True)
    for i in range(RECORD):
        d = _copy(tmp_path / "base", tmp_path / f"flip{i}")
        segment = segment_paths(d)[0]
        data = bytearray(segment.read_bytes())
        data[_record_offset(2) + i] ^= 0x10
        segment.write_bytes(data)
        q = open_queue(d)
        assert (q.corrupt_count, q.corrupt_bytes) == (1, RECORD), i
        assert q.depth == 4
        assert keys(drain(q)) == keys(msgs[:2] + msgs[3:])
        (aside,) = bad_files(d)
        assert aside.read_bytes() == data[_record_offset(2) : _record_offset(3)]
        q.close()
        shutil.rmtree(d)


def test_a_corrupt_region_is_reported_again_but_copied_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    msgs = _five_records(tmp_path, sync_last=True)
    d = tmp_path / "base"
    segment = segment_paths(d)[0]
    data = bytearray(segment.read_bytes())
    data[_record_offset(1) + 10] ^= 1
    segment.write_bytes(data)
    for _ in range(2):
        q = open_queue(d)
        assert q.corrupt_count == 1
        q.close()
    assert len(bad_files(d)) == 1
    assert "corrupt region of 82 bytes at offset 114 set aside" in caplog.text
    assert caplog.records[0].name == "lmqd.storage"
    q = open_queue(d)
    assert keys(drain(q)) == keys(msgs[:1] + msgs[2:])
    q.close()


def test_set_aside_bytes_can_be_inspected_as_documented(tmp_path: Path) -> None:
    # docs/storage.md, "After corruption is reported": the snippet reads a record whose
    # checksum no longer matches.
    msgs = _five_records(tmp_path, sync_last=True)
    d = tmp_path / "base"
    segment = segment_paths(d)[0]
    damaged = bytearray(segment.read_bytes())
    damaged[_record_offset(3) + RECORD - 1] ^= 0x01  # the CRC's last byte
    segment.write_bytes(damaged)
    q = open_queue(d)
    q.close()
    (aside,) = bad_files(d)
    assert aside.name.endswith(f".bad-{_record_offset(3)}")
    data = aside.read_bytes()
    _, kind, flags, count = BATCH_HEADER.unpack_from(data)
    assert (chr(kind), flags, count) == ("B", 0, 1)
    found = []
    body_at = BATCH_HEADER_SIZE + count * BATCH_ENTRY_SIZE
    for i in range(count):
        size, msg_id, timestamp, attempts, _ = BATCH_ENTRY.unpack_from(
            data, BATCH_HEADER_SIZE + i * BATCH_ENTRY_SIZE
        )
        found.append((msg_id, timestamp, attempts, data[body_at : body_at + size]))
        body_at += size
    m = msgs[3]
    assert found == [(m.id, m.timestamp, m.attempts, m.body)]


def _three_segments(path: Path) -> tuple[list[Message], int]:
    max_bytes = SEGMENT_HEADER_SIZE + 3 * RECORD
    msgs = make_messages(9, body_size=BODY)
    q = open_queue(path, max_bytes_per_file=max_bytes)
    put_each(q, msgs)
    q.close()
    assert len(segment_paths(path)) == 3
    return msgs, max_bytes


def test_corruption_in_an_older_segment_is_skipped_and_the_rest_read(tmp_path: Path) -> None:
    msgs, max_bytes = _three_segments(tmp_path)
    segment = segment_paths(tmp_path)[1]
    data = bytearray(segment.read_bytes())
    data[_record_offset(2) - 3] ^= 0xFF  # CRC of the middle segment's second record
    segment.write_bytes(data)
    q = open_queue(tmp_path, max_bytes_per_file=max_bytes)
    assert q.corrupt_count == 1 and q.depth == 8
    assert keys(drain(q)) == keys(msgs[:4] + msgs[5:])
    q.sync()
    assert len(segment_paths(tmp_path)) == 1  # consumed segments go, damaged or not
    assert len(bad_files(tmp_path)) == 1  # the set-aside copy stays
    q.close()


def test_damaged_segment_header_is_set_aside_and_its_records_kept(tmp_path: Path) -> None:
    msgs, max_bytes = _three_segments(tmp_path)
    segment = segment_paths(tmp_path)[1]
    data = bytearray(segment.read_bytes())
    data[3] ^= 0xFF
    segment.write_bytes(data)
    q = open_queue(tmp_path, max_bytes_per_file=max_bytes)
    assert (q.corrupt_count, q.corrupt_bytes) == (1, SEGMENT_HEADER_SIZE)
    assert keys(drain(q)) == keys(msgs)
    q.close()


def test_corruption_found_while_reading_is_set_aside(tmp_path: Path) -> None:
    q = open_queue(tmp_path, write_cache=0)
    msgs = make_messages(5, body_size=BODY)
    put_each(q, msgs)
    # The disk rots after start-up: record 2's body changes under the running queue.
    segment = segment_paths(tmp_path)[0]
    with open(segment, "r+b") as f:
        f.seek(_record_offset(2) + 45)
        f.write(b"?")
    assert keys(q.read_many(1)) == keys(msgs[:1])
    assert keys(q.read_many(10)) == keys([msgs[1], msgs[3], msgs[4]])
    assert (q.corrupt_count, q.corrupt_bytes, q.depth) == (1, RECORD, 0)
    assert len(bad_files(tmp_path)) == 1
    q.put_many(make_messages(1, start=7))
    assert keys(q.read_many(5)) == keys(make_messages(1, start=7))
    q.close()


def test_missing_segment_is_skipped_and_counted(tmp_path: Path) -> None:
    msgs, max_bytes = _three_segments(tmp_path)
    os.unlink(segment_paths(tmp_path)[1])
    q = open_queue(tmp_path, max_bytes_per_file=max_bytes)
    assert q.missing_segments == 1
    assert q.depth == 6
    assert keys(drain(q)) == keys(msgs[:3] + msgs[6:])
    q.close()


def test_missing_write_segment_starts_a_new_one(tmp_path: Path) -> None:
    msgs, max_bytes = _three_segments(tmp_path)
    os.unlink(segment_paths(tmp_path)[2])
    q = open_queue(tmp_path, max_bytes_per_file=max_bytes)
    assert q.missing_segments == 1
    extra = make_messages(1, start=50, body_size=BODY)
    q.put_many(extra)
    assert keys(drain(q)) == keys(msgs[:6] + extra)
    q.close()


def test_missing_positions_file_is_rebuilt_from_the_segments(tmp_path: Path) -> None:
    msgs, max_bytes = _three_segments(tmp_path)
    q = open_queue(tmp_path, max_bytes_per_file=max_bytes)
    q.read_many(4)
    q.close()
    os.unlink(tmp_path / POSITIONS)
    q = open_queue(tmp_path, max_bytes_per_file=max_bytes)
    assert q.rebuilt_positions
    # Segment 0 was consumed and deleted; segment 1 is read again from its start (at-least-once).
    assert keys(drain(q)) == keys(msgs[3:])
    q.close()


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"{not json",
        b"\xff\xfe",
        b"[]",
        b'{"version":1,"name":"t:c","depth":0,"read":[0,32]}',
        b'{"version":1,"name":"other","depth":0,"read":[0,32],"write":[0,32]}',
        b'{"version":1,"name":"t:c","depth":0,"read":[2,32],"write":[0,32]}',
        b'{"version":1,"name":"t:c","depth":-1,"read":[0,32],"write":[0,32]}',
        b'{"version":9,"name":"t:c","depth":0,"read":[0,32],"write":[0,32]}',
    ],
)
def test_damaged_positions_file_is_kept_aside_and_rebuilt(tmp_path: Path, content: bytes) -> None:
    msgs, max_bytes = _three_segments(tmp_path)
    (tmp_path / POSITIONS).write_bytes(content)
    q = open_queue(tmp_path, max_bytes_per_file=max_bytes)
    assert q.rebuilt_positions
    assert (tmp_path / f"{POSITIONS}.bad").read_bytes() == content
    assert keys(drain(q)) == keys(msgs)
    q.close()
    q = open_queue(tmp_path, max_bytes_per_file=max_bytes)  # the rebuilt file is valid
    assert not q.rebuilt_positions
    q.close()


def test_read_position_off_a_record_boundary_resumes_at_the_record_before(tmp_path: Path) -> None:
    msgs, max_bytes = _three_segments(tmp_path)
    q = open_queue(tmp_path, max_bytes_per_file=max_bytes)
    q.read_many(2)
    q.close()
    doc = json.loads((tmp_path / POSITIONS).read_bytes())
    assert doc["read"] == [0, _record_offset(2), 0]
    doc["read"] = [0, _record_offset(2) + 5, 0]
    (tmp_path / POSITIONS).write_text(json.dumps(doc))
    q = open_queue(tmp_path, max_bytes_per_file=max_bytes)
    assert keys(drain(q)) == keys(msgs[2:])
    q.close()


def test_valid_records_past_the_persisted_write_position_are_kept(tmp_path: Path) -> None:
    msgs = _five_records(tmp_path, sync_last=False)  # record 5 written, not synced
    q = open_queue(tmp_path / "base")
    assert (q.depth, q.corrupt_count, q.torn_bytes) == (5, 0, 0)
    assert keys(drain(q)) == keys(msgs)
    q.close()


def test_garbage_past_the_persisted_write_position_is_set_aside(tmp_path: Path) -> None:
    msgs = _five_records(tmp_path, sync_last=False)
    segment = segment_paths(tmp_path / "base")[0]
    with open(segment, "ab") as f:
        f.write(b"\x00" * 100)  # a crash can leave a zero-filled extent
    q = open_queue(tmp_path / "base")
    assert (q.corrupt_count, q.corrupt_bytes) == (1, 100)
    assert keys(drain(q)) == keys(msgs)
    assert segment.stat().st_size == _record_offset(5)
    q.close()


def test_consumed_segments_left_by_a_crash_are_removed_at_start(tmp_path: Path) -> None:
    msgs, max_bytes = _three_segments(tmp_path)
    first = segment_paths(tmp_path)[0]
    saved = first.read_bytes()
    q = open_queue(tmp_path, max_bytes_per_file=max_bytes)
    q.read_many(4)
    q.close()
    assert not first.exists()
    first.write_bytes(saved)  # the unlink after the positions update was lost
    q = open_queue(tmp_path, max_bytes_per_file=max_bytes)
    assert not first.exists()
    assert keys(drain(q)) == keys(msgs[4:])
    q.close()


def test_segment_of_a_newer_format_is_left_untouched(tmp_path: Path) -> None:
    msgs = make_messages(3)
    q = open_queue(tmp_path)
    q.put_many(msgs)
    q.close()
    head = encode_segment_header(5, 0)[:28]
    head = head[:8] + struct.pack(">H", 3) + head[10:]
    future = head + struct.pack(">I", crc32c(head)) + b"future records"
    future_path = tmp_path / "t%3Ac.lmq.000005.dat"
    future_path.write_bytes(future)
    q = open_queue(tmp_path)
    q.put_many(make_messages(1, start=3))
    assert keys(drain(q)) == keys(make_messages(4))
    q.sync()
    q.close()
    assert future_path.read_bytes() == future
    assert (tmp_path / "t%3Ac.lmq.000006.dat").exists()


def test_segment_created_without_its_header_is_reused(tmp_path: Path) -> None:
    max_bytes = SEGMENT_HEADER_SIZE + 2 * RECORD
    msgs = make_messages(3, body_size=BODY)
    q = open_queue(tmp_path / "live", max_bytes_per_file=max_bytes)
    q.put_many(msgs[:2])
    q.sync()
    q.put_many(msgs[2:])  # rolls to segment 1, after the last sync
    crash_copy(tmp_path / "live", tmp_path / "crashed")
    q.close()
    segment = segment_paths(tmp_path / "crashed")[1]
    os.truncate(segment, 5)  # the crash came before the new file got its header
    q = open_queue(tmp_path / "crashed", max_bytes_per_file=max_bytes)
    assert q.torn_bytes == 5 and q.corrupt_count == 0
    extra = make_messages(1, start=9, body_size=BODY)
    q.put_many(extra)
    q.close()
    q = open_queue(tmp_path / "crashed", max_bytes_per_file=max_bytes)
    assert keys(drain(q)) == keys(msgs[:2] + extra)
    assert segment_paths(tmp_path / "crashed")[1] == segment
    q.close()


@settings(max_examples=60, deadline=None)
@given(
    damage=st.lists(
        st.tuples(
            st.sampled_from(["flip", "truncate", "insert", "zero"]),
            st.integers(0, 10_000),
            st.integers(1, 60),
        ),
        min_size=1,
        max_size=4,
    )
)
def test_arbitrary_damage_never_raises_and_never_invents_messages(
    damage: list[tuple[str, int, int]],
) -> None:
    with memory_dir() as d:
        _damage_and_reopen(d, damage)


def _damage_and_reopen(d: Path, damage: list[tuple[str, int, int]]) -> None:
    max_bytes = SEGMENT_HEADER_SIZE + 4 * RECORD
    msgs = make_messages(10, body_size=BODY)
    q = open_queue(d, max_bytes_per_file=max_bytes)
    q.put_many(msgs)
    q.close()
    segments = segment_paths(d)
    for kind, where, size in damage:
        segment = segments[where % len(segments)]
        data = bytearray(segment.read_bytes())
        at = where % (len(data) + 1)
        if kind == "flip":
            for i in range(at, min(at + size, len(data))):
                data[i] ^= 0x5A
        elif kind == "truncate":
            del data[at:]
        elif kind == "insert":
            data[at:at] = bytes(range(size))
        else:
            data[at : at + size] = bytes(len(data[at : at + size]))
        segment.write_bytes(data)
    q = open_queue(d, max_bytes_per_file=max_bytes)
    got = drain(q)
    # Whatever survived is a subsequence of what was written, in order.
    expected = iter(keys(msgs))
    assert all(k in expected for k in keys(got))
    q.put_many(make_messages(1, start=77))
    assert keys(q.read_many(5)) == keys(make_messages(1, start=77))
    q.close()


@settings(max_examples=60, deadline=None)
@given(
    damage=st.lists(
        st.tuples(
            st.sampled_from(["flip", "truncate", "zero"]),
            st.integers(0, 10_000),
            st.integers(1, 60),
        ),
        min_size=1,
        max_size=4,
    ),
    ack_mode=st.booleans(),
    read_first=st.integers(0, 3),
)
def test_damage_while_running_never_raises_and_never_invents_messages(
    damage: list[tuple[str, int, int]], ack_mode: bool, read_first: int
) -> None:
    with memory_dir() as d:
        max_bytes = SEGMENT_HEADER_SIZE + 4 * RECORD
        msgs = make_messages(10, body_size=BODY)
        q = open_queue(d, max_bytes_per_file=max_bytes, ack_mode=ack_mode)
        q.put_many(msgs)
        got = q.read_many(read_first)
        segments = segment_paths(d)
        for kind, where, size in damage:
            segment = segments[where % len(segments)]
            data = bytearray(segment.read_bytes())
            at = where % (len(data) + 1)
            if kind == "truncate":
                os.truncate(segment, at)
                continue
            for i in range(at, min(at + size, len(data))):
                data[i] = data[i] ^ 0x5A if kind == "flip" else 0
            with open(segment, "r+b") as f:  # in place: the queue keeps its descriptors
                f.write(data)
        got += drain(q)
        expected = iter(keys(msgs))
        assert all(k in expected for k in keys(got))
        assert q.depth == 0
        q.put_many(make_messages(1, start=77))
        assert keys(q.read_many(5)) == keys(make_messages(1, start=77))
        q.close()
        open_queue(d, max_bytes_per_file=max_bytes, ack_mode=ack_mode).close()

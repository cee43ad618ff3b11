"""Batch records through the disk queue: splitting, partial reads, positions, damage, old data.

``put_many`` writes its messages as batch records (``record.py``); these tests check what that
changes for a user of ``DiskQueue``: a batch read in parts resumes exactly where it stopped after
a close or a crash, acknowledgement mode persists the oldest unacknowledged message inside its
batch, a damaged batch is one bad region, and data directories written before batches (single-
message records, version-1 positions files) still open.
"""

from __future__ import annotations

import json
import os
import shutil
from itertools import pairwise
from pathlib import Path

import pytest
from crc32c import crc32c

from lmqd.message import Message
from lmqd.storage import StoredMessage, token_index, token_position
from lmqd.storage.record import (
    BATCH_ENTRY_SIZE,
    BATCH_OVERHEAD,
    MAX_BATCH_BYTES,
    SEGMENT_HEADER_SIZE,
    TYPE_BATCH,
    Record,
    encode_segment_header,
)
from lmqd.storage.scan import scan_records
from lmqd.storage.verify import verify_record

from .record_encoders import encode_records
from .storage_helpers import (
    FakeTimeBase,
    bad_files,
    crash_copy,
    delivered_once,
    drain,
    keys,
    make_messages,
    open_queue,
    segment_paths,
)

POSITIONS = "t%3Ac.lmq.pos.json"
BODY = 30


def _batch_size(count: int, body: int = BODY) -> int:
    return BATCH_OVERHEAD + count * (BATCH_ENTRY_SIZE + body)


def _records(segment: Path) -> list[tuple[int, int, int]]:
    """(offset, type, message count) of every record in a segment file."""
    data = segment.read_bytes()
    out = []
    pos = SEGMENT_HEADER_SIZE
    while pos < len(data):
        end, count = verify_record(data, pos, len(data))
        assert end > 0, pos
        out.append((pos, data[pos + 4], count))
        pos = end
    return out


def _positions(path: Path) -> dict[str, object]:
    doc: dict[str, object] = json.loads((path / POSITIONS).read_bytes())
    return doc


def test_one_put_many_is_one_batch_record(tmp_path: Path) -> None:
    q = open_queue(tmp_path)
    msgs = make_messages(10, body_size=BODY)
    q.put_many(msgs)
    (segment,) = segment_paths(tmp_path)
    assert _records(segment) == [(SEGMENT_HEADER_SIZE, TYPE_BATCH, 10)]
    assert segment.stat().st_size == SEGMENT_HEADER_SIZE + _batch_size(10)
    assert q.depth == 10
    assert keys(drain(q)) == keys(msgs)
    q.close()


def test_large_calls_are_split_at_the_batch_size_cap(tmp_path: Path) -> None:
    q = open_queue(tmp_path)
    msgs = make_messages(5000, body_size=100)
    q.put_many(msgs)
    records = _records(segment_paths(tmp_path)[0])
    assert sum(count for _, _, count in records) == 5000
    sizes = [b - a for (a, _, _), (b, _, _) in pairwise(records)]
    assert len(records) == -(-5000 * 138 // (MAX_BATCH_BYTES - BATCH_OVERHEAD))
    assert all(size <= MAX_BATCH_BYTES for size in sizes)
    assert keys(drain(q, batch=777)) == keys(msgs)
    q.close()


def test_skewed_sizes_still_respect_the_cap_and_a_big_message_gets_its_own_batch(
    tmp_path: Path,
) -> None:
    q = open_queue(tmp_path)
    msgs = make_messages(40, body_size=10)
    for m in msgs[:10]:
        m.body = m.body.ljust(30_000, b"b")  # ten big ones first, then small ones
    msgs[20].body = b"H" * (MAX_BATCH_BYTES + 1)  # alone above the cap
    q.put_many(msgs)
    records = _records(segment_paths(tmp_path)[0])
    data = segment_paths(tmp_path)[0].read_bytes()
    for offset, _, count in records:
        size = verify_record(data, offset, len(data))[0] - offset
        assert size <= MAX_BATCH_BYTES or count == 1
    assert sum(count for _, _, count in records) == 40
    assert keys(drain(q, batch=3)) == keys(msgs)
    q.close()


def test_a_batch_spanning_segments_is_split_at_the_boundary(tmp_path: Path) -> None:
    max_bytes = SEGMENT_HEADER_SIZE + _batch_size(4)
    q = open_queue(tmp_path, max_bytes_per_file=max_bytes)
    msgs = make_messages(10, body_size=BODY)
    q.put_many(msgs[:1])
    q.put_many(msgs[1:])
    counts = [[c for _, _, c in _records(s)] for s in segment_paths(tmp_path)]
    # Segment 0 had room for two more messages in a second batch; then four per segment.
    assert counts == [[1, 2], [4], [3]]
    assert all(s.stat().st_size <= max_bytes for s in segment_paths(tmp_path))
    q.close()
    q = open_queue(tmp_path, max_bytes_per_file=max_bytes)
    assert keys(drain(q, batch=3)) == keys(msgs)
    q.close()


@pytest.mark.parametrize("read_ahead", [1, 100, 1000])
def test_reading_with_a_read_ahead_smaller_than_a_batch(tmp_path: Path, read_ahead: int) -> None:
    q = open_queue(tmp_path, read_ahead=read_ahead)
    msgs = make_messages(30, body_size=BODY)
    q.put_many(msgs[:20])
    q.put_many(msgs[20:])
    assert keys(drain(q, batch=7)) == keys(msgs)
    q.close()


@pytest.mark.parametrize("first", [0, 1, 3, 9, 10])
def test_a_partly_read_batch_resumes_exactly_after_close_and_reopen(
    tmp_path: Path, first: int
) -> None:
    q = open_queue(tmp_path)
    msgs = make_messages(10, body_size=BODY)
    q.put_many(msgs)
    q.put_many(make_messages(2, start=10, body_size=BODY))
    assert keys(q.read_many(first)) == keys(msgs[:first])
    assert q.depth == 12 - first
    q.close()
    expected_read = (
        [0, SEGMENT_HEADER_SIZE, first]
        if first < 10
        else [0, SEGMENT_HEADER_SIZE + _batch_size(10), 0]
    )
    assert _positions(tmp_path)["read"] == expected_read
    q = open_queue(tmp_path)
    assert q.depth == 12 - first
    everything = msgs + make_messages(2, start=10, body_size=BODY)
    assert keys(drain(q, batch=4)) == keys(everything[first:])
    q.close()


def test_partial_reads_of_a_batch_return_each_message_once(tmp_path: Path) -> None:
    q = open_queue(tmp_path)
    msgs = make_messages(25, body_size=BODY)
    q.put_many(msgs)
    got: list[Message] = []
    for n in [1, 2, 0, 5, 1, 30]:
        got += q.read_many(n)
        assert q.depth == 25 - len(got)
    assert keys(got) == keys(msgs)
    q.close()


def test_a_crash_resumes_at_the_synced_index_inside_a_batch(tmp_path: Path) -> None:
    q = open_queue(tmp_path / "live")
    msgs = make_messages(10, body_size=BODY)
    q.put_many(msgs)
    q.read_many(4)
    q.sync()
    q.read_many(3)  # not synced: read again after the crash
    crashed = crash_copy(tmp_path / "live", tmp_path / "crashed")
    q.close()
    q = open_queue(crashed)
    assert q.depth == 6
    assert keys(drain(q)) == keys(msgs[4:])
    q.close()


def test_ack_mode_tokens_name_the_batch_and_the_index(tmp_path: Path) -> None:
    q = open_queue(tmp_path, ack_mode=True)
    q.put_many(make_messages(3))
    q.put_many(make_messages(2, start=3))
    got = [m for m in q.read_many(5) if isinstance(m, StoredMessage)]
    second = SEGMENT_HEADER_SIZE + BATCH_OVERHEAD + 3 * (BATCH_ENTRY_SIZE + len(b"m0."))
    assert [token_position(m.token) for m in got] == [(0, SEGMENT_HEADER_SIZE)] * 3 + [
        (0, second)
    ] * 2
    assert [token_index(m.token) for m in got] == [0, 1, 2, 0, 1]
    assert len({m.token for m in got}) == 5
    q.close()


def test_ack_mode_crash_rereads_from_the_oldest_unacked_message_in_its_batch(
    tmp_path: Path,
) -> None:
    q = open_queue(tmp_path / "live", ack_mode=True)
    msgs = make_messages(10, body_size=BODY)
    q.put_many(msgs)
    got = [m for m in q.read_many(6) if isinstance(m, StoredMessage)]
    q.ack_many([got[0].token, got[1].token, got[3].token, got[5].token])
    q.sync()
    assert _positions(tmp_path / "live")["read"] == [0, SEGMENT_HEADER_SIZE, 2]
    q.ack(got[2].token)  # not synced: message 2 comes back after the crash
    crashed = crash_copy(tmp_path / "live", tmp_path / "crashed")
    q.close()  # a clean close persists the oldest unacknowledged: message 4
    q = open_queue(crashed, ack_mode=True)
    # At-least-once: 2 (acked after the sync), 3 (acked, behind 2), 4 (never acked), 5.. (unread);
    # 2 to 5 were handed out before the crash: they count that delivery in their attempts.
    assert keys(drain(q)) == keys(delivered_once(msgs[2:6]) + msgs[6:])
    q.close()
    q = open_queue(tmp_path / "live", ack_mode=True)
    assert keys(drain(q)) == keys(delivered_once(msgs[4:6]) + msgs[6:])
    q.close()


def test_ack_mode_keeps_the_segment_of_a_partly_acked_batch(tmp_path: Path) -> None:
    max_bytes = SEGMENT_HEADER_SIZE + _batch_size(4)
    q = open_queue(tmp_path, ack_mode=True, max_bytes_per_file=max_bytes)
    q.put_many(make_messages(8, body_size=BODY))  # two segments of one batch each
    got = [m for m in q.read_many(8) if isinstance(m, StoredMessage)]
    q.ack_many(m.token for m in got if m is not got[3])
    q.sync()
    assert len(segment_paths(tmp_path)) == 2  # message 3 holds segment 0
    q.ack(got[3].token)
    q.sync()
    assert len(segment_paths(tmp_path)) == 1
    q.close()


def test_a_flipped_byte_in_a_batch_sets_the_whole_batch_aside(scratch: Path) -> None:
    msgs = make_messages(15, body_size=BODY)
    q = open_queue(scratch / "base")
    for i in range(0, 15, 5):
        q.put_many(msgs[i : i + 5])
    q.close()
    start = SEGMENT_HEADER_SIZE + _batch_size(5)
    for i in range(_batch_size(5)):
        d = scratch / f"flip{i}"
        shutil.copytree(scratch / "base", d)
        (segment,) = segment_paths(d)
        data = bytearray(segment.read_bytes())
        data[start + i] ^= 0x04
        segment.write_bytes(data)
        q = open_queue(d)
        assert (q.corrupt_count, q.corrupt_bytes, q.depth) == (1, _batch_size(5), 10), i
        assert keys(drain(q)) == keys(msgs[:5] + msgs[10:])
        (aside,) = bad_files(d)
        assert aside.read_bytes() == data[start : start + _batch_size(5)]
        q.close()
        shutil.rmtree(d)


def test_a_torn_batch_at_the_tail_is_truncated_at_every_offset(scratch: Path) -> None:
    msgs = make_messages(8, body_size=BODY)
    q = open_queue(scratch / "live")
    q.put_many(msgs[:3])
    q.sync()
    q.put_many(msgs[3:])
    crash_copy(scratch / "live", scratch / "base")
    q.close()
    good = SEGMENT_HEADER_SIZE + _batch_size(3)
    for kept in range(_batch_size(5)):
        d = scratch / f"cut{kept}"
        shutil.copytree(scratch / "base", d)
        os.truncate(segment_paths(d)[0], good + kept)
        q = open_queue(d)
        assert (q.depth, q.torn_bytes, q.corrupt_count) == (3, kept, 0), kept
        assert keys(drain(q)) == keys(msgs[:3])
        q.put_many(msgs[3:4])
        q.close()
        q = open_queue(d)
        assert keys(drain(q)) == keys(msgs[3:4])
        q.close()
        shutil.rmtree(d)


def test_rot_found_while_reading_loses_one_batch(tmp_path: Path) -> None:
    # One read per record, and none from the write cache: rot is seen when read.
    q = open_queue(tmp_path, read_ahead=1, write_cache=0)
    msgs = make_messages(9, body_size=BODY)
    for i in range(0, 9, 3):
        q.put_many(msgs[i : i + 3])
    assert keys(q.read_many(4)) == keys(msgs[:4])  # the second batch is now decoded, 1 read
    (segment,) = segment_paths(tmp_path)
    with open(segment, "r+b") as f:
        f.seek(SEGMENT_HEADER_SIZE + _batch_size(3) + 20)
        f.write(b"?")  # rots under the decoded batch: its messages were verified already
        f.seek(SEGMENT_HEADER_SIZE + 2 * _batch_size(3) + 20)
        f.write(b"?")  # and under the third, not read yet: set aside
    assert keys(q.read_many(10)) == keys(msgs[4:6])
    assert (q.corrupt_count, q.depth) == (1, 0)
    q.close()


def test_depth_counts_messages_at_recovery(tmp_path: Path) -> None:
    records = scan_records
    q = open_queue(tmp_path)
    q.put_many(make_messages(7))
    q.put_many(make_messages(5, start=7))
    q.read_many(9)
    q.close()
    q = open_queue(tmp_path)
    assert q.depth == 3
    data = segment_paths(tmp_path)[0].read_bytes()
    assert records(data, SEGMENT_HEADER_SIZE, len(data)).records == 12
    q.close()


def test_attempts_beyond_the_field_saturate(tmp_path: Path) -> None:
    q = open_queue(tmp_path, write_cache=0)
    msgs = make_messages(3)
    msgs[1].attempts = 70_000
    q.put_many(msgs)
    assert [m.attempts for m in drain(q)] == [0, 0xFFFF, 2]
    q.close()


def test_a_bad_message_id_stores_nothing(tmp_path: Path) -> None:
    q = open_queue(tmp_path)
    msgs = make_messages(3)
    msgs[2].id = b"short"
    with pytest.raises(ValueError, match="16 bytes"):
        q.put_many(msgs)
    msgs[1].attempts = 70_000  # the saturating path checks ids too
    with pytest.raises(ValueError, match="16 bytes"):
        q.put_many(msgs)
    assert q.depth == 0 and segment_paths(tmp_path)[0].stat().st_size == SEGMENT_HEADER_SIZE
    q.close()


# -- data written before batch records ----------------------------------------------------------


def _old_format_queue(path: Path, count: int, read_record: int) -> list[Message]:
    """A queue as the previous format left it: 'M' records and a version-1 positions file."""
    path.mkdir()
    msgs = make_messages(count, body_size=BODY)
    tb = FakeTimeBase()
    msgs[1].deliver_at = 12.5
    wall = [tb.to_wall_ns(m.deliver_at) if m.deliver_at else 0 for m in msgs]
    header = bytearray(encode_segment_header(0, 0))
    header[8:10] = b"\x00\x01"  # version 1, as written before batch records
    header[28:32] = crc32c(bytes(header[:28])).to_bytes(4, "big")
    data = bytes(header) + encode_records(
        [Record(m.id, m.timestamp, m.attempts, w, m.body) for m, w in zip(msgs, wall, strict=True)]
    )
    (path / "t%3Ac.lmq.000000.dat").write_bytes(data)
    record = 44 + BODY
    doc = {
        "version": 1,
        "name": "t:c",
        "depth": count - read_record,
        "read": [0, SEGMENT_HEADER_SIZE + read_record * record],
        "write": [0, len(data)],
    }
    (path / POSITIONS).write_text(json.dumps(doc))
    return msgs


@pytest.mark.parametrize("ack_mode", [False, True])
def test_an_old_format_segment_is_read_and_appended_to(tmp_path: Path, ack_mode: bool) -> None:
    msgs = _old_format_queue(tmp_path / "q", 6, read_record=2)
    q = open_queue(tmp_path / "q", ack_mode=ack_mode)
    assert (q.depth, q.corrupt_count, q.rebuilt_positions) == (4, 0, False)
    assert keys(q.read_many(1)) == keys(msgs[2:3])
    more = make_messages(3, start=50, body_size=BODY)
    q.put_many(more)  # batches go to a new segment of version 2; the old one is never appended to
    q.close()
    assert _positions(tmp_path / "q")["version"] == 2
    old, new = segment_paths(tmp_path / "q")
    assert old.read_bytes()[8:10] == b"\x00\x01" and new.read_bytes()[8:10] == b"\x00\x02"
    q = open_queue(tmp_path / "q", ack_mode=ack_mode)
    # Nothing was acknowledged: message 2, handed out, comes back counting that delivery.
    again = delivered_once(msgs[2:3]) if ack_mode else []
    assert keys(drain(q, batch=2)) == keys(again + msgs[3:] + more)
    q.close()


def test_an_old_format_deferred_message_keeps_its_deadline(tmp_path: Path) -> None:
    msgs = _old_format_queue(tmp_path / "q", 3, read_record=0)
    q = open_queue(tmp_path / "q")
    got = drain(q)
    assert got[1].deliver_at == 12.5
    assert keys(got) == keys(msgs)
    q.close()


def test_a_version_1_positions_file_with_a_bad_field_is_rebuilt(tmp_path: Path) -> None:
    msgs = _old_format_queue(tmp_path / "q", 3, read_record=1)
    doc = _positions(tmp_path / "q")
    doc["read"] = [0, SEGMENT_HEADER_SIZE, 0]  # version 1 has no index
    (tmp_path / "q" / POSITIONS).write_text(json.dumps(doc))
    q = open_queue(tmp_path / "q")
    assert q.rebuilt_positions
    assert keys(drain(q)) == keys(msgs)
    q.close()


def test_ack_many_counts_each_known_token_once(tmp_path: Path) -> None:
    q = open_queue(tmp_path, ack_mode=True)
    q.put_many(make_messages(4))
    got = [m for m in q.read_many(4) if isinstance(m, StoredMessage)]
    dirty = q.dirty_count
    assert q.ack_many([got[1].token, got[1].token, 12345, got[2].token]) == 2
    assert (q.unacked_count, q.dirty_count) == (2, dirty + 2)
    assert q.ack_many(iter([got[0].token, got[3].token])) == 2
    assert q.unacked_count == 0 and not q.ack(got[0].token)
    q.close()

"""Damage is counted and positions are never trusted (issue 18, item 4), for disk queues and
topic logs alike.

Rules for this module:
- Real files under ``tmp_path``; the damage is done to them between a close and a reopen, as an
  operator, a bad disk or a stray script would: a middle segment emptied or zeroed, a record
  flipped, a positions or state file edited to disagree with the segments.
- Each case asserts what is delivered (every intact message, nothing corrupt: ``keys`` compares
  ids, bodies, timestamps and attempts), what is counted (``damage``), and what is logged.
- A positions file that disagrees is rebuilt from the segments: messages may come again
  (at-least-once), none may be skipped, and no unread segment may be deleted.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from lmqd.message import Message
from lmqd.storage.record import BATCH_OF_ONE_OVERHEAD, SEGMENT_HEADER_SIZE

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
from .storage_helpers import (
    bad_files,
    drain,
    keys,
    make_messages,
    open_queue,
    put_each,
    segment_paths,
)

BODY = 30
RECORD = BATCH_OF_ONE_OVERHEAD + BODY
PER_SEGMENT = 3
MAX_BYTES = SEGMENT_HEADER_SIZE + PER_SEGMENT * RECORD
POSITIONS = "t%3Ac.lmq.pos.json"


def _queue_of_four_segments(path: Path) -> list[Message]:
    """Twelve one-message records in four full segments of three; closed cleanly."""
    msgs = make_messages(4 * PER_SEGMENT, body_size=BODY)
    q = open_queue(path, max_bytes_per_file=MAX_BYTES)
    put_each(q, msgs)
    q.close()
    assert len(segment_paths(path)) == 4
    return msgs


def _edit_positions(path: Path, **changes: object) -> None:
    doc = json.loads((path / POSITIONS).read_text())
    doc.update(changes)
    (path / POSITIONS).write_text(json.dumps(doc))


# -- a disk queue's segments ----------------------------------------------------------------


@pytest.mark.parametrize("how", ["empty", "zeroed"])
def test_queue_empty_or_zeroed_middle_segment_is_damage(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, how: str
) -> None:
    msgs = _queue_of_four_segments(tmp_path)
    middle = segment_paths(tmp_path)[1]
    size = middle.stat().st_size
    middle.write_bytes(b"" if how == "empty" else bytes(size))
    with caplog.at_level(logging.ERROR, logger="lmqd.storage"):
        q = open_queue(tmp_path, max_bytes_per_file=MAX_BYTES)
    assert keys(drain(q)) == keys(msgs[:3] + msgs[6:])
    damage = q.damage
    assert damage.corrupt_count == 1
    assert damage.corrupt_bytes == (0 if how == "empty" else size)
    # The positions file recorded a depth of 12 and the segments hold 9: exactly 3 lost.
    assert damage.lost_messages == 3
    assert damage.rebuilt_count == 0
    assert [p.name for p in bad_files(tmp_path)] == [f"{middle.name}.bad-0"]
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and middle.name in errors[0].getMessage()
    q.close()


def test_queue_region_found_while_reading_counts_its_messages_exactly(tmp_path: Path) -> None:
    msgs = _queue_of_four_segments(tmp_path)
    q = open_queue(tmp_path, max_bytes_per_file=MAX_BYTES)
    assert q.damage.corrupt_count == 0
    # Rot after start-up: the second record of the third segment and the one after it.
    third = segment_paths(tmp_path)[2]
    data = bytearray(third.read_bytes())
    data[SEGMENT_HEADER_SIZE + RECORD + 50] ^= 0xFF
    data[SEGMENT_HEADER_SIZE + 2 * RECORD + 50] ^= 0xFF
    third.write_bytes(data)
    assert keys(drain(q)) == keys(msgs[:7] + msgs[9:])
    damage = q.damage
    assert (damage.corrupt_count, damage.corrupt_bytes, damage.lost_messages) == (1, 2 * RECORD, 2)
    q.close()


def test_queue_flipped_record_at_start_up_estimates_from_its_prefix(tmp_path: Path) -> None:
    msgs = _queue_of_four_segments(tmp_path)
    second = segment_paths(tmp_path)[1]
    data = bytearray(second.read_bytes())
    data[SEGMENT_HEADER_SIZE + 60] ^= 0xFF  # a body byte: the length and count are intact
    second.write_bytes(data)
    q = open_queue(tmp_path, max_bytes_per_file=MAX_BYTES)
    assert keys(drain(q)) == keys(msgs[:3] + msgs[4:])
    assert (q.damage.corrupt_count, q.damage.lost_messages) == (1, 1)
    q.close()


# -- a disk queue's positions file ------------------------------------------------------------


def _consumed_one_segment(path: Path) -> list[Message]:
    """Four segments, the first one read (and deleted by the close's sync): 9 messages left."""
    msgs = _queue_of_four_segments(path)
    q = open_queue(path, max_bytes_per_file=MAX_BYTES)
    assert keys(q.read_many(3)) == keys(msgs[:3])
    q.close()
    assert len(segment_paths(path)) == 3
    return msgs[3:]


@pytest.mark.parametrize(
    "edit",
    [
        pytest.param({"read": [1, 10**6, 0]}, id="read-offset-past-the-file-end"),
        pytest.param({"read": [3, SEGMENT_HEADER_SIZE, 0]}, id="read-segment-ahead"),
        pytest.param({"read": [7, SEGMENT_HEADER_SIZE, 0], "write": [7, 64]}, id="no-such-segment"),
        pytest.param({"read": [2, 4, 0]}, id="read-offset-in-the-header"),
        pytest.param({"write": [10**9, SEGMENT_HEADER_SIZE]}, id="write-segment-far-past"),
        pytest.param({"read": [1, 2**64, 0]}, id="out-of-range-number"),
        pytest.param(
            {"read": [3, SEGMENT_HEADER_SIZE, 0], "write": [2, 64]}, id="read-ahead-of-write"
        ),
    ],
)
def test_queue_positions_that_disagree_are_rebuilt_from_the_segments(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, edit: dict[str, object]
) -> None:
    left = _consumed_one_segment(tmp_path)
    q = open_queue(tmp_path, max_bytes_per_file=MAX_BYTES)
    assert keys(q.read_many(1)) == keys(left[:1])  # read, but the position is not synced
    q.close()
    _edit_positions(tmp_path, **edit)
    with caplog.at_level(logging.WARNING, logger="lmqd.storage"):
        q = open_queue(tmp_path, max_bytes_per_file=MAX_BYTES)
    # Everything still on disk is delivered, from the oldest segment (one message again).
    assert len(segment_paths(tmp_path)) == 3
    assert keys(drain(q)) == keys(left)
    assert q.rebuilt_positions and q.damage.rebuilt_count == 1
    assert q.damage.corrupt_count == 0 and q.damage.lost_messages == 0
    assert any(p.name.startswith(POSITIONS + ".bad") for p in bad_files(tmp_path))
    assert "rebuilding positions from the segments" in caplog.text
    q.close()


def test_queue_positions_that_agree_are_kept(tmp_path: Path) -> None:
    left = _consumed_one_segment(tmp_path)
    q = open_queue(tmp_path, max_bytes_per_file=MAX_BYTES)
    assert keys(q.read_many(4)) == keys(left[:4])
    q.close()
    q = open_queue(tmp_path, max_bytes_per_file=MAX_BYTES)
    assert keys(drain(q)) == keys(left[4:])  # no rebuild, no redelivery
    assert not q.rebuilt_positions and q.damage.rebuilt_count == 0
    q.close()


# -- a topic log --------------------------------------------------------------------------------

LOG_BYTES = 600


def _log_of_segments(path: Path) -> tuple[list[Message], list[Path]]:
    msgs = stamped(40, body_size=BODY)
    log = open_log(path, max_bytes_per_file=LOG_BYTES)
    for m in msgs:
        log.append_many([m])
    log.create_cursor("c", "earliest")
    log.close()
    files = segment_files(path)
    assert len(files) >= 4
    return msgs, files


@pytest.mark.parametrize("how", ["empty", "zeroed"])
def test_log_empty_or_zeroed_middle_segment_is_damage(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, how: str
) -> None:
    msgs, files = _log_of_segments(tmp_path)
    middle = files[1]
    size = middle.stat().st_size
    middle.write_bytes(b"" if how == "empty" else bytes(size))
    with caplog.at_level(logging.ERROR, logger="lmqd.storage"):
        log = open_log(tmp_path, max_bytes_per_file=LOG_BYTES)
    cursor = log.cursor("c")
    assert cursor is not None
    got = entry_keys(read_all(cursor))
    # The middle segment's offsets are gone, as one run; every other message is intact.
    offsets = [entry[0] for entry in got]
    lost_from = next(i for i, o in enumerate(offsets) if o != i)
    lost_to = offsets[lost_from]
    assert 0 < lost_from < lost_to < len(msgs)
    assert got == expected(0, msgs[:lost_from]) + expected(lost_to, msgs[lost_to:])
    damage = log.damage
    assert damage.corrupt_count == 1
    assert damage.corrupt_bytes == (0 if how == "empty" else size)
    assert damage.lost_messages >= 1  # a lower bound: the segment's content is gone
    assert f"{middle.name}" in caplog.text
    log.close()


def _edit_state(path: Path, **changes: object) -> None:
    edit_state_file(path / STATE, **changes)


@pytest.mark.parametrize(
    "edit",
    [
        pytest.param({"write": [0, 10**6]}, id="write-offset-past-the-file-end"),
        pytest.param({"write": [10**9, 64]}, id="write-segment-far-past"),
        pytest.param({"write": [0, 3]}, id="write-offset-in-the-header"),
        pytest.param({"next_offset": 2**64}, id="out-of-range-number"),
    ],
)
def test_log_state_that_disagrees_is_set_aside_and_rebuilt(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, edit: dict[str, object]
) -> None:
    msgs, _ = _log_of_segments(tmp_path)
    _edit_state(tmp_path, **edit)
    with caplog.at_level(logging.WARNING, logger="lmqd.storage"):
        log = open_log(tmp_path, max_bytes_per_file=LOG_BYTES)
    # No mark of that file is trusted: the owner recreates its cursors at the earliest offset.
    assert log.rebuilt_state and log.damage.rebuilt_count == 1
    assert dict(log.cursors) == {}
    assert log.next_offset == len(msgs)
    again = log.create_cursor("c", "earliest")
    assert entry_keys(read_all(again)) == expected(0, msgs)
    assert any(p.name.startswith(STATE + ".bad") for p in bad_files(tmp_path))
    assert "rebuilding the log state from the segments" in caplog.text
    log.close()


@pytest.mark.parametrize(
    "edit",
    [
        pytest.param({"cursors": {"c": 30}}, id="cursor-moved-forward"),
        pytest.param({"next_offset": 41}, id="next-offset"),
        pytest.param({"crc": 1}, id="checksum"),
    ],
)
def test_log_state_edited_by_hand_is_set_aside_and_rebuilt(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, edit: dict[str, object]
) -> None:
    """A state file whose checksum does not match its content: no mark of it is trusted (a
    cursor moved forward inside the log would skip messages and look right)."""
    msgs, _ = _log_of_segments(tmp_path)
    edit_state_file(tmp_path / STATE, resign=False, **edit)
    with caplog.at_level(logging.WARNING, logger="lmqd.storage"):
        log = open_log(tmp_path, max_bytes_per_file=LOG_BYTES)
    assert log.rebuilt_state and log.damage.rebuilt_count == 1
    assert dict(log.cursors) == {}
    again = log.create_cursor("c", "earliest")
    assert entry_keys(read_all(again)) == expected(0, msgs)
    assert "its checksum does not match its content (edited or damaged)" in caplog.text
    assert any(p.name.startswith(STATE + ".bad") for p in bad_files(tmp_path))
    log.close()


def test_log_state_without_a_checksum_is_read_as_before(tmp_path: Path) -> None:
    """An older lmqd's state file has no ``crc``: its marks are checked as they always were."""
    _log_of_segments(tmp_path)
    doc = json.loads((tmp_path / STATE).read_text())
    del doc["crc"]
    doc["cursors"] = {"c": 12}
    (tmp_path / STATE).write_text(json.dumps(doc))
    log = open_log(tmp_path, max_bytes_per_file=LOG_BYTES)
    assert not log.rebuilt_state
    cursor = log.cursor("c")
    assert cursor is not None and cursor.position == 12
    log.close()


def test_log_cursor_past_the_end_reads_everything_again(tmp_path: Path) -> None:
    msgs, _ = _log_of_segments(tmp_path)
    _edit_state(tmp_path, cursors={"c": 10**6})
    log = open_log(tmp_path, max_bytes_per_file=LOG_BYTES)
    cursor = log.cursor("c")
    assert cursor is not None
    assert entry_keys(read_all(cursor)) == expected(0, msgs)
    assert log.damage.rebuilt_count == 1 and not log.rebuilt_state
    log.close()


def test_a_segment_that_lost_its_unsynced_header_is_not_a_disagreement(tmp_path: Path) -> None:
    # empty() and a new log write a segment's header without an fsync before the positions:
    # after a power cut the file may be empty while the positions point just past its header.
    q = open_queue(tmp_path, max_bytes_per_file=MAX_BYTES)
    q.put_many(make_messages(2, body_size=BODY))
    q.empty()
    q.close()
    (newest,) = segment_paths(tmp_path)
    newest.write_bytes(b"")
    q = open_queue(tmp_path, max_bytes_per_file=MAX_BYTES)
    assert not q.rebuilt_positions and q.damage.rebuilt_count == 0 and q.depth == 0
    q.close()
    log = open_log(tmp_path / "log")
    log.close()
    (segment,) = segment_files(tmp_path / "log")
    segment.write_bytes(b"")
    log = open_log(tmp_path / "log")
    assert not log.rebuilt_state and log.damage.rebuilt_count == 0
    log.close()

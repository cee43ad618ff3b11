"""What recovery notes of the stored messages' lmq extensions (``ext_notes.py``), and the log's
floor for the dedup windows (``keep_recent_ms``).

Rules for this module: real files in ``tmp_path``; the tests' own record encoder
(``record_encoders.py``, written from the format's tables) makes the records read back; a crash
is ``crash_copy`` (what the OS holds at a kill -9), a restart a close and a new open.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lmqd.message import Message
from lmqd.message_ext import MessageExt, encode_ext, ttl_and_dedup_id
from lmqd.storage.decoder import extension_blocks
from lmqd.storage.ext_notes import ExtensionNotes
from lmqd.storage.record import Record

from .log_helpers import open_log, read_all, segment_files, stamped
from .record_encoders import encode_batch, encode_record
from .storage_helpers import crash_copy, make_messages, open_queue

ID_EXT = MessageExt(dedup_id=b"order-1")
TTL_EXT = MessageExt(priority=2, ttl_ms=1500, headers=(("k", "v"),))


def _record(n: int, ts: int, ext: MessageExt | None) -> Record:
    return Record(b"%016x" % n, ts, 0, 0, b"body-%d" % n, None,
                  encode_ext(ext) if ext is not None else None)  # fmt: skip


@pytest.mark.parametrize(
    ("ext", "fields"),
    [
        (MessageExt(), (0, b"")),
        (MessageExt(priority=9, ttl_ms=7, dedup_id=b"x" * 255, headers=(("a", "b"),)),
         (7, b"x" * 255)),
        (MessageExt(dedup_id=b"only"), (0, b"only")),
        (MessageExt(ttl_ms=2**32 - 1, headers=(("h", "v"),)), (2**32 - 1, b"")),
    ],
)  # fmt: skip
def test_ttl_and_dedup_id_read_the_first_fields(ext: MessageExt, fields: tuple[int, bytes]) -> None:
    assert ttl_and_dedup_id(encode_ext(ext)) == fields


@pytest.mark.parametrize("block", [b"", b"\x02\x00\x00", b"\x04\x05abc", b"\x80", b"\x04"])
def test_a_block_that_does_not_parse_gives_nothing(block: bytes) -> None:
    assert ttl_and_dedup_id(block) == (0, b"")


def test_extension_blocks_of_a_batch_and_of_a_single_message_record() -> None:
    batch = encode_batch([_record(0, 10, None), _record(1, 11, ID_EXT), _record(2, 12, TTL_EXT)])
    assert extension_blocks(batch, 0, len(batch)) == [
        (11, encode_ext(ID_EXT)), (12, encode_ext(TTL_EXT)),
    ]  # fmt: skip
    plain = encode_batch([_record(0, 10, None), _record(1, 11, None)])
    assert extension_blocks(plain, 0, len(plain)) == []
    single = encode_record(b"%016x" % 5, 99, 0, 0, b"b", None, encode_ext(ID_EXT))
    assert extension_blocks(single, 0, len(single)) == [(99, encode_ext(ID_EXT))]
    assert extension_blocks(encode_record(b"%016x" % 5, 99, 0, 0, b"b"), 0, len(single)) == []


def test_notes_keep_the_newest_ids_and_see_a_ttl() -> None:
    notes = ExtensionNotes(keep_ids=2)
    for n in range(4):
        data = encode_batch([_record(n, 100 + n, MessageExt(dedup_id=b"id-%d" % n))])
        notes.visit(memoryview(data), 0, len(data), 1)
    assert not notes.message_ttls
    assert list(notes.dedup_ids) == [(102, b"id-2"), (103, b"id-3")]
    data = encode_batch([_record(9, 1, TTL_EXT)])
    notes.visit(memoryview(data), 0, len(data), 1)
    assert notes.message_ttls


def _with(messages: list[Message], exts: dict[int, MessageExt]) -> list[Message]:
    for i, ext in exts.items():
        messages[i].ext = ext
    return messages


@pytest.mark.parametrize("how", ["restart", "crash"])
def test_a_log_reopened_tells_its_ttls_and_newest_ids(tmp_path: Path, how: str) -> None:
    live = tmp_path / "live"
    log = open_log(live, max_bytes_per_file=500)
    messages = stamped(40, body_size=20)
    for i in range(0, 40, 4):
        messages[i].ext = MessageExt(dedup_id=b"id-%d" % i)
    messages[33].ext = TTL_EXT
    for i in range(0, 40, 5):  # several records and segments
        log.append_many(messages[i : i + 5])
    assert len(segment_files(live)) > 2
    assert not log.stored_message_ttls and log.take_recovered_ids() == []
    if how == "crash":
        path = crash_copy(live, tmp_path / "crash")
    else:
        log.close()
        path = live
    again = open_log(path, recover_ids=3)
    assert again.stored_message_ttls
    assert again.take_recovered_ids() == [
        (messages[i].timestamp, b"id-%d" % i) for i in (28, 32, 36)
    ]
    assert again.take_recovered_ids() == []  # handed over once
    again.close()
    if how == "crash":
        log.close()


def test_a_log_without_extensions_notes_nothing(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.append_many(_with(stamped(10), {3: MessageExt(priority=4)}))  # a priority is no TTL
    log.close()
    again = open_log(tmp_path, recover_ids=100)
    assert not again.stored_message_ttls
    assert again.take_recovered_ids() == []
    again.close()


def test_a_disk_queue_reopened_tells_whether_it_holds_ttls(tmp_path: Path) -> None:
    q = open_queue(tmp_path / "a")
    q.put_many(_with(make_messages(5), {2: MessageExt(ttl_ms=10)}))
    q.close()
    q = open_queue(tmp_path / "a")
    assert q.stored_message_ttls
    q.close()
    q = open_queue(tmp_path / "b")
    q.put_many(_with(make_messages(5), {2: MessageExt(dedup_id=b"x", headers=(("h", "v"),))}))
    crashed = open_queue(crash_copy(tmp_path / "b", tmp_path / "b2"))
    assert not crashed.stored_message_ttls
    crashed.close()
    q.close()


def test_the_floor_keeps_passed_segments_while_their_newest_message_is_young(
    tmp_path: Path,
) -> None:
    log = open_log(tmp_path, max_bytes_per_file=400)
    msgs = stamped(60, body_size=30)  # message i: epoch + i us
    cursor = log.create_cursor("c", "earliest")
    log.append_many(msgs)
    read_all(cursor, settle=True)
    files = segment_files(tmp_path)
    assert len(files) > 3
    log.keep_recent_ms = 10
    log.sync(now_ns=msgs[-1].timestamp)
    assert segment_files(tmp_path) == files  # all within 10 ms
    # 10 ms after message 30: the segments whose newest message is older go, not the others.
    log.sync(now_ns=msgs[30].timestamp + 10 * 10**6)
    left = segment_files(tmp_path)
    assert 1 < len(left) < len(files)
    assert 20 < log.earliest_offset <= 31
    log.keep_recent_ms = None
    log.sync(now_ns=msgs[30].timestamp + 10 * 10**6)
    assert len(segment_files(tmp_path)) == 1
    log.close()

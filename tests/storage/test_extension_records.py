"""Messages with an lmq extension (``Message.ext``) on disk: written in option blocks, read back
whole, through a disk queue, a topic log, restarts and a crash copy; plain messages unchanged.

Rules for this module: real files in ``tmp_path``; the tests' own record encoder
(``record_encoders.py``, written from the format's tables) is the oracle for the bytes.
"""

from __future__ import annotations

import hashlib
import struct
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from lmqd.message import Message
from lmqd.message_ext import MessageExt, decode_ext, encode_ext
from lmqd.storage import TopicLog
from lmqd.storage.atrest.compression import Compression
from lmqd.storage.decoder import decode_any, decode_batch
from lmqd.storage.encoder import encode_entries, encode_options, frame_batches, plan_batches
from lmqd.storage.record import BATCH_OVERHEAD, SEGMENT_HEADER_SIZE, Record

from .record_encoders import encode_batch
from .storage_helpers import (
    WALL_EPOCH_NS,
    FakeTimeBase,
    crash_copy,
    drain,
    make_messages,
    open_queue,
)

TB = FakeTimeBase()
EXT = MessageExt(priority=5, ttl_ms=30_000, dedup_id=b"row-7", headers=(("trace", "t-1"),))


def _with_ext(messages: list[Message], every: int = 2) -> list[Message]:
    for i, m in enumerate(messages):
        if i % every == 0:
            m.ext = MessageExt(priority=i % 9 + 1, headers=(("n", str(i)),))
    return messages


def _full(m: Message) -> tuple[object, ...]:
    return (m.id, m.body, m.timestamp, m.attempts, m.deliver_at, m.ext)


def test_a_batch_with_extensions_has_the_format_tables_bytes() -> None:
    messages = make_messages(3)
    messages[1].ext = EXT
    entries, bodies = encode_entries(messages, TB.to_wall_ns)
    options = encode_options(messages)
    assert options is not None
    [[batch]] = plan_batches(bodies, SEGMENT_HEADER_SIZE, 1 << 20, BATCH_OVERHEAD, options)
    data = bytes(frame_batches(entries, bodies, [batch], None, options))
    oracle = encode_batch(
        [
            Record(m.id, m.timestamp, m.attempts, 0, m.body, None,
                   encode_ext(m.ext) if m.ext is not None else None)
            for m in messages
        ]
    )
    assert data == oracle
    records, _ = decode_any(data)
    assert [r.headers for r in records] == [None, encode_ext(EXT), None]


# Extensions as a publish hands them to storage: none, one object shared by the publish, one
# decoded per message (a dedup id each, the block kept), one made in the daemon (no block).
def _decoded(ext: MessageExt) -> MessageExt:
    return decode_ext(encode_ext(ext))


_SHARED = _decoded(EXT)
_EXTENSIONS = st.one_of(
    st.none(),
    st.just(_SHARED),
    st.binary(min_size=1, max_size=40).map(lambda i: _decoded(MessageExt(dedup_id=i))),
    st.integers(1, 9).map(lambda p: MessageExt(priority=p)),
)


@given(st.lists(_EXTENSIONS, min_size=1, max_size=12))
@example([_decoded(MessageExt(dedup_id=b"q:0:0:%d" % i)) for i in range(3)])
def test_option_blocks_are_the_format_tables_bytes_for_any_mix_of_extensions(
    exts: list[MessageExt | None],
) -> None:
    """``encode_options`` builds the records of distinct decoded extensions from their blocks
    by C loops, and of the others one distinct object at a time: the same bytes either way."""
    messages = make_messages(len(exts))
    for m, ext in zip(messages, exts, strict=True):
        m.ext = ext
    options = encode_options(messages)
    if all(ext is None for ext in exts):
        assert options is None
        return
    assert options is not None
    entries, bodies = encode_entries(messages, TB.to_wall_ns)
    [[batch]] = plan_batches(bodies, SEGMENT_HEADER_SIZE, 1 << 20, BATCH_OVERHEAD, options)
    data = bytes(frame_batches(entries, bodies, [batch], None, options))
    assert data == encode_batch(
        [
            Record(
                m.id, m.timestamp, m.attempts, 0, m.body, None,
                encode_ext(m.ext) if m.ext is not None else None,
            )
            for m in messages
        ]
    )  # fmt: skip


def test_plain_messages_write_no_option_blocks() -> None:
    messages = make_messages(4)
    assert encode_options(messages) is None
    entries, bodies = encode_entries(messages, TB.to_wall_ns)
    [[batch]] = plan_batches(bodies, SEGMENT_HEADER_SIZE, 1 << 20)
    assert frame_batches(entries, bodies, [batch])[5] == 0  # batch flags


def test_a_disk_queue_keeps_extensions_across_a_restart_and_a_crash(tmp_path: Path) -> None:
    messages = _with_ext(make_messages(50, body_size=40), every=3)
    q = open_queue(tmp_path / "live", max_bytes_per_file=1000)
    q.put_many(messages[:20])
    for m in messages[20:]:
        q.put_many([m])
    q.sync()
    crashed = open_queue(crash_copy(tmp_path / "live", tmp_path / "crash"))
    q.close()
    restarted = open_queue(tmp_path / "live")
    for queue in (crashed, restarted):
        assert [_full(m) for m in drain(queue)] == [_full(m) for m in messages]
        queue.close()


def test_a_topic_log_keeps_extensions_for_its_cursors(tmp_path: Path) -> None:
    messages = _with_ext(make_messages(30, body_size=20))
    log = TopicLog("t", tmp_path, timebase=TB, max_bytes_per_file=600)
    log.create_cursor("c", "earliest")
    log.append_many(messages)
    log.close()
    log = TopicLog("t", tmp_path, timebase=TB, max_bytes_per_file=600)
    cursor = log.cursor("c")
    assert cursor is not None
    got = cursor.read_many(100)
    assert [_full(m) for _, m in got] == [_full(m) for m in messages]
    log.close()


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_a_publish_appended_from_its_columns_is_written_as_its_messages_would_be(
    tmp_path: Path, compression: str
) -> None:
    """``append_plain`` with extensions (a backlog's XPUB: no message object made) writes the
    very bytes ``append_many`` writes for the same messages -- distinct dedup-id blocks, a
    shared block, none -- across several segments, plain or compressed, and reads back whole."""
    ts = WALL_EPOCH_NS
    exts = [MessageExt(dedup_id=b"q/%d" % i) if i % 3 else (SHARED if i % 2 else None)
            for i in range(40)]  # fmt: skip
    ids = [b"%016x" % i for i in range(40)]
    bodies = [b"m%d." % i + hashlib.sha256(b"%d" % i).digest()[:16] for i in range(40)]
    messages = [Message(i, b, ts, 0, 0.0, ext=e) for i, b, e in zip(ids, bodies, exts, strict=True)]
    codec = Compression.parse(compression)
    logs = {}
    for how in ("messages", "columns"):
        log = TopicLog(how, tmp_path / how, timebase=TB, max_bytes_per_file=700, compression=codec)
        log.create_cursor("c", "earliest")
        if how == "messages":
            log.append_many(messages[:25], timestamp=ts)
            log.append_many(messages[25:], timestamp=ts)
        else:
            log.append_plain(ids[:25], bodies[:25], ts, 0, exts[:25])
            log.append_plain(ids[25:], bodies[25:], ts, 25, exts[25:])
        logs[how] = log
    files = {how: sorted((tmp_path / how).glob("*.dat")) for how in logs}
    assert len(files["columns"]) > 1
    assert [f.read_bytes() for f in files["columns"]] == [f.read_bytes() for f in files["messages"]]
    for log in logs.values():
        log.close()
    log = TopicLog("columns", tmp_path / "columns", timebase=TB)
    cursor = log.cursor("c")
    assert cursor is not None
    got = [m for _, m in cursor.read_many(100)]
    assert [_full(m) for m in got] == [_full(m) for m in messages]
    assert [m.ext.block if m.ext else None for m in got] == [
        encode_ext(e) if e else None for e in exts
    ]
    log.close()


SHARED = MessageExt(headers=(("h0", "v0"), ("h1", "v1"), ("h2", "v2")))


def test_the_reader_decodes_option_blocks_as_the_general_form() -> None:
    # The reader's fast path (option blocks that are only extension blocks) against the
    # oracle's bytes: shared and distinct blocks, messages without one, a block that does not
    # decode (its message kept, without extension), reads from the middle of the batch; and
    # a batch with another optional field (an expiry), which takes the general path.
    messages = make_messages(7)
    exts = [SHARED, SHARED, None, MessageExt(priority=3), SHARED, b"\xff", None]
    expected = [(m.id, m.body, e if isinstance(e, MessageExt) else None)
                for m, e in zip(messages, exts, strict=True)]  # fmt: skip
    for expires in (None, 1234):
        records = [
            Record(m.id, m.timestamp, m.attempts, 0, m.body, expires if k == 3 else None,
                   encode_ext(e) if isinstance(e, MessageExt) else e)
            for k, (m, e) in enumerate(zip(messages, exts, strict=True))
        ]  # fmt: skip
        data = encode_batch(records)
        for skip in (0, 1, 3):
            for ack_mode in (False, True):
                got = decode_batch(data, memoryview(data), 0, len(data), 0, TB.from_wall_ns,
                                   ack_mode, skip=skip)  # fmt: skip
                assert got is not None
                assert [(m.id, m.body, m.ext) for m in got] == expected[skip:]
        whole = decode_batch(data, memoryview(data), 0, len(data), 0, TB.from_wall_ns, False)
        assert whole is not None and whole[0].ext is whole[1].ext is whole[4].ext


def test_the_reader_refuses_option_blocks_that_run_past_the_batch() -> None:
    messages = make_messages(2)
    records = [Record(m.id, m.timestamp, m.attempts, 0, m.body, None, encode_ext(SHARED))
               for m in messages]  # fmt: skip
    data = bytearray(encode_batch(records))
    crc_at = len(data) - 4
    # The last option block's length one byte longer than what is left before the CRC: a
    # writer bug under a matching CRC (the reader checks the CRC before decoding).
    last_len_at = crc_at - len(encode_ext(SHARED)) - 4
    struct.pack_into(">I", data, last_len_at, len(encode_ext(SHARED)) + 1)
    buf = bytes(data)
    assert decode_batch(buf, memoryview(buf), 0, len(buf), 0, TB.from_wall_ns, False) is None

"""The daemon's one encoder and one decoder (lmqd/storage/encoder.py, decoder.py), as units.

Rules for this module: no files, no trio; bytes in, bytes or messages out. The tests' own
encoders (``record_encoders.py``, written from the format's tables) are the oracle the daemon's
encoder is checked against, and the source of the records it never writes (option blocks,
single-message records) that its decoder must still read.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lmqd.message import Message
from lmqd.storage.decoder import decode_any, decode_batch, decode_message
from lmqd.storage.encoder import encode_entries, frame_batches, plan_batches
from lmqd.storage.record import (
    BATCH_ENTRY_SIZE,
    BATCH_OVERHEAD,
    MAX_BATCH_BYTES,
    SEGMENT_HEADER_SIZE,
    Record,
)
from lmqd.storage.tokens import StoredMessage, record_token, token_index, token_position
from lmqd.storage.verify import verify_record

from .record_encoders import encode_batch, encode_record
from .storage_helpers import FakeTimeBase

TB = FakeTimeBase()
ID = b"0123456789abcdef"


def _fields(m: Message) -> tuple[Any, ...]:
    return (type(m), m.id, m.body, m.timestamp, m.attempts, m.deliver_at)


def _encode_one_batch(messages: list[Message]) -> bytes:
    entries, bodies = encode_entries(messages, TB.to_wall_ns)
    return bytes(frame_batches(entries, bodies, [(0, len(messages), _payload(bodies))]))


def _payload(bodies: list[bytes]) -> int:
    return len(bodies) * BATCH_ENTRY_SIZE + sum(map(len, bodies))


message_fields = st.tuples(
    st.binary(min_size=16, max_size=16),
    st.binary(max_size=200),
    st.integers(-(2**63), 2**63 - 1),
    st.integers(0, 0xFFFF),
    st.sampled_from([0.0, 1.5, 3600.0]),
)


@given(st.lists(message_fields, min_size=1, max_size=30))
def test_the_daemon_encoder_writes_what_the_format_tables_say(fields: list[Any]) -> None:
    messages = [Message(*f) for f in fields]
    records = [
        Record(m.id, m.timestamp, m.attempts, TB.to_wall_ns(m.deliver_at) if m.deliver_at else 0,
               m.body)
        for m in messages
    ]  # fmt: skip
    assert _encode_one_batch(messages) == encode_batch(records)


def test_attempts_past_the_field_width_saturate() -> None:
    data = _encode_one_batch([Message(ID, b"a", 1, 70000), Message(ID, b"b", 2, 3)])
    assert [r.attempts for r in decode_any(data)[0]] == [0xFFFF, 3]


@pytest.mark.parametrize("attempts", [0, 70000])  # the fast loop and the saturating one
def test_a_message_id_of_the_wrong_length_is_refused(attempts: int) -> None:
    with pytest.raises(ValueError, match="16 bytes"):
        encode_entries([Message(ID, b"", 1, attempts), Message(b"short", b"", 1)], TB.to_wall_ns)


def test_several_batches_of_one_segment_are_framed_in_one_buffer() -> None:
    messages = [Message(b"%016d" % i, b"m%d" % i, i) for i in range(5)]
    entries, bodies = encode_entries(messages, TB.to_wall_ns)
    batches = [(0, 2, _payload(bodies[:2])), (2, 5, _payload(bodies[2:]))]
    data = bytes(frame_batches(entries, bodies, batches))
    first_end, count = verify_record(data, 0, len(data))
    assert count == 2
    assert verify_record(data, first_end, len(data)) == (len(data), 3)
    assert data == _encode_one_batch(messages[:2]) + _encode_one_batch(messages[2:])


# -- plan_batches: where a call's records go ----------------------------------------------------


def _sizes(chunks: list[list[tuple[int, int, int]]]) -> list[list[int]]:
    """Messages per batch, per segment."""
    return [[end - first for first, end, _ in batches] for batches in chunks]


def test_a_call_that_fits_is_one_batch_in_the_write_segment() -> None:
    bodies = [b"x" * 10] * 7
    assert plan_batches(bodies, SEGMENT_HEADER_SIZE, 1 << 20) == [[(0, 7, 7 * (38 + 10))]]


def test_batches_are_split_evenly_at_the_batch_cap() -> None:
    n = 900  # 900 x (38 + 1000) bytes: 3.6 batches' worth
    assert 3 * MAX_BATCH_BYTES < n * (BATCH_ENTRY_SIZE + 1000) < 4 * (MAX_BATCH_BYTES - 14)
    chunks = plan_batches([b"x" * 1000] * n, SEGMENT_HEADER_SIZE, 1 << 30)
    assert len(chunks) == 1 and len(chunks[0]) == 4
    assert sum(_sizes(chunks)[0]) == n
    assert max(_sizes(chunks)[0]) - min(_sizes(chunks)[0]) <= 1
    assert all(BATCH_OVERHEAD + size <= MAX_BATCH_BYTES for *_, size in chunks[0])


def test_a_full_segment_rolls_and_the_write_segment_may_get_nothing() -> None:
    record = BATCH_OVERHEAD + BATCH_ENTRY_SIZE + 100  # one message of 100 bytes, batched alone
    max_bytes = SEGMENT_HEADER_SIZE + 2 * record
    bodies = [b"x" * 100] * 3
    # Room for one more message's batch in the write segment, then a new segment.
    assert _sizes(plan_batches(bodies, SEGMENT_HEADER_SIZE + record, max_bytes)) == [[1], [2]]
    # No room at all: the write segment's chunk is empty; a new segment holds two.
    assert _sizes(plan_batches(bodies, max_bytes - 10, max_bytes)) == [[], [2], [1]]


def test_a_message_larger_than_a_segment_gets_a_segment_of_its_own() -> None:
    max_bytes = SEGMENT_HEADER_SIZE + 200
    bodies = [b"s", b"x" * 1000, b"t"]
    chunks = plan_batches(bodies, SEGMENT_HEADER_SIZE, max_bytes)
    assert _sizes(chunks) == [[1], [1], [1]]


# -- the reader's decoders: records to messages -------------------------------------------------


def test_decode_batch_builds_messages_with_deadlines_on_the_trio_clock() -> None:
    messages = [Message(b"%016d" % i, b"m%d" % i, i, i, 2.5 * i) for i in range(4)]
    data = _encode_one_batch(messages)
    got = decode_batch(data, memoryview(data), 0, len(data), 0, TB.from_wall_ns, False)
    assert got is not None
    assert [_fields(m) for m in got] == [_fields(m) for m in messages]


def test_decode_batch_in_acknowledgement_mode_numbers_the_tokens() -> None:
    messages = [Message(b"%016d" % i, b"m%d" % i, i) for i in range(3)]
    data = _encode_one_batch(messages)
    first = record_token(7, 4096)
    got = decode_batch(data, memoryview(data), 0, len(data), first, TB.from_wall_ns, True)
    assert got is not None and all(isinstance(m, StoredMessage) for m in got)
    tokens = [m.token for m in got if isinstance(m, StoredMessage)]
    assert [token_position(t) for t in tokens] == [(7, 4096)] * 3
    assert [token_index(t) for t in tokens] == [0, 1, 2]


@pytest.mark.parametrize("ack_mode", [False, True])
def test_option_blocks_and_single_message_records_decode_to_the_same_messages(
    ack_mode: bool,
) -> None:
    records = [
        Record(ID, 1, 2, TB.to_wall_ns(1.5), b"a"),
        Record(ID, 3, 4, 0, b"bb", expires_ns=99, headers=b"h"),
    ]
    batch = encode_batch(records)  # with option blocks: the general decoder's path
    got = decode_batch(batch, memoryview(batch), 0, len(batch), 40, TB.from_wall_ns, ack_mode)
    singles = [encode_record(*r) for r in records]
    one_by_one = []
    for k, rec in enumerate(singles):
        decoded = decode_message(rec, 0, len(rec), 40 + k, TB.from_wall_ns, ack_mode)
        assert decoded is not None
        one_by_one += decoded
    kind = StoredMessage if ack_mode else Message
    expected = [(kind, ID, b"a", 1, 2, 1.5), (kind, ID, b"bb", 3, 4, 0.0)]
    assert got is not None
    assert [_fields(m) for m in got] == [_fields(m) for m in one_by_one] == expected
    if ack_mode:
        assert [m.token for m in got if isinstance(m, StoredMessage)] == [40, 41]


def test_a_batch_whose_lengths_lie_decodes_to_none() -> None:
    # The reader checks the CRC first, so only a writer bug makes such a batch; the entries'
    # body lengths must still end exactly at the CRC.
    data = bytearray(_encode_one_batch([Message(ID, b"abc", 1), Message(ID, b"de", 2)]))
    second = 10 + BATCH_ENTRY_SIZE
    data[10:14] = (4).to_bytes(4, "big")
    data[second : second + 4] = (1).to_bytes(4, "big")
    buf = bytes(data)
    got = decode_batch(buf, memoryview(buf), 0, len(buf), 0, TB.from_wall_ns, False)
    assert got is not None and [m.body for m in got] == [b"abcd", b"e"]
    data[10:14] = (9).to_bytes(4, "big")  # now the bodies run past the CRC
    buf = bytes(data)
    assert decode_batch(buf, memoryview(buf), 0, len(buf), 0, TB.from_wall_ns, False) is None

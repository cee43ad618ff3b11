"""The on-disk record and segment header format (lmqd/storage/record.py, docs/storage.md).

The records are built by the tests' own encoders (``record_encoders.py``, written from the
format's tables) and read back by the daemon's decoder (``decoder.py``) and verifier
(``verify.py``).
"""

from __future__ import annotations

import struct
from typing import Any

import pytest
from crc32c import crc32c
from hypothesis import given
from hypothesis import strategies as st

from lmqd.storage.decoder import decode_any, decode_record, decode_records
from lmqd.storage.record import (
    BATCH_ENTRY,
    BATCH_FLAG_OPTIONS,
    BATCH_OVERHEAD,
    FLAG_EXPIRY,
    FLAG_HEADERS,
    FORMAT_VERSION,
    MIN_RECORD_LENGTH,
    RECORD_OVERHEAD,
    SEGMENT_HEADER_SIZE,
    SEGMENT_MAGIC,
    FormatError,
    Record,
    UnsupportedVersion,
    decode_segment_header,
    encode_segment_header,
)
from lmqd.storage.verify import check_record, find_next_record, verify_record

from .record_encoders import encode_batch, encode_record, encode_records, frame_batch

ID = b"0123456789abcdef"


def test_record_byte_layout_matches_the_documentation() -> None:
    rec = encode_record(ID, 0x0102030405060708, 3, 0x1112131415161718, b"hello")
    assert len(rec) == RECORD_OVERHEAD + 5 == 49
    (length,) = struct.unpack(">I", rec[:4])
    assert length == len(rec) - 4
    assert rec[4] == 0x4D  # type 'M'
    assert rec[5] == 0  # no optional fields
    assert rec[6:22] == ID
    assert rec[22:30] == bytes.fromhex("0102030405060708")
    assert rec[30:32] == b"\x00\x03"
    assert rec[32:40] == bytes.fromhex("1112131415161718")
    assert rec[40:45] == b"hello"
    assert rec[45:] == struct.pack(">I", crc32c(rec[4:45]))


def test_optional_fields_follow_the_fixed_part_in_flag_order() -> None:
    rec = encode_record(ID, 1, 0, 0, b"b", expires_ns=99, headers=b"hh")
    assert rec[5] == FLAG_EXPIRY | FLAG_HEADERS
    assert rec[40:52] == struct.pack(">Iq", 8, 99)
    assert rec[52:58] == struct.pack(">I", 2) + b"hh"
    assert rec[58:59] == b"b"
    record, end = decode_record(rec)
    assert end == len(rec)
    assert record == Record(ID, 1, 0, 0, b"b", 99, b"hh")


def test_unknown_flag_bits_are_skipped_by_their_length() -> None:
    # A future writer adds field 0x08; this reader must still find the body.
    body = b"payload"
    fixed = struct.pack(">BB16sqHq", 0x4D, 0x08, ID, 5, 1, 0)
    payload = fixed + struct.pack(">I", 3) + b"new" + body
    rec = struct.pack(">I", len(payload) + 4) + payload + struct.pack(">I", crc32c(payload))
    record, _ = decode_record(rec)
    assert record.body == body
    assert record.expires_ns is None and record.headers is None


def test_attempts_saturate_at_the_field_width() -> None:
    record, _ = decode_record(encode_record(ID, 1, 70000, 0, b""))
    assert record.attempts == 0xFFFF


def test_message_id_must_be_16_bytes() -> None:
    with pytest.raises(ValueError):
        encode_record(b"short", 1, 0, 0, b"")


def record_fields(body_size: int, header_size: int) -> st.SearchStrategy[tuple[Any, ...]]:
    """A ``Record``'s fields: id, timestamp, attempts, deliver-after, body, expiry, headers."""
    return st.tuples(
        st.binary(min_size=16, max_size=16),
        st.integers(-(2**63), 2**63 - 1),
        st.integers(0, 0xFFFF),
        st.integers(-(2**63), 2**63 - 1),
        st.binary(max_size=body_size),
        st.none() | st.integers(-(2**63), 2**63 - 1),
        st.none() | st.binary(max_size=header_size),
    )


@given(record_fields(300, 50))
def test_record_round_trip(fields: tuple[Any, ...]) -> None:
    original = Record(*fields)
    encoded = encode_record(*original)
    decoded, end = decode_record(encoded)
    assert decoded == original
    assert end == len(encoded)
    assert check_record(encoded, 0, len(encoded)) == len(encoded)


def test_batch_encode_and_scan_decode() -> None:
    records = [Record(b"%016d" % i, i, i, 0, b"x" * i) for i in range(50)]
    buf = encode_records(records)
    decoded, end = decode_records(buf)
    assert decoded == records
    assert end == len(buf)
    # Decoding stops at the first incomplete record.
    decoded, end = decode_records(buf[:-1])
    assert decoded == records[:-1]
    assert end == len(buf) - len(encode_record(*records[-1]))


def _assert_every_truncation_torn_and_every_flip_invalid(rec: bytes) -> None:
    for cut in range(len(rec)):
        assert check_record(rec, 0, cut) == -1, cut
    for i in range(len(rec)):
        damaged = bytearray(rec)
        damaged[i] ^= 0x10
        assert check_record(bytes(damaged), 0, len(rec)) < 0, i


def test_every_truncation_is_torn_and_every_byte_flip_is_invalid() -> None:
    _assert_every_truncation_torn_and_every_flip_invalid(
        encode_record(ID, 7, 1, 0, b"some body bytes")
    )


def test_impossible_lengths_are_invalid_not_torn() -> None:
    rec = encode_record(ID, 7, 1, 0, b"")
    too_short = struct.pack(">I", MIN_RECORD_LENGTH - 1) + rec[4:]
    assert check_record(too_short, 0, len(too_short)) == -2
    huge = struct.pack(">I", 0xFFFFFFFF) + rec[4:]
    assert check_record(huge, 0, len(huge)) == -2


def test_find_next_record_skips_garbage_including_fake_type_bytes() -> None:
    good = encode_record(ID, 1, 0, 0, b"MMMM")
    garbage = b"\x00\x00\x00\x30M" + b"M" * 20 + b"\xff" * 7
    buf = garbage + good + good
    assert find_next_record(buf, 0, len(buf)) == len(garbage)
    assert find_next_record(buf, len(garbage) + 1, len(buf)) == len(garbage) + len(good)
    assert find_next_record(garbage, 0, len(garbage)) == -1


def test_segment_header_round_trip_and_layout() -> None:
    header = encode_segment_header(42, 123456789)
    assert len(header) == SEGMENT_HEADER_SIZE
    assert header[:8] == SEGMENT_MAGIC
    assert header[8:12] == struct.pack(">HH", FORMAT_VERSION, SEGMENT_HEADER_SIZE)
    assert header[12:20] == struct.pack(">Q", 42)
    assert header[20:28] == struct.pack(">q", 123456789)
    assert header[28:] == struct.pack(">I", crc32c(header[:28]))
    decoded = decode_segment_header(header)
    assert (decoded.version, decoded.segment, decoded.created_ns) == (2, 42, 123456789)


def test_segment_header_rejects_damage_and_newer_versions() -> None:
    header = encode_segment_header(1, 0)
    with pytest.raises(FormatError):
        decode_segment_header(header[:31])
    with pytest.raises(FormatError):
        decode_segment_header(b"X" + header[1:])
    flipped = bytearray(header)
    flipped[15] ^= 1
    with pytest.raises(FormatError):
        decode_segment_header(bytes(flipped))
    older = header[:8] + struct.pack(">H", 1) + header[10:28]
    older += struct.pack(">I", crc32c(older))
    assert decode_segment_header(older).version == 1  # before batch records: still read
    newer = header[:8] + struct.pack(">H", 3) + header[10:28]
    newer += struct.pack(">I", crc32c(newer))
    with pytest.raises(UnsupportedVersion):
        decode_segment_header(newer)


# -- batch records ('B'), what the disk queue writes --------------------------------------------


def test_batch_byte_layout_matches_the_documentation() -> None:
    rec = encode_batch(
        [
            Record(ID, 0x0102030405060708, 3, 0x1112131415161718, b"hello"),
            Record(b"fedcba9876543210", 9, 70000, 0, b""),
        ]
    )
    assert len(rec) == BATCH_OVERHEAD + 2 * 38 + 5 == 95
    (length,) = struct.unpack(">I", rec[:4])
    assert length == len(rec) - 4
    assert rec[4] == 0x42  # type 'B'
    assert rec[5] == 0  # no option blocks
    assert rec[6:10] == struct.pack(">I", 2)  # count
    # The fixed entries, contiguous: body length, id, timestamp, attempts, deliver-after.
    assert rec[10:14] == struct.pack(">I", 5)
    assert rec[14:30] == ID
    assert rec[30:38] == bytes.fromhex("0102030405060708")
    assert rec[38:40] == b"\x00\x03"
    assert rec[40:48] == bytes.fromhex("1112131415161718")
    assert rec[48:86] == BATCH_ENTRY.pack(0, b"fedcba9876543210", 9, 0xFFFF, 0)  # saturated
    assert rec[86:91] == b"hello"  # then the bodies, in order
    assert rec[91:] == struct.pack(">I", crc32c(rec[4:91]))
    assert verify_record(rec, 0, len(rec)) == (len(rec), 2)


def test_batch_option_blocks_follow_the_bodies() -> None:
    records = [
        Record(ID, 1, 0, 0, b"a"),
        Record(ID, 2, 0, 0, b"bb", expires_ns=99, headers=b"hh"),
        Record(ID, 3, 0, 0, b"c", headers=b""),
    ]
    rec = encode_batch(records)
    assert rec[5] == BATCH_FLAG_OPTIONS
    options = rec[10 + 3 * 38 + 4 : -4]
    assert options == (
        b"\x00"
        + bytes([FLAG_EXPIRY | FLAG_HEADERS])
        + struct.pack(">Iq", 8, 99)
        + struct.pack(">I", 2)
        + b"hh"
        + bytes([FLAG_HEADERS])
        + struct.pack(">I", 0)
    )
    assert decode_any(rec) == (records, len(rec))


@given(st.lists(record_fields(200, 20), min_size=1, max_size=20))
def test_batch_round_trip(fields: list[tuple[Any, ...]]) -> None:
    records = [Record(*f) for f in fields]
    rec = encode_batch(records)
    assert decode_any(rec) == (records, len(rec))
    assert verify_record(rec, 0, len(rec)) == (len(rec), len(records))


def test_records_of_both_types_decode_in_order() -> None:
    singles = [Record(b"%016d" % i, i, 0, 0, b"s%d" % i) for i in range(3)]
    batch = [Record(b"%016d" % i, i, 1, 0, b"b%d" % i) for i in range(3, 8)]
    buf = encode_records(singles[:2]) + encode_batch(batch) + encode_records(singles[2:])
    decoded, end = decode_records(buf)
    assert decoded == singles[:2] + batch + singles[2:]
    assert end == len(buf)


def test_every_truncation_of_a_batch_is_torn_and_every_byte_flip_is_invalid() -> None:
    _assert_every_truncation_torn_and_every_flip_invalid(
        encode_batch([Record(b"%016d" % i, i, 1, 0, b"body %d" % i) for i in range(4)])
    )


def _framed(count: int, *sections: bytes, flags: int = 0) -> bytes:
    head, crc = frame_batch(count, flags, sections)
    return b"".join([head, *sections, crc])


def test_a_batch_whose_structure_lies_is_invalid_even_with_a_good_crc() -> None:
    entry = BATCH_ENTRY.pack(3, ID, 1, 0, 0)
    assert check_record(_framed(1, entry, b"abc"), 0, 55) == 55
    assert check_record(_framed(2, entry, b"abc"), 0, 55) == -2  # entries past the end
    assert check_record(_framed(1, entry, b"abcd"), 0, 56) == -2  # bytes left over
    assert check_record(_framed(1, entry, b"ab"), 0, 54) == -2  # bodies past the end
    assert check_record(_framed(0, entry, b"abc"), 0, 55) == -2  # count 0
    # An unknown batch flag bit may add data after the bodies: it is skipped.
    assert check_record(_framed(1, entry, b"abc", b"new", flags=0x80), 0, 58) == 58
    with pytest.raises(FormatError):
        decode_record(_framed(1, entry, b"abc"))  # decode_record is for 'M' records


def test_find_next_record_finds_batches_after_garbage() -> None:
    good = encode_batch([Record(ID, 1, 0, 0, b"BBMM"), Record(ID, 2, 0, 0, b"B")])
    single = encode_record(ID, 3, 0, 0, b"x")
    garbage = b"\x00\x00\x00\x30B" + b"BM" * 20 + b"\xff" * 7
    buf = garbage + good + single + good
    assert find_next_record(buf, 0, len(buf)) == len(garbage)
    assert find_next_record(buf, len(garbage) + 1, len(buf)) == len(garbage) + len(good)
    assert find_next_record(buf, len(garbage) + len(good) + 1, len(buf)) == len(buf) - len(good)
    assert find_next_record(garbage, 0, len(garbage)) == -1

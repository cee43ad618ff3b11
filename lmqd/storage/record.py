"""The on-disk format: segment file header and message records (docs/storage.md has the tables).

Every integer is big-endian. A segment file is one 32-byte header followed by records::

    segment header (32 bytes)
      0   8  magic  b"\\x89LMQSEG\\n"
      8   2  format version (1)
     10   2  header length (32; a later version may grow the header, readers skip to this offset)
     12   8  segment number
     20   8  created, wall-clock nanoseconds
     28   4  CRC32C of bytes 0..28

    record (44 bytes + optional fields + body)
      0   4  length L: bytes after this field, CRC included
      4   1  type (0x4D "M": message)
      5   1  flags: one bit per optional field present
      6  16  message id
     22   8  timestamp, int64 ns since the epoch
     30   2  attempts, uint16
     32   8  deliver-after, int64 wall-clock ns (0 = not deferred)
     40   .  optional fields, in flag-bit order, each [uint32 length][value]
      .   .  body
    L   4  CRC32C of bytes 4..L (everything after the length, before the CRC)

Optional fields are length-prefixed so a reader can skip a field whose flag bit it does not know;
a change that an old reader must not ignore bumps the format version in the segment header.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Sequence
from typing import NamedTuple

from crc32c import crc32c

from lmqd.message import MSG_ID_LENGTH

SEGMENT_MAGIC = b"\x89LMQSEG\n"
FORMAT_VERSION = 1
SEGMENT_HEADER_SIZE = 32

TYPE_MESSAGE = 0x4D
"""'M': readable at offset 4 of every record in a hex dump of a segment."""

FLAG_EXPIRY = 0x01
"""Optional field: int64 wall-clock ns after which the message is dropped (reserved for TTL)."""
FLAG_HEADERS = 0x02
"""Optional field: opaque header bytes (reserved for message headers)."""

RECORD_PREFIX_SIZE = 40
"""Length field plus the fixed fields, up to the optional fields."""
RECORD_OVERHEAD = RECORD_PREFIX_SIZE + 4
"""A record's size beyond its body when no optional field is present."""
MIN_RECORD_LENGTH = RECORD_OVERHEAD - 4
"""The smallest valid value of the length field."""
MAX_RECORD_LENGTH = 256 * 1024 * 1024
"""Largest length field accepted on read. Deliberately independent of --max-msg-size, so that
lowering that option never turns stored messages into "corrupt" ones (a go-diskqueue trap);
it only bounds the memory a damaged length field can make a reader allocate."""

MAX_ATTEMPTS = 0xFFFF

_SEGMENT_HEADER = struct.Struct(">8sHHQq")
_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")
RECORD_PREFIX = struct.Struct(">IBB16sqHq")
"""The fixed record prefix: length, type, flags, id, timestamp, attempts, deliver-after."""
_PREFIX = RECORD_PREFIX
_CRC_ABOUT_HEADER = _SEGMENT_HEADER.size  # the header CRC covers bytes 0..28


Buffer = bytes | bytearray | memoryview | mmap.mmap
"""Anything the decoders read from: a read-ahead buffer or a whole segment mapped in memory."""


class FormatError(ValueError):
    """Bytes that are not a valid segment header or record."""


class UnsupportedVersion(FormatError):
    """A segment written by a newer format version than this build reads."""


class SegmentHeader(NamedTuple):
    """A decoded segment file header."""

    version: int
    header_length: int
    segment: int
    created_ns: int


class Record(NamedTuple):
    """One decoded record (the general form; the disk queue's hot path decodes in place)."""

    id: bytes
    timestamp: int
    attempts: int
    deliver_after_ns: int
    body: bytes
    expires_ns: int | None = None
    headers: bytes | None = None


def encode_segment_header(segment: int, created_ns: int) -> bytes:
    """The 32-byte header that starts segment file ``segment``."""
    head = _SEGMENT_HEADER.pack(
        SEGMENT_MAGIC, FORMAT_VERSION, SEGMENT_HEADER_SIZE, segment, created_ns
    )
    return head + _U32.pack(crc32c(head))


def decode_segment_header(data: bytes) -> SegmentHeader:
    """Parse and verify a segment header; raises ``FormatError`` (``UnsupportedVersion``)."""
    if len(data) < SEGMENT_HEADER_SIZE:
        raise FormatError(f"short segment header ({len(data)} bytes)")
    magic, version, header_length, segment, created_ns = _SEGMENT_HEADER.unpack_from(data)
    if magic != SEGMENT_MAGIC:
        raise FormatError("bad segment magic")
    (crc,) = _U32.unpack_from(data, _CRC_ABOUT_HEADER)
    if crc != crc32c(data[:_CRC_ABOUT_HEADER]):
        raise FormatError("segment header checksum mismatch")
    if version != FORMAT_VERSION:
        raise UnsupportedVersion(f"segment format version {version} (this build reads 1)")
    if header_length != SEGMENT_HEADER_SIZE:
        raise FormatError(f"bad segment header length {header_length}")
    return SegmentHeader(version, header_length, segment, created_ns)


def _optional_fields(expires_ns: int | None, headers: bytes | None) -> tuple[int, bytes]:
    flags = 0
    parts = []
    if expires_ns is not None:
        flags |= FLAG_EXPIRY
        parts.append(_U32.pack(8) + _I64.pack(expires_ns))
    if headers is not None:
        flags |= FLAG_HEADERS
        parts.append(_U32.pack(len(headers)) + headers)
    return flags, b"".join(parts)


def record_parts(
    msg_id: bytes,
    timestamp: int,
    attempts: int,
    deliver_after_ns: int,
    body: bytes,
    expires_ns: int | None = None,
    headers: bytes | None = None,
) -> tuple[bytes, bytes, bytes]:
    """A record as three pieces (prefix with optional fields, body, CRC) to join with others.

    Returning pieces lets a batch be joined once, so a body is copied once on its way to disk.
    """
    if len(msg_id) != MSG_ID_LENGTH:
        raise ValueError(f"message id must be {MSG_ID_LENGTH} bytes")
    if expires_ns is None and headers is None:
        flags, extra = 0, b""
    else:
        flags, extra = _optional_fields(expires_ns, headers)
    length = RECORD_OVERHEAD - 4 + len(extra) + len(body)
    prefix = _PREFIX.pack(
        length,
        TYPE_MESSAGE,
        flags,
        msg_id,
        timestamp,
        min(attempts, MAX_ATTEMPTS),
        deliver_after_ns,
    )
    if extra:
        prefix += extra
    crc = crc32c(body, crc32c(prefix[4:]))
    return prefix, body, _U32.pack(crc)


def encode_record(
    msg_id: bytes,
    timestamp: int,
    attempts: int,
    deliver_after_ns: int,
    body: bytes,
    expires_ns: int | None = None,
    headers: bytes | None = None,
) -> bytes:
    """One record as bytes."""
    return b"".join(
        record_parts(msg_id, timestamp, attempts, deliver_after_ns, body, expires_ns, headers)
    )


def encode_records(records: Sequence[Record]) -> bytes:
    """Many records in one buffer (a single join: the batch path)."""
    parts: list[bytes] = []
    extend = parts.extend
    for r in records:
        extend(record_parts(*r))
    return b"".join(parts)


def parse_optional_fields(
    buf: Buffer, offset: int, end: int, flags: int
) -> tuple[int | None, bytes | None, int]:
    """Decode the optional fields at ``offset``; returns (expires_ns, headers, body offset).

    Unknown flag bits are skipped by their length prefix. Raises ``FormatError`` if a field runs
    past ``end`` (the CRC offset).
    """
    expires_ns: int | None = None
    headers: bytes | None = None
    bit = 1
    while flags >= bit:
        if flags & bit:
            if offset + 4 > end:
                raise FormatError("optional field header past the record end")
            (n,) = _U32.unpack_from(buf, offset)
            offset += 4
            if offset + n > end:
                raise FormatError("optional field past the record end")
            if bit == FLAG_EXPIRY:
                if n != 8:
                    raise FormatError("bad expiry field length")
                (expires_ns,) = _I64.unpack_from(buf, offset)
            elif bit == FLAG_HEADERS:
                headers = bytes(buf[offset : offset + n])
            offset += n
        bit <<= 1
    return expires_ns, headers, offset


def check_record(buf: Buffer, offset: int, end: int) -> int:
    """Verify the record at ``offset`` (bounded by ``end``) and return the offset after it.

    Returns ``-1`` if the bytes up to ``end`` are a valid *beginning* of a record that ends past
    ``end`` (what a torn write leaves), and ``-2`` if the record is invalid (bad length, type or
    checksum). Never raises for bad data.
    """
    if offset + 4 > end:
        return -1
    length: int = _U32.unpack_from(buf, offset)[0]
    if not MIN_RECORD_LENGTH <= length <= MAX_RECORD_LENGTH:
        return -2
    rec_end = offset + 4 + length
    if offset + 5 <= end and buf[offset + 4] != TYPE_MESSAGE:
        return -2
    if rec_end > end:
        return -1
    (crc,) = _U32.unpack_from(buf, rec_end - 4)
    with memoryview(buf) as whole, whole[offset + 4 : rec_end - 4] as view:
        if crc32c(view) != crc:
            return -2
    flags: int = buf[offset + 5]
    if flags:
        try:
            parse_optional_fields(buf, offset + RECORD_PREFIX_SIZE, rec_end - 4, flags)
        except FormatError:
            return -2
    return rec_end


def decode_record(buf: bytes | memoryview, offset: int = 0) -> tuple[Record, int]:
    """Decode and verify one record; returns it and the offset after it. Raises FormatError."""
    end = check_record(buf, offset, len(buf))
    if end == -1:
        raise FormatError("truncated record")
    if end < 0:
        raise FormatError("invalid record")
    _, _, flags, msg_id, timestamp, attempts, deliver = _PREFIX.unpack_from(buf, offset)
    body_at = offset + RECORD_PREFIX_SIZE
    expires_ns: int | None = None
    headers: bytes | None = None
    if flags:
        expires_ns, headers, body_at = parse_optional_fields(buf, body_at, end - 4, flags)
    body = bytes(buf[body_at : end - 4])
    return Record(msg_id, timestamp, attempts, deliver, body, expires_ns, headers), end


def decode_records(buf: bytes | memoryview, offset: int = 0) -> tuple[list[Record], int]:
    """Decode records from ``offset`` until the first that is incomplete or invalid.

    Returns the records and the offset where decoding stopped (``len(buf)`` if all were valid).
    """
    out: list[Record] = []
    end = len(buf)
    while offset < end:
        try:
            record, next_offset = decode_record(buf, offset)
        except FormatError:
            break
        out.append(record)
        offset = next_offset
    return out, offset


def find_next_record(buf: bytes | mmap.mmap, start: int, end: int) -> int:
    """The first offset in ``[start, end)`` where a complete, valid record begins, or ``-1``.

    Used to resynchronise after a corrupt region: candidates are found by the type byte (a C
    search), and each is accepted only if its length fits and its CRC32C matches, so a false
    match needs a 1 in 2**32 coincidence.
    """
    type_byte = bytes((TYPE_MESSAGE,))
    i = start + 4
    while True:
        i = buf.find(type_byte, i, end)
        if i < 0:
            return -1
        if check_record(buf, i - 4, end) > 0:
            return i - 4
        i += 1

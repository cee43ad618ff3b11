"""The on-disk format: segment file header and message records (docs/storage.md has the tables).

Every integer is big-endian. A segment file is one 32-byte header followed by records::

    segment header (32 bytes)
      0   8  magic  b"\\x89LMQSEG\\n"
      8   2  format version (2; version 1 segments hold only "M" records, still read)
     10   2  header length (32; a later version may grow the header, readers skip to this offset)
     12   8  segment number
     20   8  created, wall-clock nanoseconds
     28   4  CRC32C of bytes 0..28

    batch record (what the disk queue writes: N messages, one CRC)
      0   4  length L: bytes after this field, CRC included
      4   1  type (0x42 "B": batch)
      5   1  batch flags (0x01: an options section follows the bodies)
      6   4  count N of messages, uint32 (1 .. MAX_BATCH_COUNT)
     10   .  N entries of 38 bytes, one per message, in order:
               0  4  body length, uint32
               4 16  message id
              20  8  timestamp, int64 ns since the epoch
              28  2  attempts, uint16
              30  8  deliver-after, int64 wall-clock ns (0 = not deferred)
      .   .  the N bodies, concatenated in order
      .   .  if flag 0x01: N option blocks, in order, each
               [uint8 flags][optional fields in flag-bit order, each [uint32 length][value]]
    L   4  CRC32C of bytes 4..L (everything after the length, before the CRC)

    message record (the format before batches; still read, no longer written)
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

A batch's fixed entries are contiguous so that a reader unpacks all of them with one
``struct.iter_unpack`` (a C loop) and then only slices bodies and builds messages; one CRC32C
covers the whole batch, so a damaged or torn batch is one bad region, whatever N.

Optional fields are length-prefixed so a reader can skip a field whose flag bit it does not know;
unknown batch flag bits are ignored (a new bit may only add data after the option blocks); a
change that an old reader must not ignore bumps the format version in the segment header.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Sequence
from operator import itemgetter
from typing import NamedTuple

from crc32c import crc32c

from lmqd.message import MSG_ID_LENGTH

SEGMENT_MAGIC = b"\x89LMQSEG\n"
FORMAT_VERSION = 2
"""The version this build writes: 2 since batch records. An older build reads version 1 only, so
it leaves a version-2 segment untouched instead of taking its batches for corruption."""
READABLE_VERSIONS = (1, 2)
SEGMENT_HEADER_SIZE = 32

TYPE_MESSAGE = 0x4D
"""'M': one message per record (the format before batches; still read, no longer written)."""
TYPE_BATCH = 0x42
"""'B': a batch of messages under one CRC (what the disk queue writes). The type byte is readable
at offset 4 of every record in a hex dump of a segment."""
RECORD_TYPES = (TYPE_MESSAGE, TYPE_BATCH)

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

BATCH_HEADER = struct.Struct(">IBBI")
"""A batch record's header: length, type, batch flags, message count."""
BATCH_HEADER_SIZE = BATCH_HEADER.size
BATCH_OVERHEAD = BATCH_HEADER_SIZE + 4
"""A batch record's size beyond its entries, bodies and option blocks."""
BATCH_ENTRY = struct.Struct(">I16sqHq")
"""One message's fixed part in a batch: body length, id, timestamp, attempts, deliver-after."""
BATCH_ENTRY_SIZE = BATCH_ENTRY.size
BATCH_OF_ONE_OVERHEAD = BATCH_OVERHEAD + BATCH_ENTRY_SIZE
"""A batch record holding one message: its size beyond the body (52 bytes)."""
BATCH_FLAG_OPTIONS = 0x01
"""Batch flag: an option block per message follows the bodies."""
MAX_BATCH_COUNT = (1 << 24) - 1
"""Largest message count accepted on read (more than a 256 MiB record can hold; the disk queue's
tokens give the index inside a batch 24 bits)."""
MAX_BATCH_BYTES = 256 * 1024
"""Writers start a new batch record once one would pass this many bytes (a single larger message
gets a batch of its own): the disk queue's read-ahead size, so a reader needs one read per batch
and never a huge one, and a partly read batch holds a bounded number of decoded messages."""

_SEGMENT_HEADER = struct.Struct(">8sHHQq")
_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")
RECORD_PREFIX = struct.Struct(">IBB16sqHq")
"""The fixed record prefix: length, type, flags, id, timestamp, attempts, deliver-after."""
_PREFIX = RECORD_PREFIX
_ENTRY_LENGTHS = struct.Struct(">I34x")
"""Just the body length of each batch entry, for checking a batch's structure in C."""
_first = itemgetter(0)
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
    if version not in READABLE_VERSIONS:
        raise UnsupportedVersion(
            f"segment format version {version} (this build reads {READABLE_VERSIONS})"
        )
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
    """Many single-message ('M') records in one buffer (the format before batches)."""
    parts: list[bytes] = []
    extend = parts.extend
    for r in records:
        extend(record_parts(*r))
    return b"".join(parts)


def frame_batch(count: int, flags: int, sections: Sequence[bytes]) -> tuple[bytes, bytes]:
    """The header and the CRC that turn a batch's ``sections`` into a record.

    ``sections`` are the bytes between the header and the CRC (entries, bodies, option blocks),
    in order; the record is ``header + b"".join(sections) + crc``.
    """
    size = 0
    for section in sections:
        size += len(section)
    head = BATCH_HEADER.pack(BATCH_OVERHEAD - 4 + size, TYPE_BATCH, flags, count)
    crc = crc32c(head[4:])
    for section in sections:
        crc = crc32c(section, crc)
    return head, _U32.pack(crc)


def encode_batch(records: Sequence[Record]) -> bytes:
    """One batch ('B') record holding ``records`` in order (the general form, optional fields
    included; the disk queue's hot path builds the same bytes with ``frame_batch``)."""
    if not records:
        raise ValueError("a batch holds at least one message")
    entries = []
    bodies = []
    options = []
    for r in records:
        if len(r.id) != MSG_ID_LENGTH:
            raise ValueError(f"message id must be {MSG_ID_LENGTH} bytes")
        entries.append(
            BATCH_ENTRY.pack(
                len(r.body), r.id, r.timestamp, min(r.attempts, MAX_ATTEMPTS), r.deliver_after_ns
            )
        )
        bodies.append(r.body)
        if r.expires_ns is None and r.headers is None:
            options.append(b"\x00")
        else:
            field_flags, extra = _optional_fields(r.expires_ns, r.headers)
            options.append(bytes((field_flags,)) + extra)
    sections = [b"".join(entries), b"".join(bodies)]
    flags = 0
    if any(o != b"\x00" for o in options):
        flags = BATCH_FLAG_OPTIONS
        sections.append(b"".join(options))
    head, crc = frame_batch(len(records), flags, sections)
    return b"".join([head, *sections, crc])


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


def _batch_layout(buf: Buffer, offset: int, rec_end: int) -> tuple[int, int, int]:
    """(count, bodies offset, option blocks offset) of a batch whose CRC matched.

    Raises ``FormatError`` if its structure is inconsistent (entries or bodies past the end, a
    count out of range, bytes left over).
    """
    crc_at = rec_end - 4
    _, _, flags, count = BATCH_HEADER.unpack_from(buf, offset)
    if not 1 <= count <= MAX_BATCH_COUNT:
        raise FormatError(f"bad batch count {count}")
    entries_at = offset + BATCH_HEADER_SIZE
    bodies_at = entries_at + count * BATCH_ENTRY_SIZE
    if bodies_at > crc_at:
        raise FormatError("batch entries past the record end")
    with memoryview(buf) as whole, whole[entries_at:bodies_at] as entries:
        options_at = bodies_at + sum(map(_first, _ENTRY_LENGTHS.iter_unpack(entries)))
    if options_at > crc_at:
        raise FormatError("batch bodies past the record end")
    stop = options_at
    if flags & BATCH_FLAG_OPTIONS:
        for _ in range(count):
            if stop >= crc_at:
                raise FormatError("option block past the record end")
            stop = parse_optional_fields(buf, stop + 1, crc_at, buf[stop])[2]
    if stop != crc_at and not flags & ~BATCH_FLAG_OPTIONS:
        raise FormatError("bytes left over in a batch")
    return count, bodies_at, options_at


def verify_record(buf: Buffer, offset: int, end: int) -> tuple[int, int]:
    """Verify the record at ``offset`` (bounded by ``end``): (offset after it, message count).

    The offset is ``-1`` if the bytes up to ``end`` are a valid *beginning* of a record that ends
    past ``end`` (what a torn write leaves), and ``-2`` if the record is invalid (bad length,
    type, checksum or structure). Never raises for bad data.
    """
    if offset + 4 > end:
        return -1, 0
    length: int = _U32.unpack_from(buf, offset)[0]
    if not MIN_RECORD_LENGTH <= length <= MAX_RECORD_LENGTH:
        return -2, 0
    rec_end = offset + 4 + length
    typ = buf[offset + 4] if offset + 5 <= end else TYPE_BATCH
    if typ != TYPE_BATCH and typ != TYPE_MESSAGE:
        return -2, 0
    if rec_end > end:
        return -1, 0
    (crc,) = _U32.unpack_from(buf, rec_end - 4)
    with memoryview(buf) as whole, whole[offset + 4 : rec_end - 4] as view:
        if crc32c(view) != crc:
            return -2, 0
    try:
        if typ == TYPE_BATCH:
            return rec_end, _batch_layout(buf, offset, rec_end)[0]
        flags: int = buf[offset + 5]
        if flags:
            parse_optional_fields(buf, offset + RECORD_PREFIX_SIZE, rec_end - 4, flags)
    except FormatError:
        return -2, 0
    return rec_end, 1


def check_record(buf: Buffer, offset: int, end: int) -> int:
    """``verify_record`` without the count: the offset after the record, ``-1`` or ``-2``."""
    return verify_record(buf, offset, end)[0]


def decode_record(buf: bytes | memoryview, offset: int = 0) -> tuple[Record, int]:
    """Decode and verify one single-message ('M') record; returns it and the offset after it.

    Raises FormatError (also for a batch record: use ``decode_any``).
    """
    end = check_record(buf, offset, len(buf))
    if end == -1:
        raise FormatError("truncated record")
    if end < 0:
        raise FormatError("invalid record")
    if buf[offset + 4] != TYPE_MESSAGE:
        raise FormatError("not a single-message record")
    _, _, flags, msg_id, timestamp, attempts, deliver = _PREFIX.unpack_from(buf, offset)
    body_at = offset + RECORD_PREFIX_SIZE
    expires_ns: int | None = None
    headers: bytes | None = None
    if flags:
        expires_ns, headers, body_at = parse_optional_fields(buf, body_at, end - 4, flags)
    body = bytes(buf[body_at : end - 4])
    return Record(msg_id, timestamp, attempts, deliver, body, expires_ns, headers), end


def decode_batch_records(buf: Buffer, offset: int, rec_end: int) -> list[Record]:
    """The messages of the batch at ``offset`` whose CRC has been checked (general form).

    Raises ``FormatError`` if its structure is inconsistent.
    """
    count, bodies_at, options_at = _batch_layout(buf, offset, rec_end)
    flags: int = buf[offset + 5]
    out = []
    body_at = bodies_at
    opt_at = options_at
    for i in range(count):
        n, msg_id, timestamp, attempts, deliver = BATCH_ENTRY.unpack_from(
            buf, offset + BATCH_HEADER_SIZE + i * BATCH_ENTRY_SIZE
        )
        expires_ns: int | None = None
        headers: bytes | None = None
        if flags & BATCH_FLAG_OPTIONS:
            expires_ns, headers, opt_at = parse_optional_fields(
                buf, opt_at + 1, rec_end - 4, buf[opt_at]
            )
        body = bytes(buf[body_at : body_at + n])
        body_at += n
        out.append(Record(msg_id, timestamp, attempts, deliver, body, expires_ns, headers))
    return out


def decode_any(buf: Buffer, offset: int = 0) -> tuple[list[Record], int]:
    """Decode and verify the record at ``offset``, of either type: its messages and its end.

    Raises FormatError.
    """
    end = check_record(buf, offset, len(buf))
    if end == -1:
        raise FormatError("truncated record")
    if end < 0:
        raise FormatError("invalid record")
    if buf[offset + 4] == TYPE_BATCH:
        return decode_batch_records(buf, offset, end), end
    with memoryview(buf) as view:
        record, end = decode_record(view, offset)
    return [record], end


def decode_records(buf: Buffer, offset: int = 0) -> tuple[list[Record], int]:
    """Decode records of either type from ``offset`` until the first incomplete or invalid one.

    Returns the messages and the offset where decoding stopped (``len(buf)`` if all were valid).
    """
    out: list[Record] = []
    end = len(buf)
    while offset < end:
        try:
            records, next_offset = decode_any(buf, offset)
        except FormatError:
            break
        out.extend(records)
        offset = next_offset
    return out, offset


_TYPE_BYTES = tuple(bytes((t,)) for t in RECORD_TYPES)


def find_next_record(buf: bytes | bytearray | mmap.mmap, start: int, end: int) -> int:
    """The first offset in ``[start, end)`` where a complete, valid record begins, or ``-1``.

    Used to resynchronise after a corrupt region: candidates are found by the type bytes (a C
    search per type), and each is accepted only if its length fits and its CRC32C matches, so a
    false match needs a 1 in 2**32 coincidence.
    """
    # The next candidate of each type; the smaller one is tried first.
    find = buf.find
    nxt = [find(t, start + 4, end) for t in _TYPE_BYTES]
    while True:
        live = [i for i in nxt if i >= 0]
        if not live:
            return -1
        i = min(live)
        if check_record(buf, i - 4, end) > 0:
            return i - 4
        nxt = [find(t, i + 1, end) if n == i else n for t, n in zip(_TYPE_BYTES, nxt, strict=True)]

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

This module is the format's one home: its constants, the segment header and the decoded form of
a message (``Record``). The format has one encoder, ``encoder.py`` (batch records, what the disk
queue writes), and one decoder, ``decoder.py`` (every record type a segment of a readable version
holds); ``verify.py`` checks a record's bytes without decoding its messages.
"""

from __future__ import annotations

import mmap
import struct
from typing import NamedTuple

from crc32c import crc32c

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
"""The attempts field is a uint16: a writer saturates larger counts to this."""

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

U32 = struct.Struct(">I")
"""A length field or a CRC32C."""
I64 = struct.Struct(">q")
"""The expiry optional field's value."""
RECORD_PREFIX = struct.Struct(">IBB16sqHq")
"""The fixed prefix of an 'M' record: length, type, flags, id, timestamp, attempts, deliver."""
_SEGMENT_HEADER = struct.Struct(">8sHHQq")
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
    """One decoded message of a record, every field kept (``decoder.py``'s general form; the
    disk queue's reader decodes the common case straight into ``Message`` objects)."""

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
    return head + U32.pack(crc32c(head))


def decode_segment_header(data: bytes) -> SegmentHeader:
    """Parse and verify a segment header; raises ``FormatError`` (``UnsupportedVersion``)."""
    if len(data) < SEGMENT_HEADER_SIZE:
        raise FormatError(f"short segment header ({len(data)} bytes)")
    magic, version, header_length, segment, created_ns = _SEGMENT_HEADER.unpack_from(data)
    if magic != SEGMENT_MAGIC:
        raise FormatError("bad segment magic")
    (crc,) = U32.unpack_from(data, _CRC_ABOUT_HEADER)
    if crc != crc32c(data[:_CRC_ABOUT_HEADER]):
        raise FormatError("segment header checksum mismatch")
    if version not in READABLE_VERSIONS:
        raise UnsupportedVersion(
            f"segment format version {version} (this build reads {READABLE_VERSIONS})"
        )
    if header_length != SEGMENT_HEADER_SIZE:
        raise FormatError(f"bad segment header length {header_length}")
    return SegmentHeader(version, header_length, segment, created_ns)

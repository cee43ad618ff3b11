"""The on-disk format: segment file header and message records (docs/storage.md has the tables).

Every integer is big-endian. A segment file is one 32-byte header followed by records::

    segment header (32 bytes)
      0   8  magic  b"\\x89LMQSEG\\n"
      8   2  format version (2: a disk queue's; 3: a topic log's; 1: only "M" records, still read)
     10   2  header length (32; a later version may grow the header, readers skip to this offset)
     12   8  segment number
     20   8  version 1, 2: created, wall-clock nanoseconds
             version 3: base offset (the topic offset of the segment's first message)
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

    offset batch record (version 3, what a topic log writes): a batch record whose header also
    carries the topic offset of its first message; message k of the batch has offset first + k
      0   4  length L
      4   1  type (0x4F "O": offset batch)
      5   1  batch flags (as "B")
      6   4  count N of messages
     10   8  first offset, uint64
     18   .  N entries, the bodies, the option blocks, as in "B"
    L   4  CRC32C of bytes 4..L

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
"""The version a disk queue writes: 2 since batch records. An older build reads version 1 only,
so it leaves a version-2 segment untouched instead of taking its batches for corruption."""
SEALED_FORMAT_VERSION = 4
"""The version a disk queue writes while it seals its batches (compression or encryption at
rest, ``atrest/seal.py``): version 2's records plus sealed batches ('b'). A build that reads
versions 1 and 2 only leaves such a segment untouched instead of taking its sealed batches for
corruption; a queue that stops sealing starts a new version-2 segment."""
READABLE_VERSIONS = (1, 2, SEALED_FORMAT_VERSION)
"""The versions a disk queue reads. Not 3 or 5: a topic log's segments are not a queue's."""
LOG_FORMAT_VERSION = 3
"""The version a topic log (``log.py``) writes: offset batch records ('O') and a header whose
bytes 20..28 hold the segment's base offset. A build that reads versions 1 and 2 only leaves
such a segment untouched (it could not tell the offsets)."""
SEALED_LOG_FORMAT_VERSION = 5
"""The version a topic log writes while it seals its batches: version 3's records plus sealed
offset batches ('o'), its header as version 3's (base offset)."""
LOG_VERSIONS = (LOG_FORMAT_VERSION, SEALED_LOG_FORMAT_VERSION)
"""The versions whose header holds a base offset (a topic log's own segments)."""
LOG_READABLE_VERSIONS = (1, 2, 3, SEALED_LOG_FORMAT_VERSION)
"""The versions a topic log reads: its own, and a disk queue's segments (offsets assigned when
the log first opens them, see ``log_recovery.py``)."""
SEGMENT_HEADER_SIZE = 32

TYPE_MESSAGE = 0x4D
"""'M': one message per record (the format before batches; still read, no longer written)."""
TYPE_BATCH = 0x42
"""'B': a batch of messages under one CRC (what the disk queue writes). The type byte is readable
at offset 4 of every record in a hex dump of a segment."""
TYPE_OFFSET_BATCH = 0x4F
"""'O': a batch whose header carries the topic offset of its first message (version 3, what a
topic log writes)."""
TYPE_SEALED_BATCH = 0x62
"""'b': a 'B' record sealed at rest (compressed and/or encrypted, ``atrest/seal.py``)."""
TYPE_SEALED_OFFSET_BATCH = 0x6F
"""'o': an 'O' record sealed at rest; its first 18 bytes are laid out as an 'O' header's."""
SEALED_TYPES = (TYPE_SEALED_BATCH, TYPE_SEALED_OFFSET_BATCH)
PLAIN_TYPE_OF = {TYPE_SEALED_BATCH: TYPE_BATCH, TYPE_SEALED_OFFSET_BATCH: TYPE_OFFSET_BATCH}
"""The record type a sealed record holds."""
SEALED_TYPE_OF = {TYPE_BATCH: TYPE_SEALED_BATCH, TYPE_OFFSET_BATCH: TYPE_SEALED_OFFSET_BATCH}
RECORD_TYPES = (TYPE_MESSAGE, TYPE_BATCH)
"""The record types of segment versions 1 and 2 (a disk queue's)."""
LOG_RECORD_TYPES = (TYPE_OFFSET_BATCH,)
"""The record types of a version-3 segment (a topic log's)."""
SEALED_RECORD_TYPES = (TYPE_MESSAGE, TYPE_BATCH, TYPE_SEALED_BATCH)
"""The record types of a version-4 segment (a disk queue that seals)."""
SEALED_LOG_RECORD_TYPES = (TYPE_OFFSET_BATCH, TYPE_SEALED_OFFSET_BATCH)
"""The record types of a version-5 segment (a topic log that seals)."""
RECORD_TYPES_BY_VERSION = {
    1: RECORD_TYPES,
    2: RECORD_TYPES,
    3: LOG_RECORD_TYPES,
    4: SEALED_RECORD_TYPES,
    5: SEALED_LOG_RECORD_TYPES,
}
"""What a scanner accepts in a segment of each version. A segment whose header is damaged is
scanned for every type of the versions its reader reads (``types_for``)."""

FLAG_EXPIRY = 0x01
"""Optional field: int64 wall-clock ns after which the message is dropped (reserved for TTL)."""
FLAG_HEADERS = 0x02
"""Optional field: the message's lmq extension block (``lmqd.message_ext``: priority, TTL,
dedup id, headers)."""
FLAG_OFFSET = 0x04
"""Optional field: int64, the topic offset of a message a channel keeps in its own store (a
disk queue's copy of a message of the topic's log; never in a log's own records, whose header
has them). A mirror follows a channel's unfinished messages by offset (``lmqd.engine.holds``);
an older build skips the field by its length."""

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
OFFSET_BATCH_HEADER = struct.Struct(">IBBIQ")
"""An offset batch record's header: length, type, batch flags, message count, first offset. The
first 10 bytes are laid out as a batch header's, so one structure check serves both types."""
OFFSET_BATCH_HEADER_SIZE = OFFSET_BATCH_HEADER.size
OFFSET_BATCH_OVERHEAD = OFFSET_BATCH_HEADER_SIZE + 4
"""An offset batch record's size beyond its entries, bodies and option blocks (22 bytes)."""
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
    """Versions 1 and 2; 0 in version 3, whose header holds ``base_offset`` there instead."""
    base_offset: int = -1
    """Version 3: the topic offset of the segment's first message (-1 in older versions)."""


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
    offset: int = -1
    """The topic offset a disk queue's record carries (``FLAG_OFFSET``); -1: none."""


def header_offset_size(kind: int) -> int:
    """Bytes before the entries of a batch record of type ``kind`` ('B' or 'O'; for a sealed
    one, 'b' or 'o', the bytes before its seal header)."""
    if kind in (TYPE_OFFSET_BATCH, TYPE_SEALED_OFFSET_BATCH):
        return OFFSET_BATCH_HEADER_SIZE
    return BATCH_HEADER_SIZE


def log_record_types(sealed: bool) -> tuple[int, ...]:
    """The record types of a topic log's segment created now: version 5's if it seals, else 3's."""
    return SEALED_LOG_RECORD_TYPES if sealed else LOG_RECORD_TYPES


def types_for(readable: tuple[int, ...]) -> tuple[int, ...]:
    """Every record type a segment of one of the ``readable`` versions may hold."""
    out: list[int] = []
    for version in readable:
        out.extend(t for t in RECORD_TYPES_BY_VERSION[version] if t not in out)
    return tuple(out)


def encode_segment_header(
    segment: int, created_ns: int, *, base_offset: int | None = None, sealed: bool = False
) -> bytes:
    """The 32-byte header that starts segment file ``segment``: a disk queue's (version 2), or
    with ``base_offset`` a topic log's (version 3, the base offset where ``created`` was);
    ``sealed``: the segment may hold sealed batches (versions 4 and 5)."""
    if base_offset is None:
        version = SEALED_FORMAT_VERSION if sealed else FORMAT_VERSION
        head = _SEGMENT_HEADER.pack(
            SEGMENT_MAGIC, version, SEGMENT_HEADER_SIZE, segment, created_ns
        )
    else:
        version = SEALED_LOG_FORMAT_VERSION if sealed else LOG_FORMAT_VERSION
        head = _SEGMENT_HEADER.pack(
            SEGMENT_MAGIC, version, SEGMENT_HEADER_SIZE, segment, base_offset
        )
    return head + U32.pack(crc32c(head))


def decode_segment_header(
    data: bytes, readable: tuple[int, ...] = READABLE_VERSIONS
) -> SegmentHeader:
    """Parse and verify a segment header; raises ``FormatError`` (``UnsupportedVersion`` for a
    version not in ``readable``: by default a disk queue's, ``LOG_READABLE_VERSIONS`` for a
    topic log)."""
    if len(data) < SEGMENT_HEADER_SIZE:
        raise FormatError(f"short segment header ({len(data)} bytes)")
    magic, version, header_length, segment, created_ns = _SEGMENT_HEADER.unpack_from(data)
    if magic != SEGMENT_MAGIC:
        raise FormatError("bad segment magic")
    (crc,) = U32.unpack_from(data, _CRC_ABOUT_HEADER)
    if crc != crc32c(data[:_CRC_ABOUT_HEADER]):
        raise FormatError("segment header checksum mismatch")
    if version not in readable:
        raise UnsupportedVersion(f"segment format version {version} (readable: {readable})")
    if header_length != SEGMENT_HEADER_SIZE:
        raise FormatError(f"bad segment header length {header_length}")
    if version in LOG_VERSIONS:
        if created_ns < 0:
            raise FormatError(f"bad base offset {created_ns}")
        return SegmentHeader(version, header_length, segment, 0, created_ns)
    return SegmentHeader(version, header_length, segment, created_ns)

"""Checking a record's bytes (``record.py``'s format) without decoding its messages.

Which record types are valid depends on the segment's format version
(``record.RECORD_TYPES_BY_VERSION``): every function here takes the accepted ``types``, by
default a disk queue's ('M' and 'B'); a topic log's version-3 segments hold offset batches
('O'), which share the batch layout (their header is 8 bytes longer).

``verify_record`` answers, for the bytes at an offset, one of three things: a valid record ends
here (and holds this many messages), this is the valid *beginning* of a record whose end is
missing (what a torn write leaves), or this is not a record. It checks the length field, the type
byte, the CRC32C and, for a batch, that its structure adds up (``batch_layout``: entries, bodies
and option blocks end exactly at the CRC). A CRC that matches over a lying structure can only
come from a writer bug, but a reader must not trust it either.

``find_next_record`` resynchronises after a bad region. Recovery (``scan.py``), the reader's
repair and the general decoder (``decoder.py``) all verify through this module, so "valid" means
the same thing everywhere. Nothing here does I/O or raises for bad data, except
``parse_optional_fields`` and ``batch_layout``, which raise ``FormatError`` for their callers
to turn into a verdict.
"""

from __future__ import annotations

import mmap
import struct
from operator import itemgetter
from typing import TYPE_CHECKING

from crc32c import crc32c

from lmqd.message_ext import PRIORITY as EXT_HAS_PRIORITY
from lmqd.storage.record import (
    BATCH_ENTRY_SIZE,
    BATCH_FLAG_OPTIONS,
    BATCH_HEADER,
    FLAG_EXPIRY,
    FLAG_HEADERS,
    FLAG_OFFSET,
    I64,
    MAX_BATCH_COUNT,
    MAX_RECORD_LENGTH,
    MIN_RECORD_LENGTH,
    RECORD_PREFIX_SIZE,
    RECORD_TYPES,
    SEALED_TYPES,
    TYPE_MESSAGE,
    U32,
    Buffer,
    FormatError,
    header_offset_size,
)

if TYPE_CHECKING:
    from lmqd.storage.atrest.seal import Opener

_ENTRY_LENGTHS = struct.Struct(">I34x")
"""Just the body length of each batch entry, for checking a batch's structure in C."""
_first = itemgetter(0)
_TYPE_BYTES: dict[tuple[int, ...], tuple[bytes, ...]] = {}
"""Per set of accepted types, their bytes (what ``find_next_record`` searches for)."""


def _type_bytes(types: tuple[int, ...]) -> tuple[bytes, ...]:
    found = _TYPE_BYTES.get(types)
    if found is None:
        found = _TYPE_BYTES[types] = tuple(bytes((t,)) for t in types)
    return found


def parse_optional_fields(
    buf: Buffer, offset: int, end: int, flags: int
) -> tuple[int | None, bytes | None, int, int]:
    """Decode the optional fields at ``offset``; returns (expires_ns, headers, body offset,
    topic offset (-1: none)).

    Unknown flag bits are skipped by their length prefix. Raises ``FormatError`` if a field runs
    past ``end`` (the CRC offset).
    """
    expires_ns: int | None = None
    headers: bytes | None = None
    topic_offset = -1
    bit = 1
    while flags >= bit:
        if flags & bit:
            if offset + 4 > end:
                raise FormatError("optional field header past the record end")
            (n,) = U32.unpack_from(buf, offset)
            offset += 4
            if offset + n > end:
                raise FormatError("optional field past the record end")
            if bit == FLAG_EXPIRY:
                if n != 8:
                    raise FormatError("bad expiry field length")
                (expires_ns,) = I64.unpack_from(buf, offset)
            elif bit == FLAG_HEADERS:
                headers = bytes(buf[offset : offset + n])
            elif bit == FLAG_OFFSET:
                if n != 8:
                    raise FormatError("bad offset field length")
                (topic_offset,) = I64.unpack_from(buf, offset)
            offset += n
        bit <<= 1
    return expires_ns, headers, offset, topic_offset


def option_priorities(buf: Buffer, at: int, end: int, count: int) -> list[int]:
    """The lmq priority (0: none) in each of the ``count`` option blocks from ``at`` (a batch
    whose structure ``batch_layout`` checked): the extension block's first byte says whether a
    priority byte follows it (``lmqd.message_ext``). Reads nothing else of the messages."""
    out: list[int] = []
    stop = at
    for _ in range(count):
        flags = buf[stop]
        offset = stop + 1
        priority = 0
        bit = 1
        while flags >= bit:
            if flags & bit:
                (n,) = U32.unpack_from(buf, offset)
                offset += 4
                if bit == FLAG_HEADERS and n >= 2 and buf[offset] & EXT_HAS_PRIORITY:
                    priority = buf[offset + 1]
                offset += n
            bit <<= 1
        if offset > end:
            raise FormatError("option block past the record end")
        out.append(priority)
        stop = offset
    return out


def batch_layout(buf: Buffer, offset: int, rec_end: int) -> tuple[int, int, int]:
    """(count, bodies offset, option blocks offset) of a batch ('B' or 'O') whose CRC matched.

    Raises ``FormatError`` if its structure is inconsistent (entries or bodies past the end, a
    count out of range, bytes left over).
    """
    crc_at = rec_end - 4
    _, _, flags, count = BATCH_HEADER.unpack_from(buf, offset)
    if not 1 <= count <= MAX_BATCH_COUNT:
        raise FormatError(f"bad batch count {count}")
    entries_at = offset + header_offset_size(buf[offset + 4])
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


def verify_record(
    buf: Buffer,
    offset: int,
    end: int,
    types: tuple[int, ...] = RECORD_TYPES,
    opener: Opener | None = None,
) -> tuple[int, int]:
    """Verify the record at ``offset`` (bounded by ``end``): (offset after it, message count).
    ``types``: the record types valid here; ``opener``: how to open a sealed record
    (``atrest/seal.py``; without one a sealed record is checked by its CRC alone).

    The offset is ``-1`` if the bytes up to ``end`` are a valid *beginning* of a record that ends
    past ``end`` (what a torn write leaves), and ``-2`` if the record is invalid (bad length,
    type, checksum or structure; a sealed one that does not open). Never raises for bad data.
    """
    return verify_open(buf, offset, end, types, opener)[:2]


def verify_open(
    buf: Buffer,
    offset: int,
    end: int,
    types: tuple[int, ...] = RECORD_TYPES,
    opener: Opener | None = None,
) -> tuple[int, int, bytes | None]:
    """``verify_record``, and for a sealed record that ``opener`` opened, the plain record it
    holds (framed at offset 0, ``Opener.open``); None for a plain record."""
    if offset + 4 > end:
        return -1, 0, None
    length: int = U32.unpack_from(buf, offset)[0]
    if not MIN_RECORD_LENGTH <= length <= MAX_RECORD_LENGTH:
        return -2, 0, None
    rec_end = offset + 4 + length
    typ = buf[offset + 4] if offset + 5 <= end else types[-1]
    if typ not in types:
        return -2, 0, None
    if rec_end > end:
        return -1, 0, None
    (crc,) = U32.unpack_from(buf, rec_end - 4)
    with memoryview(buf) as whole, whole[offset + 4 : rec_end - 4] as view:
        if crc32c(view) != crc:
            return -2, 0, None
    try:
        if typ in SEALED_TYPES:
            if opener is None:
                return rec_end, BATCH_HEADER.unpack_from(buf, offset)[3], None
            plain = opener.open(buf, offset, rec_end)
            return rec_end, batch_layout(plain, 0, len(plain))[0], plain
        if typ != TYPE_MESSAGE:
            return rec_end, batch_layout(buf, offset, rec_end)[0], None
        flags: int = buf[offset + 5]
        if flags:
            parse_optional_fields(buf, offset + RECORD_PREFIX_SIZE, rec_end - 4, flags)
    except FormatError:
        return -2, 0, None
    return rec_end, 1, None


def check_record(
    buf: Buffer,
    offset: int,
    end: int,
    types: tuple[int, ...] = RECORD_TYPES,
    opener: Opener | None = None,
) -> int:
    """``verify_record`` without the count: the offset after the record, ``-1`` or ``-2``."""
    return verify_open(buf, offset, end, types, opener)[0]


def find_next_record(
    buf: bytes | bytearray | mmap.mmap,
    start: int,
    end: int,
    types: tuple[int, ...] = RECORD_TYPES,
) -> int:
    """The first offset in ``[start, end)`` where a complete, valid record begins, or ``-1``.

    Used to resynchronise after a corrupt region: candidates are found by the type bytes (a C
    search per type), and each is accepted only if its length fits and its CRC32C matches, so a
    false match needs a 1 in 2**32 coincidence.
    """
    # The next candidate of each type; the smaller one is tried first.
    find = buf.find
    type_bytes = _type_bytes(types)
    nxt = [find(t, start + 4, end) for t in type_bytes]
    while True:
        live = [i for i in nxt if i >= 0]
        if not live:
            return -1
        i = min(live)
        if check_record(buf, i - 4, end, types) > 0:
            return i - 4
        nxt = [find(t, i + 1, end) if n == i else n for t, n in zip(type_bytes, nxt, strict=True)]


def estimate_messages(buf: Buffer, types: tuple[int, ...] = RECORD_TYPES) -> int:
    """A lower bound on the messages a bad region held, for the damage counters.

    The region's records failed their checks, but their length prefixes and batch counts are
    often intact (a flipped bit in a body, a zeroed page in the middle): walk the prefixes while
    they are plausible (length in range, a valid type, a batch count in range) and add up their
    message counts. Where nothing plausible is left, the rest counts as one message: a region
    is damage only where a record was written, so it held at least one (an empty ``buf``
    counts none). Never raises.
    """
    size = len(buf)
    pos = 0
    count = 0
    while pos + 5 <= size:
        length: int = U32.unpack_from(buf, pos)[0]
        typ = buf[pos + 4]
        if not MIN_RECORD_LENGTH <= length <= MAX_RECORD_LENGTH or typ not in types:
            break
        if typ == TYPE_MESSAGE:
            count += 1
        elif pos + BATCH_HEADER.size <= size:
            batch = BATCH_HEADER.unpack_from(buf, pos)[3]
            count += batch if 1 <= batch <= MAX_BATCH_COUNT else 1
        else:
            count += 1
        pos += 4 + length
    if pos < size:
        count += 1
    return count

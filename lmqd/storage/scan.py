"""Verification of segment bytes, without I/O: which records are valid, which regions are bad.

Each record is checked for a plausible length, its type byte (batch or single message), its
CRC32C and, for a batch, its structure; counts are in messages, not records. Where a
check fails the scanner resynchronises: it searches forward for the next offset where a complete
record with a matching CRC begins (``verify.find_next_record``). The result splits the bytes into
valid records and *bad regions*; what to do with the regions is ``recovery.py``'s business.

The record types accepted are those of the segment's format version
(``record.RECORD_TYPES_BY_VERSION``); a caller that needs each valid record (a topic log
building its offset and time index) passes a ``visit`` callback, called once per valid record
in file order. A sealed record (``atrest/seal.py``) is valid only if the ``opener`` opens it
(authentication, decompression, the plain record's structure): one that does not is a bad
region like a record with a bad CRC, and the visitor gets the plain record it holds.
"""

from __future__ import annotations

import mmap
from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs

from lmqd.storage.record import (
    READABLE_VERSIONS,
    RECORD_TYPES,
    RECORD_TYPES_BY_VERSION,
    SEGMENT_HEADER_SIZE,
    SEGMENT_MAGIC,
    FormatError,
    SegmentHeader,
    UnsupportedVersion,
    decode_segment_header,
    types_for,
)
from lmqd.storage.verify import find_next_record, verify_open

if TYPE_CHECKING:
    from lmqd.storage.atrest.seal import Opener


@attrs.define(slots=True)
class RecordScan:
    """What ``scan_records`` found between two offsets."""

    records: int = 0
    """Messages in valid records."""
    records_from: int = 0
    """Messages in valid records at or after the ``floor``."""
    floor: int = 0
    """The greatest record boundary <= ``count_from`` (a record or region start, or the end)."""
    floor_count: int = 0
    """Messages in the valid record that starts at ``floor`` (0 if none does)."""
    regions: list[tuple[int, int, bool]] = attrs.field(factory=list)
    """Bad regions ``(start, end, torn)`` in order; ``torn``: the last record runs past the end."""
    saved: int = 0
    """Bytes the valid sealed records take less than the plain records they hold (negative if
    more): a segment's logical size is its size plus this."""


RecordVisitor = Callable[[memoryview, int, int, int, int], None]
"""Called for each valid record: (the bytes holding it, its index there, the index after it,
messages, its file offset). The bytes are the scanned ones (index = file offset) or, for a
sealed record, the plain record it holds (index 0). The view is only valid during the call."""


def scan_records(
    buf: bytes | mmap.mmap,
    start: int,
    end: int,
    count_from: int = 0,
    *,
    types: tuple[int, ...] = RECORD_TYPES,
    visit: RecordVisitor | None = None,
    opener: Opener | None = None,
) -> RecordScan:
    """Verify the records in ``buf[start:end]``, resynchronising after bad ones. Never raises
    (unless ``visit`` does). ``types``: the record types valid here; ``opener``: how sealed
    records open."""
    scan = RecordScan(floor=start)
    pos = start
    seen = 0  # valid records before pos
    before_floor = 0
    # One view for the whole scan: each access to an mmap directly would export a new buffer.
    view = memoryview(buf)
    try:
        while pos < end:
            if pos <= count_from:
                scan.floor = pos
                scan.floor_count = 0
                before_floor = seen
            nxt, count, plain = verify_open(view, pos, end, types, opener)
            if nxt > 0:
                if pos == scan.floor:
                    scan.floor_count = count
                if plain is not None:
                    scan.saved += len(plain) - (nxt - pos)
                    if visit is not None:
                        with memoryview(plain) as opened:
                            visit(opened, 0, len(plain), count, pos)
                elif visit is not None:
                    visit(view, pos, nxt, count, pos)
                seen += count
                pos = nxt
                continue
            resync = find_next_record(buf, pos + 1, end, types)
            if resync < 0:
                scan.regions.append((pos, end, nxt == -1))
                break
            scan.regions.append((pos, resync, False))
            pos = resync
        else:
            if pos <= count_from:
                scan.floor = pos
                scan.floor_count = 0
                before_floor = seen
    finally:
        view.release()
    scan.records = seen
    scan.records_from = seen - before_floor
    return scan


@attrs.define(slots=True)
class SegmentScan:
    """What ``scan_segment`` found in a whole segment file."""

    size: int
    header_ok: bool
    unsupported: bool
    valid_end: int
    """Offset after the last valid record, or where the bad tail begins."""
    records: RecordScan
    version: int = 0
    """The header's format version (0 if the header is damaged)."""
    header: SegmentHeader | None = None
    """The decoded header (None if it is damaged or of an unreadable version)."""


def scan_segment(
    buf: bytes | mmap.mmap,
    size: int,
    count_from: int = 0,
    *,
    readable: tuple[int, ...] = READABLE_VERSIONS,
    visit: RecordVisitor | None = None,
    opener: Opener | None = None,
) -> SegmentScan:
    """Verify the header and every record of a segment held in ``buf``. Never raises (unless
    ``visit`` does). ``readable``: the format versions the caller reads (a disk queue's by
    default); the records accepted are those of the header's version, or of every readable
    version if the header is damaged."""
    if size < SEGMENT_HEADER_SIZE:
        records = RecordScan(floor=0)
        if size:
            # A short file that is a prefix of a valid header is a crash during creation.
            torn = SEGMENT_MAGIC.startswith(bytes(buf[: min(size, len(SEGMENT_MAGIC))]))
            records.regions.append((0, size, torn))
        return SegmentScan(size, header_ok=False, unsupported=False, valid_end=0, records=records)
    header: SegmentHeader | None = None
    try:
        header = decode_segment_header(bytes(buf[:SEGMENT_HEADER_SIZE]), readable)
    except UnsupportedVersion:
        return SegmentScan(size, False, True, SEGMENT_HEADER_SIZE, RecordScan())
    except FormatError:
        pass
    header_ok = header is not None
    version = header.version if header is not None else 0
    types = RECORD_TYPES_BY_VERSION[version] if header is not None else types_for(readable)
    start = SEGMENT_HEADER_SIZE
    if not header_ok:
        resync = find_next_record(buf, SEGMENT_HEADER_SIZE, size, types)
        start = size if resync < 0 else resync
    records = scan_records(buf, start, size, count_from, types=types, visit=visit, opener=opener)
    if not header_ok:
        records.regions.insert(0, (0, start, False))
        if count_from < start:
            records.floor = 0
            records.floor_count = 0
            records.records_from = records.records
    last = records.regions[-1] if records.regions else None
    valid_end = last[0] if last is not None and last[1] == size else size
    return SegmentScan(size, header_ok, False, valid_end, records, version, header)

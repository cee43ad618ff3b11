"""Start-up verification of one segment file.

Theory of operation
-------------------
A segment is scanned record by record, each one checked for a plausible length, the message type
byte and its CRC32C. Where a check fails the scanner resynchronises: it searches forward for the
next offset where a complete record with a matching CRC begins (``find_next_record``). That
splits the file into valid records and *bad regions*:

* a **torn tail**: the last bytes of the newest segment are the beginning of a record whose end
  is missing, and they lie past the last fsynced write position. This is what a crash in the
  middle of a write leaves; it held nothing that was ever acknowledged as durable, so it is
  truncated (logged, counted in ``torn_bytes``).
* anything else is **corruption**: a checksum mismatch, an impossible length, a partial record
  below the fsynced position, garbage between records. The bytes are first copied, durably, to
  ``<segment file>.bad-<offset>`` (``save_aside``), then logged and counted. A corrupt region in
  the middle stays in place and the reader skips it; a corrupt tail of the newest segment is
  truncated after the copy so that appending can continue.

Only the newest segment is ever modified, and only at its tail (or, when it was created but never
got its header, by writing the header). Older segments are read-only: a region found in one is
reported again at the next start (its set-aside copy is reused, not duplicated) until the reader
has consumed the segment and it is deleted.

A segment whose header names a newer format version is left untouched: not read, not deleted,
not appended to. A segment whose header is damaged is treated as a corrupt region from offset 0
to its first valid record.
"""

from __future__ import annotations

import logging
import mmap
import os
import time

import attrs

from lmqd.storage.files import save_aside
from lmqd.storage.record import (
    SEGMENT_HEADER_SIZE,
    SEGMENT_MAGIC,
    FormatError,
    UnsupportedVersion,
    check_record,
    decode_segment_header,
    encode_segment_header,
    find_next_record,
)

log = logging.getLogger("lmqd.storage")


@attrs.define(slots=True)
class RecordScan:
    """What ``scan_records`` found between two offsets."""

    records: int = 0
    """Valid records."""
    records_from: int = 0
    """Valid records at or after the ``floor``."""
    floor: int = 0
    """The greatest record boundary <= ``count_from`` (a record or region start, or the end)."""
    regions: list[tuple[int, int, bool]] = attrs.field(factory=list)
    """Bad regions ``(start, end, torn)`` in order; ``torn``: the last record runs past the end."""


def scan_records(buf: bytes | mmap.mmap, start: int, end: int, count_from: int = 0) -> RecordScan:
    """Verify the records in ``buf[start:end]``, resynchronising after bad ones. Never raises."""
    scan = RecordScan(floor=start)
    pos = start
    seen = 0  # valid records before pos
    before_floor = 0
    while pos < end:
        if pos <= count_from:
            scan.floor = pos
            before_floor = seen
        nxt = check_record(buf, pos, end)
        if nxt > 0:
            seen += 1
            pos = nxt
            continue
        resync = find_next_record(buf, pos + 1, end)
        if resync < 0:
            scan.regions.append((pos, end, nxt == -1))
            break
        scan.regions.append((pos, resync, False))
        pos = resync
    else:
        if pos <= count_from:
            scan.floor = pos
            before_floor = seen
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


def scan_segment(buf: bytes | mmap.mmap, size: int, count_from: int = 0) -> SegmentScan:
    """Verify the header and every record of a segment held in ``buf``. Never raises."""
    if size < SEGMENT_HEADER_SIZE:
        records = RecordScan(floor=0)
        if size:
            # A short file that is a prefix of a valid header is a crash during creation.
            torn = SEGMENT_MAGIC.startswith(bytes(buf[: min(size, len(SEGMENT_MAGIC))]))
            records.regions.append((0, size, torn))
        return SegmentScan(size, header_ok=False, unsupported=False, valid_end=0, records=records)
    header_ok = True
    try:
        decode_segment_header(bytes(buf[:SEGMENT_HEADER_SIZE]))
    except UnsupportedVersion:
        return SegmentScan(size, False, True, SEGMENT_HEADER_SIZE, RecordScan())
    except FormatError:
        header_ok = False
    start = SEGMENT_HEADER_SIZE
    if not header_ok:
        resync = find_next_record(buf, SEGMENT_HEADER_SIZE, size)
        start = size if resync < 0 else resync
    records = scan_records(buf, start, size, count_from)
    if not header_ok:
        records.regions.insert(0, (0, start, False))
        if count_from < start:
            records.floor = 0
            records.records_from = records.records
    last = records.regions[-1] if records.regions else None
    valid_end = last[0] if last is not None and last[1] == size else size
    return SegmentScan(size, header_ok, False, valid_end, records)


@attrs.define(slots=True)
class RecoveredSegment:
    """A segment after recovery: what the disk queue needs to read and append to it."""

    number: int
    path: str
    end: int
    """Offset after the last valid record (where appending continues)."""
    skips: list[tuple[int, int]]
    """Corrupt regions the reader jumps over, in file order."""
    records: int
    records_from: int
    """Valid records at or after the requested read offset."""
    floor: int
    """Record boundary at or before the requested read offset (where reading resumes)."""
    appendable: bool
    """False when the header is unusable: the writer must start a new segment instead."""
    unsupported: bool = False
    corrupt_count: int = 0
    corrupt_bytes: int = 0
    torn_bytes: int = 0


def recover_segment(
    path: str,
    number: int,
    *,
    queue: str,
    newest: bool,
    synced_end: int,
    count_from: int = 0,
) -> RecoveredSegment:
    """Scan segment file ``path`` and repair it as the module docstring describes.

    ``newest``: this is the last segment (the only one that may be truncated or appended to).
    ``synced_end``: offset below which the file's content was fsynced (0 if unknown), so a
    partial record there is corruption, not a torn write. ``count_from``: the persisted read
    offset in this segment, for counting the unread records and checking it is a boundary.
    Raises ``OSError`` only if the file cannot be opened or repaired at all.
    """
    fd = os.open(path, os.O_RDWR)
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            return _recover(fd, b"", 0, path, number, queue, newest, synced_end, count_from)
        with mmap.mmap(fd, size, access=mmap.ACCESS_READ) as mm:
            return _recover(fd, mm, size, path, number, queue, newest, synced_end, count_from)
    finally:
        os.close(fd)


def _recover(
    fd: int,
    buf: bytes | mmap.mmap,
    size: int,
    path: str,
    number: int,
    queue: str,
    newest: bool,
    synced_end: int,
    count_from: int,
) -> RecoveredSegment:
    scan = scan_segment(buf, size, count_from)
    result = RecoveredSegment(
        number=number,
        path=path,
        end=scan.valid_end,
        skips=[],
        records=scan.records.records,
        records_from=scan.records.records_from,
        floor=scan.records.floor,
        appendable=newest and scan.header_ok,
        unsupported=scan.unsupported,
    )
    if scan.unsupported:
        log.error(
            "DISKQUEUE(%s): %s has an unsupported format version; left untouched", queue, path
        )
        return result
    truncate_at = -1
    for start, end, torn in scan.records.regions:
        tail = end == size
        if tail and newest and torn and start >= synced_end:
            result.torn_bytes += end - start
            truncate_at = start
            log.warning(
                "DISKQUEUE(%s): %s: torn write of %d bytes at offset %d truncated",
                queue,
                path,
                end - start,
                start,
            )
            continue
        aside = save_aside(f"{path}.bad-{start}", bytes(buf[start:end]))
        result.corrupt_count += 1
        result.corrupt_bytes += end - start
        log.error(
            "DISKQUEUE(%s): %s: corrupt region of %d bytes at offset %d set aside in %s",
            queue,
            path,
            end - start,
            start,
            aside,
        )
        if tail and newest:
            truncate_at = start
        else:
            result.skips.append((start, end))
    if isinstance(buf, mmap.mmap):
        # Unmap before the file shrinks: touching a mapping past EOF is SIGBUS.
        buf.close()
    if not scan.header_ok and newest and scan.valid_end == 0:
        # The file never got past (a copy of) its header: start it afresh and keep using it.
        os.ftruncate(fd, 0)
        os.pwrite(fd, encode_segment_header(number, time.time_ns()), 0)
        os.fsync(fd)
        result.end = SEGMENT_HEADER_SIZE
        result.floor = SEGMENT_HEADER_SIZE
        result.skips = []
        result.appendable = True
    elif truncate_at >= 0:
        os.ftruncate(fd, truncate_at)
        os.fsync(fd)
        result.end = truncate_at
    return result

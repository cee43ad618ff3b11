"""Start-up recovery of a disk queue: its positions file and every live segment.

Theory of operation
-------------------
A segment is scanned record by record, each one checked for a plausible length, its type byte
(a batch of messages, or one message in the format before batches), its CRC32C and, for a
batch, its structure. A batch is all or nothing: a damaged one is one bad region, whatever the
number of messages in it; counts (depth, records) are in messages. Where a check fails the
scanner resynchronises: it searches forward for the next offset where a complete record with a
matching CRC begins (``find_next_record``). That splits the file into valid records and *bad
regions*:

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

A segment of format version 1 (written before batch records) is read but never appended to: the
writer starts a new segment, so an older build never finds a batch in a segment it can read.
A segment whose header names a newer format version is left untouched: not read, not deleted,
not appended to. A segment whose header is damaged is treated as a corrupt region from offset 0
to its first valid record. An **empty** segment file that is not the newest is damage too (a
segment is only created for a write, so it held at least one record): logged at ERROR, an empty
``.bad-0`` marker set aside, counted.

Each region counts the messages it probably held (``verify.estimate_messages``: the record
prefixes still plausible in it, at least one), for the damage counters (``repair.Damage``).

Positions are never trusted blindly (``check_positions``): a positions file whose read segment
does not exist, whose read offset lies inside the header or past the end of its segment file,
or whose write segment is more than one past the newest segment on disk disagrees with the
segments; so does one whose recorded depth is more than the segments from its read position
hold while segments before that position are still on disk (the read position may have run
ahead of what was read). Such a file is set aside like a damaged one and the positions are
rebuilt from the segments: reading restarts at the oldest record on disk and no segment is
removed as consumed. Redelivering is the price; skipping a segment or deleting unread ones
(what trusting such a file would do) is never taken.
"""

from __future__ import annotations

import logging
import mmap
import os
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, TypeVar

import attrs

from lmqd.storage.ext_notes import ExtensionNotes
from lmqd.storage.files import (
    free_aside_path,
    list_segments,
    positions_filename,
    save_aside,
    unlink_quietly,
)
from lmqd.storage.positions import Positions, decode_positions
from lmqd.storage.record import (
    FORMAT_VERSION,
    READABLE_VERSIONS,
    RECORD_TYPES_BY_VERSION,
    SEALED_FORMAT_VERSION,
    SEGMENT_HEADER_SIZE,
    FormatError,
    decode_segment_header,
    encode_segment_header,
    types_for,
)
from lmqd.storage.scan import RecordVisitor, scan_segment
from lmqd.storage.verify import estimate_messages

if TYPE_CHECKING:
    from lmqd.storage.atrest.seal import Opener

log = logging.getLogger("lmqd.storage")

T = TypeVar("T")


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
    floor_count: int
    """Messages in the valid record at ``floor`` (0 if none)."""
    appendable: bool
    """False when the header is unusable or of an older version: the writer must start a new
    segment instead."""
    unsupported: bool = False
    corrupt_count: int = 0
    corrupt_bytes: int = 0
    torn_bytes: int = 0
    version: int = 0
    """The header's format version (0 if it was damaged)."""
    base_offset: int = -1
    """Version 3 (a topic log's segment): the base offset in its header; -1 otherwise."""
    lost_messages: int = 0
    """Messages estimated lost in the corrupt regions (``verify.estimate_messages``)."""
    saved: int = 0
    """Bytes its sealed records take less than the plain ones they hold (``scan.RecordScan``)."""


@attrs.frozen
class SegmentFormat:
    """What a segment's owner reads and writes: a disk queue's format (the default) or a topic
    log's (``log_recovery.py``)."""

    readable: tuple[int, ...] = READABLE_VERSIONS
    """The versions read; a segment of another version is left untouched."""
    version: int = FORMAT_VERSION
    """The version written: the newest segment is appended to only if it has this version."""
    fresh_header: Callable[[int], bytes] = lambda number: encode_segment_header(
        number, time.time_ns()
    )
    """The header to write into segment ``number`` when it was created but never got one."""
    visit: RecordVisitor | None = None
    """Called for each valid record found (``scan.scan_records``)."""
    subject: str = "DISKQUEUE"
    """How log lines name the owner: ``DISKQUEUE(<name>)`` or ``TOPICLOG(<name>)``."""
    opener: Opener | None = None
    """How sealed records open (``atrest/seal.py``); None: checked by their CRC alone."""


QUEUE_FORMAT = SegmentFormat()


def recover_segment(
    path: str,
    number: int,
    *,
    queue: str,
    newest: bool,
    synced_end: int,
    count_from: int = 0,
    fmt: SegmentFormat = QUEUE_FORMAT,
) -> RecoveredSegment:
    """Scan segment file ``path`` and repair it as the module docstring describes.

    ``newest``: this is the last segment (the only one that may be truncated or appended to).
    ``synced_end``: offset below which the file's content was fsynced (0 if unknown), so a
    partial record there is corruption, not a torn write. ``count_from``: the persisted read
    offset in this segment, for counting the unread records and checking it is a boundary.
    ``fmt``: the owner's format (a disk queue's by default).
    Raises ``OSError`` only if the file cannot be opened or repaired at all.
    """
    # Only the newest segment may be repaired; older ones need no write access.
    fd = os.open(path, os.O_RDWR if newest else os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            return _recover(fd, b"", 0, path, number, queue, newest, synced_end, count_from, fmt)
        with mmap.mmap(fd, size, access=mmap.ACCESS_READ) as mm:
            return _recover(fd, mm, size, path, number, queue, newest, synced_end, count_from, fmt)
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
    fmt: SegmentFormat,
) -> RecoveredSegment:
    scan = scan_segment(
        buf, size, count_from, readable=fmt.readable, visit=fmt.visit, opener=fmt.opener
    )
    result = RecoveredSegment(
        number=number,
        path=path,
        end=scan.valid_end,
        skips=[],
        records=scan.records.records,
        records_from=scan.records.records_from,
        floor=scan.records.floor,
        floor_count=scan.records.floor_count,
        appendable=newest and scan.header_ok and scan.version == fmt.version,
        unsupported=scan.unsupported,
        version=scan.version,
        base_offset=scan.header.base_offset if scan.header is not None else -1,
        saved=scan.records.saved,
    )
    if scan.unsupported:
        log.error(
            "%s(%s): %s has an unsupported format version; left untouched",
            fmt.subject,
            queue,
            path,
        )
        return result
    truncate_at = -1
    if size == 0 and not newest:
        # Segments are created only to be written to: an empty one in the middle lost its
        # records (a file truncated or replaced behind lmqd's back).
        aside = save_aside(f"{path}.bad-0", b"")
        result.corrupt_count += 1
        result.lost_messages += 1
        log.error(
            "%s(%s): %s is empty in the middle of the queue; its records are lost (marked in %s)",
            fmt.subject,
            queue,
            path,
            aside,
        )
    for start, end, torn in scan.records.regions:
        tail = end == size
        if tail and newest and torn and start >= synced_end:
            result.torn_bytes += end - start
            truncate_at = start
            log.warning(
                "%s(%s): %s: torn write of %d bytes at offset %d truncated",
                fmt.subject,
                queue,
                path,
                end - start,
                start,
            )
            continue
        data = bytes(buf[start:end])
        aside = save_aside(f"{path}.bad-{start}", data)
        result.corrupt_count += 1
        result.corrupt_bytes += end - start
        types = RECORD_TYPES_BY_VERSION.get(scan.version) or types_for(fmt.readable)
        # A region from offset 0 begins with the (damaged) header, not with a record.
        result.lost_messages += estimate_messages(
            data[SEGMENT_HEADER_SIZE:] if start == 0 else data, types
        )
        log.error(
            "%s(%s): %s: corrupt region of %d bytes at offset %d set aside in %s",
            fmt.subject,
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
        header = fmt.fresh_header(number)
        os.pwrite(fd, header, 0)
        os.fsync(fd)
        result.version = fmt.version
        result.base_offset = decode_segment_header(header, fmt.readable).base_offset
        result.end = SEGMENT_HEADER_SIZE
        result.floor = SEGMENT_HEADER_SIZE
        result.floor_count = 0
        result.skips = []
        result.appendable = True
    elif truncate_at >= 0:
        os.ftruncate(fd, truncate_at)
        os.fsync(fd)
        result.end = truncate_at
    return result


# A synced offset beyond any file: everything in a segment older than the write segment of the
# last positions file was fsynced before that file was written.
_ALL_SYNCED = 1 << 62


@attrs.define(slots=True)
class RecoveredQueue:
    """The state of a queue's files after recovery, for ``DiskQueue`` to start from."""

    segments: list[RecoveredSegment]
    """Readable segments, oldest first; the reader starts in the first."""
    read_offset: int
    """Where the reader starts in ``segments[0]``: a record boundary."""
    read_index: int
    """Messages of the record at ``read_offset`` already consumed (skipped on reading)."""
    read_consumed: int
    """Messages in ``segments[0]`` before the read position (``read_index`` included)."""
    depth: int
    next_number: int
    """The lowest segment number above every segment file seen (the next one to create)."""
    positions: Positions | None
    """The positions file as loaded, or None if it was missing or damaged."""
    corrupt_count: int = 0
    corrupt_bytes: int = 0
    torn_bytes: int = 0
    missing_segments: int = 0
    rebuilt_positions: bool = False
    lost_messages: int = 0
    """Messages estimated lost: the regions' estimates, or the shortfall against the depth
    the positions file recorded, whichever is larger."""
    message_ttls: bool = False
    """Some message in the live segments has its own TTL (``ext_notes.py``)."""

    @property
    def appendable(self) -> bool:
        """Whether the writer can continue in the last segment."""
        return bool(self.segments) and self.segments[-1].appendable


def load_positions(path: str, name: str) -> tuple[Positions | None, bool]:
    """Read a positions file: (positions or None, whether it was damaged or unreadable).

    A damaged file is renamed to ``<path>.bad`` (or a free ``.bad.N``) and logged.
    """
    return load_state_file(path, name, decode_positions)


def load_state_file(
    path: str,
    name: str,
    decode: Callable[[str, bytes], T],
    *,
    subject: str = "DISKQUEUE",
    what: str = "positions",
    max_bytes: int = 64 * 1024,
) -> tuple[T | None, bool]:
    """Read a small state file with ``decode`` (raising ``ValueError`` for bad content):
    (its content or None, whether it was damaged or unreadable).

    A damaged file is renamed to ``<path>.bad`` (or a free ``.bad.N``) and logged; ``what`` is
    what the log line says is rebuilt from the segments.
    """
    try:
        with open(path, "rb") as f:
            data = f.read(max_bytes)
    except FileNotFoundError:
        return None, False
    except OSError:
        log.error("%s(%s): cannot read %s", subject, name, path, exc_info=True)
        return None, True
    try:
        return decode(name, data), False
    except ValueError as exc:
        aside = free_aside_path(path + ".bad")
        try:
            os.rename(path, aside)
        except OSError:
            aside = "(could not be moved)"
        log.error(
            "%s(%s): %s damaged (%s), kept as %s; rebuilding %s from the segments",
            subject,
            name,
            path,
            exc,
            aside,
            what,
        )
        return None, True


def recover_queue(
    directory: str, name: str, *, opener: Opener | None = None, sealed: bool = False
) -> RecoveredQueue:
    """Recover queue ``name`` in ``directory`` (blocking: reads every live segment).
    ``opener``: how sealed records open; ``sealed``: the queue writes sealed records (its
    newest segment is appended to only if it has the sealed format version).

    Damaged content never raises. ``OSError`` is raised when a file cannot be read or repaired
    (an I/O error, or a full disk while copying bytes aside): skipping that segment instead
    would let the next persisted read position pass it, and a later start delete it unread.
    """
    on_disk = list_segments(directory, name)
    positions_path = os.path.join(directory, positions_filename(name))
    positions, damaged = load_positions(positions_path, name)
    numbers = sorted(on_disk)
    if positions is not None:
        disagreement = check_positions(positions, on_disk)
        if disagreement is not None:
            set_aside_state_file(positions_path, name, disagreement, "positions")
            positions, damaged = None, True
    state = RecoveredQueue(
        segments=[],
        read_offset=SEGMENT_HEADER_SIZE,
        read_index=0,
        read_consumed=0,
        depth=0,
        next_number=max([*numbers, positions.write_segment if positions else -1]) + 1,
        positions=positions,
        rebuilt_positions=damaged or (positions is None and bool(numbers)),
    )
    if positions is None:
        if numbers and not damaged:
            log.warning(
                "DISKQUEUE(%s): %s missing; rebuilding positions from the segments",
                name,
                positions_path,
            )
        live = numbers
        read_segment = numbers[0] if numbers else 0
        read_offset = SEGMENT_HEADER_SIZE
    else:
        read_segment, read_offset = positions.read
        live = [n for n in numbers if n >= read_segment]
        state.missing_segments += _count_missing(name, positions, set(live))
    notes = ExtensionNotes()
    version = SEALED_FORMAT_VERSION if sealed else FORMAT_VERSION
    fmt = SegmentFormat(
        version=version,
        fresh_header=lambda number: encode_segment_header(number, time.time_ns(), sealed=sealed),
        visit=notes.visit,
        opener=opener,
    )
    for index, number in enumerate(live):
        if positions is None:
            synced_end = 0
        elif number < positions.write_segment:
            synced_end = _ALL_SYNCED
        elif number == positions.write_segment:
            synced_end = positions.write_offset
        else:
            synced_end = 0
        try:
            r = recover_segment(
                on_disk[number],
                number,
                queue=name,
                newest=index == len(live) - 1,
                synced_end=synced_end,
                count_from=read_offset if number == read_segment else 0,
                fmt=fmt,
            )
        except FileNotFoundError:
            # Removed between listing and opening: the same as missing.
            log.error("DISKQUEUE(%s): %s vanished during recovery", name, on_disk[number])
            state.missing_segments += 1
            continue
        state.corrupt_count += r.corrupt_count
        state.corrupt_bytes += r.corrupt_bytes
        state.torn_bytes += r.torn_bytes
        state.lost_messages += r.lost_messages
        if not r.unsupported:
            state.segments.append(r)
            state.depth += r.records
    first = state.segments[0] if state.segments else None
    if first is not None and first.number == read_segment and positions is not None:
        state.read_offset = first.floor
        if first.floor == read_offset:
            state.read_index = min(positions.read_index, first.floor_count)
        state.read_consumed = first.records - first.records_from + state.read_index
        state.depth -= state.read_consumed
        if first.floor != read_offset:
            log.warning(
                "DISKQUEUE(%s): read position %d in %s is not a record boundary; resuming at %d",
                name,
                read_offset,
                first.path,
                first.floor,
            )
    consumed = [n for n in numbers if positions is not None and n < positions.read_segment]
    if positions is not None and positions.depth > state.depth and consumed:
        # Older segments are still there and the read position holds fewer messages than it
        # recorded: it may have run ahead. Deleting those segments as consumed could lose
        # unread messages; reading them again only repeats some.
        set_aside_state_file(
            positions_path,
            name,
            f"depth {positions.depth} recorded, {state.depth} from the read position on, "
            f"and {len(consumed)} older segment(s) still on disk",
            "positions",
        )
        rebuilt = recover_queue(directory, name, opener=opener, sealed=sealed)
        rebuilt.rebuilt_positions = True
        return rebuilt
    if positions is not None:
        _remove_consumed(name, [(n, on_disk[n]) for n in consumed])
    if positions is not None and positions.depth != state.depth:
        # More than recorded is normal after a crash (writes since the last sync); fewer
        # means records were lost or set aside.
        log.log(
            logging.INFO if state.depth > positions.depth else logging.WARNING,
            "DISKQUEUE(%s): positions file said depth %d, the segments hold %d",
            name,
            positions.depth,
            state.depth,
        )
        # Writes since the last sync can hide part of a shortfall: still a lower bound.
        state.lost_messages = max(state.lost_messages, positions.depth - state.depth)
    state.message_ttls = notes.message_ttls
    return state


def check_positions(positions: Positions, on_disk: Mapping[int, str]) -> str | None:
    """Why ``positions`` disagree with the segment files ``on_disk`` (number -> path), or None.

    Trusting such a file would skip a segment (a read offset past its end) or delete unread
    ones as consumed (a read segment ahead of what is there). With no segment at all there is
    nothing to disagree with (a missing segment is counted by ``_count_missing``).
    """
    if not on_disk:
        return None
    newest = max(on_disk)
    if positions.write_segment > newest + 1:
        # One missing newest segment is a lost file (counted by _count_missing); a write
        # segment further out is a number no writer produced.
        return f"write segment {positions.write_segment} is far past the newest on disk ({newest})"
    path = on_disk.get(positions.read_segment)
    if path is None:
        return f"read segment {positions.read_segment} does not exist"
    if positions.read_offset < SEGMENT_HEADER_SIZE:
        return f"read offset {positions.read_offset} is inside the segment header"
    try:
        size = os.stat(path).st_size
    except OSError:
        return None  # recovery reports what it cannot read
    # A segment created just before the file was written may have lost its (unsynced) header
    # in a power cut: recovery gives it a fresh one, and reading at its start is right.
    if positions.read_offset > max(size, SEGMENT_HEADER_SIZE):
        return f"read offset {positions.read_offset} is past the end of {path} ({size} bytes)"
    return None


def set_aside_state_file(path: str, name: str, reason: str, what: str) -> None:
    """Keep a positions or state file that disagrees with the segments as ``<path>.bad`` (or a
    free ``.bad.N``) and log what is rebuilt."""
    aside = free_aside_path(path + ".bad")
    try:
        os.rename(path, aside)
    except OSError:
        aside = "(could not be moved)"
    subject = "TOPICLOG" if what != "positions" else "DISKQUEUE"
    log.error(
        "%s(%s): %s disagrees with the segments (%s), kept as %s; rebuilding %s from the segments",
        subject,
        name,
        path,
        reason,
        aside,
        what,
    )


def _remove_consumed(name: str, segments: list[tuple[int, str]]) -> None:
    """Unlink segments a crash left behind after the read position had passed them."""
    for number, path in segments:
        try:
            with open(path, "rb") as f:
                decode_segment_header(f.read(SEGMENT_HEADER_SIZE))
        except (OSError, FormatError):
            log.warning(
                "DISKQUEUE(%s): %s precedes the read position but is not a readable segment; "
                "left in place",
                name,
                path,
            )
            continue
        log.info("DISKQUEUE(%s): removing consumed segment %d", name, number)
        unlink_quietly(path, log)


def _count_missing(name: str, positions: Positions, present: set[int]) -> int:
    """Segments between the read and write positions that should exist and do not."""
    first, last = positions.read_segment, positions.write_segment
    last_has_data = positions.write_offset > SEGMENT_HEADER_SIZE
    # Arithmetic, not a loop over the range: a damaged file may name absurd segment numbers.
    expected = last - first + (1 if last_has_data else 0)
    have = sum(1 for n in present if first <= n < last) + (
        1 if last_has_data and last in present else 0
    )
    missing = expected - have
    if missing > 0:
        log.error(
            "DISKQUEUE(%s): %d segment file(s) between %d and %d are missing; their messages "
            "are lost",
            name,
            missing,
            first,
            last,
        )
    return max(missing, 0)

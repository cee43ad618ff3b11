"""Start-up recovery of a topic log: every segment verified, offsets and the index rebuilt.

Theory of operation
-------------------
Each segment file ``<stem>.lmq.<n>.dat`` goes through a disk queue's segment recovery
(``recovery.recover_segment``) with the log's format (``SegmentFormat``: versions 1 to 3 read,
version 3 written): torn tail truncated, damage set aside and counted, a header-less newest
segment given a fresh header, a segment of an unknown version left untouched. While it scans,
recovery hands every valid record to an ``_Indexer``, which gives the record its offsets and adds
it to the segment's sparse index (``log_index.py``): nothing of the index is stored on disk. It
also hands the record to the log's ``ExtensionNotes`` (``ext_notes.py``: whether a stored
message has its own TTL, the newest dedup ids), which the topic takes when it opens.

Offsets. A version-3 segment's records carry their first offset ('O' records) and its header
its base offset; a segment of a disk queue's format (versions 1 and 2: a topic's disk queue the
log adopted, see below) carries none, so its messages take the offsets that follow the previous
segment's, from the base the state file remembers for it (``legacy``), or, the first time, from
where the previous segment ended. Either way ``log_index.first_offset`` keeps them increasing.
The next offset is the larger of the state file's and the end of the last record found, so an
offset is never given twice even when every segment that held it is gone. (Offsets of messages
appended after the last sync and lost in a crash are given again: they were never durable.)

Cursors. The state file's low-water marks are checked against the segments, never trusted
blindly: a mark before the first offset on disk moves to it (logged: those messages are gone);
a mark past the log's end cannot be true, so the cursor is rebuilt at the earliest offset on
disk (logged at ERROR, counted in ``damage.rebuilt_count``): its channel reads again what is
there rather than skip what it had not read. A missing or damaged state file restores no cursor
(``damage.rebuilt_positions``): whoever owns the cursors recreates them, at the earliest offset
if nothing may be lost. A state file that disagrees with the segments as a whole (its write
segment lies beyond every segment on disk, or its write offset outside that file) is set aside
and treated as damaged: its cursors' marks cannot be trusted either.

Adoption. When a log opens a directory where a topic's disk queue left its segments (same file
names) and no log state file exists yet, those segments become the start of the log and the
queue's positions file says how far the topic had handed messages on: ``adopted`` is that offset
(where the cursors of the topic's existing channels start). The queue's positions file is left
in place, unused.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from functools import partial
from operator import itemgetter
from typing import TYPE_CHECKING

import attrs

from lmqd.storage.ext_notes import ExtensionNotes
from lmqd.storage.files import list_segments, log_state_filename, positions_filename
from lmqd.storage.log_index import NO_TIMESTAMP, SegmentIndex, first_offset
from lmqd.storage.log_state import LogState, decode_log_state
from lmqd.storage.positions import Positions, decode_positions
from lmqd.storage.record import (
    BATCH_ENTRY,
    BATCH_ENTRY_SIZE,
    LOG_FORMAT_VERSION,
    LOG_READABLE_VERSIONS,
    LOG_VERSIONS,
    OFFSET_BATCH_HEADER,
    RECORD_PREFIX,
    RECORD_TYPES_BY_VERSION,
    SEALED_LOG_FORMAT_VERSION,
    SEGMENT_HEADER_SIZE,
    TYPE_MESSAGE,
    TYPE_OFFSET_BATCH,
    FormatError,
    SegmentHeader,
    decode_segment_header,
    encode_segment_header,
    header_offset_size,
    types_for,
)
from lmqd.storage.recovery import (
    SegmentFormat,
    load_state_file,
    recover_segment,
    set_aside_state_file,
)
from lmqd.storage.repair import Damage
from lmqd.storage.segments import Segment

if TYPE_CHECKING:
    from lmqd.storage.atrest.seal import Opener

log = logging.getLogger("lmqd.storage")

_timestamp = itemgetter(2)

# Everything in a segment older than the state file's write segment was fsynced before the
# state file was written (as for a disk queue's positions).
_ALL_SYNCED = 1 << 62


@attrs.define(slots=True)
class RecoveredLog:
    """A topic log's files after recovery, for ``TopicLog`` to start from."""

    segments: list[SegmentIndex]
    """Readable segments, oldest first, indexed."""
    next_offset: int
    next_number: int
    """The lowest segment number above every segment file seen."""
    appendable: bool
    """Whether appending continues in the last segment (else a new one is created)."""
    cursors: dict[str, int]
    """Each restored cursor's low-water mark, checked against the segments."""
    legacy: dict[int, int]
    """Base offsets of the segments of a disk queue's format, by segment number."""
    adopted: int | None
    state: LogState | None
    damage: Damage = attrs.Factory(Damage)
    """What recovery found: corrupt regions set aside, torn bytes, missing segments, the state
    file rebuilt (``rebuilt_positions``: it was missing with segments present, or damaged), and
    ``rebuilt_count``: the state file (missing, damaged or disagreeing) and cursors rebuilt."""
    read: dict[str, int] = attrs.Factory(dict)
    skips: dict[str, list[tuple[int, int]]] = attrs.Factory(dict)
    """Each restored cursor's read position when the state was written (if past its mark)."""
    notes: ExtensionNotes = attrs.Factory(ExtensionNotes)
    """What the segments' messages carry of lmq's extension (TTLs, the newest dedup ids)."""


class _Indexer:
    """Recovery's record visitor for one segment: offsets, index entries, the adopted offset,
    the extension notes."""

    __slots__ = ("adopt_at", "adopted", "notes", "number", "running", "seg")

    def __init__(
        self,
        seg: SegmentIndex,
        adopt_at: Positions | None,
        adopted: int | None,
        notes: ExtensionNotes,
    ) -> None:
        self.seg = seg
        self.number = seg.number
        self.running = seg.base
        self.adopt_at = adopt_at
        self.adopted = adopted
        self.notes = notes

    def __call__(self, view: memoryview, pos: int, end: int, count: int, file_pos: int) -> None:
        kind = view[pos + 4]
        if kind == TYPE_MESSAGE:
            stated = -1
            newest = RECORD_PREFIX.unpack_from(view, pos)[4]
        else:
            stated = (
                OFFSET_BATCH_HEADER.unpack_from(view, pos)[4] if kind == TYPE_OFFSET_BATCH else -1
            )
            at = pos + header_offset_size(kind)
            with view[at : at + count * BATCH_ENTRY_SIZE] as entries:
                newest = max(map(_timestamp, BATCH_ENTRY.iter_unpack(entries)))
        first = first_offset(stated, self.running)
        self.seg.add_record(file_pos, first, count, newest)
        self.running = first + count
        self.notes.visit(view, pos, end, count)
        where = self.adopt_at
        if (
            where is not None
            and self.adopted is None
            and (
                self.number > where.read_segment
                or (self.number == where.read_segment and file_pos >= where.read_offset)
            )
        ):
            skip = where.read_index if file_pos == where.read_offset else 0
            self.adopted = first + min(skip, count)


def _fresh_header(number: int, *, base_offset: int, sealed: bool) -> bytes:
    return encode_segment_header(number, 0, base_offset=base_offset, sealed=sealed)


def _read_header(path: str) -> SegmentHeader | None:
    """The segment's header if it is valid and of a version the log reads; else None."""
    try:
        with open(path, "rb") as f:
            return decode_segment_header(f.read(SEGMENT_HEADER_SIZE), LOG_READABLE_VERSIONS)
    except (OSError, FormatError):
        return None


def recover_log(
    directory: str,
    name: str,
    *,
    keep_ids: int = 0,
    opener: Opener | None = None,
    sealed: bool = False,
) -> RecoveredLog:
    """Recover the log of topic ``name`` in ``directory`` (blocking: reads every segment).
    ``keep_ids``: how many of the newest dedup ids to note (``RecoveredLog.notes``);
    ``opener``: how sealed records open; ``sealed``: the log writes sealed records (the newest
    segment is appended to only if it has the sealed version, 5; else 3).

    Damaged content never raises; ``OSError`` is raised when a file cannot be read or repaired
    (as for a disk queue, skipping it could let a later start delete it unread).
    """
    on_disk = list_segments(directory, name)
    numbers = sorted(on_disk)
    state_path = os.path.join(directory, log_state_filename(name))
    state, damaged = load_state_file(
        state_path, name, decode_log_state, subject="TOPICLOG", what="the log state"
    )
    if state is not None:
        disagreement = check_state(state, on_disk)
        if disagreement is not None:
            set_aside_state_file(state_path, name, disagreement, "the log state")
            state, damaged = None, True
    adopt_at: Positions | None = None
    if state is None and not damaged and numbers:
        adopt_at = _queue_positions(directory, name)
    legacy_bases = dict(state.legacy) if state is not None else {}
    result = RecoveredLog(
        segments=[],
        next_offset=0,
        next_number=max([*numbers, state.write_segment if state else -1]) + 1,
        appendable=False,
        cursors={},
        legacy={},
        adopted=state.adopted if state is not None else None,
        state=state,
        notes=ExtensionNotes(keep_ids),
    )
    found = result.damage
    found.rebuilt_positions = damaged or (state is None and bool(numbers) and adopt_at is None)
    if found.rebuilt_positions and not damaged:
        log.warning(
            "TOPICLOG(%s): %s missing; rebuilding the log state from the segments",
            name,
            state_path,
        )
    if state is not None:
        found.missing_segments = _count_missing(name, state, numbers)
    version = SEALED_LOG_FORMAT_VERSION if sealed else LOG_FORMAT_VERSION
    expected = 0
    max_ns = NO_TIMESTAMP
    adopted = None
    last_number = numbers[-1] if numbers else -1
    for number in numbers:
        path = on_disk[number]
        header = _read_header(path)
        if header is not None and header.version in LOG_VERSIONS:
            base = max(expected, header.base_offset)
            types = RECORD_TYPES_BY_VERSION[header.version]
        else:
            base = max(expected, legacy_bases.get(number, expected))
            types = (
                RECORD_TYPES_BY_VERSION[header.version]
                if header is not None
                else types_for(LOG_READABLE_VERSIONS)
            )
        if state is None:
            synced_end = 0
        elif number < state.write_segment:
            synced_end = _ALL_SYNCED
        elif number == state.write_segment:
            synced_end = state.write_offset
        else:
            synced_end = 0
        seg = SegmentIndex(Segment(number, path, SEGMENT_HEADER_SIZE, [], 0), base, max_ns, types)
        indexer = _Indexer(seg, adopt_at, adopted, result.notes)
        fmt = SegmentFormat(
            readable=LOG_READABLE_VERSIONS,
            version=version,
            fresh_header=partial(_fresh_header, base_offset=base, sealed=sealed),
            visit=indexer,
            subject="TOPICLOG",
            opener=opener,
        )
        try:
            r = recover_segment(
                path,
                number,
                queue=name,
                newest=number == last_number,
                synced_end=synced_end,
                fmt=fmt,
            )
        except FileNotFoundError:
            log.error("TOPICLOG(%s): %s vanished during recovery", name, path)
            found.missing_segments += 1
            continue
        found.corrupt_count += r.corrupt_count
        found.corrupt_bytes += r.corrupt_bytes
        found.torn_bytes += r.torn_bytes
        found.lost_messages += r.lost_messages
        if r.unsupported:
            continue
        if r.version in LOG_VERSIONS and not seg.positions:
            # A fresh header (written just now) or an empty segment: its base is the floor.
            seg.types = RECORD_TYPES_BY_VERSION[r.version]
            seg.base = seg.next = max(seg.base, r.base_offset)
        seg.file.end = r.end
        seg.file.skips = r.skips
        seg.file.records = r.records
        seg.file.saved = r.saved
        if r.version not in LOG_VERSIONS:
            result.legacy[number] = seg.base
        result.segments.append(seg)
        expected = seg.next
        max_ns = seg.max_ns
        adopted = indexer.adopted
        result.appendable = r.appendable
    result.next_offset = max(expected, state.next_offset if state is not None else 0)
    if adopt_at is not None:
        result.adopted = adopted if adopted is not None else result.next_offset
        log.info(
            "TOPICLOG(%s): adopted the topic's queue segments; it had read up to offset %d",
            name,
            result.adopted,
        )
    if found.rebuilt_positions:
        found.rebuilt_count += 1
    if state is not None:
        earliest = result.segments[0].base if result.segments else result.next_offset
        for cursor, low in state.cursors:
            if low > result.next_offset:
                log.error(
                    "TOPICLOG(%s): cursor %s was at offset %d, past the log's end %d; rebuilt "
                    "at the earliest offset on disk, %d (messages there are read again)",
                    name,
                    cursor,
                    low,
                    result.next_offset,
                    earliest,
                )
                result.cursors[cursor] = earliest
                found.rebuilt_count += 1
                continue
            result.cursors[cursor] = _clamped(name, cursor, low, earliest, result.next_offset)
        result.read = {c: p for c, p in state.read if c in result.cursors}
        result.skips = {c: list(r) for c, r in state.skips if c in result.cursors}
    return result


def check_state(state: LogState, on_disk: Mapping[int, str]) -> str | None:
    """Why the log's ``state`` disagrees with its segment files ``on_disk``, or None.

    The write position is where the records were fsynced up to when the state was written: its
    segment exists and holds at least that many bytes, whatever happened since (a crash
    truncates only what lies past it). With no segment at all there is nothing to check.
    """
    if not on_disk:
        return None
    newest = max(on_disk)
    if state.write_segment > newest + 1:
        # One missing newest segment is a lost file (counted by _count_missing); a write
        # segment further out is a number no writer produced.
        return f"write segment {state.write_segment} is far past the newest on disk ({newest})"
    if state.write_offset < SEGMENT_HEADER_SIZE:
        return f"write offset {state.write_offset} is inside the segment header"
    path = on_disk.get(state.write_segment)
    if path is None:
        return None  # a missing segment: counted by _count_missing
    try:
        size = os.stat(path).st_size
    except OSError:
        return None  # recovery reports what it cannot read
    # A segment created just before the state was written may have lost its (unsynced) header
    # in a power cut: recovery gives it a fresh one.
    if state.write_offset > max(size, SEGMENT_HEADER_SIZE):
        return f"write offset {state.write_offset} is past the end of {path} ({size} bytes)"
    return None


def _clamped(name: str, cursor: str, low: int, earliest: int, end: int) -> int:
    """``low`` (at most ``end``), moved up to ``earliest`` if the messages before it are gone."""
    if low < earliest:
        log.warning(
            "TOPICLOG(%s): cursor %s was at offset %d, before the first one on disk; moved to %d",
            name,
            cursor,
            low,
            earliest,
        )
        return earliest
    return min(low, end)


def _queue_positions(directory: str, name: str) -> Positions | None:
    """The topic's disk queue positions file, if there is a readable one (left untouched)."""
    try:
        with open(os.path.join(directory, positions_filename(name)), "rb") as f:
            return decode_positions(name, f.read(64 * 1024))
    except (OSError, ValueError):
        return None


def _count_missing(name: str, state: LogState, numbers: list[int]) -> int:
    """Segments between the first on disk and the state's write segment that are not there."""
    if not numbers:
        return 0
    first, last = numbers[0], state.write_segment
    last_has_data = state.write_offset > SEGMENT_HEADER_SIZE
    # Arithmetic, not a loop over the range: a damaged file may name absurd segment numbers.
    expected = last - first + (1 if last_has_data else 0)
    present = sum(1 for n in numbers if first <= n < last) + (
        1 if last_has_data and last in numbers else 0
    )
    missing = max(expected - present, 0)
    if missing:
        log.error(
            "TOPICLOG(%s): %d segment file(s) between %d and %d are missing; their messages "
            "are lost",
            name,
            missing,
            first,
            last,
        )
    return missing

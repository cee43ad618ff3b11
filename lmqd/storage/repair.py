"""Damage found while reading: set it aside as recovery would, and count it.

The reader checks every record's CRC again (the disk may have rotted since start-up). When the
record at its read position fails, ``set_aside_damage`` does for the rest of that segment what
recovery (``recovery.py``) does at start-up: it scans from the read position to the segment's
end, skipping the regions already known, copies each bad region durably to
``<segment>.bad-<offset>`` (``files.save_aside``), logs and counts it. A file shorter than the
queue wrote (truncated behind lmqd's back) loses its missing tail, which is counted and logged
too. The segment file itself is not modified: the reader records the regions in the segment's
``skips`` and jumps over them, and recounts the queue's depth from what the scan found valid.

If the bytes cannot be copied aside (a full disk), ``OSError`` propagates and nothing is
skipped: the reader stops before them and tries again on the next read.

``Damage`` holds a queue's counters, from recovery and from reading; the daemon's stats read
them through ``DiskQueue`` and ``TopicLog`` (``damage_counts``). They live in memory for the
queue's life: a restart counts again what its recovery finds (a region in a segment not yet
consumed is found, and counted, at every start until the segment is deleted).
"""

from __future__ import annotations

import logging
import mmap
import os
from typing import TYPE_CHECKING

import attrs

from lmqd.storage.files import save_aside
from lmqd.storage.record import RECORD_TYPES
from lmqd.storage.scan import scan_records
from lmqd.storage.segments import Segment
from lmqd.storage.verify import estimate_messages

if TYPE_CHECKING:
    from lmqd.storage.atrest.seal import Opener

log = logging.getLogger("lmqd.storage")


@attrs.define(slots=True)
class Damage:
    """What a queue found wrong with its files, at start-up and while reading."""

    corrupt_count: int = 0
    """Corrupt regions found (at start-up and while reading) and set aside."""
    corrupt_bytes: int = 0
    torn_bytes: int = 0
    """Bytes of torn writes truncated at start-up (a crash mid-write; not data loss)."""
    missing_segments: int = 0
    """Segment files the positions file expected that were not found."""
    rebuilt_positions: bool = False
    """True if the positions file was missing or damaged and was rebuilt from the segments."""
    lost_messages: int = 0
    """Messages estimated lost in the regions set aside (``verify.estimate_messages``, a lower
    bound) or, at start-up, the shortfall against the depth the positions file recorded."""
    rebuilt_count: int = 0
    """Positions (a positions file, a log's state file, one cursor) that disagreed with the
    segments, or were missing or damaged, and were rebuilt from them."""

    def snapshot(self) -> Damage:
        """A copy of the counters (the engine turns it into ``lmqd.stats.StorageDamage``)."""
        return attrs.evolve(self)

    def add(self, other: Damage) -> None:
        """Count ``other``'s findings too (recovery's, into a store's running counters)."""
        self.corrupt_count += other.corrupt_count
        self.corrupt_bytes += other.corrupt_bytes
        self.torn_bytes += other.torn_bytes
        self.missing_segments += other.missing_segments
        self.rebuilt_positions = self.rebuilt_positions or other.rebuilt_positions
        self.lost_messages += other.lost_messages
        self.rebuilt_count += other.rebuilt_count

    def add_region(self, size: int, messages: int) -> None:
        """Count one region set aside: ``size`` bytes, ``messages`` estimated lost."""
        self.corrupt_count += 1
        self.corrupt_bytes += size
        self.lost_messages += messages


class DamageCounters:
    """The damage counters a store shows (``DiskQueue``, ``TopicLog``): read from its
    ``_damage``, which its recovery and its readers add to."""

    _damage: Damage

    @property
    def corrupt_count(self) -> int:
        """Corrupt regions found (at start-up and while reading) and set aside."""
        return self._damage.corrupt_count

    @property
    def corrupt_bytes(self) -> int:
        return self._damage.corrupt_bytes

    @property
    def torn_bytes(self) -> int:
        """Bytes of torn writes truncated at start-up (a crash mid-write; not data loss)."""
        return self._damage.torn_bytes

    @property
    def missing_segments(self) -> int:
        """Segment files the positions or state file expected that were not found."""
        return self._damage.missing_segments

    @property
    def damage(self) -> Damage:
        """What the store found wrong with its files since it was opened (recovery included)."""
        return self._damage.snapshot()


def set_aside_damage(
    name: str,
    seg: Segment,
    fd: int,
    pos: int,
    damage: Damage,
    types: tuple[int, ...] = RECORD_TYPES,
    subject: str = "DISKQUEUE",
    opener: Opener | None = None,
) -> tuple[list[tuple[int, int]], int]:
    """Set aside every bad region of ``seg`` (open as ``fd``) from ``pos`` to its end.
    ``types``: the record types valid in the segment (a disk queue's by default); ``subject``:
    how log lines name the owner (``DISKQUEUE(<name>)`` or ``TOPICLOG(<name>)``); ``opener``:
    how sealed records open (one that does not is a bad region).

    Returns the new bad regions (start, end), not yet in ``seg.skips``, and the number of
    messages in the valid records from ``pos`` on. Raises ``OSError`` if the file cannot be
    read or a region cannot be copied aside.
    """
    size = os.fstat(fd).st_size
    end = min(seg.end, size)
    ranges = []
    cursor = pos
    for start, stop in [*seg.skips, (seg.end, seg.end)]:
        if stop <= cursor:
            continue
        if start > cursor:
            ranges.append((cursor, min(start, end)))
        cursor = max(cursor, stop)
    remaining = 0
    found: list[tuple[int, int]] = []
    if end > pos:
        with mmap.mmap(fd, end, access=mmap.ACCESS_READ) as mm:
            for start, stop in ranges:
                if start >= stop:
                    continue
                scan = scan_records(mm, start, stop, types=types, opener=opener)
                remaining += scan.records
                for bad_start, bad_end, _ in scan.regions:
                    _set_aside(
                        f"{subject}({name})",
                        seg,
                        mm[bad_start:bad_end],
                        bad_start,
                        bad_end,
                        damage,
                        types,
                    )
                    found.append((bad_start, bad_end))
    if end < seg.end:
        lost = seg.end - end
        # The missing bytes held at least one record (lmqd wrote up to ``seg.end``).
        damage.add_region(lost, 1)
        log.error(
            "%s(%s): %s is %d bytes shorter than written; skipping them",
            subject,
            name,
            seg.path,
            lost,
        )
        found.append((end, seg.end))
    return found, remaining


def _set_aside(
    owner: str,
    seg: Segment,
    data: bytes,
    start: int,
    end: int,
    damage: Damage,
    types: tuple[int, ...],
) -> None:
    aside = save_aside(f"{seg.path}.bad-{start}", data)
    damage.add_region(end - start, estimate_messages(data, types))
    log.error(
        "%s: %s: corrupt region of %d bytes at offset %d set aside in %s",
        owner,
        seg.path,
        end - start,
        start,
        aside,
    )

"""Peek: a disk queue's next messages, read from its files without consuming anything.

``peek_queue`` starts where the queue's reader stands (segment, record offset, messages of that
record already taken) and decodes forward through the live segments with the verifying decoder
(``decoder.decode_records``), stepping over the regions recovery set aside (``Segment.bounds``).
It never repairs, retires or moves anything: a region it cannot decode ends the peek there (the
reader will deal with it when it gets there). Reads are ``pread`` on a descriptor of its own, in
chunks of ``PEEK_CHUNK`` bytes (a record longer than that is read whole, up to the format's
``MAX_RECORD_LENGTH``), so a peek costs what it shows, not the queue's size.

``stored_offsets`` reads the same way to the queue's end and keeps only the topic offsets its
records carry (``record.FLAG_OFFSET``): what a primary's channel keeps in its stores, for its
mirrors (``lmqd.engine.holds``); it costs a read of the queue, once.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Generator, Iterator, Sequence
from typing import TYPE_CHECKING

from lmqd.message import Message
from lmqd.message_ext import ExtError, decode_ext
from lmqd.storage.decoder import decode_records
from lmqd.storage.record import (
    MAX_RECORD_LENGTH,
    SEALED_RECORD_TYPES,
    SEGMENT_HEADER_SIZE,
    U32,
    Record,
)
from lmqd.storage.segments import Segment

if TYPE_CHECKING:
    from lmqd.storage.atrest.seal import Opener

__all__ = ["PEEK_CHUNK", "peek_queue", "peek_records", "stored_offsets"]

PEEK_CHUNK = 256 * 1024
"""Bytes read per step: a batch record's usual size (``record.MAX_BATCH_BYTES``)."""


def peek_queue(
    segments: Sequence[Segment],
    position: tuple[int, int, int],
    count: int,
    from_wall_ns: Callable[[int], float],
    opener: Opener | None = None,
) -> list[Message]:
    """Up to ``count`` messages from ``position`` = (segment number, record offset, messages of
    that record to skip) on, oldest first (sealed batches opened by ``opener``); ``OSError`` if
    a file cannot be read."""
    if count <= 0:
        return []
    out: list[Message] = []
    for r in peek_records(segments, position, opener):
        out.append(_message(r, from_wall_ns))
        if len(out) >= count:
            break
    return out


def stored_offsets(
    segments: Sequence[Segment], position: tuple[int, int, int], opener: Opener | None = None
) -> tuple[dict[bytes, int], int]:
    """The topic offsets (``record.FLAG_OFFSET``) of the messages from ``position`` on that
    carry one, by id, and how many carry none: reads every record from there (``OSError`` if
    a file cannot be read), keeping nothing else."""
    found: dict[bytes, int] = {}
    without = 0
    for r in peek_records(segments, position, opener):
        if r.offset >= 0:
            found[r.id] = r.offset
        else:
            without += 1
    return found, without


def peek_records(
    segments: Sequence[Segment], position: tuple[int, int, int], opener: Opener | None = None
) -> Iterator[Record]:
    """The records from ``position`` on, oldest first, read as they are asked for; ends at
    the last one or at a region that does not decode."""
    number, pos, skip = position
    for seg in segments:
        if seg.number < number:
            continue
        if seg.number > number:
            pos, skip = 0, 0
        try:
            fd = os.open(seg.path, os.O_RDONLY)
        except FileNotFoundError:
            continue  # a read segment a sync job just removed
        try:
            decodable = yield from _peek_segment(fd, seg, pos, skip, opener)
        finally:
            os.close(fd)
        if not decodable:
            return  # stop where the reader would have to repair
        pos = 0


def _peek_segment(
    fd: int, seg: Segment, pos: int, skip: int, opener: Opener | None
) -> Generator[Record, None, bool]:
    """The records of one segment from ``pos``; returns False if a region did not decode."""
    pos = max(pos, SEGMENT_HEADER_SIZE)
    while True:
        pos, stop = seg.bounds(pos)
        if pos >= seg.end:
            return True
        chunk = min(stop - pos, PEEK_CHUNK)
        data = os.pread(fd, chunk, pos)
        records, used = decode_records(data, 0, SEALED_RECORD_TYPES, opener)
        if used == 0:
            if len(data) < 4:
                return False
            need = U32.unpack_from(data, 0)[0] + 4
            if need <= len(data) or need > min(stop - pos, MAX_RECORD_LENGTH + 4):
                return False
            data = os.pread(fd, need, pos)
            records, used = decode_records(data, 0, SEALED_RECORD_TYPES, opener)
            if used == 0:
                return False
        yield from records[skip:]
        skip = max(skip - len(records), 0)
        pos += used


def _message(r: Record, from_wall_ns: Callable[[int], float]) -> Message:
    m = Message(
        r.id,
        r.body,
        r.timestamp,
        r.attempts,
        from_wall_ns(r.deliver_after_ns) if r.deliver_after_ns else 0.0,
    )
    if r.headers is not None:
        try:
            m.ext = decode_ext(r.headers)
        except ExtError:
            m.ext = None
    return m

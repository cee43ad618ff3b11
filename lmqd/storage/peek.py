"""Peek: a disk queue's next messages, read from its files without consuming anything.

``peek_queue`` starts where the queue's reader stands (segment, record offset, messages of that
record already taken) and decodes forward through the live segments with the verifying decoder
(``decoder.decode_records``), stepping over the regions recovery set aside (``Segment.bounds``).
It never repairs, retires or moves anything: a region it cannot decode ends the peek there (the
reader will deal with it when it gets there). Reads are ``pread`` on a descriptor of its own, in
chunks of ``PEEK_CHUNK`` bytes (a record longer than that is read whole, up to the format's
``MAX_RECORD_LENGTH``), so a peek costs what it shows, not the queue's size.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
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

__all__ = ["PEEK_CHUNK", "peek_queue"]

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
    out: list[Message] = []
    number, pos, skip = position
    for seg in segments:
        if seg.number < number:
            continue
        if seg.number > number:
            pos, skip = 0, 0
        if len(out) >= count:
            break
        fd = os.open(seg.path, os.O_RDONLY)
        try:
            skip = _peek_segment(fd, seg, pos, skip, count, out, from_wall_ns, opener)
        finally:
            os.close(fd)
        if skip < 0:
            break  # undecodable: stop where the reader would have to repair
        pos = 0
    return out


def _peek_segment(
    fd: int,
    seg: Segment,
    pos: int,
    skip: int,
    count: int,
    out: list[Message],
    from_wall_ns: Callable[[int], float],
    opener: Opener | None,
) -> int:
    """Peek one segment from ``pos``; returns 0, or -1 if a region did not decode."""
    pos = max(pos, SEGMENT_HEADER_SIZE)
    while len(out) < count:
        pos, stop = seg.bounds(pos)
        if pos >= seg.end:
            return 0
        chunk = min(stop - pos, PEEK_CHUNK)
        data = os.pread(fd, chunk, pos)
        records, used = decode_records(data, 0, SEALED_RECORD_TYPES, opener)
        if used == 0:
            if len(data) < 4:
                return -1
            need = U32.unpack_from(data, 0)[0] + 4
            if need <= len(data) or need > min(stop - pos, MAX_RECORD_LENGTH + 4):
                return -1
            data = os.pread(fd, need, pos)
            records, used = decode_records(data, 0, SEALED_RECORD_TYPES, opener)
            if used == 0:
                return -1
        for r in records[skip:]:
            out.append(_message(r, from_wall_ns))
            if len(out) >= count:
                return 0
        skip = max(skip - len(records), 0)
        pos += used
    return 0


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

"""The start-up check: can this daemon's at-rest settings read every stored batch?

A data directory written with encryption needs its keys; one written by a newer build may hold
codecs this one does not know. Recovery would take such batches for damage and set them aside,
so the daemon checks first, **before it takes the data directory** (its lock file included) and
before any store is opened: ``check_data_dir`` walks every segment file that may hold sealed
batches (format versions 4 and 5), reads each sealed record's clear header and asks the
``Opener`` whether it has what the record names (``Opener.check``: a key with that id, the codec,
the cipher). The first that it does not have stops the daemon with one line naming the file; no
file is written, moved or deleted, so a restart with the right settings reads everything.

Only records whose CRC matches are asked about: a damaged one is recovery's business (it sets it
aside and counts it). After a bad region the walk resynchronises as recovery does. Segments of
other versions hold no sealed batch and are not read past their header. Cost: one read of every
sealed segment at start-up (recovery then reads them again), well under a second per GiB.
"""

from __future__ import annotations

import mmap
import os

from crc32c import crc32c

from lmqd.storage.atrest.seal import Opener, UnknownSeal
from lmqd.storage.files import is_segment_file
from lmqd.storage.record import (
    MAX_RECORD_LENGTH,
    MIN_RECORD_LENGTH,
    RECORD_TYPES_BY_VERSION,
    SEALED_FORMAT_VERSION,
    SEALED_LOG_FORMAT_VERSION,
    SEALED_TYPES,
    SEGMENT_HEADER_SIZE,
    U32,
    FormatError,
    decode_segment_header,
)
from lmqd.storage.verify import find_next_record

_SEALED_VERSIONS = (SEALED_FORMAT_VERSION, SEALED_LOG_FORMAT_VERSION)


class AtRestRefused(ValueError):
    """A stored batch this daemon's settings cannot read; the message names the file."""


def check_data_dir(data_path: str, opener: Opener) -> int:
    """Refuse (``AtRestRefused``) if a sealed batch in ``data_path`` needs what ``opener``
    lacks; returns the number of sealed segment files checked. A missing directory has none.
    Reads only; ``OSError`` if a file cannot be read."""
    try:
        names = sorted(os.listdir(data_path))
    except (FileNotFoundError, NotADirectoryError):
        return 0  # nothing stored (the daemon then says what is wrong with the path)
    checked = 0
    for name in names:
        if not is_segment_file(name):
            continue
        path = os.path.join(data_path, name)
        if check_segment(path, opener):
            checked += 1
    return checked


def check_segment(path: str, opener: Opener) -> bool:
    """``check_data_dir`` for one segment file; False if it cannot hold sealed batches."""
    with open(path, "rb") as f:
        try:
            header = decode_segment_header(f.read(SEGMENT_HEADER_SIZE), _SEALED_VERSIONS)
        except FormatError:
            return False  # not a sealed version (or a damaged header: recovery's business)
        size = os.fstat(f.fileno()).st_size
        if size <= SEGMENT_HEADER_SIZE:
            return True
        types = RECORD_TYPES_BY_VERSION[header.version]
        with mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ) as mm:
            pos = SEGMENT_HEADER_SIZE
            while pos + 5 <= size:
                length = U32.unpack_from(mm, pos)[0]
                end = pos + 4 + length
                if (
                    MIN_RECORD_LENGTH <= length <= MAX_RECORD_LENGTH
                    and mm[pos + 4] in types
                    and end <= size
                    and crc32c(mm[pos + 4 : end - 4]) == U32.unpack_from(mm, end - 4)[0]
                ):
                    if mm[pos + 4] in SEALED_TYPES:
                        try:
                            opener.check(mm, pos)
                        except UnknownSeal as exc:
                            raise AtRestRefused(
                                f"{path}: batch at offset {pos}: {exc}; nothing was changed "
                                f"(start again with the key files it was written with)"
                            ) from None
                    pos = end
                    continue
                pos = find_next_record(mm, pos + 1, size, types)
                if pos < 0:
                    break
    return True

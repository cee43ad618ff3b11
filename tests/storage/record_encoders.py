"""Record encoders used only by the tests: the general forms the daemon never writes.

The daemon has one encoder (``lmqd.storage.encoder``: batch records without optional fields,
what ``DiskQueue.put_many`` writes). The tests also need bytes the daemon no longer or not yet
writes, to check that its decoders read them: single-message ('M') records, the format of
version-1 segments (``encode_record``, ``encode_records``), and batch records with option blocks
(``encode_batch``) or with a deliberately lying structure (``frame_batch``). They are written
from the format's tables (``lmqd/storage/record.py``, docs/storage.md), independently of the
daemon's encoder, so each checks the other.
"""

from __future__ import annotations

from collections.abc import Sequence

from crc32c import crc32c

from lmqd.message import MSG_ID_LENGTH
from lmqd.storage.record import (
    BATCH_ENTRY,
    BATCH_FLAG_OPTIONS,
    BATCH_HEADER,
    BATCH_OVERHEAD,
    FLAG_EXPIRY,
    FLAG_HEADERS,
    FLAG_OFFSET,
    I64,
    MAX_ATTEMPTS,
    RECORD_OVERHEAD,
    RECORD_PREFIX,
    TYPE_BATCH,
    TYPE_MESSAGE,
    U32,
    Record,
)


def _optional_fields(
    expires_ns: int | None, headers: bytes | None, offset: int = -1
) -> tuple[int, bytes]:
    """The flags and the bytes of a message's optional fields, in flag-bit order."""
    flags = 0
    parts = []
    if expires_ns is not None:
        flags |= FLAG_EXPIRY
        parts.append(U32.pack(8) + I64.pack(expires_ns))
    if headers is not None:
        flags |= FLAG_HEADERS
        parts.append(U32.pack(len(headers)) + headers)
    if offset >= 0:
        flags |= FLAG_OFFSET
        parts.append(U32.pack(8) + I64.pack(offset))
    return flags, b"".join(parts)


def record_parts(
    msg_id: bytes,
    timestamp: int,
    attempts: int,
    deliver_after_ns: int,
    body: bytes,
    expires_ns: int | None = None,
    headers: bytes | None = None,
    offset: int = -1,
) -> tuple[bytes, bytes, bytes]:
    """A single-message record as three pieces (prefix with optional fields, body, CRC)."""
    if len(msg_id) != MSG_ID_LENGTH:
        raise ValueError(f"message id must be {MSG_ID_LENGTH} bytes")
    if expires_ns is None and headers is None and offset < 0:
        flags, extra = 0, b""
    else:
        flags, extra = _optional_fields(expires_ns, headers, offset)
    length = RECORD_OVERHEAD - 4 + len(extra) + len(body)
    prefix = RECORD_PREFIX.pack(
        length,
        TYPE_MESSAGE,
        flags,
        msg_id,
        timestamp,
        min(attempts, MAX_ATTEMPTS),
        deliver_after_ns,
    )
    if extra:
        prefix += extra
    crc = crc32c(body, crc32c(prefix[4:]))
    return prefix, body, U32.pack(crc)


def encode_record(
    msg_id: bytes,
    timestamp: int,
    attempts: int,
    deliver_after_ns: int,
    body: bytes,
    expires_ns: int | None = None,
    headers: bytes | None = None,
    offset: int = -1,
) -> bytes:
    """One record as bytes."""
    return b"".join(
        record_parts(
            msg_id, timestamp, attempts, deliver_after_ns, body, expires_ns, headers, offset
        )
    )


def encode_records(records: Sequence[Record]) -> bytes:
    """Many single-message ('M') records in one buffer (the format before batches)."""
    parts: list[bytes] = []
    extend = parts.extend
    for r in records:
        extend(record_parts(*r))
    return b"".join(parts)


def frame_batch(count: int, flags: int, sections: Sequence[bytes]) -> tuple[bytes, bytes]:
    """The header and the CRC that turn a batch's ``sections`` into a record.

    ``sections`` are the bytes between the header and the CRC (entries, bodies, option blocks),
    in order; the record is ``header + b"".join(sections) + crc``.
    """
    size = 0
    for section in sections:
        size += len(section)
    head = BATCH_HEADER.pack(BATCH_OVERHEAD - 4 + size, TYPE_BATCH, flags, count)
    crc = crc32c(head[4:])
    for section in sections:
        crc = crc32c(section, crc)
    return head, U32.pack(crc)


def encode_batch(records: Sequence[Record]) -> bytes:
    """One batch ('B') record holding ``records`` in order (the general form, optional fields
    included). ``lmqd.storage.encoder`` builds the same bytes for records without optional
    fields; a test checks that they agree."""
    if not records:
        raise ValueError("a batch holds at least one message")
    entries = []
    bodies = []
    options = []
    for r in records:
        if len(r.id) != MSG_ID_LENGTH:
            raise ValueError(f"message id must be {MSG_ID_LENGTH} bytes")
        entries.append(
            BATCH_ENTRY.pack(
                len(r.body), r.id, r.timestamp, min(r.attempts, MAX_ATTEMPTS), r.deliver_after_ns
            )
        )
        bodies.append(r.body)
        if r.expires_ns is None and r.headers is None:
            options.append(b"\x00")
        else:
            field_flags, extra = _optional_fields(r.expires_ns, r.headers, r.offset)
            options.append(bytes((field_flags,)) + extra)
    sections = [b"".join(entries), b"".join(bodies)]
    flags = 0
    if any(o != b"\x00" for o in options):
        flags = BATCH_FLAG_OPTIONS
        sections.append(b"".join(options))
    head, crc = frame_batch(len(records), flags, sections)
    return b"".join([head, *sections, crc])

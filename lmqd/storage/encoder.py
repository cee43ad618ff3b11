"""The storage format's one encoder: messages to batch records (``record.py``), three steps.

1. ``encode_entries``: each message's 38-byte entry (``record.BATCH_ENTRY``) and its body, in two
   lists. This is the loop that runs once per message spilled to disk: one ``pack`` and two
   appends. (``encode_plain``: the same for a publish's bodies written before any message
   object is made, from C loops.)
2. ``plan_batches``: where the records go. A call's messages are split into batch records where
   a segment fills up (``max_bytes_per_file``) and where a batch would pass
   ``record.MAX_BATCH_BYTES``; a segment always takes at least one message and a batch holds at
   least one, however large. The plan is per segment, the write segment first (possibly empty,
   when the first message does not fit there), then new ones.
3. ``frame_batches``: one segment's share of the plan as bytes, in one buffer. One join copies
   every body once (no per-batch buffers joined again); each batch's CRC32C is then computed
   over its bytes in place and written into its last four bytes.

The writer (``writer.py``) then hands each segment's buffer to the OS with one ``pwrite``.
Single-message ('M') records are no longer written at all; ``decoder.py`` still reads both.

**Option blocks.** A call none of whose messages has an lmq extension (``Message.ext``: NSQ's
messages) writes batch flags 0 and no option blocks: the check is one C loop over the call
(``encode_options``). Otherwise every batch of the call has flag ``BATCH_FLAG_OPTIONS`` and one
option block per message after the bodies, ``[flags][fields]``: ``b"\x00"`` for a message
without extension, ``FLAG_HEADERS`` with the extension block (``lmqd.message_ext``) as the
field for one with it. Planning counts each message's block with its body. A disk queue's
call (no ``first_offset``) some of whose messages have a topic offset (a channel's copy of a
message of its topic's log) gives every message a block, with ``FLAG_OFFSET`` and the offset for
those that have one: what a primary tells its mirrors of a channel's stores after a restart
(``lmqd.engine.holds``).

A topic log (``log.py``) writes *offset* batches ('O', format version 3): the same steps with
the call's first offset given, each batch's header then carrying the offset of its first message
(the call's first offset plus the batch's first index); planning counts their larger overhead.

Theory of operation of ``plan_batches``: ``cum[k]``, the bytes of the entries and bodies of
messages ``0..k-1``, is built with C loops (``accumulate``, ``map``), then each batch's end is a
``bisect`` in it, so planning costs no Python bytecode per message. The common large call (all of
it fits the write segment) is split into equal counts per batch, which fits the cap unless the
sizes are skewed; the general walk handles the rest.
"""

from __future__ import annotations

import struct
from bisect import bisect_right
from collections.abc import Callable, Mapping, Sequence
from itertools import accumulate, pairwise, repeat
from operator import add, attrgetter, is_

from crc32c import crc32c

from lmqd.message import MSG_ID_LENGTH, Message
from lmqd.message_ext import MessageExt, encode_ext
from lmqd.storage.record import (
    BATCH_ENTRY,
    BATCH_ENTRY_SIZE,
    BATCH_FLAG_OPTIONS,
    BATCH_HEADER,
    BATCH_OVERHEAD,
    FLAG_HEADERS,
    FLAG_OFFSET,
    MAX_ATTEMPTS,
    MAX_BATCH_BYTES,
    OFFSET_BATCH_HEADER,
    OFFSET_BATCH_OVERHEAD,
    SEGMENT_HEADER_SIZE,
    TYPE_BATCH,
    TYPE_OFFSET_BATCH,
    U32,
)

Batch = tuple[int, int, int]
"""A planned batch record: (first message, end message, payload bytes of entries and bodies)."""

_NO_CRC = bytes(4)
"""Room for a batch's CRC, filled in once the batch's bytes are joined."""
_NO_OPTIONS = b"\x00"
"""The option block of a message without extension, in a batch where another has one."""
_EXT_OPTION = bytes((FLAG_HEADERS,))
_ext = attrgetter("ext")
_BLOCK = attrgetter("block")


def encode_entries(
    messages: Sequence[Message], to_wall_ns: Callable[[float], int]
) -> tuple[list[bytes], list[bytes]]:
    """Each message's batch entry (``record.BATCH_ENTRY``) and its body, in two lists.

    ``to_wall_ns`` converts a ``deliver_at`` (trio time) to what is stored. Raises
    ``ValueError`` for a message id of the wrong length. This loop runs once per message
    spilled to disk: one ``pack`` and two appends.
    """
    pack = BATCH_ENTRY.pack
    entries: list[bytes] = []
    bodies: list[bytes] = []
    add_entry = entries.append
    add_body = bodies.append
    try:
        for m in messages:
            msg_id = m.id
            if len(msg_id) != MSG_ID_LENGTH:
                raise ValueError(f"message id must be {MSG_ID_LENGTH} bytes, not {msg_id!r}")
            body = m.body
            deliver = m.deliver_at
            add_entry(
                pack(
                    len(body),
                    msg_id,
                    m.timestamp,
                    m.attempts,
                    to_wall_ns(deliver) if deliver else 0,
                )
            )
            add_body(body)
    except struct.error:
        # Attempts past the field's width: saturate (rare, so not in the loop above).
        entries = []
        for m in messages:
            if len(m.id) != MSG_ID_LENGTH:
                raise ValueError(
                    f"message id must be {MSG_ID_LENGTH} bytes, not {m.id!r}"
                ) from None
            deliver = m.deliver_at
            entries.append(
                pack(
                    len(m.body),
                    m.id,
                    m.timestamp,
                    min(m.attempts, MAX_ATTEMPTS),
                    to_wall_ns(deliver) if deliver else 0,
                )
            )
        bodies = [m.body for m in messages]
    return entries, bodies


def encode_plain(ids: Sequence[bytes], bodies: Sequence[bytes], timestamp: int) -> list[bytes]:
    """``encode_entries`` for a publish's bodies, before any message object is made: every
    entry has ``timestamp``, attempts 0 and no deliver-after time, and the ids (the topic's
    ``GuidFactory``'s) are well formed. One ``pack`` per message from C loops: ~35 ns a message
    less than ``encode_entries``' loop over message objects."""
    return list(map(BATCH_ENTRY.pack, map(len, bodies), ids, repeat(timestamp), _ZEROS, _ZEROS))


_ZEROS = repeat(0)
"""An endless 0, for ``encode_plain``'s attempts and deliver-after columns (map stops at the
shortest)."""


def encode_options(
    messages: Sequence[Message], offsets: Mapping[bytes, int] | None = None
) -> list[bytes] | None:
    """Each message's option block, or None when no message has an extension (the common
    case, found without a Python-level loop). Each distinct extension object (a publish's
    messages share one) is encoded once; the list is then built with C loops.

    ``offsets`` (a disk queue's records; None for a topic log's): a message with a topic offset
    (``Message.offset``: a message of a topic's log a channel keeps in its own store), or
    without one but in ``offsets`` by id (the channel's notes: read back from a store), carries
    it too (``FLAG_OFFSET``), a loop over the call's messages."""
    if offsets is not None and (offsets or any(map(_has_offset, messages))):
        return _options_with_offsets(messages, offsets)
    if not any(map(_ext, messages)):
        return None
    return ext_options(list(map(_ext, messages)))


def ext_options(exts: Sequence[MessageExt | None]) -> list[bytes]:
    """The option block of each extension (a topic log's record: no offsets), each distinct
    object encoded once, the list built with C loops.

    Extensions that are not all one object and were all decoded from blocks (an XPUB with a
    dedup id per message: one extension per message) have their records built from those
    blocks by C loops alone: ~95 ns a message against ~280 through the loop below."""
    if exts and exts[0] is not exts[-1] and not any(map(is_, exts, repeat(None))):
        blocks = list(map(_BLOCK, exts))
        if not any(map(is_, blocks, repeat(None))):
            return list(map(b"".join, zip(repeat(_EXT_OPTION), map(U32.pack, map(len, blocks)),
                                          blocks)))  # fmt: skip
    options: dict[int, bytes] = {}
    for key, ext in dict(zip(map(id, exts), exts, strict=True)).items():
        if ext is None:
            options[key] = _NO_OPTIONS
        else:
            block = encode_ext(ext, check=False)
            options[key] = _EXT_OPTION + U32.pack(len(block)) + block
    return list(map(options.__getitem__, map(id, exts)))


def _has_offset(m: Message) -> bool:
    return m.offset >= 0


def _options_with_offsets(
    messages: Sequence[Message], noted: Mapping[bytes, int]
) -> list[bytes]:
    """``encode_options`` of a disk queue's call some of whose messages have a topic offset."""
    out: list[bytes] = []
    blocks: dict[int, bytes] = {}
    for m in messages:
        offset = m.offset if m.offset >= 0 else noted.get(m.id, -1)
        ext = m.ext
        if ext is None:
            block = b""
        else:
            block = blocks.get(id(ext), b"")
            if not block:
                raw = encode_ext(ext, check=False)
                block = blocks[id(ext)] = U32.pack(len(raw)) + raw
        flags = FLAG_HEADERS if block else 0
        if offset >= 0:
            out.append(bytes((flags | FLAG_OFFSET,)) + block + _OFFSET_FIELD.pack(8, offset))
        else:
            out.append(bytes((flags,)) + block)
    return out


_OFFSET_FIELD = struct.Struct(">Iq")
"""A ``FLAG_OFFSET`` field: its length (8) and the offset."""


def plan_batches(
    bodies: list[bytes],
    start_pos: int,
    max_bytes: int,
    overhead: int = BATCH_OVERHEAD,
    options: list[bytes] | None = None,
) -> list[list[Batch]]:
    """Split messages into batch records: per segment (the write segment first, possibly
    empty, then new ones), its batches as (first, end, payload bytes): the message range and
    the bytes of its entries and bodies.

    ``start_pos``: the write position in the write segment; ``max_bytes``: the segment size
    limit (``max_bytes_per_file``); ``overhead``: a record's bytes beyond its payload
    (``BATCH_OVERHEAD``, or ``OFFSET_BATCH_OVERHEAD`` for a topic log). A batch ends where the
    segment is full or at ``MAX_BATCH_BYTES``; a segment always takes at least one message, and
    a batch holds at least one, however large. ``options``: each message's option block
    (``encode_options``), counted with its body.
    """
    sizes = list(map(len, bodies))
    if options is not None:
        sizes = list(map(add, sizes, map(len, options)))
    n = len(sizes)
    cap = MAX_BATCH_BYTES - overhead
    total = n * BATCH_ENTRY_SIZE + sum(sizes)
    parts = -(-total // cap)
    if start_pos + parts * overhead + total <= max_bytes:
        if parts == 1:
            return [[(0, n, total)]]
        # The common large call: equal counts per batch fit the cap unless sizes are skewed.
        bounds = [n * k // parts for k in range(parts + 1)]
        even = [
            (first, end, BATCH_ENTRY_SIZE * (end - first) + sum(sizes[first:end]))
            for first, end in pairwise(bounds)
        ]
        if all(size <= cap for _, _, size in even):
            return [even]
    # The general case (segment boundary, skewed sizes): cum[k] is the bytes of the entries
    # and bodies of messages 0..k-1 (C loops, no per-message bytecode).
    cum = list(
        map(
            add,
            accumulate(sizes, initial=0),
            range(0, BATCH_ENTRY_SIZE * (n + 1), BATCH_ENTRY_SIZE),
        )
    )
    chunks: list[list[Batch]] = []
    batches: list[Batch] = []
    pos = start_pos
    i = 0
    while i < n:
        room = max_bytes - pos - overhead
        j = bisect_right(cum, cum[i] + min(room, cap), i + 1) - 1
        if j == i:
            if pos > SEGMENT_HEADER_SIZE and cum[i + 1] - cum[i] > room:
                chunks.append(batches)  # this segment is full
                batches = []
                pos = SEGMENT_HEADER_SIZE
                continue
            j = i + 1
        batches.append((i, j, cum[j] - cum[i]))
        pos += overhead + cum[j] - cum[i]
        i = j
    chunks.append(batches)
    return chunks


def frame_batches(
    entries: list[bytes],
    bodies: list[bytes],
    batches: list[Batch],
    first_offset: int | None = None,
    options: list[bytes] | None = None,
) -> bytearray:
    """The batch records of one segment's share of a call, in one buffer.

    One join copies every body once (no per-batch buffers joined again); the CRC of each
    batch is then computed over its bytes in place and written into its last four bytes.
    With ``first_offset`` (the topic offset of the call's first message) the records are
    offset batches ('O'), each carrying the offset of its own first message. With
    ``options`` (``encode_options``; the plan counted them), each batch carries its messages'
    option blocks.
    """
    n = len(bodies)
    overhead = BATCH_OVERHEAD if first_offset is None else OFFSET_BATCH_OVERHEAD
    flags = 0 if options is None else BATCH_FLAG_OPTIONS
    parts: list[bytes] = []
    for first, end, payload in batches:
        length = overhead - 4 + payload
        if first_offset is None:
            parts.append(BATCH_HEADER.pack(length, TYPE_BATCH, flags, end - first))
        else:
            parts.append(
                OFFSET_BATCH_HEADER.pack(
                    length, TYPE_OFFSET_BATCH, flags, end - first, first_offset + first
                )
            )
        if first == 0 and end == n:
            parts += entries
            parts += bodies
            if options is not None:
                parts += options
        else:
            parts += entries[first:end]
            parts += bodies[first:end]
            if options is not None:
                parts += options[first:end]
        parts.append(_NO_CRC)
    data = bytearray().join(parts)
    pos = 0
    with memoryview(data) as view:
        for _, _, payload in batches:
            crc_at = pos + overhead - 4 + payload
            U32.pack_into(data, crc_at, crc32c(view[pos + 4 : crc_at]))
            pos = crc_at + 4
    return data

"""The storage format's one decoder: records of every readable version, back to messages.

Two forms of output, from the same layout rules:

* **messages** (``decode_batch``, ``decode_message``): what the disk queue's reader hands out,
  ``Message`` objects (``StoredMessage`` in acknowledgement mode, with their tokens), deadlines
  converted back to trio time. ``decode_batch`` is the read hot path: for a batch without option
  blocks, one ``iter_unpack`` for all the entries (a C loop), then per message one slice and one
  object. A batch whose option blocks are only extension blocks (what lmqd writes for messages
  with lmq fields) takes the same path, its blocks walked in place (``_option_exts``: a block
  equal to the one before it costs one comparison, each distinct one is decoded once and its
  ``MessageExt`` shared). Anything else (other optional fields, an implausible count, a
  single-message record) goes through the general form below and is converted, the headers
  field becoming the message's extension (``Message.ext``, ``lmqd.message_ext``).
* **extension blocks** (``extension_blocks``): each message's extension block and timestamp,
  for start-up's look at what is stored (``ext_notes.py``): no message made, no body copied.
* **records** (``decode_batch_records``, ``decode_message_record`` and the verifying
  ``decode_record``, ``decode_any``, ``decode_records``): ``record.Record`` tuples with every
  field, optional ones included; for tools, tests and the slow path above.

Offset batches ('O', a topic log's records) share the batch layout with an 8-byte longer header:
``decode_batch`` takes the header's size, and the general form finds it from the type byte.

The message decoders expect a record whose CRC already matched (the reader checks it while
framing) and return ``None`` for an inconsistent structure; the verifying record decoders check
everything themselves (``verify.py``) and raise ``FormatError``. Nothing here does I/O.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from operator import itemgetter
from typing import TYPE_CHECKING

from lmqd.message import Message
from lmqd.message_ext import ExtError, MessageExt, decode_ext
from lmqd.storage.record import (
    BATCH_ENTRY,
    BATCH_ENTRY_SIZE,
    BATCH_FLAG_OPTIONS,
    BATCH_HEADER,
    BATCH_HEADER_SIZE,
    FLAG_HEADERS,
    FLAG_OFFSET,
    MAX_BATCH_COUNT,
    RECORD_PREFIX,
    RECORD_PREFIX_SIZE,
    RECORD_TYPES,
    SEALED_TYPES,
    TYPE_MESSAGE,
    U32,
    Buffer,
    FormatError,
    Record,
    header_offset_size,
)
from lmqd.storage.tokens import StoredMessage
from lmqd.storage.verify import batch_layout, check_record, parse_optional_fields, verify_open

if TYPE_CHECKING:
    from lmqd.storage.atrest.seal import Opener

_ENTRY_LENGTHS = struct.Struct(">I34x")
"""Just the body length of each batch entry, for stepping over skipped messages in C."""
_first = itemgetter(0)

# -- records to messages (the disk queue's reader) ---------------------------------------------


def decode_batch(
    buf: bytes,
    view: memoryview,
    i: int,
    rec_end: int,
    token: int,
    from_wall_ns: Callable[[int], float],
    ack_mode: bool,
    header_size: int = BATCH_HEADER_SIZE,
    skip: int = 0,
    first_offset: int = -1,
) -> list[Message] | None:
    """The messages of the batch at ``buf[i:rec_end]`` (CRC already checked; ``view`` is
    ``memoryview(buf)``); None if its structure is inconsistent. ``token``: the token of its
    first message (acknowledgement mode); ``header_size``: ``OFFSET_BATCH_HEADER_SIZE`` for an
    offset batch; ``skip``: leave out that many messages at the start (a read from the middle
    of a batch: their bodies are stepped over, not copied); ``first_offset``: the topic offset
    of the first message returned (an offset batch read by a topic log's reader), set on each
    message (``Message.offset``) as it is made. The hot path: one ``iter_unpack`` for all the
    entries, then per message one slice and one message object."""
    _, _, flags, count = BATCH_HEADER.unpack_from(buf, i)
    crc_at = rec_end - 4
    at = i + header_size + count * BATCH_ENTRY_SIZE
    exts: list[MessageExt | None] | None = None
    if flags == BATCH_FLAG_OPTIONS and 1 <= count <= MAX_BATCH_COUNT and at <= crc_at:
        # Option blocks that are only extension blocks (what lmqd writes): read here, each
        # distinct block decoded once; anything else takes the general path.
        with view[i + header_size : at] as entry_view:
            options_at = at + sum(map(_first, _ENTRY_LENGTHS.iter_unpack(entry_view)))
        exts = _option_exts(buf, options_at, crc_at, count)
        if exts is not None:
            flags = 0
            crc_at = options_at
    if flags or not 1 <= count <= MAX_BATCH_COUNT or at > crc_at:
        try:
            records = decode_batch_records(buf, i, rec_end)
        except FormatError:
            return None
        general = _messages(records[skip:], token + skip, from_wall_ns, ack_mode)
        if first_offset >= 0:
            for k, m in enumerate(general, first_offset):
                m.offset = k
        return general
    entries_at = i + header_size
    if skip:
        skipped_at = entries_at + min(skip, count) * BATCH_ENTRY_SIZE
        at += sum(map(_first, _ENTRY_LENGTHS.iter_unpack(view[entries_at:skipped_at])))
        entries_at = skipped_at
        token += skip
    entries = BATCH_ENTRY.iter_unpack(view[entries_at : i + header_size + count * BATCH_ENTRY_SIZE])
    msgs: list[Message] = []
    add = msgs.append
    if ack_mode:
        for n, msg_id, timestamp, attempts, deliver in entries:
            end = at + n
            add(
                StoredMessage(
                    msg_id,
                    buf[at:end],
                    timestamp,
                    attempts,
                    from_wall_ns(deliver) if deliver else 0.0,
                    token=token,
                )
            )
            token += 1
            at = end
    elif exts is not None:
        # The fields between deliver_at and offset: their defaults (``Message``).
        offset = first_offset
        step = 1 if first_offset >= 0 else 0
        for (n, msg_id, timestamp, attempts, deliver), ext in zip(
            entries, exts[skip:], strict=True
        ):
            end = at + n
            add(
                Message(
                    msg_id, buf[at:end], timestamp, attempts,
                    from_wall_ns(deliver) if deliver else 0.0, 0, 0.0, 0.0, offset, ext,
                )
            )  # fmt: skip
            at = end
            offset += step
    elif first_offset >= 0:
        offset = first_offset
        for n, msg_id, timestamp, attempts, deliver in entries:
            end = at + n
            add(
                Message(
                    msg_id, buf[at:end], timestamp, attempts,
                    from_wall_ns(deliver) if deliver else 0.0, 0, 0.0, 0.0, offset,
                )
            )  # fmt: skip
            at = end
            offset += 1
    else:
        for n, msg_id, timestamp, attempts, deliver in entries:
            end = at + n
            add(
                Message(
                    msg_id, buf[at:end], timestamp, attempts,
                    from_wall_ns(deliver) if deliver else 0.0,
                )
            )  # fmt: skip
            at = end
    # Slices stop at the buffer's end, so a lying length shows here (only a writer bug can
    # make one: the CRC matched).
    if at != crc_at:
        return None
    if exts is not None and ack_mode:
        for m, ext in zip(msgs, exts[skip:], strict=True):
            if ext is not None:
                m.ext = ext
    return msgs


def _option_exts(buf: bytes, at: int, end: int, count: int) -> list[MessageExt | None] | None:
    """Each message's extension from the ``count`` option blocks at ``buf[at:end]``, if they
    are all ``b"\x00"``, an extension block (``FLAG_HEADERS``) and/or a topic offset
    (``FLAG_OFFSET``, which a reader of the queue leaves out: see ``record.FLAG_OFFSET``) and
    end exactly at ``end``; None otherwise (the general path decides). A block equal to the
    one before it is recognised by one comparison and shares its ``MessageExt``; a block that
    does not decode (only a writer bug could store one under a matching CRC) gives None, as in
    ``_messages``."""
    if end - at == _OFFSET_BLOCK * count and _offsets_only(buf, at, end, count):
        return [None] * count  # a channel's store: topic offsets only (checked in C)
    exts: list[MessageExt | None] = []
    add = exts.append
    decoded: dict[bytes, MessageExt | None] = {}
    last = b""
    span = 0
    ext: MessageExt | None = None
    for _ in range(count):
        if last and buf[at : at + span] == last:
            at += span
            add(ext)
            continue
        if at >= end:
            return None
        flags = buf[at]
        if flags & ~(FLAG_HEADERS | FLAG_OFFSET):
            return None
        start = at
        at += 1
        ext = None
        if flags & FLAG_HEADERS:
            if at + 4 > end:
                return None
            stop = at + 4 + U32.unpack_from(buf, at)[0]
            if stop > end:
                return None
            ext = _cached_ext(buf[at + 4 : stop], decoded)
            at = stop
        if flags & FLAG_OFFSET:
            at += _OFFSET_FIELD
            if at > end or U32.unpack_from(buf, at - _OFFSET_FIELD)[0] != 8:
                return None
            last = b""  # each message's offset differs
        else:
            last = buf[start:at]
            span = at - start
        add(ext)
    return exts if at == end else None


_OFFSET_FIELD = 12
"""A ``FLAG_OFFSET`` field's bytes: its length (8) and the offset."""
_OFFSET_BLOCK = 1 + _OFFSET_FIELD
"""An option block holding a topic offset alone."""


def _offsets_only(buf: bytes, at: int, end: int, count: int) -> bool:
    """Whether the ``count`` blocks at ``buf[at:end]`` are each a topic offset alone (flags
    ``FLAG_OFFSET``, length 8): five strided slices compared, no Python loop per message."""
    step = _OFFSET_BLOCK
    return (
        buf[at:end:step] == bytes((FLAG_OFFSET,)) * count
        and buf[at + 1 : end : step] == bytes(count)
        and buf[at + 2 : end : step] == bytes(count)
        and buf[at + 3 : end : step] == bytes(count)
        and buf[at + 4 : end : step] == b"\x08" * count
    )
_NO_OPTIONS = b"\x00"


def _cached_ext(raw: bytes, decoded: dict[bytes, MessageExt | None]) -> MessageExt | None:
    """The extension of block ``raw``, decoded once per batch (``decoded``: its messages often
    share one block). A block that does not decode, which only a writer bug could store under
    a matching CRC, gives None: the message is kept without it."""
    if raw in decoded:
        return decoded[raw]
    try:
        ext: MessageExt | None = decode_ext(raw)
    except ExtError:
        ext = None
    decoded[raw] = ext
    return ext


def decode_message(
    buf: bytes,
    i: int,
    rec_end: int,
    token: int,
    from_wall_ns: Callable[[int], float],
    ack_mode: bool,
) -> list[Message] | None:
    """The message of the single-message record at ``buf[i:rec_end]`` (the format before
    batches; CRC already checked), as a list of one; None if its structure is inconsistent."""
    try:
        record = decode_message_record(buf, i, rec_end)
    except FormatError:
        return None
    return _messages([record], token, from_wall_ns, ack_mode)


def _messages(
    records: list[Record], token: int, from_wall_ns: Callable[[int], float], ack_mode: bool
) -> list[Message]:
    """Records of the general form as the reader's messages, with their extension (an
    extension block that does not decode, which only a writer bug could store under a matching
    CRC, is dropped and the message kept)."""
    msgs: list[Message] = []
    decoded: dict[bytes, MessageExt | None] = {}  # a batch's messages often share one block
    for k, r in enumerate(records):
        deliver_at = from_wall_ns(r.deliver_after_ns) if r.deliver_after_ns else 0.0
        ext = _cached_ext(r.headers, decoded) if r.headers is not None else None
        if ack_mode:
            m: Message = StoredMessage(
                r.id, r.body, r.timestamp, r.attempts, deliver_at, token=token + k
            )
        else:
            m = Message(r.id, r.body, r.timestamp, r.attempts, deliver_at)
        m.ext = ext
        msgs.append(m)
    return msgs


# -- extension blocks only ---------------------------------------------------------------------


def extension_blocks(buf: Buffer, offset: int, rec_end: int) -> list[tuple[int, bytes]]:
    """(timestamp, extension block) of each message of the record at ``offset`` (any type, its
    CRC checked) that carries a block, in order. A record without option blocks costs two byte
    reads; otherwise the entries are unpacked in C and only the option blocks are walked.

    Raises ``FormatError`` if the option blocks run past the record's end.
    """
    crc_at = rec_end - 4
    flags = buf[offset + 5]
    if buf[offset + 4] == TYPE_MESSAGE:
        if not flags & FLAG_HEADERS:
            return []
        timestamp = RECORD_PREFIX.unpack_from(buf, offset)[4]
        block = parse_optional_fields(buf, offset + RECORD_PREFIX_SIZE, crc_at, flags)[1]
        return [(timestamp, block)] if block is not None else []
    if not flags & BATCH_FLAG_OPTIONS:
        return []
    count = BATCH_HEADER.unpack_from(buf, offset)[3]
    entries_at = offset + header_offset_size(buf[offset + 4])
    bodies_at = entries_at + count * BATCH_ENTRY_SIZE
    if not 1 <= count <= MAX_BATCH_COUNT or bodies_at > crc_at:
        raise FormatError("batch entries past the record end")
    with memoryview(buf) as whole, whole[entries_at:bodies_at] as view:
        entries = [(n, timestamp) for n, _, timestamp, _, _ in BATCH_ENTRY.iter_unpack(view)]
    at = bodies_at + sum(n for n, _ in entries)
    out: list[tuple[int, bytes]] = []
    for _, timestamp in entries:
        if at >= crc_at:
            raise FormatError("option block past the record end")
        _, block, at, _ = parse_optional_fields(buf, at + 1, crc_at, buf[at])
        if block is not None:
            out.append((timestamp, block))
    return out


# -- records, every field (the general form) ---------------------------------------------------


def decode_message_record(buf: Buffer, offset: int, rec_end: int) -> Record:
    """The message of the 'M' record at ``offset`` whose CRC has been checked.

    Raises ``FormatError`` if its optional fields run past the CRC.
    """
    crc_at = rec_end - 4
    if offset + RECORD_PREFIX_SIZE > crc_at:
        raise FormatError("single-message record shorter than its prefix")
    _, _, flags, msg_id, timestamp, attempts, deliver = RECORD_PREFIX.unpack_from(buf, offset)
    body_at = offset + RECORD_PREFIX_SIZE
    expires_ns: int | None = None
    headers: bytes | None = None
    topic_offset = -1
    if flags:
        expires_ns, headers, body_at, topic_offset = parse_optional_fields(
            buf, body_at, crc_at, flags
        )
    body = bytes(buf[body_at:crc_at])
    return Record(msg_id, timestamp, attempts, deliver, body, expires_ns, headers, topic_offset)


def decode_batch_records(buf: Buffer, offset: int, rec_end: int) -> list[Record]:
    """The messages of the batch ('B' or 'O') at ``offset`` whose CRC has been checked
    (general form).

    Raises ``FormatError`` if its structure is inconsistent.
    """
    count, bodies_at, options_at = batch_layout(buf, offset, rec_end)
    flags: int = buf[offset + 5]
    out = []
    body_at = bodies_at
    opt_at = options_at
    entries_at = bodies_at - count * BATCH_ENTRY_SIZE
    for i in range(count):
        n, msg_id, timestamp, attempts, deliver = BATCH_ENTRY.unpack_from(
            buf, entries_at + i * BATCH_ENTRY_SIZE
        )
        expires_ns: int | None = None
        headers: bytes | None = None
        topic_offset = -1
        if flags & BATCH_FLAG_OPTIONS:
            expires_ns, headers, opt_at, topic_offset = parse_optional_fields(
                buf, opt_at + 1, rec_end - 4, buf[opt_at]
            )
        body = bytes(buf[body_at : body_at + n])
        body_at += n
        out.append(
            Record(msg_id, timestamp, attempts, deliver, body, expires_ns, headers, topic_offset)
        )
    return out


def decode_record(buf: bytes | memoryview, offset: int = 0) -> tuple[Record, int]:
    """Decode and verify one single-message ('M') record; returns it and the offset after it.

    Raises FormatError (also for a batch record: use ``decode_any``).
    """
    end = check_record(buf, offset, len(buf))
    if end == -1:
        raise FormatError("truncated record")
    if end < 0:
        raise FormatError("invalid record")
    if buf[offset + 4] != TYPE_MESSAGE:
        raise FormatError("not a single-message record")
    return decode_message_record(buf, offset, end), end


def decode_any(
    buf: Buffer,
    offset: int = 0,
    types: tuple[int, ...] = RECORD_TYPES,
    opener: Opener | None = None,
) -> tuple[list[Record], int]:
    """Decode and verify the record at ``offset``, of any of ``types`` (by default a disk
    queue's: 'M' or 'B'): its messages and its end. A sealed record is opened by ``opener``
    (without one it is invalid here).

    Raises FormatError.
    """
    end, _, plain = verify_open(buf, offset, len(buf), types, opener)
    if end == -1:
        raise FormatError("truncated record")
    if end < 0:
        raise FormatError("invalid record")
    if plain is not None:
        return decode_batch_records(plain, 0, len(plain)), end
    if buf[offset + 4] in SEALED_TYPES:
        raise FormatError("a sealed record, and nothing to open it with")
    if buf[offset + 4] != TYPE_MESSAGE:
        return decode_batch_records(buf, offset, end), end
    return [decode_message_record(buf, offset, end)], end


def decode_records(
    buf: Buffer,
    offset: int = 0,
    types: tuple[int, ...] = RECORD_TYPES,
    opener: Opener | None = None,
) -> tuple[list[Record], int]:
    """Decode records of any of ``types`` from ``offset`` until the first incomplete or invalid
    one (sealed ones opened by ``opener``).

    Returns the messages and the offset where decoding stopped (``len(buf)`` if all were valid).
    """
    out: list[Record] = []
    end = len(buf)
    while offset < end:
        try:
            records, next_offset = decode_any(buf, offset, types, opener)
        except FormatError:
            break
        out.extend(records)
        offset = next_offset
    return out, offset

"""The copy frames of ``GET /mirror/read``: a topic's messages as a mirror stores them.

``/topic/read`` (``lmqd.message.READ_FRAME``) shows a reader what a consumer would see; a mirror
needs the whole message as the primary stores it, to store the same one at the same offset: its
deferred due time and every field of its lmq extension (TTL and dedup id too, which a consumer
never sees). One frame per message, big-endian::

    0   4  size: the bytes after this field (44 + the extension block's + the body's)
    4   8  offset in the topic's stream
   12   8  timestamp, ns since the epoch
   20   2  attempts (the primary stores 0 for a published message; a dead letter's count is in
           its headers)
   22   8  deliver-after, wall-clock ns since the epoch (0: not deferred)
   30  16  message id
   46   2  extension block length n (0: none)
   48   n  extension block (``lmqd.message_ext``: priority, TTL, dedup id, headers)
 48+n   .  body

Trio-free: the primary encodes with its topic log's time base (deadlines are trio time in
memory), the mirror decodes with its own.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

from lmqd.engine.replica import Copy, PlainRun
from lmqd.message import Message
from lmqd.message_ext import decode_ext, encode_ext
from lmqd.storage import TimeBase

__all__ = ["COPY_CONTENT_TYPE", "COPY_FRAME", "decode_copies", "encode_copies"]

COPY_FRAME = struct.Struct(">IqqHq16sH")
COPY_CONTENT_TYPE = "application/x-lmq-copies"


def encode_copies(entries: Iterable[tuple[int, Message]], timebase: TimeBase) -> bytes:
    """``(offset, message)`` pairs as copy frames, concatenated."""
    pack = COPY_FRAME.pack
    fixed = COPY_FRAME.size - 4
    to_wall = timebase.to_wall_ns
    parts: list[bytes] = []
    append = parts.append
    for offset, m in entries:
        body = m.body
        ext = m.ext
        if ext is None and not m.deliver_at:  # NSQ's messages: the common case, no branch more
            append(pack(fixed + len(body), offset, m.timestamp, m.attempts, 0, m.id, 0))
            append(body)
            continue
        block = encode_ext(ext, check=False) if ext is not None else b""
        due = to_wall(m.deliver_at) if m.deliver_at else 0
        append(pack(fixed + len(block) + len(body), offset, m.timestamp, m.attempts, due, m.id,
                    len(block)))  # fmt: skip
        if block:
            append(block)
        append(body)
    return b"".join(parts)


def decode_copies(data: bytes, timebase: TimeBase) -> list[Copy]:
    """What ``encode_copies`` encoded, ready to store (``replica.store_copies``): consecutive
    plain messages of one timestamp (no extension, not deferred, attempts 0: a publish's) as
    a ``PlainRun`` of columns, any other as ``(offset, message)``. Raises ``ValueError`` (an
    ``ExtError`` for a bad extension block) if the data is not framed so."""
    out: list[Copy] = []
    unpack = COPY_FRAME.unpack_from
    header = COPY_FRAME.size
    from_wall = timebase.from_wall_ns
    pos = 0
    end = len(data)
    run: PlainRun | None = None
    run_end = -1
    while pos < end:
        if pos + header > end:
            raise ValueError("truncated copy frame")
        size, offset, ts, attempts, due, msg_id, length = unpack(data, pos)
        stop = pos + 4 + size
        if size < header - 4 + length or stop > end or offset < 0:
            raise ValueError("malformed copy frame")
        start = pos + header
        pos = stop
        if not (length or due or attempts):
            if run is None or offset != run_end or ts != run.timestamp:
                run = PlainRun(offset, [], [], ts)
                out.append(run)
            run.ids.append(msg_id)
            run.bodies.append(data[start:stop])
            run_end = offset + 1
            continue
        run = None
        m = Message(msg_id, data[start + length : stop], ts, attempts)
        if due:
            m.deliver_at = from_wall(due)
        if length:
            m.ext = decode_ext(data[start : start + length])
        out.append((offset, m))
    return out

"""A message's lmq extension: per-message fields NSQ has no room for, and their byte form.

``MessageExt`` is what a message carries beyond NSQ's fields: a ``priority`` (0..9, higher
delivered first), a ``ttl_ms``, a ``dedup_id`` and string ``headers``. The same **extension
block** is its form on the wire (``lmqd.protocol.extension``: XPUB, frame type 3) and on disk
(a record's headers field, ``lmqd.storage.record``). Big-endian, self-delimiting, every field
optional and announced by a bit of the first byte::

    0   1  flags: 0x01 priority, 0x02 ttl, 0x04 dedup id, 0x08 headers (other bits: refused)
    .   1  priority, 1..9                               if 0x01
    .   4  ttl_ms, uint32, 1..MAX_TTL_MS                if 0x02
    .   1  dedup id length n, 1..MAX_DEDUP_ID           if 0x04
    .   n  dedup id bytes
    .   2  header count c, 1..MAX_HEADERS               if 0x08
           c times: [1 key length k, 1..255][k bytes key, UTF-8, no control characters]
                    [2 value length v][v bytes value, UTF-8]

A block is at most ``MAX_EXT_SIZE`` bytes; the headers' keys and values together at most
``MAX_HEADER_BYTES``. Header keys are unique within a message (a map on every side). Everything
is checked here, so the daemon only ever holds well-formed blocks.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Iterable
from operator import attrgetter

import attrs

__all__ = [
    "DEAD_LETTER_HEADERS",
    "DEAD_LETTER_PATH",
    "DEDUP_ID",
    "MAX_DEAD_LETTER_PATH",
    "MAX_DEDUP_ID",
    "MAX_EXT_SIZE",
    "MAX_HEADERS",
    "MAX_HEADER_BYTES",
    "MAX_PRIORITY",
    "MAX_TTL_MS",
    "NO_EXT",
    "PRIORITY",
    "ExtError",
    "MessageExt",
    "any_set",
    "closes_dead_letter_loop",
    "dead_letter_ext",
    "dead_letter_path",
    "decode_ext",
    "encode_ext",
    "ttl_and_dedup_id",
    "validate",
    "with_dedup_id",
    "without_dead_letter_path",
]

PRIORITY = 0x01
"""The flag bit of the priority field (storage finds priorities by it without decoding)."""
TTL = 0x02
DEDUP_ID = 0x04
HEADERS = 0x08
_KNOWN = PRIORITY | TTL | DEDUP_ID | HEADERS

MAX_PRIORITY = 9
MAX_TTL_MS = 2**32 - 1
"""A uint32 of milliseconds: 49 days, longer than any queue keeps a message waiting."""
MAX_DEDUP_ID = 255
"""A dedup id is a key (a UUID, a hash, "query/batch/partition/row"): 255 bytes is plenty."""
MAX_HEADERS = 64
MAX_HEADER_BYTES = 16 * 1024
"""Keys and values of one message together: metadata, not a second body (Kafka users keep
headers to a few hundred bytes; the bound keeps every message's overhead small and known)."""
MAX_EXT_SIZE = 1 + 1 + 4 + 1 + MAX_DEDUP_ID + 2 + MAX_HEADERS * 3 + MAX_HEADER_BYTES
"""The largest well-formed block."""

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")


class ExtError(ValueError):
    """A malformed extension block or XPUB body; ``str()`` says what, for the error frame."""


@attrs.frozen(slots=True)
class MessageExt:
    """What one message carries beyond NSQ's fields. The defaults mean "not set"."""

    priority: int = 0
    ttl_ms: int = 0
    dedup_id: bytes = b""
    headers: tuple[tuple[str, str], ...] = ()
    block: bytes | None = attrs.field(default=None, init=False, eq=False, repr=False)
    """The block it was decoded from (``decode_ext``), which ``encode_ext`` returns instead of
    encoding again: the daemon writes to its log the blocks it read from XPUBs. Not part of
    its value (equality, hash); None for an extension made from fields."""

    @property
    def visible(self) -> bool:
        """Whether a consumer sees anything of it (priority or headers)."""
        return bool(self.priority or self.headers)


_CONTROL = re.compile("[\x00-\x1f\x7f]")
"""A control character: not allowed in a header key."""

NO_EXT = MessageExt()
"""An extension with nothing set (the one-byte block ``b"\\x00"``): a message stores ``None``
instead."""


def _check_text(raw: bytes, what: str, *, key: bool) -> str:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ExtError(f"{what} is not UTF-8") from None
    if key and _CONTROL.search(text):
        raise ExtError(f"{what} has a control character")
    return text


def validate(ext: MessageExt) -> MessageExt:
    """``ext`` if every field is within the extension's bounds; raises ``ExtError``."""
    if not 0 <= ext.priority <= MAX_PRIORITY:
        raise ExtError(f"priority {ext.priority} out of range 0..{MAX_PRIORITY}")
    if not 0 <= ext.ttl_ms <= MAX_TTL_MS:
        raise ExtError(f"ttl_ms {ext.ttl_ms} out of range 0..{MAX_TTL_MS}")
    if len(ext.dedup_id) > MAX_DEDUP_ID:
        raise ExtError(f"dedup id longer than {MAX_DEDUP_ID} bytes")
    if len(ext.headers) > MAX_HEADERS:
        raise ExtError(f"more than {MAX_HEADERS} headers")
    total = 0
    seen: set[str] = set()
    for key, value in ext.headers:
        raw_key = key.encode("utf-8")
        if not 1 <= len(raw_key) <= 255:
            raise ExtError("a header key must be 1..255 bytes")
        _check_text(raw_key, f"header key {key!r}", key=True)
        if key in seen:
            raise ExtError(f"header key {key!r} repeated")
        seen.add(key)
        total += len(raw_key) + len(value.encode("utf-8"))
    if total > MAX_HEADER_BYTES:
        raise ExtError(f"headers larger than {MAX_HEADER_BYTES} bytes")
    return ext


def encode_ext(ext: MessageExt, *, check: bool = True) -> bytes:
    """The block for ``ext``, validated first (raises ``ExtError``) unless ``check`` is false:
    for an extension the daemon already holds (it was checked when it came in)."""
    if ext.block is not None:
        return ext.block  # decoded, so valid
    if check:
        validate(ext)
    flags = 0
    parts = [b""]
    if ext.priority:
        flags |= PRIORITY
        parts.append(bytes((ext.priority,)))
    if ext.ttl_ms:
        flags |= TTL
        parts.append(_U32.pack(ext.ttl_ms))
    if ext.dedup_id:
        flags |= DEDUP_ID
        parts.append(bytes((len(ext.dedup_id),)) + ext.dedup_id)
    if ext.headers:
        flags |= HEADERS
        parts.append(_U16.pack(len(ext.headers)))
        for key, value in ext.headers:
            k = key.encode("utf-8")
            v = value.encode("utf-8")
            parts += (bytes((len(k),)), k, _U16.pack(len(v)), v)
    parts[0] = bytes((flags,))
    return b"".join(parts)


def decode_ext(data: bytes) -> MessageExt:
    """The block ``data`` holds, exactly (trailing bytes are an error); raises ``ExtError``."""
    if not data:
        raise ExtError("empty extension block")
    if data[0] == DEDUP_ID and len(data) > 2 and data[1] == len(data) - 2:
        # A dedup id alone (one block per message with ``--dedup-ids``): nothing to validate
        # beyond its length, which one byte cannot make too long.
        return with_dedup_id(data[2:], data)
    if len(data) > MAX_EXT_SIZE:
        raise ExtError(f"extension block larger than {MAX_EXT_SIZE} bytes")
    flags = data[0]
    if flags & ~_KNOWN:
        raise ExtError(f"unknown extension flags 0x{flags & ~_KNOWN:02x}")
    p = 1
    end = len(data)
    priority = ttl_ms = 0
    dedup_id = b""
    headers: list[tuple[str, str]] = []
    try:
        if flags & PRIORITY:
            priority = data[p]
            p += 1
            if not 1 <= priority <= MAX_PRIORITY:
                raise ExtError(f"priority {priority} out of range 1..{MAX_PRIORITY}")
        if flags & TTL:
            ttl_ms = _U32.unpack_from(data, p)[0]
            p += 4
            if ttl_ms == 0:
                raise ExtError("ttl_ms 0 (leave the field out for none)")
        if flags & DEDUP_ID:
            n = data[p]
            p += 1
            if n == 0:
                raise ExtError("empty dedup id (leave the field out for none)")
            if p + n > end:
                raise ExtError("truncated dedup id")
            dedup_id = data[p : p + n]
            p += n
        if flags & HEADERS:
            count = _U16.unpack_from(data, p)[0]
            p += 2
            if not 1 <= count <= MAX_HEADERS:
                raise ExtError(f"header count {count} out of range 1..{MAX_HEADERS}")
            for _ in range(count):
                k = data[p]
                p += 1
                if k == 0 or p + k > end:
                    raise ExtError("bad header key length")
                key = _check_text(data[p : p + k], "a header key", key=True)
                p += k
                v = _U16.unpack_from(data, p)[0]
                p += 2
                if p + v > end:
                    raise ExtError("truncated header value")
                value = _check_text(data[p : p + v], f"header {key!r}", key=False)
                p += v
                headers.append((key, value))
    except (IndexError, struct.error):
        raise ExtError("truncated extension block") from None
    if p != end:
        raise ExtError(f"{end - p} bytes after the extension block")
    ext = validate(MessageExt(priority, ttl_ms, dedup_id, tuple(headers)))
    _set_block(ext, bytes(data))
    return ext


# attrs' frozen __init__ sets each field through object.__setattr__; a block with a dedup id
# alone is decoded once per message, so its extension is made by setting the slots directly.
_set_priority = MessageExt.__dict__["priority"].__set__
_set_ttl_ms = MessageExt.__dict__["ttl_ms"].__set__
_set_dedup_id = MessageExt.__dict__["dedup_id"].__set__
_set_headers = MessageExt.__dict__["headers"].__set__
_set_block = MessageExt.__dict__["block"].__set__


def with_dedup_id(dedup_id: bytes, block: bytes) -> MessageExt:
    """``MessageExt(dedup_id=dedup_id)`` decoded from ``block`` (a dedup id alone: ``DEDUP_ID``,
    its length, the id), faster; the caller checked the block's form."""
    ext: MessageExt = object.__new__(MessageExt)
    _set_priority(ext, 0)
    _set_ttl_ms(ext, 0)
    _set_dedup_id(ext, dedup_id)
    _set_headers(ext, ())
    _set_block(ext, bytes(block))
    return ext


def any_set(exts: Iterable[MessageExt | None], field: str) -> bool:
    """Whether some extension of ``exts`` (a publish's, None where a message has none) has
    ``field`` (``"priority"``, ``"ttl_ms"``, ``"dedup_id"``, ``"headers"``) set. C loops
    alone (an extension object is always true): ~10 ns a message whether the messages share
    one extension or each has its own (a dedup id per message), where finding the distinct
    objects first cost ~40 ns a message more for the latter."""
    return any(map(attrgetter(field), filter(None, exts)))


def ttl_and_dedup_id(block: bytes) -> tuple[int, bytes]:
    """The ``ttl_ms`` and ``dedup_id`` of a stored block (0 and ``b""`` where unset), read from
    its first fields only: no validation, no header decoded. For start-up, which looks at every
    stored block (``lmqd.storage.ext_notes``); a block that does not parse gives ``(0, b"")``,
    as ``decode_ext`` failing makes the message's extension None."""
    try:
        flags = block[0]
        if flags & ~_KNOWN:
            return 0, b""
        p = 2 if flags & PRIORITY else 1
        ttl_ms = 0
        if flags & TTL:
            ttl_ms = _U32.unpack_from(block, p)[0]
            p += 4
        if not flags & DEDUP_ID:
            return ttl_ms, b""
        n = block[p]
        dedup_id = bytes(block[p + 1 : p + 1 + n])
    except (IndexError, struct.error):
        return 0, b""
    return ttl_ms, dedup_id if len(dedup_id) == n else b""


DEAD_LETTER_HEADERS = ("lmq-dead-letter-topic", "lmq-dead-letter-channel",
                       "lmq-dead-letter-reason", "lmq-dead-letter-attempts")  # fmt: skip
"""What a dead-lettered message carries about where it came from (replacing the same keys from
an earlier dead-lettering)."""

DEAD_LETTER_PATH = "lmq-dead-letter-path"
"""The topics a dead letter was dead-lettered from, oldest first, comma-separated (a topic name
holds no comma), since it was published or last redriven: a channel whose dead-letter topic is
on it would close a loop, and drops the message instead (``lmqd.engine.retry``; RabbitMQ's
``x-death`` rule). A redrive starts it again (``without_dead_letter_path``)."""

MAX_DEAD_LETTER_PATH = 4096
"""Bytes a dead-letter path may take (dozens of topics): a dead letter that would need more is
dropped as if it closed a loop, so the path always fits the headers' bound."""


def dead_letter_path(ext: MessageExt | None) -> tuple[str, ...]:
    """The topics a message was dead-lettered from (``DEAD_LETTER_PATH``; () for none)."""
    if ext is not None:
        for key, value in ext.headers:
            if key == DEAD_LETTER_PATH:
                return tuple(value.split(","))
    return ()


def closes_dead_letter_loop(ext: MessageExt | None, target: str) -> bool:
    """Whether dead-lettering a message with ``ext`` to topic ``target`` would send it back to
    a topic it was dead-lettered from (or make its path longer than ``MAX_DEAD_LETTER_PATH``)."""
    path = dead_letter_path(ext)
    if not path:
        return False
    return target in path or sum(map(len, path)) + len(path) + len(target) > MAX_DEAD_LETTER_PATH


def without_dead_letter_path(ext: MessageExt | None) -> MessageExt | None:
    """``ext`` without its dead-letter path (a redriven copy: its dead-lettering starts again);
    the other dead-letter headers stay, for whoever looks at where it came from."""
    if ext is None or not any(key == DEAD_LETTER_PATH for key, _ in ext.headers):
        return ext
    headers = tuple((k, v) for k, v in ext.headers if k != DEAD_LETTER_PATH)
    return MessageExt(ext.priority, ext.ttl_ms, ext.dedup_id, headers)


def dead_letter_ext(
    ext: MessageExt | None, topic: str, channel: str, reason: str, attempts: int
) -> MessageExt:
    """``ext`` (or none) with the dead-letter headers naming the source topic, channel, the
    reason and the attempts, and ``topic`` added to its dead-letter path; the priority and
    headers kept, the TTL and dedup id dropped (the dead-letter topic's own policies apply
    there). If the headers would pass the bounds, the message's own headers are dropped: the
    origin is what an operator needs (``closes_dead_letter_loop`` keeps the path within them)."""
    origin = (
        (DEAD_LETTER_HEADERS[0], topic),
        (DEAD_LETTER_HEADERS[1], channel),
        (DEAD_LETTER_HEADERS[2], reason),
        (DEAD_LETTER_HEADERS[3], str(attempts)),
        (DEAD_LETTER_PATH, ",".join((*dead_letter_path(ext), topic))),
    )
    kept = tuple(
        (k, v)
        for k, v in (ext.headers if ext is not None else ())
        if k not in DEAD_LETTER_HEADERS and k != DEAD_LETTER_PATH
    )
    priority = ext.priority if ext is not None else 0
    try:
        return validate(MessageExt(priority, 0, b"", kept + origin))
    except ExtError:
        return MessageExt(priority, 0, b"", origin)

"""lmq's message extension over HTTP: ``/pub`` and ``/mpub`` with per-message fields.

``priority`` (1..9; 0 or absent: none), ``ttl_ms`` (1..4294967295) and ``dedup_id`` (1..255
bytes) are query parameters; headers come from request headers named ``Lmq-Header-<name>``
(HTTP header names are case-insensitive, so a header's key is ``<name>`` in lowercase; its
value must be UTF-8). On ``/mpub`` the headers, priority and TTL apply to every message, and
message ``k`` of the batch gets the dedup id ``<dedup_id>:<k>``, so a retried batch is
recognised message by message. The rules are the extension block's (``lmqd.message_ext``);
anything outside them is ``400 INVALID_<PARAM>`` (``INVALID_PRIORITY``, ``INVALID_TTL_MS``,
``INVALID_DEDUP_ID``, ``INVALID_HEADER``) with nothing published.
"""

from __future__ import annotations

import re

from lmqd.httpapi.asgi import HttpError, Query, Request
from lmqd.message_ext import MAX_DEDUP_ID, ExtError, MessageExt, validate

__all__ = ["batch_exts", "request_ext"]

_DIGITS = re.compile(r"[0-9]{1,10}")


def _int_param(query: Query, key: str, low: int, high: int) -> int:
    raw = query.get(key)
    if raw is None:
        return 0
    if not _DIGITS.fullmatch(raw) or not low <= int(raw) <= high:
        raise HttpError(400, f"INVALID_{key.upper()}")
    return int(raw)


def request_ext(request: Request, query: Query) -> MessageExt | None:
    """The extension the request asks for (None: a plain nsqd publish); raises ``HttpError``."""
    priority = _int_param(query, "priority", 0, 9)
    ttl_ms = _int_param(query, "ttl_ms", 1, 2**32 - 1)
    raw_id = query.get("dedup_id")
    dedup_id = b""
    if raw_id is not None:
        dedup_id = raw_id.encode("utf-8", "surrogateescape")
        if not 1 <= len(dedup_id) <= MAX_DEDUP_ID:
            raise HttpError(400, "INVALID_DEDUP_ID")
    headers: list[tuple[str, str]] = []
    for name, value in request.lmq_headers:
        try:
            headers.append((name.decode("utf-8"), value.decode("utf-8")))
        except UnicodeDecodeError:
            raise HttpError(400, "INVALID_HEADER") from None
    if not (priority or ttl_ms or dedup_id or headers):
        return None
    try:
        return validate(MessageExt(priority, ttl_ms, dedup_id, tuple(headers)))
    except ExtError:
        raise HttpError(400, "INVALID_HEADER") from None


def batch_exts(ext: MessageExt | None, count: int) -> list[MessageExt | None] | None:
    """``/mpub``: each message's extension (its own dedup id ``<id>:<k>``); raises
    ``HttpError`` if such an id would be too long."""
    if ext is None:
        return None
    if not ext.dedup_id:
        return [ext] * count
    last = ext.dedup_id + b":%d" % (count - 1)
    if len(last) > MAX_DEDUP_ID:
        raise HttpError(400, "INVALID_DEDUP_ID")
    return [
        MessageExt(ext.priority, ext.ttl_ms, ext.dedup_id + b":%d" % k, ext.headers)
        for k in range(count)
    ]

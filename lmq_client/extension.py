"""lmq's per-message fields from the clients: headers, priority, TTL and dedup ids.

Every lmq client asks for the extension in its IDENTIFY (``"lmq_ext": 1``, a key nsqd ignores);
lmqd's answer says whether it was accepted (``negotiated``). A publish with any of the fields
goes out as XPUB (docs/protocol.md); one without is nsqd's PUB/MPUB/DPUB, so a client works
against nsqd as before and only a publish that needs the extension fails there, with a clear
error. Consumed messages carry the headers and priority the daemon sends in frame type 3.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypedDict, Unpack

from lmq_client.errors import LmqClientError
from lmqd.message_ext import ExtError, MessageExt, validate
from lmqd.protocol import Dpub, Mpub, Pub
from lmqd.protocol.extension import EXT_VERSION, IDENTIFY_KEY, XpubMessage, encode_xpub

__all__ = [
    "IDENTIFY_FIELDS",
    "Fields",
    "message_ext",
    "negotiated",
    "publish_command",
    "require_extension",
    "xpub_command",
]

IDENTIFY_FIELDS: dict[str, Any] = {IDENTIFY_KEY: EXT_VERSION}
"""What every lmq client adds to its IDENTIFY."""


def negotiated(server_settings: Mapping[str, Any]) -> bool:
    """Whether the daemon's IDENTIFY answer accepted the extension."""
    return server_settings.get(IDENTIFY_KEY) == EXT_VERSION


def require_extension(server_settings: Mapping[str, Any], address: str) -> None:
    """Raise ``LmqClientError`` unless the daemon at ``address`` accepted the extension."""
    if not negotiated(server_settings):
        raise LmqClientError(
            f"{address} does not support lmq's message extension (headers, priority, ttl, "
            "dedup_id): it is not lmqd, or an older one"
        )


def message_ext(
    *,
    headers: Mapping[str, str] | None = None,
    priority: int | None = None,
    ttl: float | None = None,
    dedup_id: str | bytes | None = None,
) -> MessageExt | None:
    """The extension for these fields (None when none is given); ``ValueError`` if one is out
    of the extension's bounds. ``ttl`` is in seconds (millisecond precision, at least 1 ms)."""
    if headers is None and priority is None and ttl is None and dedup_id is None:
        return None
    ttl_ms = 0
    if ttl is not None:
        ttl_ms = round(ttl * 1000)
        if ttl_ms < 1:
            raise ValueError(f"ttl {ttl!r} must be at least 0.001 s")
    raw_id = dedup_id.encode("utf-8") if isinstance(dedup_id, str) else (dedup_id or b"")
    if dedup_id is not None and not raw_id:
        raise ValueError("dedup_id must not be empty")
    try:
        return validate(
            MessageExt(
                priority or 0, ttl_ms, raw_id, tuple((headers or {}).items())
            )
        )
    except ExtError as exc:
        raise ValueError(str(exc)) from None


def xpub_command(
    topic: str,
    bodies: Sequence[bytes],
    ext: MessageExt | None,
    *,
    dedup_ids: Sequence[str | bytes] | None = None,
    defer_ms: int | None = None,
) -> bytes:
    """XPUB for ``bodies``, each with ``ext`` (and its own dedup id from ``dedup_ids``)."""
    base = ext or MessageExt()
    if dedup_ids is None:
        exts = [base] * len(bodies)
    else:
        if len(dedup_ids) != len(bodies):
            raise ValueError("dedup_ids must have one id per message")
        exts = []
        for dedup_id in dedup_ids:
            one = message_ext(dedup_id=dedup_id)
            assert one is not None
            exts.append(MessageExt(base.priority, base.ttl_ms, one.dedup_id, base.headers))
    return encode_xpub(topic, [XpubMessage(b, e) for b, e in zip(bodies, exts, strict=True)],
                       defer_ms)  # fmt: skip


class Fields(TypedDict, total=False):
    """lmq's per-message fields as the producers' keyword arguments."""

    headers: Mapping[str, str] | None
    priority: int | None
    ttl: float | None


def publish_command(
    topic: str,
    bodies: Sequence[bytes],
    *,
    single: bool,
    defer_ms: int | None = None,
    dedup_ids: Sequence[str | bytes] | None = None,
    **fields: Unpack[Fields],
) -> tuple[bytes, bool]:
    """The command that publishes ``bodies`` and whether it needs the extension: nsqd's PUB
    (``single``), MPUB or DPUB (``defer_ms``) when no lmq field is given, else an XPUB. The
    producers' one rule (``lmq_client.producer``, ``lmq_client.sync``); ``ValueError`` for a
    field out of bounds."""
    ext = message_ext(**fields)
    if ext is None and dedup_ids is None:
        if defer_ms is not None:
            return Dpub(topic=topic, defer_ms=defer_ms, body=bodies[0]).encode(), False
        if single:
            return Pub(topic=topic, body=bodies[0]).encode(), False
        return Mpub(topic=topic, bodies=list(bodies)).encode(), False
    return xpub_command(topic, bodies, ext, dedup_ids=dedup_ids, defer_ms=defer_ms), True

"""What lmqd's and lmqlookupd's HTTP APIs share of Go's net/http: query strings as Go parses
them, status lines as Go writes them.

nsqd and nsqlookupd read parameters with ``url.ParseQuery``; a request whose query does not parse
is answered ``400`` by both, so both APIs use this one parser.

Go's server writes every status line with its reason phrase (``HTTP/1.1 404 Not Found``); Go's
clients show it (``resp.Status``): nsqadmin's errors read ``got response 404 Not Found
"{...}"``. hypercorn leaves the phrase out (``HTTP/1.1 404 ``, which HTTP/1.1 allows), so
``send_reason_phrases`` makes its HTTP/1.1 protocol add the standard phrase to responses that
have none; both daemons call it before they serve.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import Any
from urllib.parse import unquote_to_bytes

import h11
from hypercorn.protocol.h11 import H11Protocol

__all__ = ["QueryError", "parse_query", "send_reason_phrases"]


class QueryError(ValueError):
    """The query string does not parse (nsqd: ``400 INVALID_REQUEST``)."""


_BAD_ESCAPE = re.compile(rb"%(?![0-9A-Fa-f]{2})")


def _unescape(raw: bytes) -> str:
    if _BAD_ESCAPE.search(raw):
        raise QueryError("invalid URL escape")
    # Names are ASCII; anything else only has to survive long enough to be rejected as invalid.
    return unquote_to_bytes(raw.replace(b"+", b" ")).decode("utf-8", "replace")


def parse_query(raw: bytes) -> dict[str, list[str]]:
    """Go's ``url.ParseQuery``: every well-formed pair, then ``QueryError`` if any was bad."""
    values: dict[str, list[str]] = {}
    bad = False
    for part in raw.split(b"&"):
        if not part:
            continue
        if b";" in part:  # Go 1.17+: "invalid semicolon separator in query"
            bad = True
            continue
        key, _, value = part.partition(b"=")
        try:
            k, v = _unescape(key), _unescape(value)
        except QueryError:
            bad = True
            continue
        values.setdefault(k, []).append(v)
    if bad:
        raise QueryError("invalid query string")
    return values


def _with_reason(event: Any) -> Any:
    """``event`` with the standard reason phrase if it is a response without one."""
    if isinstance(event, h11.Response | h11.InformationalResponse) and not event.reason:
        try:
            phrase = HTTPStatus(event.status_code).phrase
        except ValueError:  # a code with no standard phrase: as Go, none
            return event
        return type(event)(
            status_code=event.status_code,
            headers=event.headers,
            http_version=event.http_version,
            reason=phrase,
        )
    return event


def send_reason_phrases() -> None:
    """Make hypercorn's HTTP/1.1 responses carry Go's reason phrases (idempotent)."""
    original: Callable[[H11Protocol, Any], Awaitable[None]] = H11Protocol._send_h11_event
    if getattr(original, "lmq_reason_phrases", False):
        return

    async def send(self: H11Protocol, event: Any) -> None:
        await original(self, _with_reason(event))

    send.lmq_reason_phrases = True  # type: ignore[attr-defined]
    H11Protocol._send_h11_event = send  # type: ignore[method-assign]

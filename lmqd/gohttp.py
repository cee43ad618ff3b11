"""What lmqd's and lmqlookupd's HTTP APIs share of Go's net/http: query strings as Go parses them.

nsqd and nsqlookupd read parameters with ``url.ParseQuery``; a request whose query does not parse
is answered ``400`` by both, so both APIs use this one parser.
"""

from __future__ import annotations

import re
from urllib.parse import unquote_to_bytes

__all__ = ["QueryError", "parse_query"]


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

"""Where in a topic's stored stream: the ``from`` / ``to`` / ``at`` values of lmq's replay API.

One rule for the daemon (``lmqd.httpapi.replay``) and for lmqadmin, which checks a value before
it asks, so that a mistyped position is answered with the forms that are accepted
(``POSITION_FORMS``) instead of a bare ``INVALID_ARG_TO``.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import attrs

__all__ = ["POSITION_FORMS", "Position", "parse_position"]

POSITION_FORMS = (
    "earliest, latest, offset:N, a Unix time in milliseconds (1767225600000) or an RFC 3339 "
    "time (2026-01-01T00:00:00Z)"
)
"""The accepted forms, as errors and help texts list them."""

_DIGITS = re.compile(r"[0-9]{1,18}")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@attrs.frozen
class Position:
    """A parsed position: one of its fields is set."""

    earliest: bool = False
    latest: bool = False
    time_ns: int | None = None
    offset: int | None = None


def parse_position(value: str) -> Position | None:
    """``earliest``, ``latest``, an RFC 3339 time, Unix milliseconds or ``offset:N``; None if
    ``value`` is none of them."""
    if value == "earliest":
        return Position(earliest=True)
    if value == "latest":
        return Position(latest=True)
    if value.startswith("offset:"):
        digits = value.removeprefix("offset:")
        return Position(offset=int(digits)) if _DIGITS.fullmatch(digits) else None
    if _DIGITS.fullmatch(value):
        return Position(time_ns=int(value) * 1_000_000)
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        return None
    if when.tzinfo is None or "T" not in value.upper():
        return None  # RFC 3339 has both a date-time separator and an offset
    return Position(time_ns=(when - _EPOCH) // timedelta(microseconds=1) * 1000)

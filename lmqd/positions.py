"""Where in a topic's stored stream: the ``from`` / ``to`` / ``at`` values of lmq's replay API.

One rule for the daemon (``lmqd.httpapi.replay``) and for lmqadmin, which checks a value before
it asks, so that a mistyped position is answered with the forms that are accepted
(``POSITION_FORMS``) instead of a bare ``INVALID_ARG_TO``.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import attrs

__all__ = ["MAX_OFFSET", "POSITION_FORMS", "Position", "parse_number", "parse_position"]

POSITION_FORMS = (
    "earliest, latest, offset:N, a Unix time in milliseconds (1767225600000) or an RFC 3339 "
    "time (2026-01-01T00:00:00Z)"
)
"""The accepted forms, as errors and help texts list them."""

MAX_OFFSET = (1 << 63) - 1
"""The largest number a position or an offset argument stands for: offsets are int64 on disk
and in every answer (a Unix time in milliseconds this large is far past every message), so a
larger number means the same: past everything stored."""

_MAX_DIGITS = len(str(MAX_OFFSET))
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@attrs.frozen
class Position:
    """A parsed position: one of its fields is set."""

    earliest: bool = False
    latest: bool = False
    time_ns: int | None = None
    offset: int | None = None


def parse_number(value: str) -> int | None:
    """Decimal digits (ASCII, at least one) as a number, at most ``MAX_OFFSET``; None if
    ``value`` is anything else. A longer number is not converted: ``int()`` takes time quadratic
    in the digits and refuses more than 4,300."""
    if not value or not value.isascii() or not value.isdigit():
        return None
    significant = value.lstrip("0")
    if len(significant) > _MAX_DIGITS:
        return MAX_OFFSET
    return min(int(value), MAX_OFFSET)


def parse_position(value: str) -> Position | None:
    """``earliest``, ``latest``, an RFC 3339 time, Unix milliseconds or ``offset:N``; None if
    ``value`` is none of them."""
    if value == "earliest":
        return Position(earliest=True)
    if value == "latest":
        return Position(latest=True)
    if value.startswith("offset:"):
        offset = parse_number(value.removeprefix("offset:"))
        return Position(offset=offset) if offset is not None else None
    millis = parse_number(value)
    if millis is not None:
        return Position(time_ns=millis * 1_000_000)
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        return None
    if when.tzinfo is None or "T" not in value.upper():
        return None  # RFC 3339 has both a date-time separator and an offset
    return Position(time_ns=(when - _EPOCH) // timedelta(microseconds=1) * 1000)

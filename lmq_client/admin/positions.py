"""Positions in a topic's stored stream, as lmqadmin's ``--from`` and ``--to`` take them.

A value is checked before anything is asked of a daemon (``lmqd.positions``, the daemon's own
rule), so a mistyped one is answered with the forms that are accepted. An ``offset:N`` outside
what a daemon stores is clamped by the daemon (to the oldest offset stored, or to the end);
``clamp_note`` says so on stderr instead of letting the channel silently read elsewhere.
"""

from __future__ import annotations

import click

from lmq_client.errors import LmqClientError
from lmq_client.http import HTTPClient
from lmqd.positions import POSITION_FORMS, parse_position

__all__ = ["POSITION_HELP", "check_position", "clamp_note", "position_option", "stored_range"]

POSITION_HELP = f"{POSITION_FORMS} (lmqd)."


def check_position(value: str, option: str) -> str:
    """``value`` if it is a position; otherwise a usage error naming ``option`` and the forms."""
    if parse_position(value) is None:
        raise click.BadParameter(
            f"{value!r} is not a position: use {POSITION_FORMS}", param_hint=option
        )
    return value


def position_option(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A click callback: ``check_position`` for an option that is only ever a position."""
    if value is None:
        return None
    return check_position(value, param.opts[0] if param.opts else "POS")


def requested_offset(value: str) -> int | None:
    """N for ``offset:N`` (the only form a daemon clamps), else None."""
    position = parse_position(value)
    return position.offset if position is not None else None


def stored_range(client: HTTPClient, topic: str) -> tuple[int, int] | None:
    """(earliest, end) of what ``client``'s daemon stores of ``topic``; None if it cannot tell
    (no such topic yet: a channel create makes it, empty)."""
    try:
        answer = client.topic_offsets(topic)
    except LmqClientError:
        return None
    return int(answer["earliest"]), int(answer["end"])


def clamp_note(value: str, where: str, stored: tuple[int, int] | None) -> str | None:
    """What to tell the user when ``value`` (``offset:N``) lies outside ``stored`` (the
    daemon's earliest offset and end when it was asked), or None."""
    wanted = requested_offset(value)
    if wanted is None or stored is None:
        return None
    earliest, end = stored
    if wanted > end:
        return (
            f"{where}: {value} is past the end of the topic (its next offset is {end}): "
            f"reads from {end}, the end"
        )
    if wanted < earliest:
        return (
            f"{where}: {value} is no longer stored (the oldest offset is {earliest}): "
            f"reads from {earliest}"
        )
    return None

"""The hint of ``tail`` and ``archive`` when nothing arrives: other channels took the earlier
messages.

A new user's first surprise with NSQ: a new channel only receives what is published after it
exists (only a topic's first channel gets the backlog). ``tail`` subscribes through a channel of
its own, and ``archive`` through its channel (``archive`` by default), often new. When nothing
has arrived after ``TAIL_HINT_AFTER_S``, they ask the daemons' ``/stats`` for the topic and,
only if it is so, say on stderr which channels took how many messages published before their
channel existed (the topic's message count less its own channel's) and how to read what the
topic still stores (``tail --from earliest``; for ``archive``, seeking its channel back). A
topic with no other channel, or whose every message reached the command's channel too, gets no
hint: the advice would be wrong there.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import click
import trio

from lmq_client.admin.common import Settings
from lmq_client.errors import LmqClientError

__all__ = ["TAIL_HINT_AFTER_S", "earlier_messages_hint", "say_earlier_messages_hint"]

log = logging.getLogger("lmq_client.admin")

TAIL_HINT_AFTER_S = 2.0
"""Quiet time before the hint: a topic with traffic delivers well within it, and a person
waiting at a terminal wonders after about that long."""


def earlier_messages_hint(
    stats: Sequence[Mapping[str, Any]],
    topic: str,
    own_channel: str,
    *,
    command: str = "tail",
) -> str | None:
    """The hint ``command`` (``tail`` or ``archive``) gives, from every daemon's
    ``/stats?topic=`` answer, or None when it would not be true."""
    published = received = 0
    others: dict[str, None] = {}
    for data in stats:
        for t in data.get("topics") or []:
            if t.get("topic_name") != topic:
                continue
            published += int(t.get("message_count") or 0)
            for c in t.get("channels") or []:
                if c.get("channel_name") == own_channel:
                    received += int(c.get("message_count") or 0)
                else:
                    others[str(c.get("channel_name"))] = None
    earlier = published - received
    if not others or earlier <= 0:
        return None
    names = ", ".join(others)
    if command == "tail":
        since = "this tail subscribed"
        advice = f"'lmqadmin tail {topic} --from earliest' reads"
    else:
        since = f"channel {own_channel} existed"
        advice = (
            f"'lmqadmin channel seek {topic} {own_channel} --to earliest' makes it read"
        )
    return (
        f"{command}: nothing new on {topic} yet; its {len(others)} existing channel(s) ({names}) "
        f"took the {earlier:,} message(s) published before {since}. {advice} the messages the "
        "topic still stores."
    )


async def say_earlier_messages_hint(
    settings: Settings, topic: str, channel: str, *, command: str = "tail"
) -> None:
    """Nothing arrived at first: say on stderr if other channels took the earlier messages."""

    def ask() -> list[dict[str, Any]]:
        return [c.stats(topic) for c in settings.http_clients(topic)]

    try:
        stats = await trio.to_thread.run_sync(ask)
    except LmqClientError as exc:  # the hint is a courtesy: no HTTP API, no hint
        log.info("%s: no hint, /stats failed: %s", command, exc)
        return
    text = earlier_messages_hint(stats, topic, channel, command=command)
    if text is not None:
        click.echo(text, err=True)

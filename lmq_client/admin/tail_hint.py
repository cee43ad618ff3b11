"""``tail``'s hint when nothing arrives: the topic's other channels took its earlier messages.

A new user's first surprise with NSQ: ``tail`` subscribes through a new channel, and a new channel
only receives what is published after it exists (only a topic's first channel gets the backlog).
When nothing has arrived after ``TAIL_HINT_AFTER_S``, tail asks the daemons' ``/stats`` for the
topic and, only if it is so, says on stderr which channels took how many messages published
before tail's channel existed (the topic's message count less its own channel's) and that
``--from earliest`` reads what the topic still stores. A topic with no other channel, or whose
every message reached tail's channel too, gets no hint: the advice would be wrong there.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["TAIL_HINT_AFTER_S", "earlier_messages_hint"]

TAIL_HINT_AFTER_S = 2.0
"""Quiet time before the hint: a topic with traffic delivers well within it, and a person
waiting at a terminal wonders after about that long."""


def earlier_messages_hint(
    stats: Sequence[Mapping[str, Any]], topic: str, own_channel: str
) -> str | None:
    """The hint, from every daemon's ``/stats?topic=`` answer, or None when it would not be true."""
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
    return (
        f"tail: nothing new on {topic} yet; its {len(others)} existing channel(s) ({names}) took "
        f"the {earlier:,} message(s) published before this tail subscribed. "
        f"'lmqadmin tail {topic} --from earliest' reads the messages the topic still stores."
    )

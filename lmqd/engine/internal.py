"""Internal channels: lmq's own channels on a topic, which users' channels must not notice.

nsqd's rule for a topic's backlog: the messages published while a topic has no channel wait in
the topic, and the first channel created takes them. lmq creates channels of its own: a
dead-letter topic's ``REDRIVE_CHANNEL`` (``channel_policy.py``), created by the first dead
letter so that ``/channel/redrive`` has every dead letter to move back. Were it a channel like
the others it would be that first channel, and every consumer a user starts afterwards
(``nsq_tail --topic=orders.dead``, a new channel of any NSQ client) would see none of the dead
letters that came before it.

So an internal channel **reads ahead**: its cursor reads the topic's stream up to its end
(``ChannelCursor.ahead``) instead of what the pump has handed on, and the pump does not count it
as a channel (``Topic``): the topic keeps its backlog (its ``depth``, as nsqd shows a topic
without channels) until a user's channel takes it. An internal channel is otherwise a channel:
consumers may subscribe to it, its messages are counted (``message_count``, as the topic stores
them), settled and stored as any channel's. ``/topic/empty`` drops the backlog for it too:
emptying a dead-letter topic empties it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lmqd.engine.channel_policy import REDRIVE_CHANNEL

if TYPE_CHECKING:
    from lmqd.engine.channel import Channel
    from lmqd.engine.stream import TopicStream

__all__ = ["INTERNAL_CHANNELS", "reads_ahead", "waiting_beyond_topic"]

INTERNAL_CHANNELS = frozenset({REDRIVE_CHANNEL})
"""The names of lmq's internal channels."""


def reads_ahead(channel_name: str) -> bool:
    """Whether a channel of this name is internal: it reads ahead of the pump."""
    return channel_name in INTERNAL_CHANNELS


def waiting_beyond_topic(channel: Channel, stream: TopicStream) -> int:
    """What ``channel`` has waiting that the topic's own backlog (``stream.depth``) does not
    already count: its depth for a channel the pump feeds; for one reading ahead, whose unread
    messages include that backlog, the rest (a topic's ``max_depth`` bounds the two summed)."""
    depth = channel.depth
    cursor = channel.cursor
    if cursor is None or not cursor.ahead:
        return depth
    return max(depth - stream.depth, 0)

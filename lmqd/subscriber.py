"""What a channel needs from a subscribed client (the TCP server's connections implement it).

The channel owns the counters below and updates them; the connection owns ``ready_count`` (set by
RDY) and ``msg_timeout`` (from IDENTIFY), and turns delivered messages into frames.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from lmqd.message import Message

if TYPE_CHECKING:
    from lmqd.stats import ClientStats


class Subscriber(Protocol):
    id: int
    """Unique per daemon process (nsqd's client id sequence)."""
    ready_count: int
    """The RDY window: the channel delivers while ``in_flight_count < ready_count``."""
    in_flight_count: int
    message_count: int
    finish_count: int
    requeue_count: int
    msg_timeout: float
    """Seconds a delivered message may stay in flight before it times out."""
    sample_rate: int
    """IDENTIFY's sample_rate: 0 = off, else 1..99 (nsqd drops the unsampled messages)."""

    def write_messages(self, messages: Sequence[Message]) -> None:
        """Queue message frames for sending (never awaits; wakes the writer once per call)."""
        ...

    def close(self) -> None:
        """End this client's connection (its channel was deleted; nsqd closes them too)."""
        ...

    def statistics(self) -> ClientStats:
        """A frozen snapshot of this client, for /stats."""
        ...

"""A consumer on a channel: what the channel needs of it, and the counters it keeps for it.

A ``Consumer`` is the server's side (a TCP connection's session): it owns its RDY window
(``ready_count``), its message timeout and sample rate (IDENTIFY), and turns delivered messages
into frames. A ``Subscription`` is the channel's side: made by ``Channel.add_consumer``, it holds
the counters the channel updates on every delivery, FIN and REQ, so a consumer (or a test's fake)
carries none of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from lmqd.message import Message

if TYPE_CHECKING:
    from lmqd.stats import ClientStats


class Consumer(Protocol):
    id: int
    """Unique per daemon process (nsqd's client id sequence)."""

    @property
    def ready_count(self) -> int:
        """The RDY window: the channel delivers while ``in_flight_count < ready_count``."""
        ...

    @property
    def msg_timeout(self) -> float:
        """Seconds a delivered message may stay in flight before it times out."""
        ...

    @property
    def sample_rate(self) -> int:
        """IDENTIFY's sample_rate: 0 = off, else 1..99 (nsqd drops the unsampled messages)."""
        ...

    def byte_room(self) -> int:
        """Bytes of message bodies this consumer may still take (its output buffer's room);
        <= 0: none now. A delivery round gives it messages while the bodies given so far are
        below this, so it may exceed it by one message. Asked once per round; a consumer that
        answers <= 0 must call ``Channel.consumer_ready`` once it has room again."""
        ...

    def write_messages(self, messages: Sequence[Message]) -> None:
        """Queue message frames for sending (never awaits; wakes the writer once per call)."""
        ...

    def close(self) -> None:
        """End this consumer's connection (its channel was deleted; nsqd closes them too)."""
        ...

    def statistics(self) -> ClientStats:
        """A frozen snapshot of this consumer, for /stats."""
        ...


class Subscription:
    """One consumer on one channel, with the counters nsqd keeps per client."""

    __slots__ = (
        "consumer",
        "finish_count",
        "id",
        "in_flight_count",
        "message_count",
        "requeue_count",
    )

    def __init__(self, consumer: Consumer) -> None:
        self.consumer = consumer
        self.id = consumer.id
        self.in_flight_count = 0
        self.message_count = 0
        self.finish_count = 0
        self.requeue_count = 0

    def __repr__(self) -> str:
        return f"<Subscription {self.id} in_flight={self.in_flight_count}>"

    @property
    def free(self) -> int:
        """Room left in the RDY window (negative when RDY was lowered below what is in flight)."""
        return self.consumer.ready_count - self.in_flight_count

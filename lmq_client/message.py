"""A message as a Consumer hands it to application code."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from lmqd.message_ext import MessageExt
from lmqd.protocol import Req, Touch, encode_fin

if TYPE_CHECKING:
    from lmq_client.core.link import Link

__all__ = ["Message"]


class Outcomes(Protocol):
    """Who sends the answers and is told about them (the consumer core: order, counters,
    backoff)."""

    def _answer(self, message: Message, command: bytes, *, success: bool, backoff: bool
                ) -> None: ...  # fmt: skip

    def _touch(self, message: Message, command: bytes) -> None: ...


class Message:
    """One delivery of a message: its data, and how to answer it.

    Answer each message exactly once with ``finish()`` or ``requeue()`` (``touch()`` any number of
    times before that to extend its timeout). The answers are plain calls that queue the command
    on the connection the message came from; they never block. A message whose connection was
    lost in the meantime cannot be answered: the daemon delivers it again.
    """

    __slots__ = ("_conn", "_consumer", "_ext", "attempts", "body", "id", "responded", "timestamp")

    def __init__(
        self,
        id: bytes,
        body: bytes,
        timestamp: int,
        attempts: int,
        conn: Link,
        consumer: Outcomes,
        ext: MessageExt | None = None,
    ) -> None:
        self.id = id
        """16 bytes, as the daemon sent them."""
        self.body = body
        self.timestamp = timestamp
        """When the message was published, nanoseconds since the Unix epoch."""
        self.attempts = attempts
        """Deliveries so far, this one included (1 on the first delivery)."""
        self.responded = False
        """True once ``finish()`` or ``requeue()`` was called."""
        self._conn = conn
        self._consumer = consumer
        self._ext = ext

    @property
    def headers(self) -> dict[str, str]:
        """lmq's message headers (``{}`` for a message published without, and from nsqd)."""
        return dict(self._ext.headers) if self._ext is not None else {}

    @property
    def priority(self) -> int:
        """lmq's priority, 0 to 9 (0 for a message published without one, and from nsqd)."""
        return self._ext.priority if self._ext is not None else 0

    def __repr__(self) -> str:
        return (
            f"<Message {self.id.decode('ascii', 'replace')} attempts={self.attempts} "
            f"len={len(self.body)} from {self._conn.address}>"
        )

    @property
    def address(self) -> str:
        """The daemon that delivered the message."""
        return self._conn.address

    def finish(self) -> None:
        """FIN: the message is done and will not be delivered again."""
        self._respond(encode_fin(self.id), success=True, backoff=False)

    def requeue(self, delay: float = 0.0, *, backoff: bool = True) -> None:
        """REQ: deliver the message again ``delay`` seconds from now (0: as soon as possible).

        With ``backoff`` (the default) this counts as a failure for the consumer's backoff.
        """
        if delay < 0:
            raise ValueError("requeue delay must be >= 0")
        self._respond(
            Req(id=self.id, timeout_ms=round(delay * 1000)).encode(), success=False, backoff=backoff
        )

    def touch(self) -> None:
        """TOUCH: reset the message's timeout (the daemon's ``msg_timeout``) to start now."""
        if self.responded:
            raise RuntimeError(f"{self!r} was already answered")
        self._consumer._touch(self, Touch(id=self.id).encode())

    def _respond(self, command: bytes, *, success: bool, backoff: bool) -> None:
        if self.responded:
            raise RuntimeError(f"{self!r} was already answered")
        self.responded = True
        self._consumer._answer(self, command, success=success, backoff=backoff)

"""One connection's protocol state after its handshake, sans I/O: what every client connection
does whatever runs it.

A ``Link`` is the part of a V2 connection that is neither bytes on a socket nor a consumer's or
a producer's policy. It holds

* the **output**: commands are appended to ``out`` by plain calls (``write``, ``command``) and the
  driver takes them all at once (``take_output``), so a burst of FINs costs one send. ``wake``
  (set by a driver that writes from its own task) is called when output appears on an empty
  buffer;
* the **answers expected**, in order: the daemon answers commands in the order it got them
  (go-nsq#320), so a deque of ``Reply`` objects is matched to response and error frames as they
  arrive. A fatal error answers the oldest command; the daemon then closes, and every other
  command waiting fails with ``ConnectionFailed`` (nothing after the failing command was stored);
* **heartbeats**: each ``_heartbeat_`` is answered with ``NOP`` and is nobody's answer;
* the **silence deadline**: a daemon heard from neither data nor heartbeat for two heartbeat
  intervals plus ``HEARTBEAT_GRACE`` is gone (``deadline``; the driver or the consumer core
  closes the connection then).

Plain ``def`` throughout, with ``now`` passed in. The async ``Connection``, the blocking
``SocketConnection`` and the consumer and producer cores all use it.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from lmq_client.errors import ConnectionFailed, LmqClientError, NSQError, error_from_frame
from lmqd.protocol import Error, FrameEvent, MessageFrame, Nop, Response

__all__ = ["HEARTBEAT_GRACE", "RECEIVE_SIZE", "Link", "Reply", "max_rdy_count"]

log = logging.getLogger("lmq_client.link")

RECEIVE_SIZE = 256 * 1024
"""Bytes one receive takes, in every front end: a full RDY window of 2500 100-byte messages
(~335 KB of frames) arrives in two reads, and one read is parsed and handled as one batch."""

HEARTBEAT_GRACE = 5.0
"""Seconds past two heartbeat intervals before a silent daemon is declared gone: the daemon's
ticker and ours drift a little, and a busy daemon may send a heartbeat late."""

DEFAULT_MAX_RDY_COUNT = 2500
"""nsqd's default ``--max-rdy-count``, assumed when a daemon does not say (pynsq does the same)."""

_NOP = Nop().encode()


def max_rdy_count(settings: Mapping[str, Any]) -> int:
    """The daemon's RDY ceiling from its IDENTIFY answer (2500 when it does not say)."""
    value = settings.get("max_rdy_count", DEFAULT_MAX_RDY_COUNT)
    return value if isinstance(value, int) and value > 0 else DEFAULT_MAX_RDY_COUNT


class Reply:
    """The daemon's answer to one command. A driver that waits for it sets ``waker`` (called
    once, when the answer or the failure is in)."""

    __slots__ = ("data", "done", "error", "waker")

    def __init__(self) -> None:
        self.data = b""
        self.error: BaseException | None = None
        self.done = False
        self.waker: Callable[[], None] | None = None

    def set(self, data: bytes) -> None:
        if not self.done:
            self.data = data
            self.done = True
            self._settled()

    def fail(self, error: BaseException) -> None:
        if not self.done:
            self.error = error
            self.done = True
            self._settled()

    def _settled(self) -> None:
        if self.waker is not None:
            self.waker()

    def result(self) -> bytes:
        """The response frame's data (``b"OK"``...); raises the error it failed with."""
        if self.error is not None:
            raise self.error
        return self.data


class Link:
    """The state of one connection to the daemon at ``address`` after its handshake."""

    __slots__ = ("__weakref__", "address", "error", "heard_at", "on_error", "open", "out",
                 "replies", "settings", "silence_limit", "wake")  # fmt: skip

    def __init__(
        self,
        address: str,
        *,
        heartbeat_interval: float,
        now: float,
        settings: Mapping[str, Any] | None = None,
    ) -> None:
        self.address = address
        self.settings: dict[str, Any] = dict(settings or {})
        """The daemon's answer to IDENTIFY (``max_rdy_count``...)."""
        self.out: list[bytes] = []
        self.replies: deque[Reply] = deque()
        self.wake: Callable[[], None] | None = None
        """Called when output appears on an empty buffer (a driver's writer wakes up)."""
        self.on_error: Callable[[Link, NSQError], None] | None = None
        """Told about non-fatal errors, and fatal ones that answer no command."""
        self.open = True
        self.error: LmqClientError | None = None
        """Why the link ended (None while open)."""
        self.silence_limit = (
            2 * heartbeat_interval + HEARTBEAT_GRACE if heartbeat_interval > 0 else math.inf
        )
        self.heard_at = now

    def __repr__(self) -> str:
        return f"<Link {self.address} open={self.open}>"

    @property
    def is_open(self) -> bool:
        return self.open

    @property
    def deadline(self) -> float:
        """When the daemon counts as gone unless something arrives before."""
        return self.heard_at + self.silence_limit

    @property
    def max_rdy_count(self) -> int:
        return max_rdy_count(self.settings)

    # -- output ----------------------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        """Queue bytes (one or more encoded commands); ``ConnectionFailed`` once closed."""
        if not self.open:
            raise self.not_open()
        out = self.out
        out.append(data)
        if len(out) == 1 and self.wake is not None:
            self.wake()

    def command(self, data: bytes, reply: Reply | None = None) -> Reply:
        """Queue a command that the daemon answers; its ``Reply`` is settled by ``receive``."""
        self.write(data)
        reply = Reply() if reply is None else reply
        self.replies.append(reply)
        return reply

    def take_output(self) -> bytes:
        """Everything queued so far, in order (b"" if nothing)."""
        out = self.out
        if not out:
            return b""
        data = out[0] if len(out) == 1 else b"".join(out)
        out.clear()
        return data

    # -- input -----------------------------------------------------------------------------------

    def receive(self, events: list[FrameEvent], now: float) -> list[MessageFrame]:
        """Handle a batch of decoded frames: answers, heartbeats, errors. Returns the message
        frames, in order. After a fatal error the link is closed (``open`` False) and the
        frames after it are ignored: the daemon closes the connection."""
        self.heard_at = now
        messages: list[MessageFrame] = []
        for event in events:
            if type(event) is MessageFrame:
                messages.append(event)
            elif type(event) is Response:
                if event.data == b"_heartbeat_":
                    if self.open:
                        self.write(_NOP)
                elif self.replies:
                    self.replies.popleft().set(event.data)
                else:
                    log.warning("NSQD(%s): unexpected response %r", self.address, event.data)
            elif type(event) is Error:
                error = error_from_frame(event.code, event.text, address=self.address)
                if not error.fatal:
                    log.info("NSQD(%s): %s", self.address, error)
                    if self.on_error is not None:
                        self.on_error(self, error)
                    continue
                log.warning("NSQD(%s): %s", self.address, error)
                if self.replies:
                    self.replies.popleft().fail(error)
                elif self.on_error is not None:
                    self.on_error(self, error)
                self.lost(error)
                break
        return messages

    def lost(self, error: LmqClientError) -> None:
        """The connection ended (``error`` says why): refuse output, fail what waits."""
        if self.error is None:
            self.error = error
        self.open = False
        self.out.clear()
        # Each waiter gets its own exception object: one instance raised in many tasks would
        # collect all their tracebacks.
        while self.replies:
            self.replies.popleft().fail(self.not_open())

    def silent(self, now: float) -> bool:
        """Whether the daemon was silent past ``deadline`` at ``now``: the link is then lost."""
        if now < self.deadline:
            return False
        why = f"no data for {self.silence_limit:.0f}s (heartbeats missed)"
        self.lost(ConnectionFailed(self.address, why))
        return True

    def not_open(self) -> ConnectionFailed:
        """The error for using the link after it ended."""
        if self.error is None:
            return ConnectionFailed(self.address, "not connected")
        if isinstance(self.error, ConnectionFailed):
            return ConnectionFailed(self.address, self.error.reason)
        return ConnectionFailed(self.address, f"connection closed after {self.error}")

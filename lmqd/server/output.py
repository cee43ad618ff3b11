"""A connection's output: frames waiting for the writer, and the holds of durable publishes.

Trio-free: the connection's writer task takes what is ready (``take``) and sends it in one
``send_all``; everything else appends frames with plain calls. ``on_ready`` is called whenever
something becomes ready to send (the connection sets its writer's wakeup Event there).

Durable holds
-------------
With ``--durable`` a publish's ``OK`` must wait for the fsync of its records. The reader does not
wait (it goes on applying the buffer and reading, so one connection pipelining many publishes
shares an fsync): the publish opens a *hold*, a segment of output that starts with its ``OK``
frames and collects everything written after it (responses stay FIFO, as clients match them in
order). ``release`` resolves holds in order; a released hold's frames move to the output, and a
failed sync turns the ``OK`` into nsqd's fatal ``E_PUB_FAILED`` / ``E_MPUB_FAILED`` /
``E_DPUB_FAILED``: nothing after it is sent and the connection closes.

Counting bytes
--------------
``pending_bytes`` is everything this connection holds for its client: ready, held, and what
the writer took and is sending now (``sending_bytes``, until it calls ``sent``), since the
joined copy lives until the send completes. Every change is also added to a ``BufferTotal``
shared by all connections (``lmqd.server.budget``, the daemon-wide bound): one addition per
write, with the sizes the frames already carry, never a pass over the messages.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from lmqd.protocol import ProtocolError, errors


class BufferTotal:
    """Bytes held in buffers, summed over connections; ``lmqd.server.budget.BufferBudget``
    (the daemon's) adds waiting for it to drop. Alone it only counts (one connection in a
    test, an embedder without the bound)."""

    __slots__ = ("limit", "used")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        """``--max-buffered-bytes``: past it, publishes wait (``lmqd.server.budget``)."""
        self.used = 0
        """Bytes counted now. Buffers add to it directly (one addition per write)."""

    @property
    def over(self) -> bool:
        """Whether the total is past the bound."""
        return self.used > self.limit

    def release(self, nbytes: int) -> None:
        """``nbytes`` left a buffer (sent, parsed, dropped)."""
        self.used -= nbytes


class Hold:
    """Output held until a durable publish's records are fsynced."""

    __slots__ = ("done", "error", "frames", "kind", "nbytes")

    def __init__(self, kind: str, frames: list[bytes]) -> None:
        self.kind = kind
        self.frames = frames
        self.nbytes = sum(map(len, frames))
        self.done = False
        self.error: OSError | None = None


class OutputBuffer:
    """Frames to send, in order, behind any durable holds."""

    __slots__ = (
        "_holds",
        "_on_ready",
        "_parts",
        "held_bytes",
        "ready_bytes",
        "sending_bytes",
        "total",
    )

    def __init__(self, on_ready: Callable[[], None], total: BufferTotal | None = None) -> None:
        self._parts: list[bytes] = []
        self._holds: deque[Hold] = deque()
        self._on_ready = on_ready
        self.total = total if total is not None else BufferTotal(2**62)
        """Where this buffer's bytes are also counted (the daemon-wide bound)."""
        self.ready_bytes = 0
        """Bytes ready to send now."""
        self.held_bytes = 0
        """Bytes waiting behind durable holds."""
        self.sending_bytes = 0
        """Bytes the writer took and is sending (``take`` to ``sent``)."""

    @property
    def pending_bytes(self) -> int:
        """Everything not yet sent: ready, held and being sent."""
        return self.ready_bytes + self.held_bytes + self.sending_bytes

    @property
    def has_unsent(self) -> bool:
        """Whether frames wait to be sent (or for a durable publish's fsync)."""
        return bool(self._parts or self._holds)

    @property
    def has_ready(self) -> bool:
        return bool(self._parts)

    def write(self, frame: bytes) -> None:
        """Queue one frame, behind any hold."""
        self.write_parts([frame], len(frame))

    def write_parts(self, parts: list[bytes], nbytes: int) -> None:
        """Queue ``parts`` (``nbytes`` in all), behind any hold."""
        self.total.used += nbytes
        if self._holds:
            hold = self._holds[-1]
            hold.frames += parts
            hold.nbytes += nbytes
            self.held_bytes += nbytes
            return
        self._parts += parts
        self.ready_bytes += nbytes
        self._on_ready()

    def write_now(self, frame: bytes) -> None:
        """Queue ``frame`` ahead of any hold (heartbeats: they answer no command)."""
        self._parts.append(frame)
        self.ready_bytes += len(frame)
        self.total.used += len(frame)

    def hold(self, kind: str, frames: list[bytes]) -> Hold:
        """Open a hold that starts with ``frames`` (a durable publish's ``OK``s): they and all
        output after them wait for ``release``."""
        hold = Hold(kind, frames)
        self._holds.append(hold)
        self.held_bytes += hold.nbytes
        self.total.used += hold.nbytes
        return hold

    def release(self, hold: Hold, error: OSError | None) -> ProtocolError | None:
        """``hold``'s fsync finished (``error`` None) or failed: move every hold resolved so
        far, in order, to the output. Returns the fatal publish error a failed hold turned
        into (the connection must close; nothing after it is sent)."""
        hold.done = True
        hold.error = error
        holds = self._holds
        failure: ProtocolError | None = None
        while holds and holds[0].done:
            first = holds.popleft()
            self.held_bytes -= first.nbytes
            if first.error is not None:
                failure = errors.publish_failed(first.kind, str(first.error))
                holds.clear()
                self.total.release(self.held_bytes + first.nbytes)
                self.held_bytes = 0
                self.write_now(failure.frame())
                break
            self._parts += first.frames
            self.ready_bytes += first.nbytes
        self._on_ready()
        return failure

    def take(self) -> bytes:
        """Everything ready to send, joined (b"" if nothing); it counts as being sent until
        ``sent``."""
        if not self._parts:
            return b""
        data = b"".join(self._parts)
        self._parts.clear()
        self.sending_bytes += self.ready_bytes
        self.ready_bytes = 0
        return data

    def sent(self) -> None:
        """What ``take`` returned has been sent (or never will be: the connection ended)."""
        if self.sending_bytes:
            self.total.release(self.sending_bytes)
            self.sending_bytes = 0

    def discard(self) -> None:
        """The connection ended: nothing more will be sent; its bytes leave the total, and
        anything written later (a durable hold's late release) no longer counts there."""
        self.total.release(self.ready_bytes + self.held_bytes + self.sending_bytes)
        self.total = BufferTotal(2**62)
        self._parts.clear()
        self._holds.clear()
        self.ready_bytes = self.held_bytes = self.sending_bytes = 0

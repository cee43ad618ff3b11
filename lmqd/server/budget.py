"""BufferBudget: the bytes all V2 connections hold in their buffers, and the daemon-wide bound.

Every connection bounds its own buffers (``lmqd.server.session`` and ``connection``: a consumer's
output, a publisher that does not read its answers, one command's body); this bounds their *sum*
(``--max-buffered-bytes``), so a thousand connections each within its own bound cannot add up to
more memory than the operator allowed.

What is counted: each connection's output not yet sent (ready, held for a durable fsync, and the
data its writer is sending now) and its input received but not yet parsed (a partial command:
at most one command body, ``--max-body-size``). Each ``OutputBuffer`` adds its bytes with the
lengths it already has (one addition per write, per batch of frames); each reader reports its
parser's buffer after every receive.

What happens past the bound: readers start no new receive (backpressure on every client: its
TCP window fills and it blocks on send); writers go on, so output drains and the total goes
down; readers resume once it is back under the bound. A receive already waiting when the total
crosses the bound still brings its one chunk (at most ``RECEIVE_SIZE``), which is applied as
usual: applying releases input, and a cancelled receive would cost a cancel scope per
connection on the hot path to save one chunk.

Why it cannot deadlock. A byte counted is either output, which the writers send whatever the
readers do (and a send that cannot proceed is bounded by the heartbeat interval, after which the
connection closes and its bytes are released), or a partial command in some connection's parser,
which only that client's next bytes can complete. So a reader whose parser holds a partial
command is not paused like the others: it may read to complete it, one connection at a time
(``finishing``, a FIFO lock), and only as many bytes as that command still needs. A completed
command is applied at once and its buffer released. The one-at-a-time rule keeps the overshoot
past the bound to one command body plus one receive, however many clients started a big MPUB.
A client holding ``finishing`` without sending is dropped by the reader's no-data timeout (two
heartbeat intervals), like any silent client; the readers queued behind it stop waiting as soon
as the total is back under the bound (``cancel_when_below``), so a slow one only holds up the
others while the daemon is over its bound.
"""

from __future__ import annotations

import trio

from lmqd.server.output import BufferTotal


class BufferBudget(BufferTotal):
    """Bytes held in all connections' buffers against ``limit`` (see the module docstring)."""

    __slots__ = ("_below", "_below_scopes", "finishing", "paused_count")

    def __init__(self, limit: int) -> None:
        super().__init__(limit)
        self.paused_count = 0
        """How many times a reader has paused for the bound (for tests and logs)."""
        self.finishing = trio.Lock()
        """Held by the one reader completing a partial command while over the bound (FIFO)."""
        self._below = trio.Event()
        self._below.set()
        self._below_scopes: set[trio.CancelScope] = set()

    def release(self, nbytes: int) -> None:
        """``nbytes`` left a buffer (sent, parsed, dropped); wakes paused readers once the
        total is back under the bound."""
        self.used -= nbytes
        if self.used <= self.limit:
            if not self._below.is_set():
                self._below.set()
            if self._below_scopes:
                for scope in self._below_scopes:
                    scope.cancel()
                self._below_scopes.clear()

    def cancel_when_below(self, scope: trio.CancelScope) -> None:
        """Cancel ``scope`` once the total is back under the bound (at once if it is)."""
        if self.used <= self.limit:
            scope.cancel()
        else:
            self._below_scopes.add(scope)

    def forget(self, scope: trio.CancelScope) -> None:
        """``scope`` is done: no need to cancel it any more."""
        self._below_scopes.discard(scope)

    async def wait_below(self) -> None:
        """Return once the total is at most the bound (at once if it is)."""
        while self.used > self.limit:
            if self._below.is_set():
                self._below = trio.Event()
                self.paused_count += 1
            await self._below.wait()

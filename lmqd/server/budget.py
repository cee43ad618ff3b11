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

What happens past the bound: backpressure on publishers. A connection whose next command is a
PUB, MPUB or DPUB holds it, with whatever follows it (``Session.waiting`` is ``Backpressure``),
and reads nothing more from its client until the total is back under the bound: its client's
TCP window fills and it blocks on send. Every other command is still read and applied, so a
consumer's FINs, REQs and RDYs keep flowing, on its own connection or one that also publishes;
writers never pause, so output drains and the total goes down. What a held connection keeps is
the rest of one receive (at most ``RECEIVE_SIZE``: the commands after the publish, the start of
the next one), not counted here while it waits: counting it could hold the total over the bound
with nothing left to drain it.

Why it cannot deadlock. A byte counted is output, which the writers send whatever the readers
do (a send that makes no progress for the heartbeat interval closes its connection and releases
the bytes), or a command partly received, which only that client's next bytes can complete. So
a connection with a command body begun is not held: it may read to complete it, one connection
at a time (``finishing``, a FIFO lock), and only the bytes that command still needs; the command
is then applied, publish or not, and its buffer released.

How far past the bound: the receives already under way when it was crossed, then per connection
what one receive brings while over it (``OVER_BOUND_RECEIVE_SIZE``, 16 KiB: hundreds of FINs),
plus the one command body being completed in turn, however many clients began a big MPUB. A
client holding ``finishing`` without sending is
dropped by the reader's no-data timeout (two heartbeat intervals), like any silent client; the
readers queued behind it stop waiting as soon as the total is back under the bound
(``cancel_when_below``).

What the bound cannot drain: output stuck at consumers that stopped reading and disabled
heartbeats (no write deadline then, as in nsqd). Each holds at most its own bound (4 MiB plus a
message); publishers wait while they fill the budget, consumers do not.
"""

from __future__ import annotations

import trio

from lmqd.server.output import BufferTotal

OVER_BOUND_RECEIVE_SIZE = 16 * 1024
"""What one receive may take while the total is past the bound: a command line's limit
(``MAX_LINE_LENGTH``), hundreds of FINs, so consumers keep up while each connection can add
little before a publish is held or a body waits for its turn."""


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

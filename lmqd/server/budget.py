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

Giving memory back. A connection that ends with a large partial command (a client that sent
most of a 4 MiB MPUB and left) frees its buffer at once (``TcpConnection.serve``), but the C
heap keeps the freed pages: glibc returns only the top of its heap, and bodies received in many
chunks leave it fragmented (280 abandoned 4 MiB uploads at once held ~290 MB after they were
all freed). So such an ending asks for a heap trim (``trim_after``, glibc's ``malloc_trim``,
what ``/debug/freememory`` does): in a worker thread, at most once per ``TRIM_INTERVAL_S``, the
last request always served, none while no client abandons large commands.
"""

from __future__ import annotations

import trio

from lmqd.memory import trim_heap
from lmqd.server.output import BufferTotal

OVER_BOUND_RECEIVE_SIZE = 16 * 1024
"""What one receive may take while the total is past the bound: a command line's limit
(``MAX_LINE_LENGTH``), hundreds of FINs, so consumers keep up while each connection can add
little before a publish is held or a body waits for its turn."""


TRIM_AFTER_BYTES = 1024 * 1024
"""A connection that ended holding this much of a partial command asks for a heap trim: a
large body abandoned (``--max-body-size`` is 5 MiB); below it the freed chunks are reused."""

TRIM_INTERVAL_S = 1.0
"""The least time between two heap trims: one walks the heap's free chunks (a few ms with
hundreds of MB free), so a flood of abandoned uploads costs a trim a second, not one each."""


class BufferBudget(BufferTotal):
    """Bytes held in all connections' buffers against ``limit`` (see the module docstring)."""

    __slots__ = (
        "_below", "_below_scopes", "_trim_wanted", "_trimming", "finishing", "paused_count",
        "trims",
    )  # fmt: skip

    def __init__(self, limit: int) -> None:
        super().__init__(limit)
        self.paused_count = 0
        """How many times a reader has paused for the bound (for tests and logs)."""
        self.finishing = trio.Lock()
        """Held by the one reader completing a partial command while over the bound (FIFO)."""
        self._below = trio.Event()
        self._below.set()
        self._below_scopes: set[trio.CancelScope] = set()
        self._trim_wanted = False
        self._trimming = False
        self.trims = 0
        """Heap trims run (for tests and logs)."""

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

    def trim_after(self, input_bytes: int) -> None:
        """A connection ended that held ``input_bytes`` of a partial command at most: if that
        is ``TRIM_AFTER_BYTES`` or more, give the freed heap back to the OS soon (see the module
        docstring)."""
        if input_bytes < TRIM_AFTER_BYTES:
            return
        self._trim_wanted = True
        if not self._trimming:
            self._trimming = True
            trio.lowlevel.spawn_system_task(self._trim, name="heap trim")

    async def _trim(self) -> None:
        try:
            while self._trim_wanted:
                self._trim_wanted = False
                await trio.to_thread.run_sync(trim_heap)
                self.trims += 1
                await trio.sleep(TRIM_INTERVAL_S)
        finally:
            self._trimming = False

"""SpillQueue: a topic's or channel's ready messages — memory first, the overflow in a backend.

At most ``limit`` messages (``--mem-queue-size``) are kept in a deque; the rest go to the
``BackendQueue`` (a disk queue, or for ephemeral names a dummy that drops them). **FIFO rule**:
while the backend holds anything, new messages go to the backend too, so everything in memory is
older than everything in the backend and reading "memory first, then backend" keeps order.

**Failure policy** (one for topics and channels): a failed backend write never loses a message.
``put_many`` is all or none and raises ``BackendError``, for givers that still hold the messages
(a publisher, answered with an error); ``put_many_or_hold`` is for messages the queue's owner
already accepted (requeues, timeouts, the topic's fan-out): it holds what the backend refused in
memory past ``limit`` and returns the error, so the owner reports bad health instead of dropping
them. Order versus the backend's contents is then not kept.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from itertools import islice

from lmqd.engine.backend import BackendError, BackendQueue
from lmqd.message import Message


class SpillQueue:
    """Ready messages in order: a bounded memory deque, then the backend."""

    __slots__ = ("_memory", "_on_backend_change", "backend", "limit", "wrote_backend")

    def __init__(
        self,
        backend: BackendQueue,
        limit: int,
        on_backend_change: Callable[[BackendQueue], None] | None = None,
    ) -> None:
        self.backend = backend
        self.limit = limit
        """Messages kept in memory before the backend takes the rest (``--mem-queue-size``)."""
        self._memory: deque[Message] = deque()
        self._on_backend_change = on_backend_change
        """Called with the backend after each write or read to it (the syncer counts them as
        dirty)."""
        self.wrote_backend = False
        """Whether the last put wrote to the backend (a success there clears bad health)."""

    def __len__(self) -> int:
        """Ready messages: memory + backend."""
        return len(self._memory) + self.backend.depth

    @property
    def memory_count(self) -> int:
        return len(self._memory)

    def memory(self) -> list[Message]:
        """The messages held in memory, oldest first (shutdown flushes them)."""
        return list(self._memory)

    def peek(self, count: int) -> list[Message]:
        """Up to ``count`` of the messages ``take`` would return next, changing nothing."""
        out = list(islice(self._memory, count))
        if len(out) < count and self.backend.depth > 0:
            out += self.backend.peek(count - len(out))
        return out

    def _split(self, messages: Sequence[Message]) -> tuple[Sequence[Message], Sequence[Message]]:
        # (for memory, for the backend) under the FIFO rule.
        if self.backend.depth == 0:
            room = self.limit - len(self._memory)
            if room >= len(messages):
                return messages, ()
            if room > 0:
                return messages[:room], messages[room:]
        return (), messages

    def put_many(self, messages: Sequence[Message]) -> None:
        """Append ``messages``; all or none: raises ``BackendError`` having queued none."""
        head, tail = self._split(messages)
        self.wrote_backend = bool(tail)
        if tail:
            # The backend first: if it fails nothing has been queued yet.
            self.backend.put_many(tail)
            if self._on_backend_change is not None:
                self._on_backend_change(self.backend)
        if head:
            self._memory.extend(head)

    def put_many_or_hold(self, messages: Sequence[Message]) -> BackendError | None:
        """Append ``messages``, never refusing: what the backend refuses is held in memory past
        ``limit``. Returns the backend's error, or None."""
        head, tail = self._split(messages)
        self.wrote_backend = bool(tail)
        if head:
            self._memory.extend(head)
        if tail:
            try:
                self.backend.put_many(tail)
            except BackendError as exc:
                self._memory.extend(tail)
                return exc
            if self._on_backend_change is not None:
                self._on_backend_change(self.backend)
        return None

    def hold(self, messages: Sequence[Message]) -> None:
        """Append to memory whatever the limit (messages already safe elsewhere: a durable
        channel's requeues, still unacknowledged on disk)."""
        self._memory.extend(messages)

    def requeue_front(self, messages: Sequence[Message]) -> None:
        """Put messages back at the head of memory, in order (a batch that found no taker)."""
        self._memory.extendleft(reversed(messages))

    def take_memory(self, count: int) -> list[Message]:
        """Remove and return up to ``count`` messages from memory, oldest first."""
        memory = self._memory
        if len(memory) <= count:
            out = list(memory)
            memory.clear()
            return out
        popleft = memory.popleft
        return [popleft() for _ in range(count)]

    def read_backend(self, count: int) -> list[Message]:
        """Remove and return up to ``count`` of the backend's oldest messages."""
        got = self.backend.read_many(count)
        if self._on_backend_change is not None:
            self._on_backend_change(self.backend)
        return got

    def take(self, count: int) -> list[Message]:
        """Remove and return up to ``count`` messages, memory first, then the backend."""
        out = self.take_memory(count)
        if len(out) < count and self.backend.depth > 0:
            out += self.read_backend(count - len(out))
        return out

    def clear_memory(self) -> None:
        self._memory.clear()

    def empty(self) -> None:
        """Drop every message, in memory and in the backend."""
        self._memory.clear()
        self.backend.empty()

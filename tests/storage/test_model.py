"""Property tests: DiskQueue against a model list, through random operation sequences.

Hypothesis drives put_many / read_many / ack / sync / close+reopen / crash+reopen / empty with a
segment size small enough to roll every few records. The model is the list of records the queue
must still hold, in order; after every step the contents read, their order and the depth must
match it. A *crash* reopens a copy of the data directory taken while the queue was still open,
so only what the last sync persisted counts: plain mode reads again from the read position of
the last sync, acknowledgement mode from the oldest record unacknowledged at the last sync.

Queues live on tmpfs (``memory_dir``) so that hundreds of reopens stay fast.
"""

from __future__ import annotations

import shutil
from contextlib import ExitStack
from pathlib import Path
from typing import Any, ClassVar

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from lmqd.message import Message
from lmqd.storage import DiskQueue, StoredMessage

from .storage_helpers import WALL_EPOCH_NS, key, memory_dir, open_queue

MAX_BYTES = 300
"""A batch is 14 bytes + 38 per message + bodies: a new segment every 1-6 messages, so batches are
often split at segment boundaries, and reads of 0-12 stop inside batches."""


class DiskQueueMachine(RuleBasedStateMachine):
    ack_mode: ClassVar[bool] = False

    def __init__(self) -> None:
        super().__init__()
        self._stack = ExitStack()
        self.root = self._stack.enter_context(memory_dir())
        self.generation = 0
        self.counter = 0
        self.q: DiskQueue | None = None
        self.log: list[tuple[Any, ...]] = []
        """Records from the queue's starting read position on, oldest first."""
        self.cursor = 0
        """How many of ``log`` have been read in this session."""
        self.tokens: dict[int, int] = {}
        """Unacknowledged read records: log index -> token."""
        self.synced = 0
        """Log index the last persisted read position stands for."""
        self.delivered = 0
        """Acknowledgement mode: records of ``log`` below this index were handed out before
        the queue was last opened (read again, they count one more attempt)."""
        self.synced_delivered = 0
        """Log index the last persisted reader's position (``delivered``) stands for."""

    @property
    def directory(self) -> Path:
        return self.root / f"g{self.generation}"

    def _open(self, delivered: int = 0) -> None:
        self.q = open_queue(self.directory, max_bytes_per_file=MAX_BYTES, ack_mode=self.ack_mode)
        self.cursor = 0
        self.tokens = {}
        self.synced = 0
        self.delivered = self.synced_delivered = max(delivered, 0) if self.ack_mode else 0

    def _reached(self) -> int:
        return max(self.cursor, self.delivered)

    def _persisted_index(self) -> int:
        return min(self.tokens) if self.tokens else self.cursor

    @initialize()
    def start(self) -> None:
        self._open()

    @rule(
        bodies=st.lists(st.binary(max_size=60), max_size=8),
        deferred=st.lists(st.sampled_from([0.0, 0.5, 12.5, 3600.0]), min_size=8, max_size=8),
    )
    def put(self, bodies: list[bytes], deferred: list[float]) -> None:
        assert self.q is not None
        msgs = []
        for body, deliver_at in zip(bodies, deferred, strict=False):
            self.counter += 1
            msgs.append(
                Message(
                    b"%016x" % self.counter,
                    body,
                    WALL_EPOCH_NS + self.counter,
                    self.counter % 5,
                    deliver_at,
                )
            )
        self.q.put_many(msgs)
        self.log.extend(key(m) for m in msgs)

    @rule(count=st.integers(0, 12))
    def read(self, count: int) -> None:
        assert self.q is not None
        got = self.q.read_many(count)
        expected = [
            (*k[:3], k[3] + 1, *k[4:]) if i < self.delivered else k
            for i, k in enumerate(self.log[self.cursor : self.cursor + count], self.cursor)
        ]
        assert [key(m) for m in got] == expected
        if self.ack_mode:
            for i, m in enumerate(got):
                assert isinstance(m, StoredMessage)
                self.tokens[self.cursor + i] = m.token
        self.cursor += len(got)

    @precondition(lambda self: self.ack_mode and self.tokens)
    @rule(data=st.data())
    def ack(self, data: st.DataObject) -> None:
        assert self.q is not None
        index = data.draw(st.sampled_from(sorted(self.tokens)))
        assert self.q.ack(self.tokens.pop(index))

    @rule()
    def sync(self) -> None:
        assert self.q is not None
        self.q.sync()
        self.synced = self._persisted_index()
        self.synced_delivered = self._reached()

    @rule()
    def reopen(self) -> None:
        assert self.q is not None
        self.q.close()
        persisted = self._persisted_index()
        self.log = self.log[persisted:]
        self._open(self._reached() - persisted)

    @rule()
    def crash(self) -> None:
        assert self.q is not None
        old = self.directory
        self.generation += 1
        shutil.copytree(old, self.directory)  # what the OS held at the kill
        self.q.close()
        shutil.rmtree(old)
        self.log = self.log[self.synced :]
        self._open(self.synced_delivered - self.synced)

    @rule()
    def empty(self) -> None:
        assert self.q is not None
        self.q.empty()
        self.log = []
        self._open_state_after_empty()

    def _open_state_after_empty(self) -> None:
        self.cursor = 0
        self.tokens = {}
        self.synced = 0
        self.delivered = self.synced_delivered = 0

    @invariant()
    def depth_matches(self) -> None:
        if self.q is not None:
            assert self.q.depth == len(self.log) - self.cursor
            assert self.q.unacked_count == len(self.tokens)
            assert self.q.corrupt_count == 0 and self.q.missing_segments == 0

    def teardown(self) -> None:
        if self.q is not None:
            self.q.close()
        self._stack.close()


class AckModeMachine(DiskQueueMachine):
    ack_mode = True


_SETTINGS = settings(max_examples=60, stateful_step_count=40, deadline=None)

TestPlainDiskQueue = DiskQueueMachine.TestCase
TestPlainDiskQueue.settings = _SETTINGS
TestAckModeDiskQueue = AckModeMachine.TestCase
TestAckModeDiskQueue.settings = _SETTINGS

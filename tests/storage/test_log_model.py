"""Property tests: TopicLog and its cursors against a simple model, through random sequences.

Hypothesis drives append / create cursor (earliest, latest, an offset, a time) / delete cursor /
read (settling or not) / settle / seek / read_range / offset_for_time / sync / close+reopen /
process crash / power loss, with segments small enough to roll every few batches and a tail
cache of random size (none, a few records, everything).

The model is a dict offset -> message, the next offset, and per cursor its position and its
unsettled offsets. After every step the log must agree: offsets monotonic and never reused for
a synced message, every cursor reads exactly the model's sequence from its position, its
low-water mark is the oldest unsettled offset, and no message at or after any cursor's mark is
ever deleted (segments go only below every mark, and only in a sync).

Two kinds of crash, each a reopen without close:

* **process crash** (kill -9): a copy of the data directory taken while the log is open. Every
  write reached the OS, so every message survives; the state file is the last sync's, so the
  cursors are those of the last sync, at their marks of then.
* **power loss**: the copy taken right after the last sync (what was fsynced), optionally with a
  prefix of the bytes appended to the write segment since then (a torn write). Every synced
  message survives; what the torn bytes held in whole records may come back too, with the
  offsets and contents it was appended with, and nothing else.

Logs live on tmpfs (``memory_dir``) so that hundreds of reopens stay fast.
"""

from __future__ import annotations

import shutil
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from lmqd.message import Message
from lmqd.storage.log import TopicLog

from .log_helpers import TOPIC, open_log
from .storage_helpers import WALL_EPOCH_NS, key, memory_dir

MAX_BYTES = 300
"""A batch is 22 bytes + 38 per message + bodies: a new segment every one or two appends (one
append may span several), so cursors, seeks and deletions cross segment boundaries all the
time."""

NAMES = ("a", "b", "c")


class ModelCursor:
    """What a cursor must be: its position and its unsettled offsets."""

    def __init__(self, position: int) -> None:
        self.position = position
        self.unsettled: set[int] = set()

    @property
    def low(self) -> int:
        return min(self.unsettled) if self.unsettled else self.position


class TopicLogMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self._stack = ExitStack()
        self.root = self._stack.enter_context(memory_dir())
        self.generation = 0
        self.log: TopicLog | None = None
        self.options: dict[str, Any] = {}
        self.counter = 0
        self.ts = WALL_EPOCH_NS
        self.messages: dict[int, tuple[Any, ...]] = {}
        """offset -> key of every message on disk or to be read (offsets >= earliest)."""
        self.stamps: dict[int, int] = {}
        self.next_offset = 0
        self.earliest = 0
        self.cursors: dict[str, ModelCursor] = {}
        self.synced_next = 0
        self.synced_cursors: dict[str, int] = {}
        self.synced_earliest = 0

    @property
    def directory(self) -> Path:
        return self.root / f"g{self.generation}"

    @property
    def snapshot(self) -> Path:
        return self.root / f"g{self.generation}.synced"

    def _open(self) -> TopicLog:
        self.log = open_log(self.directory, max_bytes_per_file=MAX_BYTES, **self.options)
        return self.log

    @initialize(
        cache=st.sampled_from([0, 300, 1 << 20]),
        retention_bytes=st.sampled_from([None, None, 1500]),
    )
    def start(self, cache: int, retention_bytes: int | None) -> None:
        self.options = {"cache_bytes": cache, "retention_bytes": retention_bytes}
        self._open()
        self._synced_now()

    # -- appending ------------------------------------------------------------------------------

    @rule(
        bodies=st.lists(st.binary(max_size=40), max_size=10),
        steps=st.lists(st.sampled_from([1000, 1000, 0, -5000]), min_size=10, max_size=10),
    )
    def append(self, bodies: list[bytes], steps: list[int]) -> None:
        self._append(bodies, steps)

    @rule(sizes=st.lists(st.integers(1, 4), min_size=1, max_size=6), body=st.binary(max_size=20))
    def append_several(self, sizes: list[int], body: bytes) -> None:
        for size in sizes:
            self._append([body] * size, [1000] * size)

    def _append(self, bodies: list[bytes], steps: list[int]) -> None:
        assert self.log is not None
        msgs = []
        for body, step in zip(bodies, steps, strict=False):
            self.counter += 1
            self.ts += step  # the wall clock may step back
            msgs.append(Message(b"%016x" % self.counter, body, self.ts, self.counter % 4))
        assert self.log.append_many(msgs) == self.next_offset
        for m in msgs:
            self.messages[self.next_offset] = key(m)
            self.stamps[self.next_offset] = m.timestamp
            self.next_offset += 1

    # -- cursors --------------------------------------------------------------------------------

    @rule(name=st.sampled_from(NAMES), where=st.sampled_from(["earliest", "latest", "at", "time"]))
    def create_cursor(self, name: str, where: str) -> None:
        assert self.log is not None
        if where == "at":
            offset = (self.earliest + self.next_offset) // 2 + self.counter % 3 - 1
            start: Any = offset
            want = min(max(offset, self.earliest), self.next_offset)
        elif where == "time":
            start = self.log.offset_for_time(self.ts - 2500)
            want = self._first_at_or_after(self.ts - 2500)
            assert start == want
        else:
            start = where
            want = self.earliest if where == "earliest" else self.next_offset
        if name in self.cursors:
            try:
                self.log.create_cursor(name, start)
            except ValueError:
                return
            raise AssertionError("a second cursor of the same name was created")
        cursor = self.log.create_cursor(name, start)
        assert cursor.position == want
        self.cursors[name] = ModelCursor(want)

    @rule(name=st.sampled_from(NAMES))
    def delete_cursor(self, name: str) -> None:
        assert self.log is not None
        assert self.log.delete_cursor(name) == (name in self.cursors)
        self.cursors.pop(name, None)

    @precondition(lambda self: self.cursors)
    @rule(data=st.data(), count=st.integers(0, 9), settle=st.booleans())
    def read(self, data: st.DataObject, count: int, settle: bool) -> None:
        assert self.log is not None
        name = data.draw(st.sampled_from(sorted(self.cursors)))
        model = self.cursors[name]
        cursor = self.log.cursor(name)
        assert cursor is not None
        got = cursor.read_many(count, settle=settle)
        end = min(model.position + count, self.next_offset)
        want = [(o, self.messages[o]) for o in range(model.position, end)]
        assert [(o, key(m)) for o, m in got] == want
        if not settle:
            model.unsettled.update(range(model.position, end))
        model.position = end

    @precondition(lambda self: any(c.unsettled for c in self.cursors.values()))
    @rule(data=st.data())
    def settle(self, data: st.DataObject) -> None:
        assert self.log is not None
        name = data.draw(st.sampled_from(sorted(n for n, c in self.cursors.items() if c.unsettled)))
        model = self.cursors[name]
        chosen = data.draw(st.sets(st.sampled_from(sorted(model.unsettled)), min_size=1))
        cursor = self.log.cursor(name)
        assert cursor is not None
        assert cursor.settle_many([*chosen, self.next_offset + 5]) == len(chosen)
        model.unsettled -= chosen

    @precondition(lambda self: self.cursors)
    @rule(data=st.data(), shift=st.integers(-8, 8))
    def seek(self, data: st.DataObject, shift: int) -> None:
        assert self.log is not None
        name = data.draw(st.sampled_from(sorted(self.cursors)))
        model = self.cursors[name]
        cursor = self.log.cursor(name)
        assert cursor is not None
        want = min(max(model.position + shift, self.earliest), self.next_offset)
        assert cursor.seek(model.position + shift) == want
        model.position = want
        model.unsettled.clear()

    # -- tools ----------------------------------------------------------------------------------

    @rule(shift=st.integers(-3, 30), count=st.integers(1, 12))
    def read_range(self, shift: int, count: int) -> None:
        assert self.log is not None
        start = max(self.earliest + shift, self.earliest)
        got = self.log.read_range(self.earliest + shift, count)
        want = [(o, self.messages[o]) for o in range(start, min(start + count, self.next_offset))]
        assert [(o, key(m)) for o, m in got] == want

    @rule(delta=st.integers(-20_000, 3000))
    def offset_for_time(self, delta: int) -> None:
        assert self.log is not None
        ts = self.ts + delta
        assert self.log.offset_for_time(ts) == self._first_at_or_after(ts)

    def _first_at_or_after(self, ts: int) -> int:
        return next(
            (o for o in range(self.earliest, self.next_offset) if self.stamps[o] >= ts),
            self.next_offset,
        )

    # -- sync, restart, crashes -----------------------------------------------------------------

    @rule()
    def sync(self) -> None:
        assert self.log is not None
        before = self.log.earliest_offset
        self.log.sync()
        after = self.log.earliest_offset
        if self.cursors:
            assert before <= after <= min(c.low for c in self.cursors.values())
        else:
            assert after == before  # without cursors nothing is deleted
        self._forget_before(after)
        self._synced_now()

    def _synced_now(self) -> None:
        """Everything in the directory is durable now (a sync ran, or the log just opened:
        opening fsyncs what recovery found and persists the state): remember it, and keep a
        copy of the directory as a power loss from now on would leave it."""
        self.synced_next = self.next_offset
        self.synced_cursors = {n: c.low for n, c in self.cursors.items()}
        self.synced_earliest = self.earliest
        shutil.rmtree(self.snapshot, ignore_errors=True)
        shutil.copytree(self.directory, self.snapshot)

    @rule()
    def reopen(self) -> None:
        assert self.log is not None
        self.log.close()
        # close() syncs: segments every mark has passed may go then too.
        lows = [c.low for c in self.cursors.values()]
        log = self._open()
        assert log.next_offset == self.next_offset
        if lows:
            assert self.earliest <= log.earliest_offset <= min(lows)
        else:
            assert log.earliest_offset == self.earliest
        self._forget_before(log.earliest_offset)
        for model in self.cursors.values():
            model.position = model.low
            model.unsettled.clear()
        self._check_cursors_restored()
        self._synced_now()

    @rule()
    def crash_process(self) -> None:
        assert self.log is not None
        old, old_snapshot = self.directory, self.snapshot
        self.generation += 1
        shutil.copytree(old, self.directory)  # everything written is in the OS
        for tmp in self.directory.glob("*.tmp"):
            tmp.unlink()
        self.log.close()
        shutil.rmtree(old)
        shutil.rmtree(old_snapshot)
        log = self._open()
        assert log.next_offset == self.next_offset and log.torn_bytes == 0
        self._restore_synced_cursors(log)
        self._synced_now()

    @rule(tear=st.booleans(), cut=st.floats(0, 1))
    def crash_power(self, tear: bool, cut: float) -> None:
        assert self.log is not None
        old, old_snapshot = self.directory, self.snapshot
        self.generation += 1
        shutil.copytree(old_snapshot, self.directory)  # only what was fsynced
        if tear:
            *_, write_segment = sorted(self.directory.glob(f"{TOPIC}.lmq.*.dat"))
            written = (old / write_segment.name).read_bytes()
            synced = write_segment.read_bytes()
            extra = written[len(synced) : len(synced) + int((len(written) - len(synced)) * cut)]
            write_segment.write_bytes(synced + extra)
        self.log.close()
        shutil.rmtree(old)
        shutil.rmtree(old_snapshot)
        log = self._open()
        assert log.corrupt_count == 0
        assert self.synced_next <= log.next_offset <= self.next_offset
        if not tear:
            assert log.next_offset == self.synced_next
        # What came back past the last sync is a prefix of what was appended, unchanged.
        back = log.read_range(self.synced_next, end_offset=log.next_offset)
        assert [(o, key(m)) for o, m in back] == [
            (o, self.messages[o]) for o in range(self.synced_next, log.next_offset)
        ]
        for o in range(log.next_offset, self.next_offset):
            del self.messages[o]
            del self.stamps[o]
        self.next_offset = log.next_offset
        self._restore_synced_cursors(log)
        self._synced_now()

    def _restore_synced_cursors(self, log: TopicLog) -> None:
        assert log.earliest_offset == self.synced_earliest
        self.earliest = self.synced_earliest
        self.cursors = {n: ModelCursor(low) for n, low in self.synced_cursors.items()}
        self._check_cursors_restored()

    def _check_cursors_restored(self) -> None:
        assert self.log is not None
        assert sorted(self.log.cursors) == sorted(self.cursors)
        for name, model in self.cursors.items():
            cursor = self.log.cursor(name)
            assert cursor is not None and cursor.position == model.position

    def _forget_before(self, earliest: int) -> None:
        for o in range(self.earliest, earliest):
            del self.messages[o]
            del self.stamps[o]
        self.earliest = earliest

    # -- invariants -----------------------------------------------------------------------------

    @invariant()
    def agrees_with_the_model(self) -> None:
        log = self.log
        if log is None:
            return
        assert log.next_offset == self.next_offset
        assert log.earliest_offset == self.earliest
        assert log.corrupt_count == 0 and log.missing_segments == 0
        for name, model in self.cursors.items():
            cursor = log.cursor(name)
            assert cursor is not None
            assert (cursor.position, cursor.low, cursor.unsettled_count) == (
                model.position,
                model.low,
                len(model.unsettled),
            )

    def teardown(self) -> None:
        if self.log is not None:
            self.log.close()
        self._stack.close()


TestTopicLogModel = TopicLogMachine.TestCase
TestTopicLogModel.settings = settings(max_examples=80, stateful_step_count=50, deadline=None)

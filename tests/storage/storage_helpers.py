"""Helpers for the storage tests: a fake time base, message factories, crash snapshots.

The storage layer is synchronous; these tests use real files under ``tmp_path`` and no trio.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from lmqd.message import Message
from lmqd.storage import DiskQueue

WALL_EPOCH_NS = 1_700_000_000 * 10**9


class FakeTimeBase:
    """Test double for ``TimeBase``: trio time 0 is wall-clock ``wall_at_zero_ns``.

    A "restart" is a new instance with a different ``wall_at_zero_ns`` (the new process's trio
    clock started at another wall-clock moment).
    """

    def __init__(self, wall_at_zero_ns: int = WALL_EPOCH_NS) -> None:
        self.wall_at_zero_ns = wall_at_zero_ns

    def to_wall_ns(self, trio_time: float) -> int:
        return self.wall_at_zero_ns + round(trio_time * 1e9)

    def from_wall_ns(self, wall_ns: int) -> float:
        return (wall_ns - self.wall_at_zero_ns) / 1e9


def make_messages(count: int, start: int = 0, body_size: int = 0) -> list[Message]:
    """Messages with distinct ids, bodies, timestamps and attempts."""
    out = []
    for i in range(start, start + count):
        body = (b"m%d." % i).ljust(body_size, b"x")
        out.append(Message(b"%016x" % i, body, WALL_EPOCH_NS + i, i % 7))
    return out


def delivered_once(messages: Sequence[Message]) -> list[Message]:
    """``messages`` as an acknowledgement-mode queue reads them again after a crash that
    followed their delivery: one more attempt each."""
    return [Message(m.id, m.body, m.timestamp, m.attempts + 1) for m in messages]


def key(m: Message) -> tuple[Any, ...]:
    """What must survive storage unchanged."""
    return (m.id, m.body, m.timestamp, m.attempts, m.deliver_at)


def keys(messages: Sequence[Message]) -> list[tuple[Any, ...]]:
    return [key(m) for m in messages]


def open_queue(path: Path, name: str = "t:c", **kwargs: Any) -> DiskQueue:
    kwargs.setdefault("timebase", FakeTimeBase())
    return DiskQueue(name, path, **kwargs)


def segment_paths(path: Path, stem: str = "t%3Ac") -> list[Path]:
    """The queue's segment files, oldest first."""
    return sorted(p for p in path.glob(f"{stem}.lmq.*.dat"))


def bad_files(path: Path) -> list[Path]:
    return sorted(p for p in path.iterdir() if ".bad" in p.name)


def crash_copy(src: Path, dst: Path) -> Path:
    """The directory as a kill -9 would leave it: everything handed to the OS, nothing more.

    Copies the files while the queue is still open (so no close-time sync happens first).
    """
    shutil.copytree(src, dst)
    for tmp in dst.glob("*.tmp"):
        os.unlink(tmp)
    return dst


def put_each(q: DiskQueue, messages: Sequence[Message]) -> None:
    """One ``put_many`` per message: each message in a batch record of its own, so records sit at
    predictable offsets (``SEGMENT_HEADER_SIZE + i * (BATCH_OF_ONE_OVERHEAD + body)``)."""
    for m in messages:
        q.put_many([m])


def drain(q: DiskQueue, batch: int = 1000) -> list[Message]:
    out: list[Message] = []
    while True:
        got = q.read_many(batch)
        if not got:
            return out
        out.extend(got)


@contextmanager
def memory_dir() -> Iterator[Path]:
    """A scratch directory on tmpfs (``/dev/shm``) when there is one, else in the temp dir.

    For loops that open queues hundreds of times: on tmpfs an fsync costs nothing, where on the
    test machine's disk it costs ~4 ms. The code paths are identical; tests of *what* is fsynced
    use ``tmp_path`` on the real disk instead.
    """
    base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    path = Path(tempfile.mkdtemp(prefix="lmq-storage-", dir=base))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)

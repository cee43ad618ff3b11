"""Disk faults for in-process daemons: ``os.fsync`` held or failing in worker threads, and a
full disk (``disk``: ``tests.support.diskquota.DiskQuota`` over ``os.pwrite``).

The daemon fsyncs only in worker threads (``trio.to_thread``: the syncer's rounds), so the
``fsync`` fixture wraps ``os.fsync`` for those threads alone: ``hold`` makes each call wait (on a
real-clock bound) until ``released`` is set -- to show what waits for a sync round -- and
``fail`` makes it raise ``EIO``, as a failing disk does. The event-loop thread (opening a queue,
writing a file at start-up) is never held or failed.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.diskquota import DiskQuota

__all__ = ["HOLD_LIMIT_S", "FsyncFault", "disk_fixture", "fsync_fixture"]

HOLD_LIMIT_S = 20.0
"""Longest a held fsync waits for ``released``: past every test's own guard, so a test that
forgets to release fails on its ``fail_after`` instead of leaving a worker thread blocked."""


def _in_worker_thread() -> bool:
    return threading.current_thread() is not threading.main_thread()


class FsyncFault:
    """``os.fsync`` that, in worker threads, can be held (``hold``) or can fail (``fail``)."""

    def __init__(self, real: Callable[[int], None]) -> None:
        self.real = real
        self.hold = False
        self.fail = False
        self.released = threading.Event()
        self.held = threading.Event()
        """Set once a worker thread's fsync is being held."""
        self.calls = 0
        """fsyncs done by worker threads."""

    def __call__(self, fd: int) -> None:
        if _in_worker_thread():
            if self.hold:
                self.held.set()
                self.released.wait(HOLD_LIMIT_S)
            if self.fail:
                raise OSError(errno.EIO, "Input/output error")
            self.calls += 1
        self.real(fd)


@pytest.fixture(name="fsync")
def fsync_fixture(monkeypatch: pytest.MonkeyPatch) -> Iterator[FsyncFault]:
    """``os.fsync`` replaced by an ``FsyncFault`` for this test (released at its end)."""
    fault = FsyncFault(os.fsync)
    monkeypatch.setattr(os, "fsync", fault)
    yield fault
    fault.released.set()


@pytest.fixture(name="disk")
def disk_fixture(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> DiskQuota:
    """``os.pwrite`` replaced by a ``DiskQuota`` on ``tmp_path`` (where ``start_daemon`` keeps
    its data) for this test, with no limit until the test calls ``fill``."""
    quota = DiskQuota(os.pwrite, tmp_path)
    monkeypatch.setattr(os, "pwrite", quota)
    return quota

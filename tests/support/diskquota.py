"""A full disk without root: ``os.pwrite`` as on a file system with a size limit.

Every file lmqd writes (segments, state and positions files, the metadata file, the lock) goes
through ``os.pwrite`` (``lmqd.storage.files.pwrite_all``). ``DiskQuota`` wraps it: the files
under ``root`` together may hold at most ``limit`` bytes (their apparent sizes, measured on
disk at each write, so truncating or unlinking a file frees its space as on a real file
system). A write that would grow past the limit writes the part that fits (a short write, as
the kernel does) and the next one raises ``ENOSPC``. Overwrites inside a file's size always
succeed. ``limit`` None: no limit.

Two ways to drive it:

* in process: the ``disk`` fixture (``tests/support/faults.py``) installs one over ``os.pwrite``
  for the test; ``fill(free_bytes)``, ``fill()`` (full) and ``free()`` move the limit.
* in a subprocess: ``python -m tests.support.diskquota CONTROL ROOT LMQD-ARGS...`` runs lmqd's
  command line with a ``DiskQuota`` on ``ROOT`` whose limit the test sets by writing
  ``CONTROL``: ``none`` (no limit) or a number of bytes still free from then on (the limit
  becomes what ``ROOT`` holds then plus that number; ``write_control``). The file is read again
  whenever its modification time changes.

No pytest here: the subprocess imports this module.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["DiskQuota", "quota_lmqd_command", "used_bytes", "write_control"]


def used_bytes(root: str | os.PathLike[str]) -> int:
    """The apparent size of every file under ``root`` together."""
    total = 0
    for directory, _dirs, files in os.walk(root):
        for name in files:
            # A file unlinked meanwhile (a worker thread's sync job) holds no space.
            with contextlib.suppress(FileNotFoundError):
                total += os.lstat(os.path.join(directory, name)).st_size
    return total


class DiskQuota:
    """``os.pwrite`` limited to ``limit`` bytes for the files under ``root`` together."""

    def __init__(
        self,
        real: Callable[[int, Any, int], int],
        root: str | os.PathLike[str],
        *,
        control: str | os.PathLike[str] | None = None,
    ) -> None:
        self.real = real
        self.root = os.fspath(root)
        self.limit: int | None = None
        """Bytes the files under ``root`` may hold together (None: no limit; -1: full)."""
        self.refused = 0
        """Writes refused with ``ENOSPC``."""
        self._control = None if control is None else os.fspath(control)
        self._control_mtime = -1
        self._lock = threading.Lock()  # the syncer writes state files from worker threads

    def fill(self, free_bytes: int | None = None) -> None:
        """From now on only ``free_bytes`` more may be written under ``root`` (files that
        shrink meanwhile make room, as on a real disk); None: completely full, no write that
        grows a file succeeds whatever shrinks (deterministic for tests)."""
        with self._lock:
            self.limit = -1 if free_bytes is None else used_bytes(self.root) + free_bytes

    def free(self) -> None:
        """No limit any more: space came back."""
        with self._lock:
            self.limit = None

    def _read_control(self) -> None:
        if self._control is None:
            return
        try:
            mtime = os.stat(self._control).st_mtime_ns
        except FileNotFoundError:
            return
        if mtime == self._control_mtime:
            return
        self._control_mtime = mtime
        text = Path(self._control).read_text().strip()
        self.limit = None if text in ("", "none") else used_bytes(self.root) + int(text)

    def __call__(self, fd: int, data: Any, offset: int) -> int:
        with self._lock:
            self._read_control()
            limit = self.limit
            if limit is None:
                return self.real(fd, data, offset)
            size = os.fstat(fd).st_size
            growth = offset + len(data) - size
            if growth <= 0:
                return self.real(fd, data, offset)
            room = 0 if limit < 0 else limit - used_bytes(self.root)
            if room >= growth:
                return self.real(fd, data, offset)
            fits = size + max(room, 0) - offset
            if fits <= 0:
                self.refused += 1
                raise OSError(errno.ENOSPC, "No space left on device")
            return self.real(fd, bytes(memoryview(data)[:fits]), offset)


def write_control(control: str | os.PathLike[str], free_bytes: int | None) -> None:
    """Tell a subprocess's quota: ``free_bytes`` more may be written from now on (None: no
    limit). Replaced atomically, so the daemon never reads half a number."""
    tmp = f"{os.fspath(control)}.tmp"
    Path(tmp).write_text("none" if free_bytes is None else str(free_bytes))
    os.replace(tmp, control)


def quota_lmqd_command(
    control: str | os.PathLike[str], root: str | os.PathLike[str], lmqd_args: Sequence[str]
) -> list[str]:
    """The command line of lmqd (``lmqd_args``: what follows ``python -m lmqd``) under a quota
    on ``root`` driven by ``control``."""
    return [
        sys.executable,
        "-m",
        "tests.support.diskquota",
        os.fspath(control),
        os.fspath(root),
        *lmqd_args,
    ]


def _main(argv: Sequence[str]) -> None:
    control, root, *args = argv
    os.pwrite = DiskQuota(os.pwrite, root, control=control)
    from lmqd.cli import main

    main(args, prog_name="lmqd")


if __name__ == "__main__":
    _main(sys.argv[1:])

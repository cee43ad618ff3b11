"""A small disk for an lmqd subprocess: a real tmpfs where the test may mount one, else a quota.

``open_small_disk(tmp_path)`` selects at run time, so a test asserts the same things either way
(no skip): where ``mount -t tmpfs`` works (root, or a container with the capability) the data
directory is on a real 4 MiB tmpfs, filled by a filler file next to it; elsewhere (CI without
root), or with ``tmpfs=False``, it is a directory under a ``DiskQuota``
(``tests.support.diskquota``) driven through its control file. Both offer the same three
calls: ``command(flags)`` (lmqd's command line on the disk), ``fill(free_bytes)`` (from now on
only about that much more fits; a tmpfs counts whole 4 KiB pages) and ``free()`` (space is
back). The tmpfs is unmounted when the context ends.

No pytest here, as in ``process.py``.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Protocol

from tests.support.diskquota import quota_lmqd_command, write_control
from tests.support.process import lmqd_command

__all__ = ["SmallDisk", "open_small_disk"]

TMPFS_SIZE = "4m"
"""Room for the tests' few thousand small messages several times over: what fills it is the
test's filler file, never lmqd."""

FILL_CHUNK = 1 << 20


class SmallDisk(Protocol):
    kind: str
    """``"tmpfs"`` or ``"quota"``: which one was selected."""
    data_path: Path

    def command(self, flags: Sequence[str] = ()) -> list[str]:
        """The command line of an lmqd keeping its data on this disk."""
        ...

    def fill(self, free_bytes: int) -> None: ...

    def free(self) -> None: ...


class QuotaDisk:
    kind = "quota"

    def __init__(self, root: Path) -> None:
        self.data_path = root / "data"
        self.data_path.mkdir()
        self._control = root / "quota"
        write_control(self._control, None)

    def command(self, flags: Sequence[str] = ()) -> list[str]:
        args = lmqd_command(self.data_path, flags)[3:]  # what follows ``python -m lmqd``
        return quota_lmqd_command(self._control, self.data_path, args)

    def fill(self, free_bytes: int) -> None:
        write_control(self._control, free_bytes)

    def free(self) -> None:
        write_control(self._control, None)


class TmpfsDisk:
    kind = "tmpfs"

    def __init__(self, mount_point: Path) -> None:
        self._mount_point = mount_point
        self.data_path = mount_point / "data"
        self.data_path.mkdir()
        self._filler = mount_point / "filler"

    def command(self, flags: Sequence[str] = ()) -> list[str]:
        return lmqd_command(self.data_path, flags)

    def fill(self, free_bytes: int) -> None:
        st = os.statvfs(self._mount_point)
        left = st.f_bavail * st.f_frsize - free_bytes
        with open(self._filler, "ab") as f:
            while left > 0:
                n = min(left, FILL_CHUNK)
                f.write(b"\0" * n)
                left -= n

    def free(self) -> None:
        self._filler.unlink(missing_ok=True)


def _mount_tmpfs(path: Path) -> bool:
    try:
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE},mode=0755", "tmpfs", str(path)],
            capture_output=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


@contextlib.contextmanager
def open_small_disk(tmp_path: Path, *, tmpfs: bool = True) -> Iterator[SmallDisk]:
    """A small disk under ``tmp_path``: a real tmpfs if ``tmpfs`` and one can be mounted,
    else a quota."""
    mount_point = tmp_path / "tmpfs"
    mount_point.mkdir()
    if not tmpfs or os.geteuid() != 0 or not _mount_tmpfs(mount_point):
        yield QuotaDisk(tmp_path)
        return
    try:
        yield TmpfsDisk(mount_point)
    finally:
        subprocess.run(["umount", str(mount_point)], capture_output=True, timeout=30, check=True)

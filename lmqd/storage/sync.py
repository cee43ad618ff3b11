"""Sync jobs and group commit: the blocking half of a disk queue's sync, for a worker thread.

``DiskQueue.prepare_sync()`` runs in the event-loop thread and never blocks on the disk: it
snapshots the positions, takes the file descriptors written since the last sync (duplicated, so
the job owns them whatever the queue does next) and the consumed segments, and returns a
``SyncJob``. ``run_sync_jobs(jobs)`` then does, in one worker-thread call for any number of queues:

1. fsync every data file the jobs hold (the records are durable from here on);
2. write each queue's positions file (temp -> fsync -> rename);
3. fsync each directory once, however many queues live in it (the renames are durable);
4. unlink the segments the persisted read positions have moved past.

The order is what makes a crash at any point safe: a positions file never points past fsynced
data, and a segment is removed only once a durable positions file says it was consumed. Jobs of
one queue may be prepared while an earlier one is still running: each carries a sequence number,
and a positions file is only replaced by a newer snapshot, never an older one.

A topic log (``log.py``) syncs through the same jobs: its state file stands for the positions
file, and the segments every cursor has passed (and retention no longer keeps) for the consumed
ones.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Sequence

from lmqd.storage.files import fsync_dir, write_file_durably

log = logging.getLogger("lmqd.storage")


class QueueFiles:
    """The part of a disk queue that sync jobs share with it across threads (under ``lock``)."""

    __slots__ = (
        "deleted",
        "directory",
        "last_seq",
        "lock",
        "name",
        "owner",
        "persisted_seq",
        "positions",
    )

    def __init__(
        self, name: str, directory: str, positions: str, *, subject: str = "DISKQUEUE"
    ) -> None:
        self.name = name
        self.owner = f"{subject}({name})"
        """How log lines name the owner: ``DISKQUEUE(<name>)`` or ``TOPICLOG(<name>)``."""
        self.directory = directory
        self.positions = positions
        self.lock = threading.Lock()
        self.deleted = False
        """Set by ``DiskQueue.delete()``: jobs still running must not recreate or remove files."""
        self.last_seq = 0
        """Sequence number of the newest snapshot handed out (event-loop thread only)."""
        self.persisted_seq = 0
        """Sequence number of the snapshot in the positions file now (under ``lock``)."""

    def next_seq(self) -> int:
        self.last_seq += 1
        return self.last_seq

    def persist_now(self, data: bytes) -> None:
        """Replace the positions file with ``data`` and make that durable, now (blocking).

        For ``DiskQueue`` opening and ``empty``: the snapshot is newer than any job's, so it
        takes the next sequence number and an older job still running cannot overwrite it.
        Raises ``OSError``.
        """
        with self.lock:
            seq = self.next_seq()
            write_file_durably(self.positions, data)
            self.persisted_seq = seq
        fsync_dir(self.directory)

    def write_positions(self, seq: int, data: bytes) -> None:
        """Replace the positions file with snapshot ``seq`` unless a newer one is there already."""
        with self.lock:
            if self.deleted or seq <= self.persisted_seq:
                return
            write_file_durably(self.positions, data)
            self.persisted_seq = seq

    def unlink_consumed(self, paths: Sequence[str]) -> None:
        with self.lock:
            if self.deleted:
                return
            for path in paths:
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
                except OSError:
                    log.warning(
                        "%s: could not remove consumed segment %s",
                        self.owner,
                        path,
                        exc_info=True,
                    )


class SyncJob:
    """One queue's pending sync, created by ``DiskQueue.prepare_sync()``.

    Run it with ``run()`` (or many at once with ``run_sync_jobs``) in a worker thread; a job that
    will not be run must be ``cancel()``\\ ed to release its file descriptors.
    """

    __slots__ = ("_done", "_fds", "_files", "_positions", "_seq", "_unlink", "operations")

    def __init__(
        self,
        files: QueueFiles,
        seq: int,
        fds: list[int],
        positions: bytes,
        unlink: list[str],
        operations: int,
    ) -> None:
        self._files = files
        self._seq = seq
        self._fds = fds
        self._positions = positions
        self._unlink = unlink
        self._done = False
        self.operations = operations
        """Reads, writes and acknowledgements this job makes durable (the dirty count)."""

    @property
    def name(self) -> str:
        """The queue's name."""
        return self._files.name

    @property
    def directory(self) -> str:
        return self._files.directory

    def run(self) -> None:
        """Make the snapshot durable (blocking); raises ``OSError`` if any step failed."""
        (error,) = run_sync_jobs([self])
        if error is not None:
            raise error

    def cancel(self) -> None:
        """Drop the job without syncing (releases its file descriptors)."""
        self._close_fds()
        self._done = True

    def _close_fds(self) -> None:
        fds, self._fds = self._fds, []
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                log.warning("%s: close failed", self._files.owner, exc_info=True)

    def _sync_data(self) -> None:
        try:
            for fd in self._fds:
                os.fsync(fd)
        finally:
            self._close_fds()


def run_sync_jobs(jobs: Sequence[SyncJob]) -> list[OSError | None]:
    """Group commit: make every job durable with one fsync per file and per directory.

    Blocking; call it in a worker thread. Returns, per job, ``None`` or the ``OSError`` that
    stopped it (one queue's failure does not stop the others). After a failed fsync the kernel
    may already have dropped the unwritten pages, so retrying cannot help: the caller reports
    the failure (``E_PUB_FAILED`` in durable mode, unhealthy in ``/ping``).
    """
    errors: list[OSError | None] = [None] * len(jobs)
    for i, job in enumerate(jobs):
        if job._done:
            errors[i] = OSError("sync job already run")
            continue
        job._done = True
        try:
            job._sync_data()
        except OSError as exc:
            errors[i] = exc
    directories: dict[str, list[int]] = {}
    for i, job in enumerate(jobs):
        if errors[i] is None:
            try:
                job._files.write_positions(job._seq, job._positions)
            except OSError as exc:
                errors[i] = exc
                continue
            directories.setdefault(job.directory, []).append(i)
    for directory, indexes in directories.items():
        try:
            fsync_dir(directory)
        except OSError as exc:
            for i in indexes:
                errors[i] = exc
    for i, job in enumerate(jobs):
        if errors[i] is None and job._unlink:
            job._files.unlink_consumed(job._unlink)
    for job, error in zip(jobs, errors, strict=True):
        if error is not None:
            log.error("%s: sync failed: %s", job._files.owner, error)
    return errors

"""The files ``lmqadmin archive`` writes: naming, gzip, rotation by size and by age.

Synchronous and trio-free (``archive.py`` runs ``write_batch`` in a worker thread), with the wall
clock passed in as ``now``, so tests drive rotation with exact times.

Naming follows nsq_to_file: ``--filename-format`` with ``<TOPIC>``, ``<HOST>``, ``<DATETIME>``
(``--datetime-format``, strftime, UTC, taken when the file is opened) and ``<REV>``: empty for the
first file of a name, ``-1``, ``-2``, ... when that name exists already (in the output or the
work directory), so a restart or a rotation within one ``<DATETIME>`` never appends to an old
file. A format without ``<REV>`` gets it at the end. ``.gz`` is added with ``--gzip``.

A file is written in the work directory (the output directory unless ``--work-dir`` is given)
and moved to the output directory when it is closed, so with ``--work-dir`` whatever reads the
output directory only ever sees complete files.

Durability: every batch is written, flushed to the operating system (gzip: a sync flush, so
everything written so far decompresses) and, with ``fsync``, synced, before ``write_batch``
returns; only then does the archiver FIN the batch. A crash loses nothing: at worst the last
batch is in the file and redelivered too (at least once). A gzip file cut short by a crash lacks
its trailer; ``zcat`` prints its content and then complains, as it does for nsq_to_file's.
"""

from __future__ import annotations

import datetime
import gzip
import logging
import os
import shutil
from pathlib import Path
from typing import IO

import attrs

__all__ = ["ClosedFile", "FileRotator", "FileSettings"]

log = logging.getLogger("lmq_client.admin.archive")

DEFAULT_FILENAME_FORMAT = "<TOPIC>.<HOST><REV>.<DATETIME>.log"
DEFAULT_DATETIME_FORMAT = "%Y-%m-%d_%H"


@attrs.frozen(kw_only=True)
class FileSettings:
    """Where and how the archive's files are written."""

    directory: Path
    work_directory: Path | None = None
    topic: str
    host: str
    filename_format: str = DEFAULT_FILENAME_FORMAT
    datetime_format: str = DEFAULT_DATETIME_FORMAT
    gzip_level: int | None = None
    """1-9 to write gzip files; None for plain ones."""
    rotate_bytes: int = 0
    """Close a file once it holds this many bytes (on disk, after compression); 0: no limit."""
    rotate_interval_s: float = 0.0
    """Close a file this long after it was opened; 0: no limit."""
    fsync: bool = False


@attrs.frozen
class ClosedFile:
    """A finished file: where it is, how many messages and bytes it holds."""

    path: Path
    messages: int
    bytes: int


@attrs.define
class _OpenFile:
    name: str
    work_path: Path
    raw: IO[bytes]
    stream: IO[bytes]
    opened_at: float
    messages: int = 0


class FileRotator:
    """Writes batches of message bodies, one per line, into rotating files."""

    def __init__(self, settings: FileSettings) -> None:
        self.settings = settings
        self._file: _OpenFile | None = None
        settings.directory.mkdir(parents=True, exist_ok=True)
        if settings.work_directory is not None:
            settings.work_directory.mkdir(parents=True, exist_ok=True)

    @property
    def current(self) -> Path | None:
        """The file being written, if one is open."""
        return self._file.work_path if self._file is not None else None

    def write_batch(self, bodies: list[bytes], now: float) -> list[ClosedFile]:
        """Write ``bodies`` (each followed by a newline), flush (and fsync); return the files
        this closed by rotation (age before the write, size after it)."""
        closed = self.tick(now)
        f = self._file or self._open(now)
        f.stream.write(b"".join(body + b"\n" for body in bodies))
        f.messages += len(bodies)
        f.stream.flush()  # gzip: a sync flush, so everything so far decompresses
        if f.stream is not f.raw:
            f.raw.flush()
        if self.settings.fsync:
            os.fsync(f.raw.fileno())
        limit = self.settings.rotate_bytes
        if limit and f.raw.tell() >= limit:
            closed.append(self._close())
        return closed

    def tick(self, now: float) -> list[ClosedFile]:
        """Close the open file if it is older than the rotation interval."""
        f = self._file
        interval = self.settings.rotate_interval_s
        if f is not None and interval and now - f.opened_at >= interval:
            return [self._close()]
        return []

    def close(self) -> list[ClosedFile]:
        """Close the open file, if any (gzip: with its trailer)."""
        return [self._close()] if self._file is not None else []

    def _name(self, now: float) -> tuple[str, Path]:
        s = self.settings
        stamp = datetime.datetime.fromtimestamp(now, datetime.UTC).strftime(s.datetime_format)
        template = s.filename_format
        if "<REV>" not in template:
            template += "<REV>"
        template = (template.replace("<TOPIC>", s.topic).replace("<HOST>", s.host)
                    .replace("<DATETIME>", stamp))
        suffix = ".gz" if s.gzip_level is not None else ""
        work = s.work_directory or s.directory
        revision = 0
        while True:
            name = template.replace("<REV>", f"-{revision}" if revision else "") + suffix
            if not (s.directory / name).exists() and not (work / name).exists():
                return name, work / name
            revision += 1

    def _open(self, now: float) -> _OpenFile:
        name, path = self._name(now)
        raw = open(path, "xb")  # noqa: SIM115 - kept open across batches, closed by _close
        stream: IO[bytes] = raw
        if self.settings.gzip_level is not None:
            stream = gzip.GzipFile(  # type: ignore[assignment]
                filename="", mode="wb", compresslevel=self.settings.gzip_level, fileobj=raw,
                mtime=int(now),
            )
        self._file = _OpenFile(name, path, raw, stream, now)
        log.info("archive: writing %s", path)
        return self._file

    def _close(self) -> ClosedFile:
        f = self._file
        assert f is not None
        self._file = None
        if f.stream is not f.raw:
            f.stream.close()  # the gzip trailer; leaves the raw file open
        f.raw.flush()
        if self.settings.fsync:
            os.fsync(f.raw.fileno())
        size = f.raw.tell()
        f.raw.close()
        final = self.settings.directory / f.name
        if final != f.work_path:
            shutil.move(f.work_path, final)
        closed = ClosedFile(final, f.messages, size)
        log.info("archive: closed %s (%d messages, %d bytes)", final, f.messages, size)
        return closed

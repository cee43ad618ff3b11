"""File-system helpers: safe file names, atomic replacement, set-aside copies, full writes."""

from __future__ import annotations

import contextlib
import logging
import os
import re

_PLAIN = re.compile(r"[a-z0-9_.-]")
_ESCAPED = re.compile(r"%([0-9A-F]{2})")
_SEGMENT_NUMBER = re.compile(r"(\d+)\.dat")
_SEGMENT_FILE = re.compile(r".+\.lmq\.\d+\.dat")


def queue_stem(name: str) -> str:
    """The file-name stem for a queue name (``topic`` or ``topic:channel``).

    Lowercase letters, digits, ``_``, ``-`` and ``.`` are kept; every other character (``:``,
    uppercase letters, anything a future name rule admits) becomes ``%XX``, and so does a leading
    ``.``. Stems are therefore portable (no ``:`` for Windows), never hidden files, and distinct
    even on a case-insensitive file system, where topics ``Orders`` and ``orders`` would otherwise
    share files. The mapping is reversible (``name_from_stem``) because ``%`` is not a name char.
    """
    out = []
    for i, ch in enumerate(name):
        if _PLAIN.fullmatch(ch) and not (i == 0 and ch == "."):
            out.append(ch)
        else:
            out.extend(f"%{b:02X}" for b in ch.encode("utf-8"))
    return "".join(out)


def name_from_stem(stem: str) -> str:
    """Inverse of ``queue_stem``."""
    return _ESCAPED.sub(lambda m: chr(int(m.group(1), 16)), stem)


def segment_filename(name: str, number: int) -> str:
    """File name of segment ``number`` of queue ``name``: ``<stem>.lmq.<number:06d>.dat``."""
    return f"{queue_stem(name)}.lmq.{number:06d}.dat"


def positions_filename(name: str) -> str:
    """File name of the positions file of queue ``name``: ``<stem>.lmq.pos.json``."""
    return f"{queue_stem(name)}.lmq.pos.json"


def log_state_filename(name: str) -> str:
    """File name of the state file of topic ``name``'s log: ``<stem>.lmq.log.json``."""
    return f"{queue_stem(name)}.lmq.log.json"


def list_segments(directory: str, name: str) -> dict[int, str]:
    """Segment number -> path of every segment file of queue ``name`` in ``directory``.

    Exact matching on what follows the stem: a queue whose name extends another's (``a`` and
    ``a.lmq.000001``) never picks up the other's files.
    """
    prefix = f"{queue_stem(name)}.lmq."
    found = {}
    with os.scandir(directory) as entries:
        for entry in entries:
            if entry.name.startswith(prefix):
                m = _SEGMENT_NUMBER.fullmatch(entry.name, len(prefix))
                if m:
                    found[int(m.group(1))] = entry.path
    return found


def is_segment_file(filename: str) -> bool:
    """Whether ``filename`` is a segment file's name (of any queue or log)."""
    return _SEGMENT_FILE.fullmatch(filename) is not None


def unlink_quietly(path: str, log: logging.Logger) -> None:
    """Remove ``path`` if it is there; a failure is logged, not raised."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError:
        log.warning("could not remove %s", path, exc_info=True)


def fsync_dir(path: str) -> None:
    """fsync a directory, making creations, renames and unlinks in it durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_path(path: str) -> None:
    """fsync a file by name (raises ``OSError``)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def pwrite_all(fd: int, data: bytes | bytearray, offset: int) -> None:
    """Write all of ``data`` at ``offset`` (``pwrite`` may write less than asked)."""
    view = memoryview(data)
    try:
        while view:
            n = os.pwrite(fd, view, offset)
            if n <= 0:  # pragma: no cover - pwrite reports errors by raising
                raise OSError("pwrite wrote nothing")
            view = view[n:]
            offset += n
    finally:
        view.release()


def write_file_durably(path: str, data: bytes) -> None:
    """Create or replace ``path`` atomically: temp file, fsync, rename (the caller fsyncs the dir).

    A crash leaves either the old content or the new, never a mix or an empty file.
    A failed write removes the temp file: on a full disk the part it did write would
    otherwise hold space the queues' own writes need.
    """
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        try:
            pwrite_all(fd, data, 0)
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    os.replace(tmp, path)


def free_aside_path(path: str) -> str:
    """``path`` if nothing is there, else ``path.1``, ``path.2``...: never overwrite a copy."""
    candidate = path
    n = 0
    while os.path.lexists(candidate):
        n += 1
        candidate = f"{path}.{n}"
    return candidate


def save_aside(path: str, data: bytes) -> str:
    """Durably store bytes being set aside at ``path`` (or a free variant); return where.

    If ``path`` already holds exactly these bytes (set aside by an earlier start that crashed
    before it could finish recovering), that copy is reused rather than duplicated.
    """
    n = 0
    candidate = path
    while os.path.lexists(candidate):
        try:
            with open(candidate, "rb") as f:
                if f.read(len(data) + 1) == data:
                    return candidate
        except OSError:
            pass
        n += 1
        candidate = f"{path}.{n}"
    write_file_durably(candidate, data)
    fsync_dir(os.path.dirname(candidate) or ".")
    return candidate

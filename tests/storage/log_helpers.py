"""Helpers for the topic-log tests: opening a log, messages with chosen timestamps, reading all."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from crc32c import crc32c

from lmqd.message import Message
from lmqd.storage.log import TopicLog
from lmqd.storage.log_cursor import Cursor
from lmqd.storage.log_reader import LogEntry

from .storage_helpers import WALL_EPOCH_NS, FakeTimeBase, key

TOPIC = "t"
SEGMENTS = "t.lmq.*.dat"
STATE = "t.lmq.log.json"


def edit_state_file(path: Path, *, resign: bool = True, **changes: object) -> None:
    """Change keys of the JSON state (or positions) file ``path``. ``resign``: its ``crc`` is
    made to match again, as a file the daemon wrote but that disagrees with the segments (they
    changed under it); without, it is a file edited by hand (tampered with)."""
    doc = json.loads(path.read_text())
    crc = doc.pop("crc", None)
    doc.update(changes)
    if crc is not None and "crc" not in changes:
        doc["crc"] = crc32c(json.dumps(doc, separators=(",", ":")).encode()) if resign else crc
    path.write_text(json.dumps(doc, separators=(",", ":")))


def open_log(path: Path, name: str = TOPIC, **kwargs: Any) -> TopicLog:
    kwargs.setdefault("timebase", FakeTimeBase())
    return TopicLog(name, path, **kwargs)


def stamped(
    count: int, start: int = 0, body_size: int = 8, stamps: list[int] | None = None
) -> list[Message]:
    """Messages ``start .. start+count-1``: distinct ids and bodies, timestamps
    ``WALL_EPOCH_NS + i * 1000`` unless ``stamps`` gives them."""
    out = []
    for k, i in enumerate(range(start, start + count)):
        body = (b"m%d." % i).ljust(body_size, b"x")
        ts = stamps[k] if stamps is not None else WALL_EPOCH_NS + i * 1000
        out.append(Message(b"%016x" % i, body, ts, i % 3))
    return out


def entry_keys(entries: list[LogEntry]) -> list[tuple[Any, ...]]:
    """(offset, what must survive storage) of each entry."""
    return [(offset, *key(m)) for offset, m in entries]


def expected(first: int, messages: list[Message]) -> list[tuple[Any, ...]]:
    return [(first + i, *key(m)) for i, m in enumerate(messages)]


def read_all(cursor: Cursor, batch: int = 1000, *, settle: bool = False) -> list[LogEntry]:
    out: list[LogEntry] = []
    while True:
        got = cursor.read_many(batch, settle=settle)
        if not got:
            return out
        out.extend(got)


def segment_files(path: Path) -> list[Path]:
    return sorted(path.glob(SEGMENTS))

"""A topic log's state file ``<stem>.lmq.log.json``: next offset, write position, cursors.

One small JSON object per log, replaced atomically by sync jobs (temp -> fsync -> rename ->
fsync the directory, ``sync.py``), as a disk queue's positions file is::

    {"version": 1, "name": "orders", "next_offset": 1234, "write": [4, 65568],
     "cursors": {"archive": 1000, "audit": 1200}, "legacy": [[0, 0], [1, 57]], "adopted": 0,
     "read": {"archive": 1042}}

* ``next_offset``: the offset the next message gets. Recovery takes the larger of this and what
  the segments hold, so an offset is not reused even once every segment holding it is deleted.
* ``write``: (segment, position) up to which the records were fsynced when the file was written:
  recovery tells a torn write past it from corruption below it.
* ``cursors``: each cursor's low-water mark (``log_cursor.py``), by name.
* ``legacy``: the base offset given to each segment of a disk queue's format (versions 1, 2) the
  log adopted, so those segments' offsets stay the same at every start (their records carry none).
* ``adopted`` (optional): the offset at which the topic's disk queue had stopped reading when
  the log adopted its files (``log_recovery.py``); absent or null otherwise.
* ``read`` (optional): each cursor's read position, where it differs from its mark: after a
  crash, the messages a cursor reads again below it were delivered before (their ``attempts``).
* ``skips`` (optional): for a cursor, the offset ranges ``[start, end)`` it steps over (a topic
  empty dropped them before the cursor read them), kept until its mark has passed them.
* ``crc``: CRC32C of the file's JSON without this key (as written: compact, in this order), the
  last key. A file whose content does not match it was edited or damaged: its marks cannot be
  trusted (a cursor moved forward would skip messages without a trace), so it is refused like
  any damaged state file and the positions are rebuilt from the segments. A file without it (an
  older lmqd's) is read as before.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs
from crc32c import crc32c

if TYPE_CHECKING:
    from lmqd.storage.log_cursor import Cursor
    from lmqd.storage.segments import Segment

LOG_STATE_VERSION = 1


@attrs.frozen
class LogState:
    """A topic log's persisted state."""

    next_offset: int
    write_segment: int
    write_offset: int
    cursors: tuple[tuple[str, int], ...] = ()
    """(name, low-water mark) of each cursor, sorted by name."""
    legacy: tuple[tuple[int, int], ...] = ()
    """(segment number, base offset) of each adopted segment of a disk queue's format."""
    adopted: int | None = None
    read: tuple[tuple[str, int], ...] = ()
    """(name, read position) of each cursor, sorted by name: where it had read up to. After a
    crash the messages between a cursor's mark and this were delivered before (``attempts``)."""
    skips: tuple[tuple[str, tuple[tuple[int, int], ...]], ...] = ()
    """(name, ranges) of each cursor with ranges to step over, sorted by name."""


def snapshot_log_state(
    next_offset: int,
    write: Segment,
    cursors: Mapping[str, Cursor],
    legacy: Mapping[int, int],
    adopted: int | None,
) -> LogState:
    """A log's state now: its end, its write segment's end (``write``), every cursor's mark,
    read position and pending skips."""
    return LogState(
        next_offset=next_offset,
        write_segment=write.number,
        write_offset=write.end,
        cursors=tuple(sorted((name, c.low) for name, c in cursors.items())),
        legacy=tuple(sorted(legacy.items())),
        adopted=adopted,
        # Where each cursor had read, and before the last opening (a restart re-reading what a
        # crash left unsettled must not forget it again before it gets there).
        read=tuple(
            sorted(
                (name, read)
                for name, c in cursors.items()
                if (read := max(c.position, c.read_before)) > c.low
            )
        ),
        skips=tuple(
            sorted(
                (name, pending)
                for name, c in cursors.items()
                if c.skips and (pending := c.pending_skips())
            )
        ),
    )


def encode_log_state(name: str, state: LogState) -> bytes:
    """The file content for ``state`` of the log of topic ``name``."""
    doc: dict[str, Any] = {
        "version": LOG_STATE_VERSION,
        "name": name,
        "next_offset": state.next_offset,
        "write": [state.write_segment, state.write_offset],
        "cursors": dict(state.cursors),
        "legacy": [list(pair) for pair in state.legacy],
    }
    if state.adopted is not None:
        doc["adopted"] = state.adopted
    if state.read:
        doc["read"] = dict(state.read)
    if state.skips:
        doc["skips"] = {k: [list(r) for r in ranges] for k, ranges in state.skips}
    doc["crc"] = _checksum(doc)
    return json.dumps(doc, separators=(",", ":")).encode() + b"\n"


def _checksum(doc: dict[str, Any]) -> int:
    """CRC32C of ``doc`` as compact JSON, in its key order (the file without its ``crc``)."""
    return crc32c(json.dumps(doc, separators=(",", ":")).encode())


MAX_NUMBER = (1 << 63) - 1
"""The largest offset, position or segment number a state file may hold: records store offsets
as 64-bit integers, so anything larger is damage, not a position."""


def _count(value: Any, what: str) -> int:
    if type(value) is not int or not 0 <= value <= MAX_NUMBER:
        raise ValueError(f"bad {what} {value!r}")
    return value


def _pair(value: Any, what: str) -> tuple[int, int]:
    if not isinstance(value, list) or len(value) != 2:
        raise ValueError(f"bad {what} {value!r}")
    return _count(value[0], what), _count(value[1], what)


def decode_log_state(name: str, data: bytes) -> LogState:
    """Parse a state file; raises ``ValueError`` for anything malformed."""
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")
    if "crc" in doc:
        crc = doc.pop("crc")
        if crc != _checksum(doc):
            raise ValueError("its checksum does not match its content (edited or damaged)")
    version = doc.get("version")
    if type(version) is not int or version != LOG_STATE_VERSION:
        raise ValueError(f"unknown version {version!r}")
    if doc.get("name") != name:
        raise ValueError(f"written for topic {doc.get('name')!r}")
    next_offset = _count(doc.get("next_offset"), "next offset")
    write = _pair(doc.get("write"), "write position")
    cursors = doc.get("cursors")
    if not isinstance(cursors, dict):
        raise ValueError(f"bad cursors {cursors!r}")
    pairs = tuple(
        sorted((str(k), _count(v, f"low-water mark of {k!r}")) for k, v in cursors.items())
    )
    legacy = doc.get("legacy", [])
    if not isinstance(legacy, list):
        raise ValueError(f"bad legacy bases {legacy!r}")
    bases = tuple(_pair(item, "legacy base") for item in legacy)
    adopted = doc.get("adopted")
    if adopted is not None:
        adopted = _count(adopted, "adopted offset")
    read = doc.get("read", {})
    if not isinstance(read, dict):
        raise ValueError(f"bad read positions {read!r}")
    positions = tuple(
        sorted((str(k), _count(v, f"read position of {k!r}")) for k, v in read.items())
    )
    skips = doc.get("skips", {})
    if not isinstance(skips, dict) or not all(isinstance(v, list) for v in skips.values()):
        raise ValueError(f"bad skipped ranges {skips!r}")
    ranges = tuple(
        sorted((str(k), tuple(_range(r, k) for r in v)) for k, v in skips.items() if v)
    )
    return LogState(next_offset, write[0], write[1], pairs, bases, adopted, positions, ranges)


def _range(value: Any, cursor: str) -> tuple[int, int]:
    start, end = _pair(value, f"skipped range of {cursor!r}")
    if end <= start:
        raise ValueError(f"empty skipped range {value!r} of {cursor!r}")
    return start, end

"""The per-queue positions file ``<stem>.lmq.pos.json``: read and write positions, depth.

One small JSON object, replaced atomically (temp -> fsync -> rename -> fsync the directory)::

    {"version": 2, "name": "orders:archive", "depth": 12,
     "read": [3, 4096, 17], "write": [4, 65568]}

``read`` is the (segment, offset, index) of the first message not yet consumed (in
acknowledgement mode: not yet acknowledged): the record at ``offset`` and the message's index in
it (a batch record holds many; 0 for a single-message record). ``delivered`` (optional,
acknowledgement mode) is the (segment, offset, index) the reader had reached, where it is past
``read``: after a crash, the messages read again below it were handed out before (their
``attempts``, as a topic log's ``read``). ``write`` is where the next
record goes; ``depth`` is the number of messages between them when the file was written
(recovery recounts it, so it is a cross-check). Version 1 files (written before batch records,
``"read": [segment, offset]``) are still read, with index 0.
"""

from __future__ import annotations

import json
from typing import Any

import attrs

POSITIONS_VERSION = 2
_READABLE_VERSIONS = (1, 2)


@attrs.frozen
class Positions:
    """A queue's persisted positions."""

    read_segment: int
    read_offset: int
    write_segment: int
    write_offset: int
    depth: int
    read_index: int = 0
    """Messages of the record at the read position already consumed (batch records)."""
    delivered: tuple[int, int, int] | None = None
    """Acknowledgement mode: where the reader had read up to, when past ``read``."""

    @property
    def read(self) -> tuple[int, int]:
        return (self.read_segment, self.read_offset)

    @property
    def write(self) -> tuple[int, int]:
        return (self.write_segment, self.write_offset)


def encode_positions(name: str, positions: Positions) -> bytes:
    """The file content for ``positions`` of queue ``name``."""
    doc = {
        "version": POSITIONS_VERSION,
        "name": name,
        "depth": positions.depth,
        "read": [positions.read_segment, positions.read_offset, positions.read_index],
        "write": [positions.write_segment, positions.write_offset],
    }
    if positions.delivered is not None:
        doc["delivered"] = list(positions.delivered)
    return json.dumps(doc, separators=(",", ":")).encode() + b"\n"


MAX_NUMBER = (1 << 63) - 1
"""The largest segment number, offset or depth a positions file may hold (64-bit, as the
records' fields): anything larger is damage, not a position."""


def _position(value: Any, size: int = 2) -> tuple[int, ...]:
    if (
        not isinstance(value, list)
        or len(value) != size
        or not all(type(v) is int and 0 <= v <= MAX_NUMBER for v in value)
    ):
        raise ValueError(f"bad position {value!r}")
    return tuple(value)


def decode_positions(name: str, data: bytes) -> Positions:
    """Parse a positions file; raises ``ValueError`` for anything malformed or inconsistent."""
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")
    version = doc.get("version")
    if type(version) is not int or version not in _READABLE_VERSIONS:
        raise ValueError(f"unknown version {version!r}")
    if doc.get("name") != name:
        raise ValueError(f"written for queue {doc.get('name')!r}")
    depth = doc.get("depth")
    if type(depth) is not int or not 0 <= depth <= MAX_NUMBER:
        raise ValueError(f"bad depth {depth!r}")
    read = _position(doc.get("read"), 2 if version == 1 else 3)
    write = _position(doc.get("write"))
    if read[:2] > write:
        raise ValueError(f"read position {read} is past write position {write}")
    index = read[2] if version > 1 else 0
    delivered = doc.get("delivered")
    if delivered is not None:
        segment, offset, after = _position(delivered, 3)
        if (segment, offset, after) < (read[0], read[1], index) or (segment, offset) > write:
            raise ValueError(f"delivered position {delivered} is outside the read and write")
        delivered = (segment, offset, after)
    return Positions(read[0], read[1], write[0], write[1], depth, index, delivered)

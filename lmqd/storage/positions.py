"""The per-queue positions file ``<stem>.lmq.pos.json``: read and write positions, depth.

One small JSON object, replaced atomically (temp -> fsync -> rename -> fsync the directory)::

    {"version": 1, "name": "orders:archive", "depth": 12,
     "read": [3, 4096], "write": [4, 65568]}

``read`` is the (segment, offset) of the first record not yet consumed (in acknowledgement mode:
not yet acknowledged); ``write`` is where the next record goes; ``depth`` is the number of records
between them when the file was written (recovery recounts it, so it is a cross-check).
"""

from __future__ import annotations

import json
from typing import Any

import attrs

POSITIONS_VERSION = 1


@attrs.frozen
class Positions:
    """A queue's persisted positions."""

    read_segment: int
    read_offset: int
    write_segment: int
    write_offset: int
    depth: int

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
        "read": [positions.read_segment, positions.read_offset],
        "write": [positions.write_segment, positions.write_offset],
    }
    return json.dumps(doc, separators=(",", ":")).encode() + b"\n"


def _position(value: Any) -> tuple[int, int]:
    if (
        not isinstance(value, list)
        or len(value) != 2
        or not all(type(v) is int and v >= 0 for v in value)
    ):
        raise ValueError(f"bad position {value!r}")
    return value[0], value[1]


def decode_positions(name: str, data: bytes) -> Positions:
    """Parse a positions file; raises ``ValueError`` for anything malformed or inconsistent."""
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")
    if doc.get("version") != POSITIONS_VERSION:
        raise ValueError(f"unknown version {doc.get('version')!r}")
    if doc.get("name") != name:
        raise ValueError(f"written for queue {doc.get('name')!r}")
    depth = doc.get("depth")
    if type(depth) is not int or depth < 0:
        raise ValueError(f"bad depth {depth!r}")
    read = _position(doc.get("read"))
    write = _position(doc.get("write"))
    if read > write:
        raise ValueError(f"read position {read} is past write position {write}")
    return Positions(read[0], read[1], write[0], write[1], depth)

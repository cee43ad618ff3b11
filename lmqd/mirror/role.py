"""A node's role in replication: who it is, whom it follows, its epoch (``lmqd.role.json``).

Every lmqd data directory gets an identity the first time it runs (``node_id``, random): a
primary tells its mirrors who it is, and a mirror that finds another node at its primary's
address (its data directory replaced, or another machine) refuses to follow it, since the
offsets it holds would mean nothing there. The **epoch** counts promotions: a mirror promoted
(``POST /mirror/promote``) takes the epoch after its primary's and remembers whom it took over
from (``promoted_from``). Pointed at that old primary again, it refuses (it has accepted
messages since, that the old primary never had), unless forced (``--mirror-force``, which drops
the local copies and copies the primary afresh). A primary answers with its epoch, so a mirror
also refuses any primary older than itself.

The file is small JSON, replaced atomically (temp file, fsync, rename, fsync the directory)::

    {"version": 1, "node_id": "5f0c...", "epoch": 1,
     "following": null,
     "promoted_from": {"address": "10.0.0.1:4151", "node_id": "9a1e...", "epoch": 0},
     "promoted_at": 1700000000}

Blocking file I/O, trio-free: the service reads it in a worker thread at start-up and writes it
at the rare changes (a mirror's first contact, a promotion).
"""

from __future__ import annotations

import json
import os
import uuid
from typing import Any

import attrs

from lmqd.storage.files import fsync_dir, write_file_durably

__all__ = ["ROLE_FILENAME", "NodeRole", "Peer", "RoleFileError", "load_role", "save_role"]

ROLE_FILENAME = "lmqd.role.json"
_VERSION = 1


class RoleFileError(Exception):
    """The role file exists but cannot be read: the node will not guess who it is."""


@attrs.frozen
class Peer:
    """Another node as this one knows it: its HTTP address, identity and epoch."""

    address: str
    node_id: str
    epoch: int

    def to_json(self) -> dict[str, Any]:
        return {"address": self.address, "node_id": self.node_id, "epoch": self.epoch}

    @classmethod
    def from_json(cls, value: Any) -> Peer | None:
        if value is None:
            return None
        if not isinstance(value, dict):
            raise ValueError("not an object")
        address, node_id, epoch = value["address"], value["node_id"], value["epoch"]
        if not isinstance(address, str) or not isinstance(node_id, str) or type(epoch) is not int:
            raise ValueError("bad peer")
        return cls(address, node_id, epoch)


@attrs.frozen
class NodeRole:
    """This node's identity, epoch, and whom it follows or took over from."""

    node_id: str
    epoch: int = 0
    following: Peer | None = None
    """The primary this node mirrors (None: it is a primary)."""
    promoted_from: Peer | None = None
    """The primary it took over from at its last promotion."""
    promoted_at: int = 0
    """Unix seconds of that promotion (0: never promoted)."""

    @classmethod
    def new(cls) -> NodeRole:
        return cls(uuid.uuid4().hex)

    def to_bytes(self) -> bytes:
        doc = {
            "version": _VERSION,
            "node_id": self.node_id,
            "epoch": self.epoch,
            "following": self.following.to_json() if self.following else None,
            "promoted_from": self.promoted_from.to_json() if self.promoted_from else None,
            "promoted_at": self.promoted_at,
        }
        return json.dumps(doc, indent=1).encode() + b"\n"

    @classmethod
    def from_bytes(cls, data: bytes) -> NodeRole:
        """Raises ``ValueError`` if ``data`` is not a role file of a version this build reads."""
        doc = json.loads(data)
        if not isinstance(doc, dict) or doc.get("version") != _VERSION:
            raise ValueError("unknown version")
        node_id, epoch, at = doc["node_id"], doc["epoch"], doc.get("promoted_at", 0)
        if not isinstance(node_id, str) or not node_id or type(epoch) is not int or epoch < 0:
            raise ValueError("bad node_id or epoch")
        if type(at) is not int:
            raise ValueError("bad promoted_at")
        return cls(
            node_id,
            epoch,
            Peer.from_json(doc.get("following")),
            Peer.from_json(doc.get("promoted_from")),
            at,
        )


def load_role(data_path: str) -> tuple[NodeRole, bool]:
    """The node's role from ``data_path`` and whether it was there (a new identity if not,
    not yet written). Raises ``RoleFileError`` if the file cannot be read or parsed."""
    path = os.path.join(data_path, ROLE_FILENAME)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return NodeRole.new(), False
    except OSError as exc:
        raise RoleFileError(f"{path}: {exc.strerror or exc}") from None
    try:
        return NodeRole.from_bytes(data), True
    except (ValueError, KeyError, TypeError) as exc:
        raise RoleFileError(f"{path}: not a role file this lmqd reads ({exc})") from None


def save_role(data_path: str, role: NodeRole) -> None:
    """Write the role file durably; raises ``OSError``."""
    os.makedirs(data_path, exist_ok=True)
    write_file_durably(os.path.join(data_path, ROLE_FILENAME), role.to_bytes())
    fsync_dir(data_path)

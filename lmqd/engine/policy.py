"""Topic policies: what a topic keeps beyond nsqd's behaviour, as data.

A topic's **policy** is a small set of keys, each an integer. With none set, lmqd is nsqd: a
log segment is deleted once every channel has passed it. Today's keys are retention
(``lmqd.storage.log_retention`` applies them):

* ``retention_ms``: keep passed segments while their newest message is younger than this;
* ``retention_bytes``: keep passed segments while they and the newer ones take at most this
  many bytes.

* ``ttl_ms``: a message not delivered within this many ms of its publish timestamp is not
  delivered any more: each channel dead-letters it (its ``dead_letter_topic``,
  ``lmqd.engine.channel_policy``) or drops it, and counts it (``expired_count``).

0 means "no retention by this measure", "no TTL" (retention only ever keeps more, so 0 keeps nothing
extra). The daemon's ``--retention-ms`` / ``--retention-bytes`` are the defaults; a topic's own
settings (``POST /topic/policy``, persisted with the metadata) override them key by key. A topic
with any retention writes every message to its log (the memory tail would let messages every
channel read from memory vanish unwritten, which retention is there to prevent).

``parse_update`` is the one validator of a change, for the HTTP API and the metadata file alike:
unknown keys and bad values are refused whole, with a message saying which and why.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from lmqd.options import Options

__all__ = ["MAX_POLICY_VALUE", "POLICY_KEYS", "PolicyError", "TopicPolicy", "parse_update"]

POLICY_KEYS = ("retention_ms", "retention_bytes", "ttl_ms")

MAX_POLICY_VALUE = 2**63 - 1
"""The largest value a key takes (Go's int64, as every other lmqd/nsqd integer setting)."""


class PolicyError(ValueError):
    """A policy change that cannot apply; ``str()`` says which key and why."""


@attrs.frozen(kw_only=True)
class TopicPolicy:
    """A topic's effective policy."""

    retention_ms: int = 0
    retention_bytes: int = 0
    ttl_ms: int = 0

    @classmethod
    def effective(cls, options: Options, settings: Mapping[str, int]) -> TopicPolicy:
        """The daemon's defaults overridden by the topic's own ``settings``."""
        return cls(
            retention_ms=settings.get("retention_ms", options.retention_ms),
            retention_bytes=settings.get("retention_bytes", options.retention_bytes),
            ttl_ms=settings.get("ttl_ms", options.ttl_ms),
        )

    @property
    def retains(self) -> bool:
        """Whether the topic keeps segments its channels have passed."""
        return bool(self.retention_ms or self.retention_bytes)

    def to_dict(self) -> dict[str, int]:
        return {
            "retention_ms": self.retention_ms,
            "retention_bytes": self.retention_bytes,
            "ttl_ms": self.ttl_ms,
        }


def parse_update(doc: Any) -> dict[str, int]:
    """The changes a JSON policy object asks for, validated; raises ``PolicyError``."""
    if not isinstance(doc, dict):
        raise PolicyError("the policy must be a JSON object")
    changes: dict[str, int] = {}
    for key, value in doc.items():
        if key not in POLICY_KEYS:
            raise PolicyError(f"unknown key {key!r} (known: {', '.join(POLICY_KEYS)})")
        if type(value) is not int or not 0 <= value <= MAX_POLICY_VALUE:
            raise PolicyError(f"{key} must be an integer from 0 to {MAX_POLICY_VALUE}")
        changes[key] = value
    return changes

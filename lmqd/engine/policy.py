"""Topic policies: what a topic keeps and accepts beyond nsqd's behaviour, as data.

A topic's **policy** is a small set of keys. With none set, lmqd is nsqd. The keys:

* retention (``lmqd.storage.log_retention`` applies them): ``retention_ms`` keeps passed
  segments while their newest message is younger than this; ``retention_bytes`` keeps passed
  segments while they and the newer ones take at most this many bytes. A topic with any
  retention writes every message to its log (the memory tail would let messages every channel
  read from memory vanish unwritten, which retention is there to prevent).
* publish policies (``lmqd.engine.admission`` applies them on the publish path):
  ``max_depth`` bounds the backlog of every channel of the topic, ``overflow`` says what a
  publish that would pass it does (``"reject"``: refused whole; ``"drop_oldest"``: accepted,
  the oldest waiting messages dropped); ``publish_rate`` / ``publish_burst`` are a token bucket
  in messages per second; ``dedup_window_ms`` drops a body equal to one published that recently.
* ``compression`` (at rest, ``lmqd.storage.atrest``): how the batches the topic's log writes
  from now on are compressed: ``none``, ``zstd`` (``zstd:1`` .. ``zstd:22``), ``lz4``,
  ``snappy``, ``gzip`` (``gzip:1`` .. ``gzip:9``); what is already written stays as it is.
  The daemon's ``--compression`` is the default.
* ``ttl_ms``: a message not delivered within this many ms of its publish timestamp is not
  delivered any more: each channel dead-letters it (its ``dead_letter_topic``,
  ``lmqd.engine.channel_policy``) or drops it, and counts it (``expired_count``).
* ``min_insync_mirrors`` (``lmqd.engine.insync``): a publish's ``OK`` waits until that many
  mirrors stored it, and is refused with fewer in sync (0: answered without them); the daemon's
  ``--min-insync-mirrors`` is the default.

Every key but ``overflow`` and ``compression`` is an integer from 0 to 2^63-1, where 0 means
off (no retention, no TTL, no bound, no limit, no window, no mirror waited for;
``publish_burst`` 0 means one second's worth of ``publish_rate``). ``overflow`` is one of
``OVERFLOW_MODES``;
``compression`` a codec's spelling, stored as ``Compression`` writes it. The daemon's flags of
the same names (``--retention-ms``, ``--ttl-ms``, ``--max-depth``, ``--compression``, ...) are
the defaults; a topic's own settings (``POST /topic/policy``, persisted with the metadata)
override them key by key.

``parse_update`` is the one validator of a change, for the HTTP API and the metadata file alike:
unknown keys and bad values are refused whole, with a message saying which and why.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import attrs

from lmqd.options import OVERFLOW_MODES, Options
from lmqd.storage.atrest.compression import Compression

__all__ = [
    "MAX_POLICY_VALUE",
    "OVERFLOW_MODES",
    "POLICY_KEYS",
    "PUBLISH_KEYS",
    "PolicyError",
    "PolicyValue",
    "TopicPolicy",
    "parse_update",
    "shared_default",
]

PolicyValue = int | str
"""A key's value: ``overflow`` is a string, every other key an integer."""

_T = TypeVar("_T")

_SHARED_DEFAULTS: dict[type, tuple[Options, Any]] = {}
"""Per policy class, the last options and their default policy."""


def shared_default(kind: type[_T], options: Options, make: Callable[[], _T]) -> _T:
    """The default policy of ``kind`` for ``options`` (``make()``), one object shared by every
    topic or channel made with those options and no key of its own (policies are frozen), not
    one each: an idle topic or channel holds as little as it can."""
    held = _SHARED_DEFAULTS.get(kind)
    if held is None or held[0] is not options:
        held = _SHARED_DEFAULTS[kind] = (options, make())
    result: _T = held[1]
    return result

PUBLISH_KEYS = ("max_depth", "overflow", "publish_rate", "publish_burst", "dedup_window_ms")
"""The keys the publish path applies (``lmqd.engine.admission``)."""

POLICY_KEYS = (
    "retention_ms", "retention_bytes", "ttl_ms", *PUBLISH_KEYS, "compression",
    "min_insync_mirrors",
)  # fmt: skip

STRING_KEYS: Mapping[str, tuple[str, ...]] = {"overflow": OVERFLOW_MODES}
"""Keys whose value is a string, with the values they take; every other key is an integer."""

MAX_POLICY_VALUE = 2**63 - 1
"""The largest value an integer key takes (Go's int64, as every other lmqd/nsqd setting)."""


class PolicyError(ValueError):
    """A policy change that cannot apply; ``str()`` says which key and why."""


@attrs.frozen(kw_only=True)
class TopicPolicy:
    """A topic's effective policy."""

    retention_ms: int = 0
    retention_bytes: int = 0
    ttl_ms: int = 0
    max_depth: int = 0
    overflow: str = "reject"
    publish_rate: int = 0
    publish_burst: int = 0
    dedup_window_ms: int = 0
    compression: str = "none"
    min_insync_mirrors: int = 0

    @classmethod
    def effective(cls, options: Options, settings: Mapping[str, PolicyValue]) -> TopicPolicy:
        """The daemon's defaults overridden by the topic's own ``settings`` (validated)."""
        values = {key: settings.get(key, getattr(options, key)) for key in POLICY_KEYS}
        return cls(**values)

    @property
    def retains(self) -> bool:
        """Whether the topic keeps segments its channels have passed."""
        return bool(self.retention_ms or self.retention_bytes)

    @property
    def gates_publishing(self) -> bool:
        """Whether any publish policy is on (the publish path then goes through a gate)."""
        return bool(self.max_depth or self.publish_rate or self.dedup_window_ms)

    def to_dict(self) -> dict[str, PolicyValue]:
        return {key: getattr(self, key) for key in POLICY_KEYS}


def parse_update(doc: Any) -> dict[str, PolicyValue]:
    """The changes a JSON policy object asks for, validated; raises ``PolicyError``."""
    if not isinstance(doc, dict):
        raise PolicyError("the policy must be a JSON object")
    changes: dict[str, PolicyValue] = {}
    for key, value in doc.items():
        if key not in POLICY_KEYS:
            raise PolicyError(f"unknown key {key!r} (known: {', '.join(POLICY_KEYS)})")
        choices = STRING_KEYS.get(key)
        if key == "compression":
            if type(value) is not str:
                raise PolicyError(
                    "compression must be a string: none, zstd[:LEVEL], lz4, snappy, gzip[:LEVEL]"
                )
            try:
                value = str(Compression.parse(value))
            except ValueError as exc:
                raise PolicyError(f"compression invalid: {exc}") from None
        elif choices is not None:
            if type(value) is not str or value not in choices:
                shown = ", ".join(f'"{c}"' for c in choices)
                raise PolicyError(f"{key} must be one of {shown}")
        elif type(value) is not int or not 0 <= value <= MAX_POLICY_VALUE:
            raise PolicyError(f"{key} must be an integer from 0 to {MAX_POLICY_VALUE}")
        changes[key] = value
    return changes

"""Channel policies: how a channel retries and gives up on a message, as data.

A channel's **policy** is a handful of keys. With none set, lmqd is nsqd: a message is
retried for ever, a timeout or a ``REQ 0`` makes it ready again at once.

* ``max_attempts`` (0: unlimited, the default): a message that has been delivered this many
  times and comes back (``REQ``, a timeout) is not delivered again. It goes to
* ``dead_letter_topic`` (a valid, non-ephemeral topic name; ``""``, the default, means none):
  an ordinary topic, created if needed, into which the message is published keeping its id,
  body, timestamp and attempts. Without a dead-letter topic the message is dropped and counted
  (``max_attempts_dropped_count``). A message whose topic's ``ttl_ms`` ran out goes the same
  way (``expired_count``), see ``lmqd.engine.channel``.
* ``backoff_ms``, ``backoff_max_ms``, ``backoff_jitter``: a server-side delay before a timed-out
  message, or one requeued with ``REQ 0``, is delivered again::

      base  = min(backoff_max_ms, backoff_ms * 2 ** (attempts - 1))      (attempts >= 1)
      delay = base * (1 - backoff_jitter * u),   u uniform in [0, 1)

  so with jitter ``j`` the delay lies in ``(base * (1 - j), base]``: jitter only shortens,
  never lengthens, the delay, and ``backoff_max_ms`` stays a true upper bound.
  ``backoff_max_ms`` 0 means no cap. A client's ``REQ`` with an explicit delay > 0 is honoured
  as given (the client chose it). ``backoff_ms`` 0 (the default) means no server-side delay.

The daemon's ``--max-attempts``, ``--dead-letter-topic``, ``--backoff-ms``,
``--backoff-max-ms`` and ``--backoff-jitter`` are the defaults; a channel's own settings
(``POST /channel/policy``, persisted with the metadata) override them key by key.

Redrive (``POST /channel/redrive``, ``lmqd.broker``) takes ready messages from the dead-letter
topic's ``REDRIVE_CHANNEL`` and puts fresh copies of them (same id, body and timestamp,
attempts 0: they get ``max_attempts`` tries again) into one channel of the origin topic.

``parse_update`` is the one validator of a change, for the HTTP API and the metadata file
alike: unknown keys, wrong types and out-of-range values are refused whole, with a message
naming the key.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

import attrs

from lmqd.engine.policy import PolicyError
from lmqd.names import is_ephemeral, valid_name
from lmqd.options import MAX_ATTEMPTS, MAX_BACKOFF_MS, Options

__all__ = [
    "CHANNEL_POLICY_KEYS",
    "MAX_ATTEMPTS",
    "MAX_BACKOFF_MS",
    "REDRIVE_CHANNEL",
    "ChannelPolicy",
    "PolicyError",
    "PolicyValue",
    "dead_letter_name_error",
    "parse_update",
]

REDRIVE_CHANNEL = "lmq.redrive"
"""The channel a dead-letter topic keeps its dead letters in for ``/channel/redrive``: created
when the first message is dead-lettered there, so it holds every one from then on (whatever
other channels read the topic). An ordinary channel: a consumer subscribed to it competes with
redrive."""

PolicyValue = int | float | str
"""What a channel policy key holds (JSON: an integer, a number or a string)."""

CHANNEL_POLICY_KEYS = (
    "max_attempts",
    "dead_letter_topic",
    "backoff_ms",
    "backoff_max_ms",
    "backoff_jitter",
)

def dead_letter_name_error(name: str) -> str | None:
    """Why ``name`` cannot be a dead-letter topic (None: it can; ``""`` means none)."""
    if name == "":
        return None
    if not valid_name(name):
        return "dead_letter_topic must be a valid topic name"
    if is_ephemeral(name):
        return "dead_letter_topic must not be ephemeral (dead letters are kept)"
    return None


@attrs.frozen(kw_only=True)
class ChannelPolicy:
    """A channel's effective policy (see the module docstring)."""

    max_attempts: int = 0
    dead_letter_topic: str = ""
    backoff_ms: int = 0
    backoff_max_ms: int = 0
    backoff_jitter: float = 0.0

    @classmethod
    def effective(cls, options: Options, settings: Mapping[str, PolicyValue]) -> ChannelPolicy:
        """The daemon's defaults overridden by the channel's own ``settings`` (validated)."""
        return cls(
            max_attempts=int(settings.get("max_attempts", options.max_attempts)),
            dead_letter_topic=str(settings.get("dead_letter_topic", options.dead_letter_topic)),
            backoff_ms=int(settings.get("backoff_ms", options.backoff_ms)),
            backoff_max_ms=int(settings.get("backoff_max_ms", options.backoff_max_ms)),
            backoff_jitter=float(settings.get("backoff_jitter", options.backoff_jitter)),
        )

    @property
    def backs_off(self) -> bool:
        """Whether timeouts and ``REQ 0`` are delayed by the server."""
        return self.backoff_ms > 0

    def backoff_s(self, attempts: int, rng: random.Random) -> float:
        """The delay in seconds before a message delivered ``attempts`` times is retried."""
        exponent = max(attempts, 1) - 1
        base = self.backoff_ms
        cap = self.backoff_max_ms or MAX_BACKOFF_MS
        # Bounded exponent: past 2**32 the product exceeds any cap, and a huge power is slow.
        delay_ms = cap if exponent >= 32 else min(cap, base << exponent)
        if not self.backoff_jitter:
            return delay_ms / 1000
        return delay_ms * (1.0 - self.backoff_jitter * rng.random()) / 1000

    def to_dict(self) -> dict[str, PolicyValue]:
        return {
            "max_attempts": self.max_attempts,
            "dead_letter_topic": self.dead_letter_topic,
            "backoff_ms": self.backoff_ms,
            "backoff_max_ms": self.backoff_max_ms,
            "backoff_jitter": self.backoff_jitter,
        }


def _int(key: str, value: Any, top: int) -> int:
    if type(value) is not int or not 0 <= value <= top:
        raise PolicyError(f"{key} must be an integer from 0 to {top}")
    return value


def parse_update(doc: Any) -> dict[str, PolicyValue]:
    """The changes a JSON policy object asks for, validated; raises ``PolicyError``."""
    if not isinstance(doc, dict):
        raise PolicyError("the policy must be a JSON object")
    changes: dict[str, PolicyValue] = {}
    for key, value in doc.items():
        if key == "max_attempts":
            changes[key] = _int(key, value, MAX_ATTEMPTS)
        elif key in ("backoff_ms", "backoff_max_ms"):
            changes[key] = _int(key, value, MAX_BACKOFF_MS)
        elif key == "backoff_jitter":
            if type(value) not in (int, float) or not 0 <= value <= 1:
                raise PolicyError("backoff_jitter must be a number from 0 to 1")
            changes[key] = float(value)
        elif key == "dead_letter_topic":
            if not isinstance(value, str):
                raise PolicyError("dead_letter_topic must be a string (\"\" for none)")
            error = dead_letter_name_error(value)
            if error is not None:
                raise PolicyError(error)
            changes[key] = value
        else:
            raise PolicyError(f"unknown key {key!r} (known: {', '.join(CHANNEL_POLICY_KEYS)})")
    return changes

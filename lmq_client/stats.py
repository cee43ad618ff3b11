"""``ConsumerStats``: the counters the async and the blocking consumer keep alike."""

from __future__ import annotations

import attrs

__all__ = ["ConsumerStats"]


@attrs.frozen
class ConsumerStats:
    """Counters since the consumer started, and its state now."""

    received: int
    finished: int
    requeued: int
    given_up: int
    connections: int
    backoff_level: int

"""TokenBucket: a topic's ``publish_rate`` / ``publish_burst`` (``lmqd.engine.policy``).

The bucket holds up to ``burst`` tokens and gains ``rate`` per second of trio time; a publish of
n messages takes n. A publish that finds too few tokens **reserves** them all the same, taking
the bucket below zero, and waits until the refill has paid the debt back: ``deficit / rate``
seconds. Later publishers see the debt and wait behind it, so publishers are served in the
order they asked and the long-run rate is exactly ``rate``, whatever the number of connections.

A publish whose wait would be longer than ``max_wait`` takes nothing and is refused at once:
waiting longer only to refuse would hold the producer and tell it nothing more. Time is the
``now`` the caller passes (``trio.current_time()``), so tests run on the autojump clock.

Every method is O(1) per command, plain ``def``: the waiting itself is the caller's, one sleep
per publish command (``lmqd.server.session``'s ``Throttle``, the HTTP handler's ``sleep``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["TokenBucket"]


class TokenBucket:
    """``rate`` tokens per second, at most ``burst`` banked; see the module docstring."""

    __slots__ = ("_at", "_tokens", "burst", "rate")

    def __init__(self, rate: float, burst: float, now: float = -math.inf) -> None:
        """A full bucket at ``now`` (by default: at its first use, full all the same)."""
        if rate <= 0 or burst <= 0:
            raise ValueError("a token bucket needs a positive rate and burst")
        self.rate = rate
        self.burst = burst
        self._tokens = burst
        self._at = now

    def __repr__(self) -> str:
        return f"<TokenBucket {self.rate}/s burst {self.burst} tokens {self._tokens}>"

    def tokens(self, now: float) -> float:
        """Tokens available at ``now`` (negative: reserved by publishes still waiting)."""
        self._refill(now)
        return self._tokens

    def _refill(self, now: float) -> None:
        if now > self._at:
            self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
            self._at = now

    def reserve(self, sizes: Sequence[int], now: float, max_wait: float) -> tuple[int, float]:
        """Take the tokens of the longest prefix of commands (``sizes``: messages each) that is
        paid for within ``max_wait`` seconds: ``(commands, wait)``. ``commands`` 0 means the
        first command is refused (nothing taken); ``wait`` is how long the caller must hold the
        taken commands before publishing them."""
        self._refill(now)
        tokens = self._tokens
        rate = self.rate
        count = 0
        wait = 0.0
        for n in sizes:
            after = tokens - n
            needed = -after / rate if after < 0 else 0.0
            if needed > max_wait:
                break
            tokens = after
            wait = needed
            count += 1
        self._tokens = tokens
        return count, wait

    def retry_after(self, n: int, now: float) -> float:
        """Seconds until ``n`` tokens would be there (what an HTTP 429 says in Retry-After)."""
        self._refill(now)
        missing = n - self._tokens
        return missing / self.rate if missing > 0 else 0.0

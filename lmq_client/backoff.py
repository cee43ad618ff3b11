"""Exponential backoff with jitter, as a pure function of the failure level.

Used twice: by the Consumer when handlers fail (go-nsq's backoff: stop the flow with RDY 0, wait,
probe with RDY 1) and between reconnect attempts. Kept free of trio so it is tested on its own.
"""

from __future__ import annotations

import random

import attrs


@attrs.frozen(kw_only=True)
class Backoff:
    """``delay(level) = min(max_delay, base * 2 ** (level - 1))``, less up to ``jitter`` of it.

    Jitter spreads many clients that failed together (a daemon restart) so they do not all come
    back in the same instant; ``jitter=0`` gives exact delays (tests use that).
    """

    base: float = 1.0
    """Seconds at level 1."""
    max_delay: float = 120.0
    """Ceiling (go-nsq's max_backoff_duration is 2 minutes)."""
    jitter: float = attrs.field(default=0.25)
    """Fraction of the delay that is randomised away: the delay is in [d*(1-jitter), d]."""
    rng: random.Random = attrs.field(factory=random.Random, eq=False, repr=False)

    @jitter.validator
    def _check_jitter(self, attribute: attrs.Attribute[float], value: float) -> None:
        if not 0.0 <= value <= 1.0:
            raise ValueError("jitter must be within [0, 1]")

    def delay(self, level: int) -> float:
        """Seconds to wait at ``level`` (>= 1) consecutive failures; 0 for level <= 0."""
        if level <= 0:
            return 0.0
        # Cap the exponent: 2 ** 1000 overflows a float long after max_delay is reached.
        nominal = min(self.max_delay, self.base * 2.0 ** min(level - 1, 64))
        if self.jitter:
            nominal *= 1.0 - self.jitter * self.rng.random()
        return nominal

    @property
    def max_level(self) -> int:
        """The lowest level whose nominal delay reaches ``max_delay``; more levels add nothing."""
        level = 1
        while self.base * 2.0 ** (level - 1) < self.max_delay and level < 64:
            level += 1
        return level

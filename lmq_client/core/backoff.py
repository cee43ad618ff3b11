"""Exponential backoff with jitter, as a pure function of the failure level, and the consumers'
backoff state.

``Backoff`` is used twice: by the consumers when handlers fail and between reconnect attempts.
``BackoffState`` is go-nsq's consumer backoff as plain state with ``now`` passed in, held by the
consumer core's flow control (``lmq_client.core.flow``) for every front end: a failure raises
the level and pauses the flow (RDY 0 everywhere) for ``delay(level)``; when the pause ends the
consumer probes with RDY 1 on one connection; a success lowers the level (at 0
the full RDY is back, otherwise another, shorter, pause follows) and a failure raises it.
Outcomes reported during a pause belong to messages that were in flight when it began, and are
not counted, so one burst of failures counts once. Free of any event loop, so it is tested on
its own.
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


class BackoffState:
    """A consumer's backoff level and pause (see the module docstring); every method O(1)."""

    def __init__(self, backoff: Backoff) -> None:
        self.backoff = backoff
        self.level = 0
        """Consecutive failures not yet offset by successes (0: not backing off)."""
        self.paused_until: float | None = None
        """When the current pause ends (None: not paused)."""

    @property
    def probing(self) -> bool:
        """Backing off but not paused: one connection gets RDY 1, the others RDY 0."""
        return self.level > 0 and self.paused_until is None

    def outcome(self, now: float, *, failure: bool) -> bool:
        """A message was answered (``failure``: requeued with backoff); True if the level or
        the pause changed, so RDY must be set again."""
        if self.paused_until is not None:
            return False
        if failure:
            self.level = min(self.level + 1, self.backoff.max_level)
        elif self.level > 0:
            self.level -= 1
        else:
            return False
        if self.level > 0:
            self.paused_until = now + self.backoff.delay(self.level)
        return True

    def pause_over(self, now: float) -> bool:
        """End the pause if it is due; True if it ended (now probe with RDY 1)."""
        if self.paused_until is None or now < self.paused_until:
            return False
        self.paused_until = None
        return True

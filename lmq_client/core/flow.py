"""A consumer's flow control: the RDY each connection should have, sans I/O.

Theory of operation
-------------------
RDY is a window per connection (nsqd sends while ``in_flight < rdy``), so the consumer only
chooses one number per connection and sends it when it changes (``lmq_client.core.rdy`` has the
arithmetic). Three regimes, as go-nsq:

* **Normal**: ``max_in_flight`` split evenly over the connections; with fewer slots than
  connections, ``RDY 1`` on ``max_in_flight`` of them (the *active* set), and every
  ``redistribute_interval`` the slots of active connections that received nothing move to
  others (``redistribute``), so a daemon with messages is never starved by idle ones. The
  redistribution waits while the consumer backs off.
* **Paused** (backing off): a failure raises the backoff level and pauses the flow, ``RDY 0``
  everywhere, for ``backoff.delay(level)`` seconds (``lmq_client.core.backoff.BackoffState``).
* **Probing**: when a pause ends, one connection chosen at random gets ``RDY 1``; a success
  lowers the level (at 0 the normal RDY is back, otherwise a shorter pause follows), a failure
  raises it. Outcomes reported during a pause belong to messages already in flight when it
  began and are not counted.

Connections are any hashable objects (the consumer core's links); every method is plain
``def`` taking ``now``, and the only randomness is the ``rng`` passed in.
"""

from __future__ import annotations

import math
import random
from collections.abc import Collection, Hashable, Mapping, Sequence
from typing import Generic, TypeVar

from lmq_client.core.backoff import Backoff, BackoffState
from lmq_client.core.rdy import choose_active, rdy_targets

__all__ = ["Flow"]

K = TypeVar("K", bound=Hashable)


class Flow(Generic[K]):
    """RDY targets for a consumer's connections (see the module docstring)."""

    def __init__(
        self,
        *,
        max_in_flight: int,
        backoff: Backoff,
        redistribute_interval: float,
        rng: random.Random,
    ) -> None:
        self.max_in_flight = max_in_flight
        self.backoff = BackoffState(backoff)
        self.redistribute_interval = redistribute_interval
        self.rng = rng
        self.probe: K | None = None
        """The connection that gets RDY 1 while probing."""
        self.active: set[K] = set()
        """With fewer slots than connections: the connections that may receive."""
        self.redistribute_at = math.inf

    @property
    def level(self) -> int:
        return self.backoff.level

    @property
    def deadline(self) -> float:
        """The next time ``due`` has something to do."""
        paused_until = self.backoff.paused_until
        return min(self.redistribute_at, paused_until if paused_until is not None else math.inf)

    def describe(self, now: float) -> str:
        """The backoff state in words, for a log line."""
        paused_until = self.backoff.paused_until
        if paused_until is None:
            return "backoff over" if self.level == 0 else f"probing (level {self.level})"
        return f"backing off for {paused_until - now:.3f}s (level {self.level})"

    def connections_changed(self, conns: Sequence[K], now: float) -> None:
        """A connection was added or removed: keep the active set and the probe valid."""
        if self.probe is not None and self.probe not in conns:
            self.probe = self.rng.choice(list(conns)) if self.backoff.probing and conns else None
        if len(conns) > self.max_in_flight:
            self.active = choose_active(conns, self.active, (), self.max_in_flight, self.rng)
            if self.redistribute_at == math.inf:
                self.redistribute_at = now + self.redistribute_interval
        else:
            self.active.intersection_update(conns)

    def targets(self, conns: Sequence[K], caps: Mapping[K, int]) -> dict[K, int]:
        """The RDY each connection should have now."""
        if self.backoff.paused_until is not None:
            return dict.fromkeys(conns, 0)
        if self.backoff.probing:
            if self.probe is None and conns:
                self.probe = self.rng.choice(list(conns))
            return {c: (1 if c == self.probe else 0) for c in conns}
        return rdy_targets(self.max_in_flight, conns, caps, self.active)

    def outcome(self, now: float, *, failure: bool) -> bool:
        """A message was answered (``failure``: requeued with backoff); True if the RDY
        targets changed."""
        if not self.backoff.outcome(now, failure=failure):
            return False
        self.probe = None
        return True

    def due(self, now: float, conns: Sequence[K], idle: Collection[K]) -> bool:
        """End a pause and redistribute slots when due (``idle``: the connections that
        received nothing since the last redistribution); True if the RDY targets changed."""
        changed = False
        if self.backoff.pause_over(now):
            self.probe = self.rng.choice(list(conns)) if conns else None
            changed = True
        if now >= self.redistribute_at:
            if len(conns) <= self.max_in_flight:
                self.redistribute_at = math.inf
            elif self.backoff.level > 0:
                self.redistribute_at = now + self.redistribute_interval
            else:
                self.active = choose_active(conns, self.active, idle, self.max_in_flight,
                                            self.rng)  # fmt: skip
                self.redistribute_at = now + self.redistribute_interval
                changed = True
        return changed

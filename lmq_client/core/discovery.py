"""Discovery through lookupds, sans I/O: when to ask, and what to do with the answers.

* **The poll schedule.** go-nsq's and pynsq's: the first query at once, the second after a
  random ``jitter * interval`` plus one ``interval`` (``jitter`` = 0.3, ``interval`` = 60 s),
  then every ``interval``. The jitter spreads the consumers that started together (a deploy)
  over the interval, so the lookupds do not see them all at once.
* **Discovery** (``Discovery``): what a consumer does with the answers. A producer that
  appears is connected to. A connection to a discovered producer that ends is *not* simply
  redialled (go-nsq's rule): the lookupds are asked again, after that address's reconnect
  backoff, and the producer is reconnected only if they still list it -- so a node whose topic
  was tombstoned and deleted (nsqadmin's flow) is not reconnected, which would recreate the
  topic. A connected producer that the lookupds stop listing is dropped once it has been
  missing from ``DROP_AFTER_MISSES`` consecutive answers: a lookupd that was restarted a moment
  ago does not know every node yet (nsqd re-registers 15-30 s after it comes back). A round in
  which no lookupd answered changes nothing.

The queries themselves (HTTP) are ``lmq_client.lookupd``'s.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Iterator

from lmq_client.core.backoff import Backoff

__all__ = [
    "DEFAULT_POLL_INTERVAL",
    "DEFAULT_POLL_JITTER",
    "DEFAULT_TIMEOUT",
    "DROP_AFTER_MISSES",
    "Discovery",
    "check_schedule",
    "poll_times",
]

DEFAULT_POLL_INTERVAL = 60.0
"""go-nsq's ``lookupd_poll_interval`` and pynsq's: a new node is found within a minute."""

DEFAULT_POLL_JITTER = 0.3
"""go-nsq's ``lookupd_poll_jitter``: the fraction of the interval the second query is delayed
by at random."""

DEFAULT_TIMEOUT = 5.0
"""Seconds a lookupd query may take (pynsq: 1 s to connect and 2 s to answer; go-nsq 60 s)."""

DROP_AFTER_MISSES = 2
"""Consecutive answers a connected producer must be missing from before it is dropped."""


def check_schedule(interval: float, jitter: float) -> None:
    """``ValueError`` unless ``interval`` > 0 and ``jitter`` is within [0, 1]."""
    if not interval > 0:
        raise ValueError("lookupd poll interval must be > 0")
    if not 0 <= jitter <= 1:
        raise ValueError("lookupd poll jitter must be within [0, 1]")


def poll_times(
    start: float, interval: float, jitter: float, rng: random.Random
) -> Iterator[float]:
    """When to query: ``start``, then ``start + rng() * jitter * interval + k * interval``."""
    yield start
    first = start + rng.random() * jitter * interval
    k = 1
    while True:
        yield first + k * interval
        k += 1


class Discovery:
    """What to connect to and drop, from lookupd answers (see the module docstring).

    Plain ``def`` with ``now`` passed in; the consumer's task queries at ``next_poll_at`` and
    feeds the answer to ``answered``, and tells ``connected`` / ``connection_ended`` about the
    connections it made.
    """

    def __init__(
        self,
        *,
        interval: float = DEFAULT_POLL_INTERVAL,
        jitter: float = DEFAULT_POLL_JITTER,
        reconnect_backoff: Backoff | None = None,
        rng: random.Random | None = None,
        start: float = 0.0,
    ) -> None:
        check_schedule(interval, jitter)
        self.reconnect_backoff = reconnect_backoff or Backoff(base=1.0, max_delay=60.0)
        self._schedule = poll_times(start, interval, jitter, rng or random.Random())
        self._regular_at = next(self._schedule)
        self._early_at = math.inf
        self.producers: set[str] = set()
        """What the lookupds listed in the last round that was answered."""
        self.active: set[str] = set()
        """Producers a connection was started to and has not ended."""
        self._misses: dict[str, int] = {}
        self._failures: dict[str, int] = {}
        self._retry_at: dict[str, float] = {}

    @property
    def next_poll_at(self) -> float:
        """When the next query is due."""
        return min(self._regular_at, self._early_at)

    def polled(self, now: float) -> None:
        """A query round starts now: advance the schedule past ``now``."""
        while self._regular_at <= now:
            self._regular_at = next(self._schedule)
        if self._early_at <= now:
            self._early_at = math.inf

    def answered(self, now: float, producers: Iterable[str] | None) -> tuple[list[str], list[str]]:
        """The round's answer (None: no lookupd answered) -> ``(connect to, drop)``."""
        if producers is None:
            return [], []
        listed = set(producers)
        self.producers = listed
        connect = sorted(
            a for a in listed if a not in self.active and self._retry_at.get(a, -math.inf) <= now
        )
        self.active.update(connect)
        drop = []
        for address in sorted(self.active - listed):
            self._misses[address] = self._misses.get(address, 0) + 1
            if self._misses[address] >= DROP_AFTER_MISSES:
                drop.append(address)
        for address in listed:
            self._misses.pop(address, None)
        for address in list(self._retry_at):
            if address not in listed:  # gone: its backoff no longer matters
                self._retry_at.pop(address)
                self._failures.pop(address, None)
        return connect, drop

    def connected(self, address: str) -> None:
        """The connection to ``address`` is up (subscribed)."""
        self._failures.pop(address, None)
        self._retry_at.pop(address, None)

    def connection_ended(self, address: str, now: float, *, dropped: bool = False) -> None:
        """The connection to ``address`` failed or ended. Unless it was ``dropped`` (no longer
        listed), ask the lookupds again once its reconnect backoff has passed."""
        self.active.discard(address)
        self._misses.pop(address, None)
        if dropped:
            return
        failures = self._failures[address] = self._failures.get(address, 0) + 1
        retry_at = now + self.reconnect_backoff.delay(failures)
        self._retry_at[address] = retry_at
        self._early_at = min(self._early_at, retry_at)

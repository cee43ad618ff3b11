"""When a consumer dials which daemon, sans I/O: given addresses, discovered ones, lookupd polls.

Theory of operation
-------------------
A consumer's daemons come from two places. **Given** addresses are dialled at start and, after a
connection to one ends or an attempt fails, dialled again after the reconnect backoff
(``reconnect_backoff.delay(failures)``, failures counted since it was last subscribed: 1 s, 2 s,
4 s... by default). **Discovered** daemons follow ``lmq_client.lookupd.Discovery``'s rules
(go-nsq's): the lookupds are polled at once and then on the jittered schedule, a new producer is
dialled, one no longer listed for two rounds is dropped, and one whose connection ended is
dialled again only if the lookupds still list it when asked once its backoff has passed. A
daemon that is both given and listed is connected once, as a given one.

The consumer runs nothing until the **first round** is over: every given address tried once and
the first lookupd answer's daemons tried once (so the first connection is not handed all of
``max_in_flight`` before the others are even up).

``Schedule`` answers with actions for the driver to perform (``Connect``, ``Disconnect``,
``QueryLookupds``); the driver reports back with ``ended`` and ``answered``. Plain ``def``,
``now`` passed in.
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Iterable, Sequence

import attrs

from lmq_client.core.backoff import Backoff
from lmq_client.core.discovery import Discovery

__all__ = ["Action", "Connect", "Disconnect", "QueryLookupds", "Schedule"]

log = logging.getLogger("lmq_client.schedule")


@attrs.frozen
class Connect:
    """Open a connection to ``address`` (handshake, then hand it to the core)."""

    address: str


@attrs.frozen
class Disconnect:
    """Close the connection to ``address`` (or abandon the attempt to open it)."""

    address: str


@attrs.frozen
class QueryLookupds:
    """Ask every lookupd for the topic's producers and report the union (or None if no lookupd
    answered) with ``answered``."""


Action = Connect | Disconnect | QueryLookupds

_LOOKUPD_ROUND = "<lookupd>"


class Schedule:
    """The dialling plan of one consumer (see the module docstring)."""

    def __init__(
        self,
        addresses: Sequence[str],
        *,
        lookupds: bool,
        poll_interval: float,
        poll_jitter: float,
        reconnect_backoff: Backoff,
        rng: random.Random,
        now: float,
    ) -> None:
        self.given = list(addresses)
        self.reconnect_backoff = reconnect_backoff
        self.discovery = (
            Discovery(interval=poll_interval, jitter=poll_jitter,
                      reconnect_backoff=reconnect_backoff, rng=rng, start=now)
            if lookupds else None
        )  # fmt: skip
        self.dialling: set[str] = set()
        """Addresses with a connection being opened or open."""
        self._redial: dict[str, float] = dict.fromkeys(self.given, now)
        """Given addresses not dialling, and when to dial them."""
        self._failures: dict[str, int] = {}
        """Given addresses: failed attempts since the last subscription."""
        self._dropped: set[str] = set()
        self._querying = False
        self._first_round: set[str] = set(self.given)
        if lookupds:
            self._first_round.add(_LOOKUPD_ROUND)
        self._stopped = False
        self.started = False
        """True once the first round is over (see the module docstring)."""

    @property
    def deadline(self) -> float:
        """When ``due`` next has something to do."""
        if self._stopped:
            return math.inf
        due = min(self._redial.values(), default=math.inf)
        if self.discovery is not None and not self._querying:
            due = min(due, self.discovery.next_poll_at)
        return due

    def due(self, now: float) -> list[Action]:
        """The dials and lookupd polls due at ``now``."""
        actions: list[Action] = []
        if self._stopped:
            return actions
        for address, at in list(self._redial.items()):
            if at <= now:
                del self._redial[address]
                self.dialling.add(address)
                actions.append(Connect(address))
        discovery = self.discovery
        if discovery is not None and not self._querying and discovery.next_poll_at <= now:
            discovery.polled(now)
            self._querying = True
            actions.append(QueryLookupds())
        return actions

    def answered(self, now: float, found: Iterable[str] | None) -> list[Action]:
        """The lookupds' answer (None: none answered) -> the dials and drops it calls for."""
        assert self.discovery is not None
        self._querying = False
        if self._stopped:
            return []
        listed = None if found is None else set(found) - set(self.given)
        connect, drop = self.discovery.answered(now, listed)
        actions: list[Action] = []
        for address in drop:
            log.info("consumer: %s is no longer listed by the lookupds; dropping it", address)
            self.discovery.connection_ended(address, now, dropped=True)
            self.dialling.discard(address)
            self._dropped.add(address)
            actions.append(Disconnect(address))
        for address in connect:
            log.info("consumer: found %s through the lookupds", address)
            self._dropped.discard(address)
            self.dialling.add(address)
            if not self.started:
                self._first_round.add(address)
            actions.append(Connect(address))
        self._attempted(_LOOKUPD_ROUND)
        return actions

    def subscribed(self, address: str) -> None:
        """The connection to ``address`` is subscribed."""
        if self.discovery is not None and address not in self.given:
            self.discovery.connected(address)
        self._failures.pop(address, None)
        self._attempted(address)

    def ended(self, address: str, now: float) -> None:
        """The connection to ``address`` ended, or the attempt to open it failed."""
        self.dialling.discard(address)
        self._attempted(address)
        if address in self._dropped:
            self._dropped.discard(address)
            return
        if address in self.given:
            failures = self._failures[address] = self._failures.get(address, 0) + 1
            self._redial[address] = now + self.reconnect_backoff.delay(failures)
        elif self.discovery is not None:
            self.discovery.connection_ended(address, now)

    def stop(self) -> None:
        """No more dials or polls (the consumer is closing)."""
        self._stopped = True
        self._redial.clear()

    def _attempted(self, address: str) -> None:
        self._first_round.discard(address)
        if not self._first_round:
            self.started = True


"""The registration DB: which node (producer) has which topic and channel, as nsqlookupd keeps it.

Theory of operation
-------------------
The DB maps a ``Registration`` -- ``(category, key, subkey)``: ``("client", "", "")`` for every
identified connection, ``("topic", t, "")``, ``("channel", t, c)`` -- to the producers
registered under it, by producer id. A producer id is the connection's remote ``ip:port``, so
each TCP connection is a distinct producer. Each registration holds its own ``Producer`` record
(the tombstone lives there, so a tombstone is per topic and connection) and a connection's
records share one ``PeerInfo`` (the liveness lives there, so it is per connection).

The rules that users see, all nsqlookupd's (``nsqlookupd-reference.md`` §4):

- keys are created by REGISTER and by the HTTP create endpoints; they are removed only by the
  HTTP delete endpoints and by an UNREGISTER that leaves an ``#ephemeral`` key without
  producers: a key outlives its producers (a disconnect keeps every key);
- ``last_update`` is set by IDENTIFY and PING only; a producer is *inactive* when
  ``now - last_update > inactive_timeout`` (strictly), and then hidden from ``/lookup`` and
  ``/nodes`` but not removed: its next PING brings it back;
- a tombstone hides one producer of one topic from ``/lookup`` while
  ``now - tombstoned_at < lifetime``; a re-REGISTER does not clear it, UNREGISTER removes the
  record with it.

Every method is a plain ``def`` that never awaits (atomic under trio: no locks), and time is the
``now`` passed in (``trio.current_time()``), so the tests run on trio's virtual clock.

Complexity: registering and unregistering are O(1) dict operations; a disconnect is O(k) for
the k registrations of that producer (an index by producer id, where nsqlookupd scans every
key); ``find_registrations`` with a wildcard is O(keys of that category), as is listing topics.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator

import attrs

from lmqd.names import is_ephemeral

__all__ = [
    "CLIENT",
    "WILDCARD",
    "PeerInfo",
    "Producer",
    "Registration",
    "RegistrationDB",
    "active",
]

log = logging.getLogger("lmqd.lookupd.db")

WILDCARD = "*"
"""Matches any key or subkey in ``find_registrations`` (so ``/lookup?topic=*`` spans all
topics, as in nsqlookupd)."""


@attrs.frozen
class Registration:
    """A key of the DB: ``category`` is ``client``, ``topic`` or ``channel``."""

    category: str
    key: str
    subkey: str

    def matches(self, category: str, key: str, subkey: str) -> bool:
        """True if this key matches the pattern (``*`` in ``key``/``subkey`` matches any)."""
        return (
            self.category == category
            and (key == WILDCARD or self.key == key)
            and (subkey == WILDCARD or self.subkey == subkey)
        )


CLIENT = Registration("client", "", "")
"""The key every identified connection is registered under."""


@attrs.define(eq=False)
class PeerInfo:
    """One identified connection: what its IDENTIFY said, and when it was last heard of."""

    id: str
    """The producer id: the connection's remote address (``ip:port``, ``[ipv6]:port``)."""
    remote_address: str
    hostname: str
    broadcast_address: str
    tcp_port: int
    http_port: int
    version: str
    last_update: float
    """``trio.current_time()`` of the last IDENTIFY or PING."""

    def is_active(self, now: float, inactive_timeout: float) -> bool:
        """Heard from within ``inactive_timeout`` seconds (nsqlookupd: not ``>``)."""
        return not now - self.last_update > inactive_timeout


@attrs.define(eq=False)
class Producer:
    """A connection's record under one registration."""

    peer: PeerInfo
    tombstoned: bool = False
    tombstoned_at: float | None = None
    """``trio.current_time()`` of the tombstone; None if it never had one."""

    def tombstone(self, now: float) -> None:
        """Mark the record tombstoned from ``now``."""
        self.tombstoned = True
        self.tombstoned_at = now

    def is_tombstoned(self, now: float, lifetime: float) -> bool:
        """Tombstoned less than ``lifetime`` seconds ago."""
        return (
            self.tombstoned
            and self.tombstoned_at is not None
            and now - self.tombstoned_at < lifetime
        )


def active(
    producers: Iterable[Producer], now: float, inactive_timeout: float, tombstone_lifetime: float
) -> list[Producer]:
    """nsqlookupd's ``FilterByActive``: the producers heard from within ``inactive_timeout``
    and not tombstoned within ``tombstone_lifetime`` (0 ignores tombstones)."""
    return [
        p
        for p in producers
        if p.peer.is_active(now, inactive_timeout)
        and not p.is_tombstoned(now, tombstone_lifetime)
    ]


class RegistrationDB:
    """The registrations and their producers; see the module docstring."""

    def __init__(self) -> None:
        self._producers: dict[Registration, dict[str, Producer]] = {}
        # Indexes: registrations by category (insertion-ordered sets), and by producer id.
        self._by_category: dict[str, dict[Registration, None]] = {}
        self._by_producer: dict[str, dict[Registration, None]] = {}

    def __len__(self) -> int:
        return len(self._producers)

    def __contains__(self, registration: Registration) -> bool:
        return registration in self._producers

    def items(self) -> Iterator[tuple[Registration, list[Producer]]]:
        """Every registration with its producers, in the order the keys were created."""
        for registration, producers in self._producers.items():
            yield registration, list(producers.values())

    # -- nsqlookupd's RegistrationDB operations ----------------------------------------------

    def add_registration(self, registration: Registration) -> bool:
        """Create the key if it is new; True if it was."""
        if registration in self._producers:
            return False
        self._producers[registration] = {}
        self._by_category.setdefault(registration.category, {})[registration] = None
        return True

    def add_producer(self, registration: Registration, producer: Producer) -> bool:
        """Add ``producer`` under ``registration`` (creating the key); False if that id already
        has a record there (the old record, and its tombstone, are kept)."""
        self.add_registration(registration)
        producers = self._producers[registration]
        peer_id = producer.peer.id
        if peer_id in producers:
            return False
        producers[peer_id] = producer
        self._by_producer.setdefault(peer_id, {})[registration] = None
        return True

    def remove_producer(self, registration: Registration, peer_id: str) -> tuple[bool, int]:
        """Remove ``peer_id``'s record under ``registration``; (whether there was one, how many
        producers are left). The key stays, even when empty."""
        producers = self._producers.get(registration)
        if producers is None:
            return False, 0
        removed = producers.pop(peer_id, None) is not None
        if removed:
            self._forget(peer_id, registration)
        return removed, len(producers)

    def remove_registration(self, registration: Registration) -> None:
        """Delete the key and every producer record under it."""
        producers = self._producers.pop(registration, None)
        if producers is None:
            return
        for peer_id in producers:
            self._forget(peer_id, registration)
        category = self._by_category[registration.category]
        del category[registration]
        if not category:
            del self._by_category[registration.category]

    def _forget(self, peer_id: str, registration: Registration) -> None:
        keys = self._by_producer[peer_id]
        del keys[registration]
        if not keys:
            del self._by_producer[peer_id]

    def find_registrations(self, category: str, key: str, subkey: str) -> list[Registration]:
        """The keys matching the pattern (``*`` as ``key`` or ``subkey`` matches any)."""
        if key != WILDCARD and subkey != WILDCARD:
            registration = Registration(category, key, subkey)
            return [registration] if registration in self._producers else []
        return [
            r for r in self._by_category.get(category, ()) if r.matches(category, key, subkey)
        ]

    def find_producers(self, category: str, key: str, subkey: str) -> list[Producer]:
        """The records under the keys matching the pattern, one per producer id."""
        if key != WILDCARD and subkey != WILDCARD:
            return list(self._producers.get(Registration(category, key, subkey), {}).values())
        found: dict[str, Producer] = {}
        for registration in self.find_registrations(category, key, subkey):
            for peer_id, producer in self._producers[registration].items():
                found.setdefault(peer_id, producer)
        return list(found.values())

    def lookup_registrations(self, peer_id: str) -> list[Registration]:
        """Every key ``peer_id`` has a record under (``CLIENT`` included)."""
        return list(self._by_producer.get(peer_id, ()))

    def producer(self, registration: Registration, peer_id: str) -> Producer | None:
        """``peer_id``'s record under ``registration``, if any."""
        return self._producers.get(registration, {}).get(peer_id)

    # -- what the V1 commands do --------------------------------------------------------------

    def identify(self, peer: PeerInfo) -> None:
        """IDENTIFY: register the connection as a client (its ``last_update`` is set by the
        caller when it builds ``peer``)."""
        if self.add_producer(CLIENT, Producer(peer)):
            log.info("DB: client(%s) REGISTER category:client key: subkey:", peer.id)

    def register(self, peer: PeerInfo, topic: str, channel: str | None) -> None:
        """REGISTER: the topic key, and the channel key too when a channel is given."""
        keys = [Registration("channel", topic, channel)] if channel else []
        keys.append(Registration("topic", topic, ""))
        for registration in keys:
            if self.add_producer(registration, Producer(peer)):
                log.info(
                    "DB: client(%s) REGISTER category:%s key:%s subkey:%s",
                    peer.id, registration.category, registration.key, registration.subkey,
                )  # fmt: skip

    def unregister(self, peer: PeerInfo, topic: str, channel: str | None) -> None:
        """UNREGISTER: the channel key's record; or, without a channel, the records under every
        channel of the topic and under the topic. An ``#ephemeral`` key left without producers
        is deleted (a topic's channel keys are kept even then)."""
        if channel:
            registration = Registration("channel", topic, channel)
            self._unregister(peer, registration, ephemeral=is_ephemeral(channel))
            return
        for registration in self.find_registrations("channel", topic, WILDCARD):
            removed, _ = self.remove_producer(registration, peer.id)
            if removed:
                # A node deletes a topic's channels before the topic, so this is unusual.
                log.warning(
                    "client(%s) unexpected UNREGISTER category:%s key:%s subkey:%s",
                    peer.id, registration.category, registration.key, registration.subkey,
                )  # fmt: skip
        self._unregister(peer, Registration("topic", topic, ""), ephemeral=is_ephemeral(topic))

    def _unregister(self, peer: PeerInfo, registration: Registration, *, ephemeral: bool) -> None:
        removed, left = self.remove_producer(registration, peer.id)
        if removed:
            log.info(
                "DB: client(%s) UNREGISTER category:%s key:%s subkey:%s",
                peer.id, registration.category, registration.key, registration.subkey,
            )  # fmt: skip
        if left == 0 and ephemeral:
            self.remove_registration(registration)

    def disconnect(self, peer_id: str) -> None:
        """The connection ended: remove its records everywhere; every key stays."""
        for registration in self.lookup_registrations(peer_id):
            removed, _ = self.remove_producer(registration, peer_id)
            if removed:
                log.info(
                    "DB: client(%s) UNREGISTER category:%s key:%s subkey:%s",
                    peer_id, registration.category, registration.key, registration.subkey,
                )  # fmt: skip

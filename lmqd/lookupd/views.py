"""What each endpoint of nsqlookupd's HTTP API answers, as plain functions of the DB and ``now``.

The HTTP layer (``http.py``) parses the query string and routes; everything nsqlookupd's
handlers decide (``nsqlookupd/http.go``) is here: which parameter is checked in which order and
with which error, which keys a request creates or deletes, and the JSON shapes, with their
fields in nsqlookupd's order (Go writes struct fields in declaration order and sorts map keys).
A function returns the data to send as JSON, or None for an empty 200; it raises ``ApiError``
for an error answer.

Lists follow the DB's order (keys in creation order; nsqlookupd's is Go's random map order)
and are ``[]`` when empty, never ``null``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import attrs

from lmqd.lookupd.db import (
    CLIENT,
    WILDCARD,
    PeerInfo,
    Producer,
    Registration,
    RegistrationDB,
    active,
)
from lmqd.names import valid_name

__all__ = ["GO_ZERO_TIME_NS", "ApiError", "Settings", "Views"]

log = logging.getLogger("lmqd.lookupd.http")

GO_ZERO_TIME_NS = -6795364578871345152
"""``time.Time{}.UnixNano()``: what nsqlookupd's ``/debug`` shows for "never tombstoned"."""

Params = Callable[[str], str | None]
"""A query lookup: the first value of a parameter, None if absent (nsqlookupd's ReqParams)."""


class ApiError(Exception):
    """An error answer: the HTTP ``status`` and nsqlookupd's ``message`` (``TOPIC_NOT_FOUND``)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status} {message}")
        self.status = status
        self.message = message


@attrs.frozen(kw_only=True)
class Settings:
    """The options the answers depend on."""

    inactive_producer_timeout: float
    """Seconds without IDENTIFY/PING after which a producer is hidden (nsqlookupd: 300)."""
    tombstone_lifetime: float
    """Seconds a tombstone hides a producer of a topic (nsqlookupd: 45)."""
    version: str
    """What ``/info`` reports."""


def _peer(peer: PeerInfo) -> dict[str, Any]:
    return {
        "remote_address": peer.remote_address,
        "hostname": peer.hostname,
        "broadcast_address": peer.broadcast_address,
        "tcp_port": peer.tcp_port,
        "http_port": peer.http_port,
        "version": peer.version,
    }


def _require(params: Params, name: str, missing: str) -> str:
    value = params(name)
    if value is None:
        raise ApiError(400, missing)
    return value


def _topic_and_channel(params: Params) -> tuple[str, str]:
    """nsqd's ``GetTopicChannelArgs``: both present and valid, checked in this order."""
    topic = _require(params, "topic", "MISSING_ARG_TOPIC")
    if not valid_name(topic):
        raise ApiError(400, "INVALID_ARG_TOPIC")
    channel = _require(params, "channel", "MISSING_ARG_CHANNEL")
    if not valid_name(channel):
        raise ApiError(400, "INVALID_ARG_CHANNEL")
    return topic, channel


class Views:
    """nsqlookupd's handlers over one DB."""

    def __init__(self, db: RegistrationDB, settings: Settings) -> None:
        self.db = db
        self.settings = settings

    def _active(self, producers: list[Producer], now: float, tombstones: bool) -> list[Producer]:
        lifetime = self.settings.tombstone_lifetime if tombstones else 0.0
        return active(producers, now, self.settings.inactive_producer_timeout, lifetime)

    # -- GET ----------------------------------------------------------------------------------

    def info(self) -> dict[str, Any]:
        return {"version": self.settings.version}

    def lookup(self, params: Params, now: float) -> dict[str, Any]:
        """A topic's channels and its active, untombstoned producers."""
        topic = _require(params, "topic", "MISSING_ARG_TOPIC")
        if not self.db.find_registrations("topic", topic, ""):
            raise ApiError(404, "TOPIC_NOT_FOUND")
        channels = [r.subkey for r in self.db.find_registrations("channel", topic, WILDCARD)]
        producers = self._active(self.db.find_producers("topic", topic, ""), now, True)
        return {"channels": channels, "producers": [_peer(p.peer) for p in producers]}

    def topics(self) -> dict[str, Any]:
        return {"topics": [r.key for r in self.db.find_registrations("topic", WILDCARD, "")]}

    def channels(self, params: Params) -> dict[str, Any]:
        topic = _require(params, "topic", "MISSING_ARG_TOPIC")
        registrations = self.db.find_registrations("channel", topic, WILDCARD)
        return {"channels": [r.subkey for r in registrations]}

    def nodes(self, now: float) -> dict[str, Any]:
        """Every active identified connection with its topics; tombstones don't hide a node,
        they show as ``true`` in the slot of ``tombstones`` matching the topic."""
        lifetime = self.settings.tombstone_lifetime
        nodes = []
        clients = self.db.find_producers(CLIENT.category, CLIENT.key, CLIENT.subkey)
        for client in self._active(clients, now, False):
            peer = client.peer
            topics = [
                r.key for r in self.db.lookup_registrations(peer.id) if r.category == "topic"
            ]
            tombstones = []
            for topic in topics:
                record = self.db.producer(Registration("topic", topic, ""), peer.id)
                tombstones.append(record is not None and record.is_tombstoned(now, lifetime))
            nodes.append({**_peer(peer), "tombstones": tombstones, "topics": topics})
        return {"producers": nodes}

    def debug(self, wall_offset: float) -> dict[str, Any]:
        """Every key with producers and the producers' raw records (keys sorted, as Go's map).

        ``wall_offset`` converts DB times (``trio.current_time()``) to Unix time, for the
        nanosecond timestamps nsqlookupd shows.
        """
        data: dict[str, list[dict[str, Any]]] = {}
        for registration, producers in self.db.items():
            if not producers:
                continue
            key = f"{registration.category}:{registration.key}:{registration.subkey}"
            entries = data.setdefault(key, [])
            for producer in producers:
                peer = producer.peer
                at = producer.tombstoned_at
                entries.append(
                    {
                        "broadcast_address": peer.broadcast_address,
                        "hostname": peer.hostname,
                        "http_port": peer.http_port,
                        "id": peer.id,
                        "last_update": round((peer.last_update + wall_offset) * 1e9),
                        "tcp_port": peer.tcp_port,
                        "tombstoned": producer.tombstoned,
                        "tombstoned_at": (
                            GO_ZERO_TIME_NS if at is None else round((at + wall_offset) * 1e9)
                        ),
                        "version": peer.version,
                    }
                )
        return dict(sorted(data.items()))

    # -- POST ---------------------------------------------------------------------------------

    def create_topic(self, params: Params) -> None:
        topic = _require(params, "topic", "MISSING_ARG_TOPIC")
        if not valid_name(topic):
            raise ApiError(400, "INVALID_ARG_TOPIC")
        log.info("DB: adding topic(%s)", topic)
        self.db.add_registration(Registration("topic", topic, ""))

    def delete_topic(self, params: Params) -> None:
        """Delete the topic's channel keys and the topic key, with their producers (any name,
        valid or not, existing or not, answers 200)."""
        topic = _require(params, "topic", "MISSING_ARG_TOPIC")
        for registration in self.db.find_registrations("channel", topic, WILDCARD):
            log.info("DB: removing channel(%s) from topic(%s)", registration.subkey, topic)
            self.db.remove_registration(registration)
        for registration in self.db.find_registrations("topic", topic, ""):
            log.info("DB: removing topic(%s)", topic)
            self.db.remove_registration(registration)

    def create_channel(self, params: Params) -> None:
        topic, channel = _topic_and_channel(params)
        log.info("DB: adding channel(%s) in topic(%s)", channel, topic)
        self.db.add_registration(Registration("channel", topic, channel))
        log.info("DB: adding topic(%s)", topic)
        self.db.add_registration(Registration("topic", topic, ""))

    def delete_channel(self, params: Params) -> None:
        topic, channel = _topic_and_channel(params)
        registrations = self.db.find_registrations("channel", topic, channel)
        if not registrations:
            raise ApiError(404, "CHANNEL_NOT_FOUND")
        log.info("DB: removing channel(%s) from topic(%s)", channel, topic)
        for registration in registrations:
            self.db.remove_registration(registration)

    def tombstone_topic(self, params: Params, now: float) -> None:
        """Tombstone the producers of the topic whose ``<broadcast_address>:<http_port>`` is
        ``node`` (200 even when none matches; the topic name is not validated)."""
        topic = _require(params, "topic", "MISSING_ARG_TOPIC")
        node = _require(params, "node", "MISSING_ARG_NODE")
        log.info("DB: setting tombstone for producer@%s of topic(%s)", node, topic)
        for producer in self.db.find_producers("topic", topic, ""):
            peer = producer.peer
            # Go's "%s:%d": an IPv6 broadcast address gets no brackets.
            if f"{peer.broadcast_address}:{peer.http_port}" == node:
                producer.tombstone(now)

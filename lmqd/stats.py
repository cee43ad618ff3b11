"""Frozen statistics snapshots with nsqd's field names (``/stats?format=json``, nsq-reference §2.4).

Topics, channels and clients build these on demand (``statistics()``); the HTTP API, the CLI and
the Prometheus collector only serialise them, so every consumer sees one consistent picture and
none of them reaches into live queue state. ``to_dict()`` gives nsqd's JSON object (key order
and ``omitempty`` rules included).

End-to-end processing latency percentiles are computed by ``lmqd.engine.e2e`` and reported here as
``E2eLatency``.
"""

from __future__ import annotations

from typing import Any

import attrs


@attrs.frozen(kw_only=True)
class PubCount:
    """Messages one TCP producer published to one topic."""

    topic: str
    count: int

    def to_dict(self) -> dict[str, Any]:
        return {"topic": self.topic, "count": self.count}


@attrs.frozen(kw_only=True)
class Percentile:
    """One configured quantile and its value in nanoseconds."""

    quantile: float
    value: float

    def to_dict(self) -> dict[str, Any]:
        return {"quantile": self.quantile, "value": self.value}


@attrs.frozen(kw_only=True)
class E2eLatency:
    """nsqd's ``e2e_processing_latency`` object: ``percentiles`` is None when not configured."""

    count: int = 0
    percentiles: tuple[Percentile, ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "percentiles": (
                None if self.percentiles is None else [p.to_dict() for p in self.percentiles]
            ),
        }


NO_E2E_LATENCY = E2eLatency()
"""What nsqd reports when no percentiles are configured."""


@attrs.frozen(kw_only=True)
class StorageDamage:
    """Damage a topic's log or a channel's stores found in their files (lmq's, not nsqd's):
    counted since the daemon started, start-up recovery included (``lmqd.storage.repair``).

    In ``/stats`` it is the extra key ``storage_damage`` of a topic (its log) and of a channel
    (its own and deferred stores, summed); ``/metrics`` has one counter per field.
    """

    regions: int = 0
    """Corrupt regions set aside (``<segment>.bad-<offset>``), empty middle segments and
    files found shorter than written included."""
    bytes: int = 0
    """Bytes of those regions."""
    lost_messages: int = 0
    """Messages lost with them: a lower bound (the record prefixes still plausible in each
    region; exact for a channel store's region found while reading)."""
    missing_segments: int = 0
    """Segment files the positions named that were not there."""
    rebuilt_positions: int = 0
    """Positions files, log state files and cursors that disagreed with the segments (or were
    missing or damaged) and were rebuilt from them."""

    def __add__(self, other: StorageDamage) -> StorageDamage:
        return StorageDamage(
            regions=self.regions + other.regions,
            bytes=self.bytes + other.bytes,
            lost_messages=self.lost_messages + other.lost_messages,
            missing_segments=self.missing_segments + other.missing_segments,
            rebuilt_positions=self.rebuilt_positions + other.rebuilt_positions,
        )

    def __bool__(self) -> bool:
        return self != NO_DAMAGE

    def to_dict(self) -> dict[str, Any]:
        return {
            "regions": self.regions,
            "bytes": self.bytes,
            "lost_messages": self.lost_messages,
            "missing_segments": self.missing_segments,
            "rebuilt_positions": self.rebuilt_positions,
        }


NO_DAMAGE = StorageDamage()


@attrs.frozen(kw_only=True)
class ClientStats:
    """nsqd's ``ClientV2Stats`` of one TCP connection."""

    client_id: str
    hostname: str
    version: str
    remote_address: str
    state: int
    ready_count: int
    in_flight_count: int
    message_count: int
    finish_count: int
    requeue_count: int
    connect_ts: int
    sample_rate: int
    deflate: bool
    snappy: bool
    user_agent: str
    tls: bool = False
    tls_cipher_suite: str = ""
    tls_version: str = ""
    tls_negotiated_protocol: str = ""
    tls_negotiated_protocol_is_mutual: bool = False
    pub_counts: tuple[PubCount, ...] = ()
    authed: bool | None = None
    """None when auth is not in use (nsqd omits the key: ``omitempty``)."""
    auth_identity: str | None = None
    auth_identity_url: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """nsqd's JSON object, with its key order and omitempty keys left out when empty."""
        d: dict[str, Any] = {
            "client_id": self.client_id,
            "hostname": self.hostname,
            "version": self.version,
            "remote_address": self.remote_address,
            "state": self.state,
            "ready_count": self.ready_count,
            "in_flight_count": self.in_flight_count,
            "message_count": self.message_count,
            "finish_count": self.finish_count,
            "requeue_count": self.requeue_count,
            "connect_ts": self.connect_ts,
            "sample_rate": self.sample_rate,
            "deflate": self.deflate,
            "snappy": self.snappy,
            "user_agent": self.user_agent,
        }
        if self.authed:
            d["authed"] = self.authed
        if self.auth_identity:
            d["auth_identity"] = self.auth_identity
        if self.auth_identity_url:
            d["auth_identity_url"] = self.auth_identity_url
        if self.pub_counts:
            d["pub_counts"] = [p.to_dict() for p in self.pub_counts]
        d["tls"] = self.tls
        d["tls_cipher_suite"] = self.tls_cipher_suite
        d["tls_version"] = self.tls_version
        d["tls_negotiated_protocol"] = self.tls_negotiated_protocol
        d["tls_negotiated_protocol_is_mutual"] = self.tls_negotiated_protocol_is_mutual
        return d


@attrs.frozen(kw_only=True)
class ChannelStats:
    """One channel. ``depth`` is memory + backend; in-flight and deferred are counted apart."""

    channel_name: str
    depth: int
    backend_depth: int
    in_flight_count: int
    deferred_count: int
    message_count: int
    """Messages put into the channel by its topic (deferred ones included; requeues not)."""
    requeue_count: int
    timeout_count: int
    client_count: int
    clients: tuple[ClientStats, ...] | None
    """None when the caller asked for no clients (``client_count`` is still filled in)."""
    paused: bool
    e2e_processing_latency: E2eLatency = NO_E2E_LATENCY
    # lmq's channel policies (lmqd.engine.channel_policy), after nsqd's fields:
    dead_letter_count: int = 0
    """Messages published to the channel's dead-letter topic (expired or out of attempts)."""
    expired_count: int = 0
    """Messages not delivered within the topic's ``ttl_ms`` (dead-lettered or dropped)."""
    max_attempts_dropped_count: int = 0
    """Messages out of attempts dropped for want of a dead-letter topic."""
    storage_damage: StorageDamage = NO_DAMAGE
    """lmq's extra key: damage found in the channel's own and deferred stores."""
    priority_depths: tuple[tuple[int, int], ...] = ()
    """lmq's extra key: of ``depth``, the messages waiting at each priority level (highest
    first; the levels with none left out)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "channel_name": self.channel_name,
            "depth": self.depth,
            "backend_depth": self.backend_depth,
            "in_flight_count": self.in_flight_count,
            "deferred_count": self.deferred_count,
            "message_count": self.message_count,
            "requeue_count": self.requeue_count,
            "timeout_count": self.timeout_count,
            "client_count": self.client_count,
            "clients": None if self.clients is None else [c.to_dict() for c in self.clients],
            "paused": self.paused,
            "e2e_processing_latency": self.e2e_processing_latency.to_dict(),
            "dead_letter_count": self.dead_letter_count,
            "expired_count": self.expired_count,
            "max_attempts_dropped_count": self.max_attempts_dropped_count,
            "storage_damage": self.storage_damage.to_dict(),
            "priority_depths": {str(level): n for level, n in self.priority_depths},
        }


@attrs.frozen(kw_only=True)
class PublishPolicyStats:
    """lmq: what a topic's publish policies did (``lmqd.engine.admission``), in messages."""

    overflow_dropped_count: int = 0
    overflow_refused_count: int = 0
    rate_limited_count: int = 0
    deduplicated_count: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "overflow_dropped_count": self.overflow_dropped_count,
            "overflow_refused_count": self.overflow_refused_count,
            "rate_limited_count": self.rate_limited_count,
            "deduplicated_count": self.deduplicated_count,
        }


@attrs.frozen(kw_only=True)
class TopicStats:
    """One topic and its channels (sorted by name, as nsqd sorts them)."""

    topic_name: str
    channels: tuple[ChannelStats, ...]
    depth: int
    backend_depth: int
    message_count: int
    message_bytes: int
    paused: bool
    e2e_processing_latency: E2eLatency = NO_E2E_LATENCY
    publish_policy: PublishPolicyStats | None = None
    """lmq: None while the topic has no publish policy and its counters are all 0; otherwise
    its four counters follow nsqd's keys in ``to_dict``."""
    storage_damage: StorageDamage = NO_DAMAGE
    """lmq's extra key: damage found in the topic's log."""
    reader_lost_count: int = 0
    """lmq's extra key: offsets readers by offset (``/topic/read``, the Spark source) asked for
    and did not find stored (``TopicStream.reader_lost_count``)."""
    stored_bytes: int = 0
    """lmq's extra key: bytes of the topic's log segment files, as stored (compressed and
    encrypted at rest where they are)."""
    logical_bytes: int = 0
    """lmq's extra key: what those files would take with their batches plain (``stored_bytes``
    over this is the compression ratio; encryption alone makes it a little above 1)."""

    @property
    def compression_ratio(self) -> float:
        """``logical_bytes / stored_bytes`` (1.0 while the log holds nothing)."""
        return self.logical_bytes / self.stored_bytes if self.stored_bytes else 1.0

    # lmq's channel policies: the sums over the topic's channels.
    @property
    def dead_letter_count(self) -> int:
        return sum(c.dead_letter_count for c in self.channels)

    @property
    def expired_count(self) -> int:
        return sum(c.expired_count for c in self.channels)

    @property
    def max_attempts_dropped_count(self) -> int:
        return sum(c.max_attempts_dropped_count for c in self.channels)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "topic_name": self.topic_name,
            "channels": [c.to_dict() for c in self.channels],
            "depth": self.depth,
            "backend_depth": self.backend_depth,
            "message_count": self.message_count,
            "message_bytes": self.message_bytes,
            "paused": self.paused,
            "e2e_processing_latency": self.e2e_processing_latency.to_dict(),
            "dead_letter_count": self.dead_letter_count,
            "expired_count": self.expired_count,
            "max_attempts_dropped_count": self.max_attempts_dropped_count,
            "storage_damage": self.storage_damage.to_dict(),
            "reader_lost_count": self.reader_lost_count,
            "stored_bytes": self.stored_bytes,
            "logical_bytes": self.logical_bytes,
        }
        if self.publish_policy is not None:
            d.update(self.publish_policy.to_dict())
        return d

"""Prometheus metrics for ``GET /metrics``, read from the same snapshots as ``/stats``.

There is no second set of counters: ``LmqCollector`` is a prometheus-client custom collector
whose ``collect()`` runs at scrape time, takes one ``broker.statistics()`` snapshot (and the
producers' snapshots) and turns each field into a sample. So ``/metrics`` and ``/stats`` can
never disagree about what a counter means, and an idle daemon pays nothing between scrapes.

Metric names (all prefixed ``lmqd_``; counters end in ``_total``):

===================================================== ========= ===========================
name                                                  type      labels
===================================================== ========= ===========================
lmqd_info (``version``, ``nsqd_version``)             gauge (1)
lmqd_healthy (1 = OK, 0 = a backend write failed)     gauge
lmqd_write_failures_total (each makes health NOK)     counter
lmqd_start_time_seconds                               gauge
lmqd_topics                                           gauge
lmqd_topic_depth / _backend_depth                     gauge     topic
lmqd_topic_channels / _paused                         gauge     topic
lmqd_topic_messages_total (published)                 counter   topic
lmqd_topic_message_bytes_total                        counter   topic
lmqd_topic_e2e_processing_latency_seconds             gauge     topic, quantile
lmqd_topic_e2e_processing_latency_samples             gauge     topic
lmqd_topic_overflow_dropped_messages_total            counter   topic
lmqd_topic_overflow_refused_messages_total            counter   topic
lmqd_topic_rate_limited_messages_total                counter   topic
lmqd_topic_deduplicated_messages_total                counter   topic
lmqd_topic_reader_lost_messages_total                 counter   topic
lmqd_channel_depth / _backend_depth                   gauge     topic, channel
lmqd_channel_priority_depth (of depth, per level)      gauge     topic, channel, priority
lmqd_channel_in_flight / _deferred / _clients         gauge     topic, channel
lmqd_channel_paused                                   gauge     topic, channel
lmqd_channel_messages_total (put into the channel)    counter   topic, channel
lmqd_channel_requeues_total / _timeouts_total         counter   topic, channel
lmqd_channel_e2e_processing_latency_seconds           gauge     topic, channel, quantile
lmqd_channel_e2e_processing_latency_samples           gauge     topic, channel
lmqd_topic_dead_lettered_total / _expired_total       counter   topic
lmqd_topic_max_attempts_dropped_total                 counter   topic
lmqd_channel_dead_lettered_total / _expired_total     counter   topic, channel
lmqd_channel_max_attempts_dropped_total               counter   topic, channel
lmqd_client_delivered_messages_total                  counter   topic, channel, client
lmqd_client_finished_messages_total                   counter   topic, channel, client
lmqd_client_requeued_messages_total                   counter   topic, channel, client
lmqd_client_in_flight / lmqd_client_ready             gauge     topic, channel, client
lmqd_producer_published_messages_total                counter   client, topic
lmqd_sync_rounds_total (syncer rounds run)            counter
lmqd_sync_failures_total (failed queue syncs)         counter
lmqd_fsync_duration_seconds (per round)               histogram
lmqd_queue_disk_bytes                                 gauge     topic, channel
lmqd_queue_logical_bytes                              gauge     topic, channel
lmqd_storage_damaged_regions_total                    counter   topic, channel
lmqd_storage_damaged_bytes_total                      counter   topic, channel
lmqd_storage_lost_messages_total (a lower bound)      counter   topic, channel
lmqd_storage_missing_segments_total                   counter   topic, channel
lmqd_storage_rebuilt_positions_total                  counter   topic, channel
===================================================== ========= ===========================

The four topic policy counters (``lmqd.engine.admission``: dropped by ``overflow=drop_oldest``,
refused by ``overflow=reject``, refused by the publish rate, left out by the dedup window) have a
series only for topics with a publish policy or a count above 0 (``TopicStats.publish_policy``).

The ``lmqd_client_*`` and ``lmqd_producer_*`` families are left out (not even empty families)
with ``--metrics-clients=false``: one series per connection is what a daemon with many
short-lived clients can least afford to have scraped.
``client`` labels are ``client_id`` (IDENTIFY's, not unique) and ``remote_address`` (unique per
live connection). The e2e latency is nsqd's rolling-window percentile (``lmqd.engine.e2e``) in
seconds; ``_samples`` is the number of FINs in that window (it falls as the window rolls, so it
is a gauge).
The storage metrics come from the syncer's snapshot (``Syncer.statistics()``) and the disk
queues' running byte counts: ``lmqd_fsync_duration_seconds`` times each syncer round's
worker-thread call (the metadata write, if any, and one fsync per file and directory; its count
equals ``lmqd_sync_rounds_total``). ``lmqd_queue_disk_bytes`` has one series per topic log and
per channel store on disk: ``channel=""`` for a topic's log (every channel's messages, stored
once), and a channel's series sums its own store and its ``#deferred`` store once open
(``Channel.disk_queues``; a channel that never needed either has no series). Ephemeral topics
and channels (no files) have no series. ``lmqd_queue_logical_bytes`` has the same series: what
those files would take with every batch plain, so ``logical / disk`` is the compression ratio at
rest (``lmqd.storage.atrest``; equal without compression, a little smaller with encryption
alone).

The channel-policy counters (``lmqd.engine.channel_policy``): ``dead_lettered`` counts messages
published to the channel's dead-letter topic (expired or out of attempts), ``expired`` those not
delivered within the topic's ``ttl_ms`` (dead-lettered or dropped), ``max_attempts_dropped``
those out of attempts with no dead-letter topic to go to; a topic's series are the sums over its
channels.
``lmqd_topic_reader_lost_messages_total`` is ``reader_lost_count`` of ``/stats``: offsets a
reader by offset asked for (``/topic/read``, ``/topic/offsets?from=``: the Spark source) that
the topic no longer stored, deleted by retention or emptying, never written or lost to damage;
each request that finds them gone counts them (a query failing on it and restarted counts again).
The ``lmqd_storage_*`` counters are the ``storage_damage`` of ``/stats`` (``lmqd.stats.
StorageDamage``): ``channel=""`` is the topic's log, a channel's series its own and deferred
stores; every topic and channel has them, at 0 until damage is found. They count since the
daemon started, what start-up recovery found included (a restart counts again what is still on
disk), so ``rate()`` and ``increase()`` over them behave as for any counter reset by a restart.

Replication's families (``lmqd_mirror_*`` on a mirror, ``lmqd_primary_mirror_*`` on a primary
with mirrors) come from ``lmqd.mirror.metrics``, registered beside this collector.

The registry also carries prometheus-client's standard ``process_*``, ``python_gc_*`` and
``python_info`` collectors.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from lmqd import NSQD_COMPAT_VERSION, __version__
from lmqd.engine.syncer import FSYNC_BUCKETS, SyncerStats
from lmqd.stats import ChannelStats, ClientStats, E2eLatency, TopicStats

if TYPE_CHECKING:
    from lmqd.broker import Broker
    from lmqd.mirror.service import Replication

__all__ = ["LmqCollector", "make_registry"]

_TOPIC = ["topic"]
_CHANNEL = ["topic", "channel"]
_CLIENT = ["topic", "channel", "client_id", "remote_address"]


def _gauge(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=labels)


def _counter(name: str, doc: str, labels: list[str]) -> CounterMetricFamily:
    # prometheus-client appends "_total" to a counter family's samples.
    return CounterMetricFamily(name, doc, labels=labels)


class LmqCollector(Collector):
    """Builds every lmqd metric from one statistics snapshot per scrape."""

    def __init__(self, broker: Broker) -> None:
        self._broker = broker

    def describe(self) -> Iterable[Metric]:
        # Nothing to describe up front: registering must not take a snapshot.
        return []

    def collect(self) -> Iterator[Metric]:
        broker = self._broker
        # Read at every scrape, so a run-time change of the option applies at the next one.
        clients = broker.options.metrics_clients
        topics = broker.statistics(include_clients=clients)
        yield from self._daemon_metrics(broker, topics)
        yield from self._topic_metrics(topics)
        yield from self._channel_metrics(topics)
        yield from _policy_metrics(topics)
        if clients:
            yield from self._client_metrics(topics, broker.producers())
        yield from _sync_metrics(broker.syncer.statistics())
        yield from _disk_bytes(broker)
        yield from _damage_metrics(topics)

    def _daemon_metrics(self, broker: Broker, topics: list[TopicStats]) -> Iterator[Metric]:
        info = GaugeMetricFamily(
            "lmqd_info", "lmqd version and the nsqd version it is compatible with",
            labels=["version", "nsqd_version"],
        )
        info.add_metric([__version__, NSQD_COMPAT_VERSION], 1)
        yield info
        yield GaugeMetricFamily(
            "lmqd_healthy", "1 when healthy, 0 while the last backend write failed",
            value=1 if broker.is_healthy else 0,
        )
        yield CounterMetricFamily(
            "lmqd_write_failures", "failed disk writes and syncs reported (each turns /ping NOK)",
            value=broker.write_failures,
        )
        yield GaugeMetricFamily(
            "lmqd_start_time_seconds", "daemon start time, Unix seconds", value=broker.start_time
        )
        yield GaugeMetricFamily("lmqd_topics", "number of topics", value=len(topics))

    def _topic_metrics(self, topics: list[TopicStats]) -> Iterator[Metric]:
        depth = _gauge("lmqd_topic_depth", "messages queued at the topic (memory + backend)",
                       _TOPIC)
        backend = _gauge("lmqd_topic_backend_depth", "messages in the topic's backend queue",
                         _TOPIC)
        channels = _gauge("lmqd_topic_channels", "channels of the topic", _TOPIC)
        paused = _gauge("lmqd_topic_paused", "1 when the topic is paused", _TOPIC)
        messages = _counter("lmqd_topic_messages", "messages published to the topic", _TOPIC)
        nbytes = _counter("lmqd_topic_message_bytes", "bytes published to the topic", _TOPIC)
        latency, samples = _latency_families("topic", _TOPIC)
        dropped = _counter("lmqd_topic_overflow_dropped_messages",
                           "messages dropped to keep the topic's channels within max_depth", _TOPIC)
        refused = _counter("lmqd_topic_overflow_refused_messages",
                           "messages refused because the topic was at max_depth", _TOPIC)
        limited = _counter("lmqd_topic_rate_limited_messages",
                           "messages refused by the topic's publish rate", _TOPIC)
        deduplicated = _counter("lmqd_topic_deduplicated_messages",
                                "messages answered OK but not enqueued: a body seen within the "
                                "topic's dedup window", _TOPIC)
        lost = _counter("lmqd_topic_reader_lost_messages",
                        "offsets readers by offset (the Spark source) asked for that were no "
                        "longer stored", _TOPIC)
        for t in topics:
            key = [t.topic_name]
            policy = t.publish_policy
            if policy is not None:
                dropped.add_metric(key, policy.overflow_dropped_count)
                refused.add_metric(key, policy.overflow_refused_count)
                limited.add_metric(key, policy.rate_limited_count)
                deduplicated.add_metric(key, policy.deduplicated_count)
            depth.add_metric(key, t.depth)
            backend.add_metric(key, t.backend_depth)
            channels.add_metric(key, len(t.channels))
            paused.add_metric(key, 1 if t.paused else 0)
            messages.add_metric(key, t.message_count)
            nbytes.add_metric(key, t.message_bytes)
            lost.add_metric(key, t.reader_lost_count)
            _add_latency(latency, samples, key, t.e2e_processing_latency)
        yield from (depth, backend, channels, paused, messages, nbytes, latency, samples,
                    dropped, refused, limited, deduplicated, lost)

    def _channel_metrics(self, topics: list[TopicStats]) -> Iterator[Metric]:
        depth = _gauge("lmqd_channel_depth", "ready messages (memory + backend)", _CHANNEL)
        backend = _gauge("lmqd_channel_backend_depth", "messages in the channel's backend queue",
                         _CHANNEL)
        in_flight = _gauge("lmqd_channel_in_flight", "messages in flight", _CHANNEL)
        deferred = _gauge("lmqd_channel_deferred", "deferred messages", _CHANNEL)
        clients = _gauge("lmqd_channel_clients", "subscribed clients", _CHANNEL)
        paused = _gauge("lmqd_channel_paused", "1 when the channel is paused", _CHANNEL)
        messages = _counter("lmqd_channel_messages", "messages put into the channel", _CHANNEL)
        requeues = _counter("lmqd_channel_requeues", "messages requeued", _CHANNEL)
        timeouts = _counter("lmqd_channel_timeouts", "in-flight messages timed out", _CHANNEL)
        ranked = _gauge("lmqd_channel_priority_depth",
                        "ready messages waiting at a priority level (lmq's extension)",
                        [*_CHANNEL, "priority"])
        latency, samples = _latency_families("channel", _CHANNEL)
        for t in topics:
            for c in t.channels:
                key = [t.topic_name, c.channel_name]
                depth.add_metric(key, c.depth)
                for level, n in c.priority_depths:
                    ranked.add_metric([*key, str(level)], n)
                backend.add_metric(key, c.backend_depth)
                in_flight.add_metric(key, c.in_flight_count)
                deferred.add_metric(key, c.deferred_count)
                clients.add_metric(key, c.client_count)
                paused.add_metric(key, 1 if c.paused else 0)
                messages.add_metric(key, c.message_count)
                requeues.add_metric(key, c.requeue_count)
                timeouts.add_metric(key, c.timeout_count)
                _add_latency(latency, samples, key, c.e2e_processing_latency)
        yield from (depth, backend, ranked, in_flight, deferred, clients, paused, messages,
                    requeues, timeouts, latency, samples)

    def _client_metrics(
        self, topics: list[TopicStats], producers: list[ClientStats]
    ) -> Iterator[Metric]:
        delivered = _counter("lmqd_client_delivered_messages",
                             "messages delivered to the client", _CLIENT)
        finished = _counter("lmqd_client_finished_messages", "messages the client finished",
                            _CLIENT)
        requeued = _counter("lmqd_client_requeued_messages", "messages the client requeued",
                            _CLIENT)
        in_flight = _gauge("lmqd_client_in_flight", "messages in flight to the client", _CLIENT)
        ready = _gauge("lmqd_client_ready", "the client's RDY count", _CLIENT)
        for t in topics:
            for c in t.channels:
                for client in _clients(c):
                    key = [t.topic_name, c.channel_name, client.client_id,
                           client.remote_address]
                    delivered.add_metric(key, client.message_count)
                    finished.add_metric(key, client.finish_count)
                    requeued.add_metric(key, client.requeue_count)
                    in_flight.add_metric(key, client.in_flight_count)
                    ready.add_metric(key, client.ready_count)
        published = _counter("lmqd_producer_published_messages",
                             "messages a TCP producer published to a topic",
                             ["client_id", "remote_address", "topic"])
        for p in producers:
            for count in p.pub_counts:
                published.add_metric([p.client_id, p.remote_address, count.topic], count.count)
        yield from (delivered, finished, requeued, in_flight, ready, published)


def _policy_metrics(topics: list[TopicStats]) -> Iterator[Metric]:
    for level, labels in (("topic", _TOPIC), ("channel", _CHANNEL)):
        dead = _counter(f"lmqd_{level}_dead_lettered",
                        "messages published to the dead-letter topic", labels)
        expired = _counter(f"lmqd_{level}_expired",
                           "messages not delivered within the topic's ttl_ms", labels)
        dropped = _counter(f"lmqd_{level}_max_attempts_dropped",
                           "messages out of attempts dropped (no dead-letter topic)", labels)
        for t in topics:
            rows: Iterable[tuple[list[str], TopicStats | ChannelStats]] = (
                [([t.topic_name], t)]
                if level == "topic"
                else [([t.topic_name, c.channel_name], c) for c in t.channels]
            )
            for key, stats in rows:
                dead.add_metric(key, stats.dead_letter_count)
                expired.add_metric(key, stats.expired_count)
                dropped.add_metric(key, stats.max_attempts_dropped_count)
        yield from (dead, expired, dropped)


def _sync_metrics(stats: SyncerStats) -> Iterator[Metric]:
    yield CounterMetricFamily(
        "lmqd_sync_rounds", "syncer rounds run (each: one fsync per file and per directory)",
        value=stats.rounds,
    )
    yield CounterMetricFamily(
        "lmqd_sync_failures", "queue syncs that failed (or could not be prepared)",
        value=stats.failed_syncs,
    )
    buckets: list[tuple[str, float]] = []
    cumulative = 0
    for bound, count in zip((*FSYNC_BUCKETS, float("inf")), stats.fsync_bucket_counts,
                            strict=True):
        cumulative += count
        buckets.append(("+Inf" if bound == float("inf") else repr(bound), cumulative))
    yield HistogramMetricFamily(
        "lmqd_fsync_duration_seconds",
        "duration of each syncer round's worker-thread call (metadata write and fsyncs)",
        buckets=buckets,
        sum_value=stats.fsync_seconds_total,
    )


def _disk_bytes(broker: Broker) -> Iterator[GaugeMetricFamily]:
    gauge = _gauge("lmqd_queue_disk_bytes",
                   "bytes of segment files (channel \"\": the topic's log; a channel's: its "
                   "own store and its deferred store)", _CHANNEL)
    logical = _gauge("lmqd_queue_logical_bytes",
                     "what those segment files would take with every batch plain (no "
                     "compression or encryption at rest)", _CHANNEL)
    for topic in list(broker.topics.values()):
        if topic.log is not None:
            gauge.add_metric([topic.name, ""], topic.log.bytes_on_disk)
            logical.add_metric([topic.name, ""], topic.log.logical_bytes)
        for channel in list(topic.channels.values()):
            queues = channel.disk_queues
            if queues:
                gauge.add_metric([topic.name, channel.name], sum(q.bytes_on_disk for q in queues))
                logical.add_metric(
                    [topic.name, channel.name], sum(q.logical_bytes for q in queues)
                )
    yield gauge
    yield logical


_DAMAGE_FIELDS = (
    ("regions", "damaged_regions", "corrupt regions set aside (and empty middle segments)"),
    ("bytes", "damaged_bytes", "bytes of the corrupt regions set aside"),
    ("lost_messages", "lost_messages", "messages lost to damage (a lower bound)"),
    ("missing_segments", "missing_segments", "segment files found missing"),
    ("rebuilt_positions", "rebuilt_positions", "positions rebuilt from the segments"),
)


def _damage_metrics(topics: list[TopicStats]) -> Iterator[Metric]:
    families = [
        (field, _counter(f"lmqd_storage_{name}", doc + " (channel \"\": the topic's log)",
                         _CHANNEL))
        for field, name, doc in _DAMAGE_FIELDS
    ]
    for t in topics:
        rows = [([t.topic_name, ""], t.storage_damage)]
        rows += [([t.topic_name, c.channel_name], c.storage_damage) for c in t.channels]
        for key, damage in rows:
            for field, family in families:
                family.add_metric(key, getattr(damage, field))
    for _, family in families:
        yield family


def _clients(channel: ChannelStats) -> tuple[ClientStats, ...]:
    return channel.clients or ()


def _latency_families(level: str, labels: list[str]) -> tuple[GaugeMetricFamily, GaugeMetricFamily]:
    latency = _gauge(
        f"lmqd_{level}_e2e_processing_latency_seconds",
        f"end-to-end processing latency percentiles of the {level} over the rolling window",
        [*labels, "quantile"],
    )
    samples = _gauge(
        f"lmqd_{level}_e2e_processing_latency_samples",
        f"FINs in the {level}'s end-to-end latency window",
        labels,
    )
    return latency, samples


def _add_latency(
    latency: GaugeMetricFamily, samples: GaugeMetricFamily, key: list[str], e2e: E2eLatency
) -> None:
    if e2e.percentiles is None:
        return  # not configured: no series, as /stats reports null
    samples.add_metric(key, e2e.count)
    for p in e2e.percentiles:
        latency.add_metric([*key, _quantile_label(p.quantile)], p.value / 1e9)


def _quantile_label(q: float) -> str:
    # Go's %v of a float64: 0.99 -> "0.99", 1 -> "1".
    return str(int(q)) if float(q).is_integer() else repr(q)


def make_registry(broker: Broker, replication: Replication | None = None) -> CollectorRegistry:
    """A registry for one daemon: lmqd's collector (and replication's, ``lmqd.mirror.metrics``)
    plus the standard process/GC/platform ones (a private registry, so several daemons in one
    process do not clash)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(LmqCollector(broker))
    if replication is not None:
        from lmqd.mirror.metrics import MirrorCollector

        registry.register(MirrorCollector(replication))
    ProcessCollector(registry=registry)
    GCCollector(registry=registry)
    PlatformCollector(registry=registry)
    return registry

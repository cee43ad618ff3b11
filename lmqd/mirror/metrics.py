"""Replication's Prometheus metrics, read at scrape time from the same snapshots as ``/stats``
(``Replication.mirror_statistics``, ``link_statistics``); ``lmqd.metrics`` registers the
collector beside its own.

On a mirror (one series per followed topic where labelled ``topic``):

================================================ ======= ==================================
lmqd_mirror_info (primary, primary_node_id)      gauge   1 while this node mirrors
lmqd_mirror_connected (1: the primary answers)   gauge
lmqd_mirror_seconds_since_contact                gauge   -1 before the first answer
lmqd_mirror_lag_messages                         gauge   topic
lmqd_mirror_lag_seconds                          gauge   topic
lmqd_mirror_state (1 for the current one)        gauge   topic, state
lmqd_mirror_copied_messages_total                counter topic
lmqd_mirror_gap_messages_total                   counter topic
lmqd_mirror_untracked_messages                   gauge   topic
================================================ ======= ==================================

On both: ``lmqd_mirror_epoch``. On a primary, per mirror (``mirror``: its node id,
``address``: its own HTTP address): ``lmqd_primary_mirror_lag_messages``,
``lmqd_primary_mirror_seconds_since_contact``,
``lmqd_primary_mirror_released_messages_total`` (what it let go past ``--mirror-max-lag``) and
``lmqd_primary_mirror_in_sync``; per topic its mirrors follow,
``lmqd_primary_topic_mirrors_in_sync`` and ``lmqd_primary_topic_min_insync_mirrors`` (its
``min_insync_mirrors``); with ``--min-insync-mirrors`` or a topic with that policy,
``lmqd_primary_insync_waiting_publishes`` and the counters
``lmqd_primary_insync_{held,refused,timed_out}_publishes_total``.
docs/monitoring/lmqd-alerts.yml has the alert rules over them (lag, disconnected, gap, fewer in
sync than --min-insync-mirrors).
"""

from __future__ import annotations

from collections.abc import Iterable

import trio
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from lmqd.mirror.service import Replication
from lmqd.mirror.stats import FOLLOW_STATES

__all__ = ["MirrorCollector"]

_TOPIC = ["topic"]
_MIRROR = ["mirror", "address"]


class MirrorCollector(Collector):
    """Replication's metrics from one snapshot per scrape."""

    def __init__(self, replication: Replication) -> None:
        self._replication = replication

    def describe(self) -> Iterable[Metric]:
        return ()

    def collect(self) -> Iterable[Metric]:
        replication = self._replication
        now = trio.current_time()
        yield GaugeMetricFamily("lmqd_mirror_epoch", "this node's replication epoch (promotions)",
                                value=replication.role.epoch)  # fmt: skip
        mirror = replication.mirror_statistics(now)
        if mirror is not None:
            info = GaugeMetricFamily("lmqd_mirror_info", "1 while this node mirrors a primary",
                                     labels=["primary", "primary_node_id"])  # fmt: skip
            info.add_metric([mirror.primary, mirror.primary_node_id], 1)
            yield info
            yield GaugeMetricFamily(
                "lmqd_mirror_connected", "1 while the primary answers",
                value=0 if mirror.state == "disconnected" or mirror.failures else 1,
            )
            yield GaugeMetricFamily(
                "lmqd_mirror_seconds_since_contact", "seconds since the primary last answered",
                value=mirror.seconds_since_contact,
            )
            lag = GaugeMetricFamily("lmqd_mirror_lag_messages",
                                    "messages the primary has that the copy has not", labels=_TOPIC)
            lag_s = GaugeMetricFamily("lmqd_mirror_lag_seconds",
                                      "age of the oldest message not copied", labels=_TOPIC)
            state = GaugeMetricFamily("lmqd_mirror_state", "1 for the topic's current state",
                                      labels=["topic", "state"])
            copied = CounterMetricFamily("lmqd_mirror_copied_messages",
                                         "messages copied since this mirror started", labels=_TOPIC)
            gap = CounterMetricFamily(
                "lmqd_mirror_gap_messages",
                "offsets the primary accepted and no longer had when asked", labels=_TOPIC,
            )
            untracked = GaugeMetricFamily(
                "lmqd_mirror_untracked_messages",
                "messages the primary's channels hold unfinished without a known offset",
                labels=_TOPIC,
            )
            for t in mirror.topics:
                key = [t.topic_name]
                lag.add_metric(key, t.lag_messages)
                lag_s.add_metric(key, t.lag_seconds)
                for name in FOLLOW_STATES:
                    state.add_metric([t.topic_name, name], 1 if t.state == name else 0)
                copied.add_metric(key, t.copied_messages)
                gap.add_metric(key, t.gap_messages)
                untracked.add_metric(key, t.untracked_messages)
            yield from (lag, lag_s, state, copied, gap, untracked)
        links = replication.link_statistics(now)
        if links:
            lag = GaugeMetricFamily("lmqd_primary_mirror_lag_messages",
                                    "offsets a mirror has not copied, over every topic",
                                    labels=_MIRROR)  # fmt: skip
            contact = GaugeMetricFamily("lmqd_primary_mirror_seconds_since_contact",
                                        "seconds since a mirror's last request (-1: none yet)",
                                        labels=_MIRROR)  # fmt: skip
            released = CounterMetricFamily(
                "lmqd_primary_mirror_released_messages",
                "offsets let go uncopied: the mirror lagged past --mirror-max-lag",
                labels=_MIRROR,
            )
            in_sync = GaugeMetricFamily(
                "lmqd_primary_mirror_in_sync",
                "1 while a mirror is in sync on every topic it follows (--mirror-ack-timeout)",
                labels=_MIRROR,
            )
            for m in links:
                key = [m.mirror_id, m.address]
                lag.add_metric(key, m.lag_messages)
                contact.add_metric(key, m.seconds_since_contact)
                released.add_metric(key, m.released_messages)
                in_sync.add_metric(key, 1 if m.in_sync else 0)
            yield from (lag, contact, released, in_sync)
        insync = replication.insync_statistics(now)
        if links or insync is not None:
            in_sync = GaugeMetricFamily(
                "lmqd_primary_topic_mirrors_in_sync",
                "mirrors in sync on the topic (--mirror-ack-timeout)", labels=_TOPIC,
            )
            needed = GaugeMetricFamily(
                "lmqd_primary_topic_min_insync_mirrors",
                "mirrors the topic's publishes wait for (min_insync_mirrors; 0: none)",
                labels=_TOPIC,
            )
            for name, (count, wanted) in sorted(replication.mirrors_in_sync(now).items()):
                in_sync.add_metric([name], count)
                needed.add_metric([name], wanted)
            yield from (in_sync, needed)
        if insync is not None:
            yield GaugeMetricFamily(
                "lmqd_primary_insync_waiting_publishes",
                "publishes whose OK waits for the mirrors now",
                value=insync.waiting_publishes,
            )
            for name, help_text, value in (
                ("held", "publishes whose OK waited for the mirrors", insync.held_publishes),
                ("refused", "publishes refused: fewer mirrors in sync than needed",
                 insync.refused_publishes),
                ("timed_out", "held publishes not stored by the mirrors in time (stored here)",
                 insync.timed_out_publishes),
            ):  # fmt: skip
                yield CounterMetricFamily(
                    f"lmqd_primary_insync_{name}_publishes", help_text, value=value
                )

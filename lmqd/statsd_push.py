"""Pushing statistics to statsd, as nsqd's ``--statsd-*`` flags do (``nsqd/statsd.go``).

Every ``--statsd-interval`` one task takes the broker's statistics snapshot (the one ``/stats``
and ``/metrics`` serialise) and sends nsqd's keys over UDP, batched into packets of at most
``--statsd-udp-packet-size`` bytes:

* per topic ``topic.<t>.message_count`` and ``.message_bytes`` (counters: the increase since the
  last push), ``.depth`` and ``.backend_depth`` (gauges), ``.e2e_processing_latency_<p>``
  (gauges in nanoseconds, ``<p>`` the percentile times 100);
* per channel ``topic.<t>.channel.<c>.`` ``message_count``, ``requeue_count``,
  ``timeout_count`` (counters), ``depth``, ``backend_depth``, ``in_flight_count``,
  ``deferred_count``, ``clients`` and the e2e percentiles (gauges);
* with ``--statsd-mem-stats``, ``mem.*``: the ``/stats`` memory block as gauges and ``mem.gc_runs``
  as a counter (``lmqd.memory`` says what each Go number maps to in CPython).

Keys are prefixed with ``--statsd-prefix``, whose ``%s`` becomes ``<broadcast address>_<HTTP
port>`` with ``.`` and ``:`` replaced by ``_`` (nsqd's ``statsd.HostKey``). With
``--statsd-exclude-ephemeral`` ephemeral topics and channels are left out. The packets are built
and sent by the ``statsd`` package (a maintained client, rather than a hand-written line format);
UDP sends never block, so the push costs the loop one snapshot per interval.
"""

from __future__ import annotations

import contextlib
import logging
import re
from typing import Any

import trio
from statsd import StatsClient

from lmqd.broker import Broker
from lmqd.memory import memory_stats, track_gc_pauses
from lmqd.names import is_ephemeral
from lmqd.net import split_address
from lmqd.stats import E2eLatency

__all__ = ["StatsdPusher", "host_key"]

log = logging.getLogger("lmqd.statsd")

_HOST_KEY = re.compile(r"[.:]")


def host_key(broadcast_address: str, http_port: int) -> str:
    """nsqd's ``statsd.HostKey``: ``host:port`` with ``.`` and ``:`` as ``_``."""
    return _HOST_KEY.sub("_", f"{broadcast_address}:{http_port}")


class StatsdPusher:
    """Sends the broker's statistics to ``--statsd-address`` every ``--statsd-interval``."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self._last: dict[str, int] = {}
        """Counter values at the last push: a counter sends its increase since then."""

    def _prefix(self) -> str:
        options = self.broker.options
        prefix = options.statsd_prefix
        if "%s" in prefix:
            addresses = self.broker.addresses
            port = options.broadcast_http_port or (
                addresses.http[1] if addresses is not None and addresses.http else 0
            )
            prefix = prefix.replace("%s", host_key(options.broadcast_address, port))
        return prefix.rstrip(".")

    def _count(self, pipe: Any, key: str, value: int) -> None:
        last = self._last.get(key, 0)
        self._last[key] = value
        diff = value - last
        if diff:
            pipe.incr(key, diff)

    def push(self, client: StatsClient) -> None:
        """One push: every key, in as few packets as fit."""
        options = self.broker.options
        exclude = options.statsd_exclude_ephemeral
        with client.pipeline() as pipe:
            for topic in self.broker.statistics(include_clients=False):
                if exclude and is_ephemeral(topic.topic_name):
                    continue
                t = f"topic.{topic.topic_name}"
                self._count(pipe, f"{t}.message_count", topic.message_count)
                self._count(pipe, f"{t}.message_bytes", topic.message_bytes)
                pipe.gauge(f"{t}.depth", topic.depth)
                pipe.gauge(f"{t}.backend_depth", topic.backend_depth)
                _latency(pipe, t, topic.e2e_processing_latency)
                for channel in topic.channels:
                    if exclude and is_ephemeral(channel.channel_name):
                        continue
                    c = f"{t}.channel.{channel.channel_name}"
                    self._count(pipe, f"{c}.message_count", channel.message_count)
                    self._count(pipe, f"{c}.requeue_count", channel.requeue_count)
                    self._count(pipe, f"{c}.timeout_count", channel.timeout_count)
                    pipe.gauge(f"{c}.depth", channel.depth)
                    pipe.gauge(f"{c}.backend_depth", channel.backend_depth)
                    pipe.gauge(f"{c}.in_flight_count", channel.in_flight_count)
                    pipe.gauge(f"{c}.deferred_count", channel.deferred_count)
                    pipe.gauge(f"{c}.clients", channel.client_count)
                    _latency(pipe, c, channel.e2e_processing_latency)
            if options.statsd_mem_stats:
                memory = memory_stats()
                runs = memory.pop("gc_total_runs")
                for key, value in memory.items():
                    pipe.gauge(f"mem.{key}", value)
                self._count(pipe, "mem.gc_runs", runs)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Push every ``--statsd-interval`` until cancelled (the first push one interval after
        start, as nsqd's ticker)."""
        options = self.broker.options
        host, port = split_address(options.statsd_address)
        # Resolves the host once (getaddrinfo may block): in a worker thread.
        client = await trio.to_thread.run_sync(
            lambda: StatsClient(
                host, port, prefix=self._prefix(), maxudpsize=options.statsd_udp_packet_size
            )
        )
        log.info("STATSD: pushing to %s every %gs", options.statsd_address, options.statsd_interval)
        task_status.started()
        try:
            with track_gc_pauses() if options.statsd_mem_stats else contextlib.nullcontext():
                while True:
                    await trio.sleep(options.statsd_interval)
                    try:
                        self.push(client)
                    except OSError as exc:  # statsd is best effort, as in nsqd
                        log.warning("STATSD: push to %s failed - %s", options.statsd_address, exc)
        finally:
            client.close()


def _latency(pipe: Any, key: str, e2e: E2eLatency) -> None:
    if e2e.percentiles is None:
        return
    for p in e2e.percentiles:
        pipe.gauge(
            f"{key}.e2e_processing_latency_{round(p.quantile * 100)}", p.value
        )

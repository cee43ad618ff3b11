"""``/metrics`` storage series: syncer rounds, fsync-round latency histogram, bytes on disk.

Rules for this module (STYLE.md):
- A real ``LmqDaemon`` runs in-process on 127.0.0.1 port 0 (``start_daemon``); messages are
  published over HTTP with ``--mem-queue-size 1`` so they spill into the topic's log.
- Every test body runs under ``trio.fail_after(TIMEOUT)``.
- Bytes on disk are checked three ways: the scraped gauge, the logs' and queues'
  ``bytes_on_disk`` and the sizes of the segment files actually in the data directory.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import trio
from prometheus_client.parser import text_string_to_metric_families

from lmqd.broker import Broker
from lmqd.storage import TopicLog
from lmqd.storage.files import queue_stem
from tests.support.daemon import StartDaemon, eventually
from tests.support.http import http

TIMEOUT = 15.0
BODY = b"x" * 100


def segment_files(data_path: Path, name: str | None) -> list[Path]:
    """Queue ``name``'s segment files (every queue's if None; never the metadata file)."""
    stem = "*" if name is None else queue_stem(name)
    return list(data_path.glob(f"{stem}.lmq.*.dat"))


def segment_bytes(data_path: Path, name: str | None) -> int:
    """Total size of ``segment_files(data_path, name)`` (a stat per file: tests only).

    A consumed segment may be unlinked by a sync in a worker thread between the listing and its
    stat: it then counts as gone (0 bytes), as it is by the time the stat runs.
    """
    total = 0
    for path in segment_files(data_path, name):
        with contextlib.suppress(FileNotFoundError):
            total += path.stat().st_size
    return total


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


async def scrape(running_http: tuple[str, int]) -> tuple[Samples, dict[str, str]]:
    """Every sample of ``/metrics`` by (name, labels), and every family's type by name."""
    r = await http(running_http, "GET", "/metrics")
    assert r.status == 200
    samples: Samples = {}
    types: dict[str, str] = {}
    for family in text_string_to_metric_families(r.body.decode()):
        types[family.name] = family.type
        for s in family.samples:
            samples[(s.name, frozenset(s.labels.items()))] = s.value
    return samples, types


def disk_gauge(samples: Samples) -> dict[tuple[str, str], float]:
    return {
        (labels["topic"], labels["channel"]): value
        for (name, key), value in samples.items()
        if name == "lmqd_queue_disk_bytes"
        for labels in [dict(key)]
    }


def check_histogram(samples: Samples) -> int:
    """Assert the fsync histogram is well formed and agrees with the rounds counter; its count."""
    rounds = samples[("lmqd_sync_rounds_total", frozenset())]
    buckets = sorted(
        (float(dict(key)["le"]), value)
        for (name, key), value in samples.items()
        if name == "lmqd_fsync_duration_seconds_bucket"
    )
    bounds = [b for b, _ in buckets]
    assert bounds == [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                      float("inf")]
    counts = [c for _, c in buckets]
    assert counts == sorted(counts)  # cumulative
    count = samples[("lmqd_fsync_duration_seconds_count", frozenset())]
    assert counts[-1] == count == rounds
    total = samples[("lmqd_fsync_duration_seconds_sum", frozenset())]
    assert total >= 0.0
    assert (total > 0.0) == (count > 0)  # a worker-thread call takes some real time
    return int(count)


def topic_log(log: TopicLog | None) -> TopicLog:
    assert isinstance(log, TopicLog)
    return log


async def test_disk_bytes_and_fsync_histogram(start_daemon: StartDaemon) -> None:
    with trio.fail_after(TIMEOUT):
        running = await start_daemon(http=True, mem_queue_size=1, sync_timeout=0.05,
                                     max_bytes_per_file=1024)
        daemon: Broker = running.broker
        base = running.http
        # No channel yet: the topic holds the messages, all but one in its log, which rolls
        # over several 1 KiB segments.
        assert (await http(base, "POST", "/mpub?topic=spill", b"\n".join([BODY] * 20))).status \
            == 200
        assert (await http(base, "POST", "/pub?topic=eph%23ephemeral", BODY)).status == 200
        topic = daemon.topics["spill"]
        tq = topic_log(topic.log)
        assert topic.backend_depth == 19
        rounds_before = daemon.syncer.statistics().rounds
        await eventually(lambda: tq.dirty_count == 0
                         and daemon.syncer.statistics().rounds > rounds_before)

        samples, types = await scrape(base)
        assert types["lmqd_fsync_duration_seconds"] == "histogram"
        assert types["lmqd_queue_disk_bytes"] == "gauge"
        assert types["lmqd_sync_rounds"] == "counter"
        assert samples[("lmqd_sync_failures_total", frozenset())] == 0
        assert check_histogram(samples) > 0
        disk = disk_gauge(samples)
        on_disk = segment_bytes(running.data_path, "spill")
        assert len(segment_files(running.data_path, "spill")) > 1
        assert disk == {("spill", ""): tq.bytes_on_disk}  # no series for the ephemeral topic
        assert tq.bytes_on_disk == on_disk > 19 * len(BODY)

        # A channel reads the topic's log: nothing is copied, so it has no files of its own.
        assert (await http(base, "POST", "/channel/create?topic=spill&channel=c")).status == 200
        channel = topic.channels["c"]
        await eventually(lambda: channel.depth == 20 and topic.depth == 0)
        assert channel.backend_depth == 19
        samples, _ = await scrape(base)
        assert disk_gauge(samples) == {("spill", ""): tq.bytes_on_disk}
        assert tq.bytes_on_disk == on_disk
        # Once its cursor has passed them (emptied: it reads from the end), the segments go.
        assert (await http(base, "POST", "/channel/empty?topic=spill&channel=c")).status == 200
        await eventually(lambda: tq.bytes_on_disk == segment_bytes(running.data_path, "spill")
                         and tq.dirty_count == 0 and tq.bytes_on_disk < on_disk)
        samples, _ = await scrape(base)
        check_histogram(samples)
        assert disk_gauge(samples) == {("spill", ""): tq.bytes_on_disk}


async def test_durable_channel_counts_its_deferred_store(
    start_daemon: StartDaemon
) -> None:
    with trio.fail_after(TIMEOUT):
        running = await start_daemon(http=True, durable=True, sync_timeout=0.05)
        daemon: Broker = running.broker
        base = running.http
        assert (await http(base, "POST", "/topic/create?topic=t")).status == 200
        assert (await http(base, "POST", "/channel/create?topic=t&channel=c")).status == 200
        assert (await http(base, "POST", "/pub?topic=t", BODY)).status == 200
        assert (await http(base, "POST", "/pub?topic=t&defer=60000", BODY)).status == 200
        channel = daemon.topics["t"].channels["c"]
        await eventually(lambda: len(channel.disk_queues) == 1 and channel.deferred_count == 1)
        (deferred,) = channel.disk_queues  # no own store: nothing was requeued
        await eventually(lambda: deferred.dirty_count == 0)
        samples, _ = await scrape(base)
        disk = disk_gauge(samples)
        assert deferred.bytes_on_disk > len(BODY)
        assert disk[("t", "c")] == deferred.bytes_on_disk
        assert segment_bytes(running.data_path, None) == sum(disk.values())
        check_histogram(samples)

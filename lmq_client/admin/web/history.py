"""``History``: the last hour of every topic's and channel's figures, for the charts.

A ring of ``slots`` sampling rounds. Each series (a topic, or a topic's channel, summed over the
nodes) is one ``array('f')`` of ``slots * len(METRICS)`` floats, 4 bytes each: an hour at the
default 5 s interval is 720 rounds, 23 KiB per channel. A series is allocated at its first
non-zero value -- until then it reads as zeros, which is what it was -- so a console over
thousands of idle topics keeps almost nothing (the benchmark's 3,000 idle channels: none).
``record`` is O(series) per round; ``read`` returns one series oldest first, with ``None``
for rounds before the console started.

Rates are derived here from the snapshots' counters, per round: the publish rate is the change
in the topic's ``message_count``; a channel's delivery rate is the change in what has left its
queue, ``message_count + requeue_count + timeout_count - depth - deferred_count`` (every message
enters the queue by a publish, a requeue or a timeout, and leaves it by a delivery, or by
``empty``, which a negative change shows and the rate ignores); a topic's is its channels' sum.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Mapping

from lmq_client.admin.web.model import Snapshot, StatRow

__all__ = ["METRICS", "History", "SeriesKey"]

SeriesKey = tuple[str, str]
"""(topic, channel); channel "" for the topic."""

METRICS = ("depth", "in_flight", "deferred", "publish_rate", "delivery_rate", "requeue_rate",
           "timeout_rate", "e2e_ms")  # fmt: skip
_WIDTH = len(METRICS)


def _left(row: StatRow) -> int:
    return row.messages + row.requeued + row.timed_out - row.depth - row.deferred


def _e2e_ms(row: StatRow) -> float:
    return row.e2e[-1][1] / 1e6 if row.e2e else 0.0


class History:
    """The last ``slots`` rounds of every series (module docstring)."""

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self._times = array("d", [math.nan]) * slots
        self._series: dict[SeriesKey, array[float]] = {}
        self._next = 0
        self._previous: dict[SeriesKey, tuple[float, int, int, int, int]] = {}
        self._previous_at: float | None = None

    def __len__(self) -> int:
        return len(self._series)

    def record(self, snapshot: Snapshot) -> None:
        """Add one round."""
        at = snapshot.at
        elapsed = at - self._previous_at if self._previous_at is not None else 0.0
        values: dict[SeriesKey, tuple[float, ...]] = {}
        counters: dict[SeriesKey, tuple[float, int, int, int, int]] = {}
        for topic in snapshot.topics.values():
            delivered = 0.0
            for channel in topic.channels:
                key = (topic.name, channel.name)
                values[key] = self._values(key, channel.total, at, elapsed, counters)
                delivered += values[key][4]
            key = (topic.name, "")
            row = self._values(key, topic.total, at, elapsed, counters)
            values[key] = (*row[:4], delivered, *row[5:])
        self._previous = counters
        self._previous_at = at
        self._write(at, values)

    def _values(
        self, key: SeriesKey, row: StatRow, at: float, elapsed: float,
        counters: dict[SeriesKey, tuple[float, int, int, int, int]],
    ) -> tuple[float, ...]:
        now = (at, row.messages, _left(row), row.requeued, row.timed_out)
        counters[key] = now
        before = self._previous.get(key)
        rates = [0.0, 0.0, 0.0, 0.0]
        if before is not None and elapsed > 0:
            rates = [max(0.0, (n - b) / elapsed) for n, b in zip(now[1:], before[1:], strict=True)]
        return (row.depth, row.in_flight, row.deferred, *rates, _e2e_ms(row))

    def _write(self, at: float, values: Mapping[SeriesKey, tuple[float, ...]]) -> None:
        slot = self._next
        self._next = (slot + 1) % self.slots
        self._times[slot] = at
        start = slot * _WIDTH
        for key, row in values.items():
            series = self._series.get(key)
            if series is None:
                if not any(row):
                    continue
                series = self._series[key] = array("f", [0.0]) * (self.slots * _WIDTH)
            series[start : start + _WIDTH] = array("f", row)
        zeros = array("f", [0.0]) * _WIDTH
        for key, series in self._series.items():
            if key not in values:
                series[start : start + _WIDTH] = zeros

    def read(self, key: SeriesKey) -> dict[str, list[float | None]]:
        """``{"t": [seconds...], metric: [values...]}``, oldest first, rounds recorded only."""
        order = [*range(self._next, self.slots), *range(0, self._next)]
        order = [i for i in order if not math.isnan(self._times[i])]
        result: dict[str, list[float | None]] = {"t": [self._times[i] for i in order]}
        series = self._series.get(key)
        for m, name in enumerate(METRICS):
            if series is None:
                result[name] = [0.0] * len(order)
            else:
                result[name] = [round(series[i * _WIDTH + m], 3) for i in order]
        return result

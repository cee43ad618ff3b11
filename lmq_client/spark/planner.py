"""Planning the source's micro-batches: pure functions from what the nodes said to offsets.

Theory of operation
-------------------
A micro-batch reads, for every topic and node (a *pair*), the offsets ``[begin, end)``. On the
driver, ``latestOffset(start, limit)`` asks every node where its topics begin and end (``Known``:
``earliest``, ``end``) and ``plan_batch`` turns that into the batch's end offsets:

* **begin** is where the query stands (``start``). A pair it has never read (a node or topic
  that appears) joins the offsets at its start (its earliest offset: it is read from its
  beginning, as Kafka reads a new partition) in one batch, and is read from the next: so its
  start is in the checkpoint, and a batch replayed after a restart reads exactly what it read;
* **lost offsets**: when ``begin`` is below the pair's earliest offset (retention, ``/topic/
  empty``), the offsets in between are gone; when the pair's end is below ``begin`` its offsets
  went back (the topic was deleted, or the node's log started again), and everything from
  ``begin`` on in the old log is gone. Either is a ``Loss``; the batch then reads from the
  earliest offset still there. The caller fails the query on a loss (``failOnDataLoss=true``,
  Kafka's default) or logs it, counts it and goes on;
* **limits**: ``maxOffsetsPerTrigger`` is spread over the pairs in proportion to what each has
  waiting (at least one offset each while any is left, as Kafka's source does not starve a small
  partition); ``minOffsetsPerTrigger`` holds the batch back (the start is returned: Spark runs no
  batch) until that many are waiting or ``maxTriggerDelay`` has passed since the last batch,
  unless a loss is to be reported, which never waits;
* **Trigger.AvailableNow**: the ends that existed when the query started are the ``target``; no
  pair is read past its target, pairs found later are not read at all, and once every pair is at
  its target the plan is the start itself, which tells Spark to stop.

Pairs the caller did not ask (a node no longer listed, unreachable, a topic no longer matched)
keep their offsets: the source's offsets only ever gain pairs, so a node that comes back goes on
where it stopped. ``split_ranges`` cuts a batch into Spark partitions of at most
``partition_size`` offsets (and at least ``min_partitions`` partitions in all).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import NamedTuple

from lmq_client.spark.offsets import ByNode, SourceOffsets

__all__ = [
    "Known",
    "Loss",
    "Pair",
    "Plan",
    "Range",
    "plan_batch",
    "split_ranges",
    "spread",
]

Pair = tuple[str, str]
"""``(topic, node)``."""


class Known(NamedTuple):
    """What a node said of a topic: its earliest offset stored and its end (next offset)."""

    earliest: int
    end: int


@dataclasses.dataclass(frozen=True)
class Loss:
    """Offsets a query was due to read that are gone: ``[start, stop)`` of ``topic`` on
    ``node``; ``stop`` is None when the offsets went back (the whole rest of the old log)."""

    topic: str
    node: str
    start: int
    stop: int | None

    @property
    def count(self) -> int:
        """How many messages are known lost (0 when the offsets went back: unknown)."""
        return 0 if self.stop is None else self.stop - self.start

    def describe(self) -> str:
        """One line naming the topic, the node and the range."""
        where = f"topic {self.topic!r} on {self.node}"
        if self.stop is None:
            return (
                f"{where}: its offsets went back below {self.start} (the topic was deleted or "
                "emptied, or the node's log started again); what the query had not read from "
                f"offset {self.start} on is gone"
            )
        count = self.stop - self.start
        return (
            f"{where}: offsets {self.start}..{self.stop - 1} ({count} message"
            f"{'s' if count != 1 else ''}) are no longer stored (retention, an emptied "
            "topic, or never written) and were not read"
        )


@dataclasses.dataclass(frozen=True)
class Plan:
    """``plan_batch``'s answer: the batch's ``end``, where each pair's reading really begins
    (``begins``: past a loss, and for pairs new to the query), the ``losses`` found,
    ``latest`` (every pair's end, unlimited: Spark's ``reportLatestOffset``) and whether the
    batch was held back by ``minOffsetsPerTrigger`` (``end`` is then the start)."""

    end: SourceOffsets
    begins: dict[Pair, int]
    losses: list[Loss]
    latest: ByNode
    held: bool = False


def plan_batch(
    start: SourceOffsets,
    known: Mapping[Pair, Known | None],
    *,
    new_start: Callable[[str, str, Known], int],
    target: Mapping[Pair, int] | None = None,
    max_rows: int | None = None,
    min_rows: int | None = None,
    delay_passed: bool = True,
    count_losses: bool = False,
) -> Plan:
    """The end offsets of the next batch (see the module docstring).

    ``known``: the pairs asked now, with what their node said (None: it did not answer);
    ``new_start(topic, node, known)``: where a pair new to the query begins; ``target``: the
    AvailableNow ends (None: not AvailableNow); ``max_rows`` / ``min_rows``: the read limits,
    ``delay_passed``: ``maxTriggerDelay`` has passed since the last batch; ``count_losses``:
    add the lost messages to the end's ``#lost`` counts (``failOnDataLoss=false``)."""
    begins: dict[Pair, int] = {}
    caps: dict[Pair, int] = {}
    latest: ByNode = {}
    losses: list[Loss] = []
    ends: dict[Pair, int] = {(t, n): o for t, n, o in start.pairs()}
    for pair, said in known.items():
        topic, node = pair
        if said is None:
            continue  # not answering: its offset (if any) stays
        at = start.get(topic, node)
        if at is None:
            if target is None or pair in target:
                # A pair joins at its start, read from the next batch on: its start is then in
                # the checkpoint, and a batch replayed after a restart reads the same offsets.
                ends[pair] = new_start(topic, node, said)
            continue
        if said.end < at:
            losses.append(Loss(topic, node, at, None))
            at = said.earliest
        elif at < said.earliest:
            losses.append(Loss(topic, node, at, said.earliest))
            at = said.earliest
        begins[pair] = at
        latest.setdefault(topic, {})[node] = said.end
        cap = said.end if target is None else min(said.end, target.get(pair, at))
        caps[pair] = max(cap, at)
    waiting = {pair: caps[pair] - at for pair, at in begins.items()}
    total = sum(waiting.values())
    held = (
        min_rows is not None and not losses and total < min_rows and not delay_passed
        and target is None
    )  # fmt: skip
    if held:
        return Plan(start, begins, [], latest, held=True)
    shares = waiting if max_rows is None else spread(waiting, max_rows)
    for pair, at in begins.items():
        ends[pair] = at + shares[pair]
    lost = {t: dict(nodes) for t, nodes in start.lost.items()}
    if count_losses:
        for loss in losses:
            by_node = lost.setdefault(loss.topic, {})
            by_node[loss.node] = by_node.get(loss.node, 0) + loss.count
    positions: ByNode = {}
    for (topic, node), offset in ends.items():
        positions.setdefault(topic, {})[node] = offset
    return Plan(SourceOffsets(positions, lost), begins, losses, latest)


def spread(waiting: Mapping[Pair, int], limit: int) -> dict[Pair, int]:
    """How many of its ``waiting`` offsets each pair reads when at most ``limit`` are read in
    all: in proportion to what each has waiting, rounded down, but at least one for a pair with
    any waiting (so the sum may pass ``limit`` by up to the number of pairs, as in Kafka)."""
    total = sum(waiting.values())
    if total <= limit:
        return dict(waiting)
    shares = {}
    for pair, count in waiting.items():
        share = count * limit / total
        shares[pair] = min(count, math.ceil(share) if share < 1 else math.floor(share))
    return shares


class Range(NamedTuple):
    """Offsets ``[start, end)`` of ``topic`` on ``node``: one Spark partition."""

    topic: str
    node: str
    start: int
    end: int


def split_ranges(
    ranges: Mapping[Pair, tuple[int, int]], partition_size: int, min_partitions: int | None = None
) -> list[Range]:
    """``[begin, end)`` per pair cut into ranges of at most ``partition_size`` offsets, smaller
    when that makes fewer than ``min_partitions`` ranges (Kafka's ``minPartitions``)."""
    size = partition_size
    if min_partitions:
        total = sum(max(end - begin, 0) for begin, end in ranges.values())
        size = max(1, min(size, math.ceil(total / min_partitions)))
    parts = []
    for (topic, node), (begin, end) in sorted(ranges.items()):
        for at in range(begin, end, size):
            parts.append(Range(topic, node, at, min(at + size, end)))
    return parts

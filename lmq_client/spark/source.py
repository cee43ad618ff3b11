"""The source side of the ``lmq`` data source: reading topics by offset, batch and streaming.

Theory of operation
-------------------
Every message a topic stores has an offset on its daemon (docs/storage.md), and lmqd serves
them by offset without consuming anything (``GET /topic/read``, docs/http.md). The source's
position is therefore one offset per topic and node (``offsets.py``), and that is exactly what
Spark's streaming engine keeps as the source's offsets in the checkpoint:

* on the driver, ``latestOffset`` asks every node where its topics begin and end (``GET
  /topics/offsets``, one request per node: ``discovery.py``) and plans the batch's ends
  (``planner.py``: new nodes and topics, lost offsets, the read limits, AvailableNow's target);
* ``partitions(start, end)`` cuts each pair's range into Spark tasks of at most
  ``partitionSize`` offsets;
* an executor reads its range with ``/topic/read`` requests, each answer one Arrow record batch
  (``source_read.py``).

A micro-batch is a fixed set of offset ranges: reading it again (a retried task, a query
restarted from its checkpoint) reads exactly the same messages, as long as the daemon still
stores them. So a query restarted from its checkpoint reads exactly the messages after its last
committed batch: none lost, none repeated. Reading consumes nothing, so it needs the messages
retained (a retention policy, or a channel behind the reader).

Lost data. Offsets the query is due to read that are gone are found on the driver when a batch
is planned (its start below a node's earliest offset, or a node's offsets gone back) and on the
executors when they read (offsets deleted since, or never written): ``failOnDataLoss=true``
(Kafka's default) fails the query with one line naming the topic, node and range; ``false``
logs that line, counts the messages under ``#lost`` in the offsets (what the query's progress
shows of a source) and goes on. The daemon counts them too (``reader_lost_count``).

A batch read (``spark.read.format("lmq")``) fixes its ranges when it is planned: from
``startingOffsets`` (default ``earliest``) to ``endingOffsets`` (default ``latest``, the ends
at planning time). An empty range is an empty DataFrame; a range that starts after it ends, a
topic no node has and a node named that is not read are errors, one line each.

Errors a user can cause (an option, a daemon not reachable, lost data) reach Spark through
``errors.raise_for_spark``: one line, no Python traceback.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NoReturn

import pyarrow as pa  # type: ignore[import-untyped]
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)

from lmq_client.errors import LmqClientError
from lmq_client.spark.discovery import NodeAnswer, NodeDirectory
from lmq_client.spark.errors import LmqDataLossError, LmqSourceError, raise_for_spark
from lmq_client.spark.offsets import EARLIEST, LATEST, SourceOffsets
from lmq_client.spark.planner import Known, Loss, Pair, Plan, plan_batch, split_ranges
from lmq_client.spark.source_options import EARLIEST_BOUND, LATEST_BOUND, Bound, SourceOptions
from lmq_client.spark.source_read import FAIL_HINT, LmqPartition, read_partition

__all__ = ["LmqBatchReader", "LmqPartition", "LmqStreamReader", "read_partition"]

log = logging.getLogger("lmq_client.spark")


def _fail(exc: BaseException) -> NoReturn:
    """Raise a user's error as one line for Spark (``LmqSourceError``)."""
    if not isinstance(exc, LmqSourceError):
        text = str(exc)
        exc = LmqSourceError(text if text.startswith("lmq source") else f"lmq source: {text}")
    raise_for_spark(exc)


# -- positions ------------------------------------------------------------------------------------


class _Positions:
    """Turns a ``Bound`` into offsets on the nodes (driver side)."""

    def __init__(self, options: SourceOptions, directory: NodeDirectory) -> None:
        self.options = options
        self.directory = directory

    def named(self, bound: Bound, topic: str, node: str) -> int | None:
        """The value ``bound`` gives ``topic`` on ``node`` by name (any spelling), if any."""
        for key, value in bound.by_node.get(topic, {}).items():
            if key == node or self.directory.spellings.node_of(key) == node:
                return value
        return None

    def unmatched(self, bound: Bound | None, nodes: Mapping[str, NodeAnswer]) -> list[str]:
        """The ``host:port`` keys of ``bound`` that name none of ``nodes``."""
        if bound is None:
            return []
        spellings = self.directory.spellings
        return [
            f"{topic} on {key}"
            for topic, by_node in bound.by_node.items()
            for key in by_node
            if key not in nodes and spellings.node_of(key) not in nodes
        ]

    def resolve(self, bound: Bound, topic: str, node: str, known: Known, *, start: bool) -> int:
        """The offset ``bound`` stands for on this pair (a start, or an end)."""
        option = ("starting" if start else "ending") + {
            "earliest": "Offsets", "latest": "Offsets", "offsets": "Offsets",
            "times": "OffsetsByTimestamp", "time": "Timestamp",
        }[bound.kind]  # fmt: skip
        if bound.kind == "earliest":
            return known.earliest
        if bound.kind == "latest":
            return known.end
        if bound.kind == "time":
            assert bound.time_ms is not None
            return self._at_time(bound.time_ms, topic, node, known, start=start, option=option)
        value = self.named(bound, topic, node)
        if value is None:
            return known.earliest if start else known.end
        if bound.kind == "times":
            return self._at_time(value, topic, node, known, start=start, option=option)
        if value == EARLIEST:
            return known.earliest
        if value == LATEST:
            return known.end
        if value > known.end:
            raise LmqSourceError(
                f"lmq source: option {option!r}: offset {value} of topic {topic!r} on {node} is "
                f"past its end ({known.end}: the next message gets that offset)"
            )
        return value

    def _at_time(self, time_ms: int, topic: str, node: str, known: Known, *, start: bool,
                 option: str) -> int:  # fmt: skip
        offset, found = self.directory.offset_at(node, topic, time_ms)
        if not found and start and self.options.time_strategy == "error":
            raise LmqSourceError(
                f"lmq source: option {option!r}: topic {topic!r} on {node} has no message at or "
                f"after {time_ms} ms (set startingOffsetsByTimestampStrategy=latest to start at "
                "its end instead)"
            )
        return offset


def _known(answers: Mapping[str, NodeAnswer]) -> dict[Pair, Known]:
    return {
        (topic, node): known
        for node, answer in answers.items() if answer is not None
        for topic, known in answer.items()
    }  # fmt: skip


def _report(options: SourceOptions, directory: NodeDirectory, losses: Sequence[Loss]) -> None:
    """Tell the nodes, then fail the query (``failOnDataLoss``) or log each loss."""
    for loss in losses:
        directory.count_loss(loss.node, loss.topic, loss.start)
    if not losses:
        return
    if options.fail_on_data_loss:
        more = f" (and {len(losses) - 1} more range(s) lost)" if len(losses) > 1 else ""
        raise LmqDataLossError(f"lmq source: {losses[0].describe()}{more}; {FAIL_HINT}")
    for loss in losses:
        log.warning("SPARK(%s): %s; going on (failOnDataLoss=false)", loss.topic, loss.describe())


# -- batch reads ----------------------------------------------------------------------------------


class LmqBatchReader(DataSourceReader):
    """``spark.read.format("lmq")``: the offsets from ``startingOffsets`` to ``endingOffsets``,
    fixed when the read is planned (on the driver)."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        try:
            self.ranges = self._plan()
        except (LmqClientError, ValueError) as exc:
            _fail(exc)

    def _plan(self) -> dict[Pair, tuple[int, int]]:
        options = self.options
        directory = NodeDirectory(options)
        directory.discover(required=True, force=True)
        wanted = directory.wanted()
        answers: dict[str, NodeAnswer] = {
            node: directory.require(node, topics) for node, topics in wanted.items()
        }
        known = _known(answers)
        present = {topic for topic, _ in known}
        missing = [t for t in options.topics if t not in present]
        if missing:
            where = ", ".join(sorted(answers)) or "no node found"
            raise LmqSourceError(
                f"lmq source: topic {missing[0]!r} does not exist on any node read ({where})"
            )
        positions = _Positions(options, directory)
        for bound in (options.starting, options.ending):
            unmatched = positions.unmatched(bound, answers)
            if unmatched:
                raise LmqSourceError(
                    f"lmq source: offsets given for {unmatched[0]}, which is not a node read "
                    f"({', '.join(sorted(answers)) or 'none'})"
                )
        ranges: dict[Pair, tuple[int, int]] = {}
        losses = []
        for (topic, node), said in sorted(known.items()):
            begin = positions.resolve(options.starting or EARLIEST_BOUND, topic, node, said,
                                      start=True)  # fmt: skip
            end = positions.resolve(options.ending or LATEST_BOUND, topic, node, said, start=False)
            if begin > end:
                raise LmqSourceError(
                    f"lmq source: topic {topic!r} on {node}: the start ({begin}) is after the end "
                    f"({end}); check startingOffsets and endingOffsets"
                )
            if begin < said.earliest and begin < end:
                losses.append(Loss(topic, node, begin, min(said.earliest, end)))
                begin = min(said.earliest, end)
            ranges[(topic, node)] = (begin, end)
        _report(options, directory, losses)
        return ranges

    def partitions(self) -> Sequence[InputPartition]:
        options = self.options
        return [
            LmqPartition(*r)
            for r in split_ranges(self.ranges, options.partition_size, options.min_partitions)
        ]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(self.options, partition)


def _read(options: SourceOptions, partition: InputPartition) -> Iterator[pa.RecordBatch]:
    """``read_partition``, its errors one line for Spark, naming the topic and node."""
    try:
        yield from read_partition(options, partition)
    except LmqSourceError as exc:
        raise_for_spark(exc)
    except LmqClientError as exc:
        assert isinstance(partition, LmqPartition)
        raise_for_spark(LmqSourceError(
            f"lmq source: reading topic {partition.topic!r} on {partition.node}: {exc}"
        ))  # fmt: skip


# -- streams --------------------------------------------------------------------------------------


class LmqStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("lmq")``: offsets per topic and node as the source's Spark
    offsets (see the module docstring)."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self.directory = NodeDirectory(options)
        self._positions = _Positions(options, self.directory)
        self._available_now = False
        self._target: dict[Pair, int] | None = None
        self._last_batch_at: float | None = None
        self._planned: tuple[dict[str, Any], dict[str, Any], dict[Pair, int]] | None = None
        """The last plan: its start and end as Spark has them, and where each pair begins."""
        self._latest: dict[str, Any] | None = None
        self._absent: set[str] = set()
        self._start = SourceOffsets({})
        """The start of the batch being planned (``_new_start`` looks in it)."""

    def _offsets(self, doc: Mapping[str, Any]) -> SourceOffsets:
        topics = self.options.topics or tuple(sorted(self.directory.topics()))
        return SourceOffsets.from_json(doc, topics).respelled(self.directory.spellings)

    def initialOffset(self) -> dict[str, Any]:
        """Where a query without a checkpoint starts: ``startingOffsets`` & co (default
        latest) on every node holding a topic read. A node found through a lookupd but not
        answering now is left out: it joins later, from its earliest offset."""
        try:
            return self._initial()
        except (LmqClientError, ValueError) as exc:
            _fail(exc)

    def _initial(self) -> dict[str, Any]:
        options, directory = self.options, self.directory
        directory.discover(required=True, force=True)
        given = set(directory.direct_nodes())
        answers: dict[str, NodeAnswer] = {}
        for node, topics in directory.wanted().items():
            # A node given by address must answer; one a lookupd lists may be away for now.
            if node in given:
                answers[node] = directory.require(node, topics)
            else:
                answers[node] = directory.ask({node: topics})[node]
        for key in self._positions.unmatched(options.starting, answers):
            log.warning("SPARK(%s): startingOffsets names %s, not a node read now; it applies "
                        "if that node joins", options.described, key)  # fmt: skip
        self._warn_absent(answers)
        positions: dict[str, dict[str, int]] = {}
        for (topic, node), said in _known(answers).items():
            positions.setdefault(topic, {})[node] = self._positions.resolve(
                options.starting or LATEST_BOUND, topic, node, said, start=True
            )
        return SourceOffsets(positions).to_json()

    def _warn_absent(self, answers: Mapping[str, NodeAnswer]) -> None:
        """Log once each topic of the ``subscribe`` list that no node has (yet)."""
        present = {topic for topic, _ in _known(answers)}
        for topic in self.options.topics:
            if topic not in present and topic not in self._absent:
                self._absent.add(topic)
                log.warning("SPARK(%s): no node has this topic yet; it is read from its first "
                            "message once one has", topic)  # fmt: skip
            elif topic in present:
                self._absent.discard(topic)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_per_trigger is not None:
            return ReadMaxRows(self.options.max_per_trigger)
        if self.options.min_per_trigger is not None:
            return ReadMinRows(self.options.min_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        """``Trigger.AvailableNow``: read up to the ends that exist now (fixed at the next
        plan), in as many batches as the read limits make, then stop."""
        self._available_now = True

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        """The next batch's end (see ``planner.plan_batch``); ``start`` itself when there is
        nothing to read, which ends an AvailableNow query."""
        try:
            return self._latest_offset(start, limit)
        except (LmqClientError, ValueError) as exc:
            _fail(exc)

    def _latest_offset(self, start_doc: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        options, directory = self.options, self.directory
        directory.discover()
        start = self._offsets(start_doc)
        wanted = directory.wanted()
        listed = set(wanted)
        for topic, node, _ in start.pairs():
            # A topic gone from a node shows as gone; one the query no longer reads (taken out
            # of ``subscribe``) keeps its offsets, unread.
            if node in listed and options.reads(topic):
                wanted[node].add(topic)
        answers = directory.ask(wanted)
        self._warn_absent(answers)
        known: dict[Pair, Known | None] = {}
        for node, topics in wanted.items():
            answer = answers[node]
            for topic in topics:
                if answer is None:
                    known[(topic, node)] = None
                elif topic in answer:
                    known[(topic, node)] = answer[topic]
                elif start.get(topic, node) is not None:
                    known[(topic, node)] = Known(0, 0)  # the topic is gone from the node
        if self._available_now and self._target is None:
            self._target = {pair: said.end for pair, said in known.items() if said is not None}
            for topic, node, offset in start.pairs():
                self._target.setdefault((topic, node), offset)
        max_rows = min_rows = None
        if isinstance(limit, ReadMaxRows):
            max_rows = limit.max_rows
            min_rows = options.min_per_trigger
        elif isinstance(limit, ReadMinRows):
            min_rows = limit.min_rows
        now = time.monotonic()
        self._start = start
        plan = plan_batch(
            start, known,
            new_start=self._new_start,
            target=self._target,
            max_rows=max_rows,
            min_rows=None if self._available_now else min_rows,
            delay_passed=(
                self._last_batch_at is None
                or now - self._last_batch_at >= options.max_trigger_delay_s
            ),
            count_losses=not options.fail_on_data_loss,
        )  # fmt: skip
        _report(options, directory, plan.losses)
        end_doc = plan.end.to_json()
        self._latest = SourceOffsets(plan.latest).to_json() if plan.latest else None
        if end_doc != start_doc and not plan.held:
            self._last_batch_at = now
        self._planned = (start_doc, end_doc, plan.begins)
        return start_doc if _same(plan, start) else end_doc

    def _new_start(self, topic: str, node: str, known: Known) -> int:
        """Where a pair new to a running query starts: the offset ``startingOffsets`` gives it
        by name, else its earliest (Kafka reads a new partition from its start)."""
        former = self.directory.replicated(node, topic, self._start)
        if former is not None:
            log.info("SPARK(%s): %s has the offsets of %s: it goes on from %d", topic, node,
                     former[0], former[1])  # fmt: skip
            return former[1]
        starting = self.options.starting
        if starting is not None and starting.kind == "offsets":
            value = self._positions.named(starting, topic, node)
            if value is not None:
                return self._positions.resolve(starting, topic, node, known, start=True)
        log.info("SPARK(%s): %s joins the query, read from offset %d", topic, node,
                 known.earliest)  # fmt: skip
        return known.earliest

    def reportLatestOffset(self) -> dict[str, Any] | None:
        """The ends the nodes last reported (Spark's progress shows them as ``latestOffset``)."""
        return self._latest

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        try:
            ranges = self._ranges(start, end)
        except (LmqClientError, ValueError) as exc:
            _fail(exc)
        options = self.options
        return [
            LmqPartition(*r)
            for r in split_ranges(ranges, options.partition_size, options.min_partitions)
        ]

    def _ranges(self, start_doc: dict[str, Any], end_doc: dict[str, Any]
                ) -> dict[Pair, tuple[int, int]]:  # fmt: skip
        """Each pair's ``[begin, end)``: from the plan that made ``end`` (past the losses it
        reported), or for a batch Spark replays from its checkpoint, from ``start`` (the
        executors find any offsets gone since, and report them)."""
        begins: Mapping[Pair, int] = {}
        if self._planned is not None and self._planned[:2] == (start_doc, end_doc):
            begins = self._planned[2]
        start, end = self._offsets(start_doc), self._offsets(end_doc)
        ranges = {}
        for topic, node, stop in end.pairs():
            at = start.get(topic, node)
            if at is None:
                continue  # joined in this batch, at its start: read from the next one
            begin = begins.get((topic, node), at)
            if stop < begin:  # its offsets went back (the plan reported it): the new log
                begin = 0
                if (topic, node) not in begins:
                    _report(self.options, self.directory, [Loss(topic, node, at, None)])
            ranges[(topic, node)] = (begin, stop)
        return ranges

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(self.options, partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Spark recorded ``end``: nothing to release (reading consumed nothing)."""


def _same(plan: Plan, start: SourceOffsets) -> bool:
    """Whether ``plan`` reads nothing and records nothing new (so Spark runs no batch)."""
    return plan.end.to_json() == start.to_json()

"""The source side of the ``lmq`` data source: reading topics by offset, batch and streaming.

Theory of operation
-------------------
Every message a topic stores has an offset on its daemon (docs/storage.md), and lmqd serves
them by offset without consuming anything (``GET /topic/read``, docs/http.md). The source's
position in a topic is therefore one offset per daemon, ``{"host:port": offset}``, and that is
exactly what Spark's streaming engine keeps as the source's offsets in the checkpoint:

* on the driver, ``latestOffset`` asks every daemon where its topic ends (``GET
  /topic/offsets``) and returns the new per-daemon ends (``maxMessagesPerTrigger`` spread over
  the daemons in proportion to what each has waiting);
* ``partitions(start, end)`` cuts each daemon's ``[start, end)`` into ranges of at most
  ``partitionSize`` offsets, one Spark task each;
* an executor reads its range with ``/topic/read`` requests (the daemon's binary frames, each
  answer turned into one Arrow record batch without a Python object per message).

A micro-batch is a fixed set of offset ranges: reading it again (a retried task, a query
restarted from its checkpoint) reads exactly the same messages, as long as the daemon still
stores them. So a query restarted from its checkpoint reads exactly the messages after its last
committed batch: none lost, none repeated. Reading consumes nothing, so it needs the messages
retained: give the topic a retention policy (``lmqadmin topic policy T --retention 7d``), or
keep a channel behind the reader. Offsets lost to damage, or never written (messages every
channel read from memory before anything needed them on disk), are simply absent.

A batch read (``spark.read.format("lmq")``) fixes its ranges when it is planned: from
``startingOffsets`` (default ``earliest``) to ``endingOffsets`` (default ``latest``, the ends
at planning time).

Discovery (``lookupdHttpAddress``). The daemons are then the given ``httpAddress`` ones plus
the nodes the lookupds list for the topic (``/lookup``, at ``broadcast_address:http_port``),
asked again on the driver every ``lookupdPollIntervalMs`` (10 s) while a stream runs, so the
set of nodes can change between batches. A node is identified by that HTTP address, the key
of its offset. Two rules keep a restart exact:

* a node that appears after the query's first batch (a new node, one that was unreachable, a
  topic first published there) starts at the earliest offset it stores, as Kafka's source reads
  a new partition from its start: whatever was published there since the query began is read,
  never skipped (``startingOffsets`` naming that node explicitly wins). Its range in the batch
  that first includes it is ``[0, end)``, so re-planning that batch after a restart reads the
  same messages; the planner starts the range at the node's earliest offset only so as not to
  plan tasks over offsets that are long gone;
* a node that disappears (no longer listed, or unreachable) keeps its offset: the source's
  offsets only ever gain keys, and a node that comes back continues where it stopped.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]
from pyspark.sql.datasource import (
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from lmq_client.errors import ConnectionFailed, LmqClientError
from lmq_client.http import HTTPClient, HTTPError
from lmq_client.lookupd import lookup_http_producers
from lmq_client.spark.source_options import DEFAULT_READ_COUNT, Bound, SourceOptions
from lmqd.message import READ_EXT_LENGTH, READ_FRAME
from lmqd.message_ext import decode_ext

__all__ = [
    "ARROW_SCHEMA",
    "SOURCE_SCHEMA",
    "LmqBatchReader",
    "LmqPartition",
    "LmqStreamReader",
    "read_partition",
]

log = logging.getLogger("lmq_client.spark")

SOURCE_SCHEMA = StructType([
    StructField("value", BinaryType(), False),
    StructField("id", StringType(), False),
    StructField("topic", StringType(), False),
    StructField("node", StringType(), False),
    StructField("offset", LongType(), False),
    StructField("timestamp", TimestampType(), False),
    StructField("attempts", IntegerType(), False),
    StructField("headers", MapType(StringType(), StringType()), True),
    StructField("priority", IntegerType(), False),
])
"""The rows a read returns: the body, the message id, the topic, the daemon it came from (its
HTTP address, as given in ``httpAddress`` or as the lookupds list it), the offset there, the
publish time, the attempts stored, and lmq's headers (null for none) and priority (0 for none)
of the message (``/topic/read`` with ``ext=1``; from an lmqd too old to send them: null and
0)."""

ARROW_SCHEMA = pa.schema([
    pa.field("value", pa.binary(), False),
    pa.field("id", pa.string(), False),
    pa.field("topic", pa.string(), False),
    pa.field("node", pa.string(), False),
    pa.field("offset", pa.int64(), False),
    pa.field("timestamp", pa.timestamp("us", tz="UTC"), False),
    pa.field("attempts", pa.int32(), False),
    pa.field("headers", pa.map_(pa.string(), pa.string()), True),
    pa.field("priority", pa.int32(), False),
])


class LmqPartition(InputPartition):
    """Offsets ``[start, end)`` of the topic on daemon ``node``: one Spark task."""

    def __init__(self, node: str, start: int, end: int) -> None:
        super().__init__((node, start, end))
        self.node = node
        self.start = start
        self.end = end


# -- talking to the daemons ------------------------------------------------------------------


NodeLookup = Callable[[str, str, float], list[str]]
"""``lookup(lookupd, topic, timeout)`` -> the HTTP addresses of the nodes it lists for
``topic`` (``lmq_client.lookupd.lookup_http_producers``)."""


def _lookup_http_producers(lookupd: str, topic: str, timeout: float) -> list[str]:
    return lookup_http_producers(lookupd, topic, timeout=timeout)


def find_nodes(
    options: SourceOptions, *, lookup: NodeLookup = _lookup_http_producers
) -> list[str] | None:
    """The daemons to read: ``httpAddress`` as given, then what the lookupds list for the topic.

    A lookupd that does not answer is skipped (logged); None when there are lookupds and none
    answered. ``LmqClientError`` from ``require_nodes`` says so where a read cannot do without.
    """
    found: list[str] = []
    failures: list[str] = []
    for lookupd in options.lookupd_addresses:
        try:
            found.extend(lookup(lookupd, options.topic, options.timeout_s))
        except LmqClientError as exc:
            log.warning("SPARK(%s): lookupd %s: %s", options.topic, lookupd, exc)
            failures.append(str(exc))
    if failures and len(failures) == len(options.lookupd_addresses):
        return None
    return list(dict.fromkeys([*options.addresses, *sorted(found)]))


def require_nodes(options: SourceOptions) -> list[str]:
    """``find_nodes``, or ``LmqClientError`` when no lookupd answered (a batch read, or a
    stream's start, cannot be planned without knowing its nodes)."""
    nodes = find_nodes(options)
    if nodes is None:
        raise LmqClientError(
            f"lmq source: topic {options.topic!r}: no lookupd answered "
            f"({', '.join(options.lookupd_addresses)}; see the driver's log)"
        )
    return nodes


def _offsets(client: HTTPClient, topic: str) -> dict[str, int]:
    """``/topic/offsets`` of ``topic`` (a daemon that does not have it: all zero)."""
    try:
        answer = client.topic_offsets(topic)
    except HTTPError as exc:
        if exc.status == 404:
            return {"earliest": 0, "end": 0}
        raise
    except ConnectionFailed as exc:
        if exc.reason.startswith("not an HTTP API"):
            # The commonest slip: the sink's TCP address copied into the source's options.
            raise ConnectionFailed(
                exc.address,
                "not an HTTP API: the source reads through the daemons' HTTP addresses "
                "(httpAddress, lmqd's --http-address), not their TCP addresses",
            ) from None
        raise
    return {"earliest": int(answer["earliest"]), "end": int(answer["end"])}


def _node_offsets(options: SourceOptions, address: str) -> dict[str, int]:
    return _offsets(HTTPClient(address, timeout=options.timeout_s), options.topic)


def _resolve(
    options: SourceOptions, nodes: Sequence[str], bound: Bound, default: str, *,
    skip_unreachable: bool = False,
) -> dict[str, int]:  # fmt: skip
    """Per-daemon offsets for ``bound`` (daemons it leaves out: ``default``). A daemon that
    cannot be reached fails the read, unless ``skip_unreachable`` (then it is left out)."""
    result: dict[str, int] = {}
    for address in nodes:
        if isinstance(bound, Mapping) and address in bound:
            result[address] = int(bound[address])
            continue
        which = bound if isinstance(bound, str) else default
        try:
            known = _node_offsets(options, address)
        except ConnectionFailed as exc:
            if not skip_unreachable:
                raise
            log.warning("SPARK(%s): %s left out for now: %s", options.topic, address, exc)
            continue
        result[address] = known["earliest"] if which == "earliest" else known["end"]
    return result


def _new_node_start(options: SourceOptions, address: str, known: Mapping[str, int] | None
                    ) -> int:  # fmt: skip
    """Where a node that joined a running stream starts: the offset ``startingOffsets`` gives
    it by name, else its earliest (``known``, or asked now; 0 if it cannot be asked)."""
    if isinstance(options.starting, Mapping) and address in options.starting:
        return int(options.starting[address])
    if known is None:
        try:
            known = _node_offsets(options, address)
        except LmqClientError:
            return 0  # [0, end) holds the same messages; only the task plan is coarser
    return known["earliest"]


def _split(start: Mapping[str, int], end: Mapping[str, int], size: int) -> list[LmqPartition]:
    parts = []
    for node, stop in end.items():
        first = start.get(node, 0)
        for at in range(first, stop, size):
            parts.append(LmqPartition(node, at, min(at + size, stop)))
    return parts


def read_partition(options: SourceOptions, partition: LmqPartition) -> Iterator[pa.RecordBatch]:
    """The messages of ``partition`` as Arrow record batches (one per ``/topic/read``)."""
    client = HTTPClient(partition.node, timeout=options.timeout_s)
    position = partition.start
    while position < partition.end:
        params = {
            "topic": options.topic,
            "offset": str(position),
            "count": str(min(DEFAULT_READ_COUNT, partition.end - position)),
            "end": str(partition.end),
            "ext": "1",  # each message's priority and headers
        }
        try:
            data, headers = client.request_with_headers("GET", "/topic/read", params)
        except HTTPError as exc:
            if exc.status == 404:
                return  # the topic is gone: nothing left to read
            raise
        following = int(headers.get("x-lmq-next-offset", position))
        if data:
            with_ext = headers.get("x-lmq-ext") == "1"
            yield _record_batch(data, options.topic, partition.node, with_ext=with_ext)
        if following <= position:
            log.warning(
                "SPARK(%s): %s cannot read offset %d now (see its log); partition ends early",
                options.topic,
                partition.node,
                position,
            )
            return
        position = following


def _record_batch(data: bytes, topic: str, node: str, *, with_ext: bool = False
                  ) -> pa.RecordBatch:  # fmt: skip
    """One ``/topic/read`` answer as rows of ``ARROW_SCHEMA`` (``with_ext``: its frames carry
    extension blocks, ``X-Lmq-Ext: 1``)."""
    values: list[bytes] = []
    ids: list[bytes] = []
    offsets: list[int] = []
    stamps: list[int] = []
    attempts: list[int] = []
    headers: list[list[tuple[str, str]] | None] = []
    priorities: list[int] = []
    unpack = READ_FRAME.unpack_from
    header = READ_FRAME.size
    ext_length = READ_EXT_LENGTH.unpack_from
    pos = 0
    end = len(data)
    while pos < end:
        size, offset, ts, tries, msg_id = unpack(data, pos)
        stop = pos + 4 + size
        start = pos + header
        if with_ext:
            (length,) = ext_length(data, start)
            start += 2
            if length:
                ext = decode_ext(data[start : start + length])
                start += length
                headers.append(list(ext.headers) or None)
                priorities.append(ext.priority)
            else:
                headers.append(None)
                priorities.append(0)
        values.append(data[start:stop])
        ids.append(msg_id)
        offsets.append(offset)
        stamps.append(ts // 1000)
        attempts.append(tries)
        pos = stop
    count = len(values)
    if not with_ext:
        headers = [None] * count
        priorities = [0] * count
    return pa.RecordBatch.from_arrays(
        [
            pa.array(values, pa.binary()),
            pa.array(ids, pa.binary()).cast(pa.string()),
            pa.array([topic] * count, pa.string()),
            pa.array([node] * count, pa.string()),
            pa.array(offsets, pa.int64()),
            pa.array(stamps, pa.timestamp("us", tz="UTC")),
            pa.array(attempts, pa.int32()),
            pa.array(headers, pa.map_(pa.string(), pa.string())),
            pa.array(priorities, pa.int32()),
        ],
        schema=ARROW_SCHEMA,
    )


# -- the readers --------------------------------------------------------------------------------


class LmqBatchReader(DataSourceReader):
    """``spark.read.format("lmq")``: the offsets from ``startingOffsets`` to ``endingOffsets``,
    fixed when the read is planned (on the driver)."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        nodes = require_nodes(options)
        self.start = _resolve(options, nodes, options.starting or "earliest", "earliest")
        self.end = _resolve(options, nodes, options.ending, "latest")

    def partitions(self) -> Sequence[InputPartition]:
        return _split(self.start, self.end, self.options.partition_size)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, LmqPartition)
        return read_partition(self.options, partition)


class LmqStreamReader(DataSourceStreamReader):
    """``spark.readStream.format("lmq")``: offsets per daemon as the source's Spark offsets."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._nodes: list[str] = list(options.addresses)
        self._nodes_asked_at = -math.inf
        self._unreachable: set[str] = set()

    def _current_nodes(self) -> list[str]:
        """The nodes of the last lookupd query that was answered, asked again once
        ``lookupdPollIntervalMs`` has passed (``source_options.DEFAULT_LOOKUPD_POLL_INTERVAL_MS``
        says why not every micro-batch)."""
        now = time.monotonic()
        if now - self._nodes_asked_at >= self.options.lookupd_poll_interval_s:
            self._nodes_asked_at = now
            nodes = find_nodes(self.options)
            if nodes is not None:  # no lookupd answered: keep what they said last
                self._nodes = nodes
        return self._nodes

    def initialOffset(self) -> dict[str, int]:
        """Where a query without a checkpoint starts: ``startingOffsets`` (default latest).
        A node found through a lookupd but unreachable now is left out: it joins later as a
        new node (from its earliest offset)."""
        options = self.options
        nodes = require_nodes(options)
        self._nodes, self._nodes_asked_at = nodes, time.monotonic()
        return _resolve(options, nodes, options.starting or "latest", "earliest",
                        skip_unreachable=bool(options.lookupd_addresses))  # fmt: skip

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_per_trigger is None:
            return ReadAllAvailable()
        return ReadMaxRows(self.options.max_per_trigger)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, int]:
        """Every daemon's end, or no more than ``limit`` messages past ``start`` in all.

        The daemons are those of ``start`` and those listed now. One that is no longer listed
        keeps its offset without being asked (a node that left the cluster must not cost every
        batch a connect timeout); a new one starts at its earliest offset (see the module
        docstring); one listed but not answering adds nothing to this batch."""
        options = self.options
        begins = {address: int(offset) for address, offset in start.items()}
        ends: dict[str, int] = {}
        listed = self._current_nodes()
        for address in dict.fromkeys([*begins, *listed]):
            if address not in listed:
                ends[address] = begins[address]
                continue
            known = self._ask(address, begins.get(address))
            if address not in begins:
                if known is None:
                    continue  # a new node that cannot be asked joins once it answers
                begins[address] = _new_node_start(options, address, known)
                log.info("SPARK(%s): new node %s, read from offset %d",
                         options.topic, address, begins[address])  # fmt: skip
            begin = begins[address]
            ends[address] = begin if known is None else max(begin, known["end"])
        if isinstance(limit, ReadMaxRows):
            return _spread(begins, ends, limit.max_rows)
        return ends

    def _ask(self, address: str, offset: int | None) -> dict[str, int] | None:
        """``address``'s offsets, or None if it does not answer: logged once when it stops
        answering and once when it is back (an idle stream asks every 10 ms)."""
        try:
            known = _node_offsets(self.options, address)
        except (LmqClientError, KeyError, TypeError, ValueError) as exc:  # or not lmqd's answer
            if address not in self._unreachable:
                self._unreachable.add(address)
                log.warning("SPARK(%s): %s does not answer (%s); its offset stays at %s",
                            self.options.topic, address, exc,
                            "its start" if offset is None else offset)  # fmt: skip
            return None
        if address in self._unreachable:
            self._unreachable.discard(address)
            log.info("SPARK(%s): %s answers again", self.options.topic, address)
        return known

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        begin = {k: int(v) for k, v in start.items()}
        for address in end:
            if address not in begin:  # joined in this batch: [0, end), planned from its earliest
                begin[address] = _new_node_start(self.options, address, None)
        return _split(begin, {k: int(v) for k, v in end.items()}, self.options.partition_size)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, LmqPartition)
        return read_partition(self.options, partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Spark recorded ``end``: nothing to release (reading consumed nothing)."""


def _spread(start: Mapping[str, Any], ends: Mapping[str, int], limit: int) -> dict[str, int]:
    """``ends`` cut so that at most ``limit`` offsets lie past ``start`` in all, each daemon
    getting a share in proportion to what it has waiting (at least one while any is left)."""
    waiting = {a: max(e - int(start.get(a, 0)), 0) for a, e in ends.items()}
    total = sum(waiting.values())
    if total <= limit:
        return dict(ends)
    result = {}
    left = limit
    for address, count in waiting.items():
        share = min(count, max(count * limit // total, 1 if count else 0), left)
        left -= share
        result[address] = int(start.get(address, 0)) + share
    return result

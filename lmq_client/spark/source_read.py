"""The source's executor side: reading one partition (a range of one topic on one node) with
``GET /topic/read`` and turning each answer into one Arrow record batch.

The rows' schema is Kafka's source schema where lmq has the field (``key``, always null: an lmq
message has none; ``value``; ``topic``; ``offset``; ``timestamp``, the publish time the daemon
stamps, so ``timestampType`` is Kafka's LogAppendTime, 1), with lmq's ``node`` where Kafka has a
``partition``, then lmq's own fields: the message ``id``, its stored ``attempts``, its
``priority`` and its headers as a map (``headerMap``). ``includeHeaders=true`` adds Kafka's
``headers`` column, an array of ``{key: string, value: binary}`` structs in the message's order.

Offsets a partition was due to read and did not get (deleted between planning and reading,
never written, lost to damage) are a data loss: with ``failOnDataLoss`` the task fails naming
the range, otherwise the executor logs it. The daemon counts them either way
(``reader_lost_count``), since the read asked for them.
"""

from __future__ import annotations

import array
import logging
import struct
import sys
from collections.abc import Iterator, Sequence

import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.compute as pc  # type: ignore[import-untyped]
from pyspark.sql.datasource import InputPartition
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from lmq_client.http import HTTPClient, HTTPError
from lmq_client.spark.errors import LmqDataLossError
from lmq_client.spark.planner import Loss
from lmq_client.spark.source_options import DEFAULT_READ_COUNT, SourceOptions
from lmqd.message import READ_EXT_LENGTH, READ_FRAME
from lmqd.message_ext import decode_ext

__all__ = [
    "LOG_APPEND_TIME",
    "LmqPartition",
    "arrow_schema",
    "read_partition",
    "source_schema",
]

log = logging.getLogger("lmq_client.spark")

LOG_APPEND_TIME = 1
"""Kafka's ``timestampType`` for a time the broker stamped: lmqd stamps every message."""

_BASE_FIELDS = [
    StructField("key", BinaryType(), True),
    StructField("value", BinaryType(), False),
    StructField("topic", StringType(), False),
    StructField("node", StringType(), False),
    StructField("offset", LongType(), False),
    StructField("timestamp", TimestampType(), False),
    StructField("timestampType", IntegerType(), False),
    StructField("id", StringType(), False),
    StructField("attempts", IntegerType(), False),
    StructField("priority", IntegerType(), False),
    StructField("headerMap", MapType(StringType(), StringType()), True),
]
_KAFKA_HEADERS = StructField(
    "headers",
    ArrayType(StructType([
        StructField("key", StringType(), False),
        StructField("value", BinaryType(), True),
    ]), False),
    True,
)  # fmt: skip

_ARROW_BASE = [
    pa.field("key", pa.binary(), True),
    pa.field("value", pa.binary(), False),
    pa.field("topic", pa.string(), False),
    pa.field("node", pa.string(), False),
    pa.field("offset", pa.int64(), False),
    pa.field("timestamp", pa.timestamp("us", tz="UTC"), False),
    pa.field("timestampType", pa.int32(), False),
    pa.field("id", pa.string(), False),
    pa.field("attempts", pa.int32(), False),
    pa.field("priority", pa.int32(), False),
    pa.field("headerMap", pa.map_(pa.string(), pa.string()), True),
]
_ARROW_HEADERS_TYPE = pa.list_(
    pa.field("element", pa.struct([
        pa.field("key", pa.string(), False), pa.field("value", pa.binary(), True),
    ]), False)
)  # fmt: skip
_ARROW_WITH_HEADERS = pa.schema([*_ARROW_BASE, pa.field("headers", _ARROW_HEADERS_TYPE, True)])
_ARROW_WITHOUT = pa.schema(_ARROW_BASE)


def source_schema(include_headers: bool) -> StructType:
    """The columns a read returns (``includeHeaders`` adds Kafka's ``headers``)."""
    return StructType([*_BASE_FIELDS, *([_KAFKA_HEADERS] if include_headers else [])])


def arrow_schema(include_headers: bool) -> pa.Schema:
    return _ARROW_WITH_HEADERS if include_headers else _ARROW_WITHOUT


class LmqPartition(InputPartition):
    """Offsets ``[start, end)`` of ``topic`` on ``node``: one Spark task."""

    def __init__(self, topic: str, node: str, start: int, end: int) -> None:
        super().__init__((topic, node, start, end))
        self.topic = topic
        self.node = node
        self.start = start
        self.end = end


def read_partition(options: SourceOptions, partition: InputPartition) -> Iterator[pa.RecordBatch]:
    """The messages of ``partition`` as Arrow record batches (one per ``/topic/read``). A
    partition that is not an ``LmqPartition`` is PySpark's stand-in for an empty plan (it runs
    one task with ``InputPartition(None)`` when there are none): it reads nothing."""
    if not isinstance(partition, LmqPartition):
        return
    client = HTTPClient(partition.node, timeout=options.timeout_s)
    topic, node = partition.topic, partition.node
    position = partition.start
    while position < partition.end:
        params = {
            "topic": topic,
            "offset": str(position),
            "count": str(min(DEFAULT_READ_COUNT, partition.end - position)),
            "end": str(partition.end),
            "ext": "1",  # each message's priority and headers
        }
        try:
            data, headers = client.request_with_headers("GET", "/topic/read", params)
        except HTTPError as exc:
            if exc.status != 404:
                raise
            following = partition.end  # the topic is gone, and the rest of the range with it
            _lost(options, Loss(topic, node, position, following))
            return
        following = int(headers.get("x-lmq-next-offset", position))
        if following <= position:
            log.warning("SPARK(%s): %s cannot read offset %d now (see its log); partition ends "
                        "early", topic, node, position)  # fmt: skip
            return
        if data:
            batch = record_batch(
                data, topic, node, with_ext=headers.get("x-lmq-ext") == "1",
                include_headers=options.include_headers,
            )  # fmt: skip
            offsets = batch.column(4)
            count = len(offsets)
            if (count != following - position or offsets[0].as_py() != position
                    or offsets[count - 1].as_py() != following - 1):  # fmt: skip
                for loss in _gaps(topic, node, position, offsets.to_pylist(), following):
                    _lost(options, loss)
            yield batch
        else:
            _lost(options, Loss(topic, node, position, following))
        position = following


def _gaps(topic: str, node: str, position: int, offsets: Sequence[int], following: int
          ) -> Iterator[Loss]:  # fmt: skip
    """The ranges of ``[position, following)`` that are not in ``offsets`` (increasing)."""
    expected = position
    for offset in [*offsets, following]:
        if offset > expected:
            yield Loss(topic, node, expected, offset)
        expected = offset + 1


def _lost(options: SourceOptions, loss: Loss) -> None:
    if options.fail_on_data_loss:
        raise LmqDataLossError(f"lmq source: {loss.describe()}; {FAIL_HINT}")
    log.warning("SPARK(%s): %s; going on (failOnDataLoss=false)", loss.topic, loss.describe())


FAIL_HINT = (
    "the query fails on data loss (failOnDataLoss=true); to go on past it, run it with option "
    "failOnDataLoss=false (the loss is then logged and counted in its offsets under #lost)"
)


def record_batch(
    data: bytes, topic: str, node: str, *, with_ext: bool = False, include_headers: bool = False
) -> pa.RecordBatch:
    """One ``/topic/read`` answer as rows of ``arrow_schema(include_headers)`` (``with_ext``:
    its frames carry extension blocks, ``X-Lmq-Ext: 1``).

    Column-wise: the frames lie back to back, so their start positions (found by one step per
    frame along the size fields, the only per-message Python) make ``data`` itself an Arrow
    binary array of whole frames, and every field is an Arrow slice of it (fixed-width integers
    byte-swapped from the wire's big-endian in C). An answer with extension blocks (messages
    with headers or a priority) is decoded message by message (``_record_batch_by_message``)."""
    starts = array.array("i")
    size = _SIZE.unpack_from
    pos = 0
    end = len(data)
    while pos < end:
        starts.append(pos)
        pos += 4 + size(data, pos)[0]
    if pos != end:
        raise ValueError(f"/topic/read from {node}: a frame runs past the answer's end")
    count = len(starts)
    starts.append(end)
    frames = pa.BinaryArray.from_buffers(
        pa.binary(), count, [None, pa.py_buffer(starts), pa.py_buffer(data)]
    )
    header = READ_FRAME.size
    if count and pc.min(pc.binary_length(frames)).as_py() < header + (2 if with_ext else 0):
        raise ValueError(f"/topic/read from {node}: a frame shorter than its header")
    if with_ext:
        if count and pc.max(_big_endian(frames, header, 2)).as_py():
            return _record_batch_by_message(data, topic, node, include_headers)
        header += READ_EXT_LENGTH.size
    offsets = _big_endian(frames, 4, 8)
    columns = [
        pa.nulls(count, pa.binary()),
        pc.binary_slice(frames, header, _NO_END),
        pa.repeat(pa.scalar(topic, pa.string()), count),
        pa.repeat(pa.scalar(node, pa.string()), count),
        offsets,
        pc.divide(_big_endian(frames, 12, 8), 1000).cast(pa.timestamp("us", tz="UTC")),
        pa.repeat(pa.scalar(LOG_APPEND_TIME, pa.int32()), count),
        pc.binary_slice(frames, 22, 38).cast(pa.string()),
        _big_endian(frames, 20, 2).cast(pa.int32()),
        pa.repeat(pa.scalar(0, pa.int32()), count),
        pa.nulls(count, pa.map_(pa.string(), pa.string())),
    ]
    if include_headers:
        columns.append(pa.nulls(count, _ARROW_HEADERS_TYPE))
    return pa.RecordBatch.from_arrays(columns, schema=arrow_schema(include_headers))


_SIZE = struct.Struct(">I")
_NO_END = 1 << 31  # binary_slice up to the frame's end (pyarrow 26 errs on stop=None)
_WORDS = {2: ("H", pa.uint16()), 8: ("q", pa.int64())}


def _big_endian(frames: pa.Array, start: int, width: int) -> pa.Array:
    """The big-endian integer at bytes ``start..start+width`` of every frame."""
    typecode, kind = _WORDS[width]
    field = pc.binary_slice(frames, start, start + width)
    words = array.array(typecode)
    if len(field):
        words.frombytes(memoryview(field.buffers()[2])[: len(field) * width])
        if sys.byteorder == "little":
            words.byteswap()
    return pa.Array.from_buffers(kind, len(field), [None, pa.py_buffer(words)])


def _record_batch_by_message(
    data: bytes, topic: str, node: str, include_headers: bool
) -> pa.RecordBatch:
    """``record_batch`` of an answer whose frames carry extension blocks, one message at a
    time (each block decoded by ``lmqd.message_ext.decode_ext``)."""
    values: list[bytes] = []
    ids: list[bytes] = []
    offsets: list[int] = []
    stamps: list[int] = []
    attempts: list[int] = []
    header_lists: list[list[tuple[str, str]] | None] = []
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
        (length,) = ext_length(data, start)
        start += 2
        if length:
            ext = decode_ext(data[start : start + length])
            start += length
            header_lists.append(list(ext.headers) or None)
            priorities.append(ext.priority)
        else:
            header_lists.append(None)
            priorities.append(0)
        values.append(data[start:stop])
        ids.append(msg_id)
        offsets.append(offset)
        stamps.append(ts // 1000)
        attempts.append(tries)
        pos = stop
    count = len(values)
    columns = [
        pa.nulls(count, pa.binary()),
        pa.array(values, pa.binary()),
        pa.array([topic] * count, pa.string()),
        pa.array([node] * count, pa.string()),
        pa.array(offsets, pa.int64()),
        pa.array(stamps, pa.timestamp("us", tz="UTC")),
        pa.array([LOG_APPEND_TIME] * count, pa.int32()),
        pa.array(ids, pa.binary()).cast(pa.string()),
        pa.array(attempts, pa.int32()),
        pa.array(priorities, pa.int32()),
        pa.array(header_lists, pa.map_(pa.string(), pa.string())),
    ]
    if include_headers:
        kafka = [
            None if pairs is None else [{"key": k, "value": v.encode()} for k, v in pairs]
            for pairs in header_lists
        ]
        columns.append(pa.array(kafka, _ARROW_HEADERS_TYPE))
    return pa.RecordBatch.from_arrays(columns, schema=arrow_schema(include_headers))

"""Arrow record batches -> message bodies (and per-row delays), a whole batch at a time.

Spark's Arrow writer path hands each task its rows as ``pyarrow.RecordBatch`` objects
(``spark.sql.execution.arrow.maxRecordsPerBatch`` rows each, 10 000 by default). Everything here
works column-wise: a body column stays an Arrow ``binary`` array (cast from a string column),
null or empty bodies are found with Arrow compute kernels instead of a Python test per row, and a
stream's dedup ids become extension blocks in Arrow too (``frames.py`` turns both into the
wire's items). Per row: the JSON encoding of whole rows, and the blocks of rows with headers, a
priority or a TTL (``MessageExt`` objects, checked one by one).

JSON rows: one object per row, keys in column order, nested structs as objects, maps as objects,
arrays as lists, null as ``null``; timestamps and dates in ISO 8601 (``isoformat()``; timestamps
carry the session time zone's offset), decimals as strings (exact digits), binary as base64, NaN
and infinities as the bare tokens Python's ``json`` writes. For Spark's own JSON
(``spark.sql.jsonGenerator.*`` settings), build a string column with ``to_json(struct(*))`` and
name it as ``bodyColumn``.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import json
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.compute as pc  # type: ignore[import-untyped]

from lmq_client._util import check_name
from lmq_client.spark.frames import binary_bodies, blocks_of, dedup_blocks
from lmq_client.spark.options import SinkOptions
from lmqd.message_ext import MAX_PRIORITY, MAX_TTL_MS, NO_EXT, ExtError, MessageExt, validate

__all__ = ["BadRowError", "RowEncoder", "json_default"]


def json_default(value: object) -> object:
    """``json``'s fallback for the Python values Arrow produces that JSON has no type for."""
    if isinstance(value, datetime.datetime | datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    raise TypeError(f"cannot write {type(value).__name__} as JSON")


_JSON = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, default=json_default)


class RowEncoder:
    """Encodes one task's record batches with the options' body column (or JSON) and delays.

    ``encode(batch, first_row)`` returns ``(bodies, delays)``: ``bodies`` a ``binary`` Arrow
    array, ``delays`` None when every row takes ``options.defer_ms``, else one delay in ms per
    row; ``blocks`` gives each row's extension block, if any. ``first_row`` (the batch's first
    row's index in the task) only makes error messages point at the offending row. A row that
    cannot be a message (null or empty body, negative delay) raises ``BadRowError``.
    """

    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def encode(self, batch: Any, first_row: int = 0) -> tuple[Any, list[int] | None]:
        """The batch's bodies and delays."""
        if self.options.body_column is not None:
            bodies = self._column_bodies(batch, self.options.body_column, first_row)
        else:
            bodies = self._json_bodies(batch)
        delays = None
        if self.options.defer_column is not None:
            delays = self._delays(batch, self.options.defer_column, first_row)
        return bodies, delays

    def _column_bodies(self, batch: Any, name: str, first_row: int) -> Any:
        column = binary_bodies(batch.column(name))
        if column.null_count:
            row = first_row + _first_true(column.is_null())
            raise BadRowError(f"row {row} has a null {name!r}: a message needs a body")
        if len(column) and pc.min(pc.binary_length(column)).as_py() == 0:
            row = first_row + _first_true(pc.equal(pc.binary_length(column), 0))
            raise BadRowError(f"row {row} has an empty {name!r}: NSQ accepts no empty message")
        return column

    def topics(self, batch: Any, first_row: int = 0) -> list[str] | None:
        """Each row's topic from the topic column (None: every row goes to the ``topic``
        option's). Every distinct name is checked once, with NSQ's rules."""
        name = self.options.topic_column
        if name is None or self.options.topic:
            return None
        column = batch.column(name)
        if column.null_count:
            row = first_row + _first_true(column.is_null())
            raise BadRowError(f"row {row} has a null {name!r}: it routes the row to a topic")
        for topic in pc.unique(column).to_pylist():
            try:
                check_name("topic", topic)
            except ValueError as exc:
                row = first_row + _first_true(pc.equal(column, topic))
                raise BadRowError(f"row {row}: {exc}") from None
        topics: list[str] = column.to_pylist()
        return topics

    def _json_bodies(self, batch: Any) -> Any:
        # delivery metadata, not part of the message
        skip = self.options.metadata_columns
        names: list[str] = []
        columns: list[list[Any]] = []
        for name, column in zip(batch.schema.names, batch.columns, strict=True):
            if name in skip:
                continue
            names.append(name)
            columns.append(column.to_pylist(maps_as_pydicts="strict"))
        encode = _JSON.encode
        return pa.array([
            encode(dict(zip(names, values, strict=True))).encode()
            for values in zip(*columns, strict=True)
        ] if columns else [b"{}"] * batch.num_rows, pa.binary())  # fmt: skip

    def blocks(self, batch: Any, first_row: int = 0, dedup_prefix: bytes | None = None) -> Any:
        """Each row's extension block (a ``binary`` Arrow array), from ``exts``; None when no
        row carries any. Rows whose only field is a dedup id get theirs without a
        ``MessageExt`` per row (``frames.dedup_blocks``)."""
        if not self.options.has_extension:
            if dedup_prefix is None:
                return None
            return dedup_blocks(dedup_prefix, first_row, batch.num_rows)
        exts = self.exts(batch, first_row, dedup_prefix)
        return None if exts is None else blocks_of(exts)

    def exts(
        self, batch: Any, first_row: int = 0, dedup_prefix: bytes | None = None
    ) -> list[MessageExt] | None:
        """Each row's lmq extension from the headers, priority and TTL columns and, with
        ``dedup_prefix``, its dedup id ``dedup_prefix + str(row index in the task)``; None when
        no row carries any (the options name no such column and no prefix is given). A value
        out of the extension's bounds raises ``BadRowError`` naming the row and the column."""
        options = self.options
        if not options.has_extension and dedup_prefix is None:
            return None
        n = batch.num_rows
        priorities = self._bounded(batch, options.priority_column, first_row, MAX_PRIORITY)
        ttls = self._bounded(batch, options.ttl_column, first_row, MAX_TTL_MS)
        headers = self._headers(batch, first_row)
        ids: list[bytes] | list[None] = (
            [b"%s%d" % (dedup_prefix, first_row + i) for i in range(n)]
            if dedup_prefix is not None else [None] * n
        )  # fmt: skip
        out: list[MessageExt] = []
        for i in range(n):
            priority = priorities[i] if priorities is not None else 0
            ttl_ms = ttls[i] if ttls is not None else 0
            row_headers = headers[i] if headers is not None else ()
            dedup_id = ids[i] or b""
            if not (priority or ttl_ms or row_headers or dedup_id):
                out.append(NO_EXT)
                continue
            ext = MessageExt(priority, ttl_ms, dedup_id, row_headers)
            if row_headers:
                try:
                    validate(ext)
                except ExtError as exc:
                    raise BadRowError(
                        f"row {first_row + i}: column {options.headers_column!r}: {exc}"
                    ) from None
            out.append(ext)
        return out

    @staticmethod
    def _bounded(batch: Any, name: str | None, first_row: int, highest: int) -> list[int] | None:
        """An integer column's values (null: 0), each within ``0..highest``."""
        if name is None:
            return None
        column = batch.column(name)
        if len(column) and column.null_count < len(column):
            low, high = pc.min_max(column).values()
            if low.as_py() < 0 or high.as_py() > highest:
                bad = pc.or_(pc.less(column, 0), pc.greater(column, highest))
                row = first_row + _first_true(pc.fill_null(bad, False))
                value = column[row - first_row].as_py()
                raise BadRowError(
                    f"row {row}: column {name!r}: {value} out of range 0..{highest}"
                )
        return [v or 0 for v in column.to_pylist()]

    def _headers(self, batch: Any, first_row: int) -> list[tuple[tuple[str, str], ...]] | None:
        """Each row's headers as the extension holds them (a null or empty map: none)."""
        name = self.options.headers_column
        if name is None:
            return None
        column = batch.column(name)
        out: list[tuple[tuple[str, str], ...]] = []
        if pa.types.is_map(column.type):
            for i, entries in enumerate(column.to_pylist()):
                if entries and any(value is None for _, value in entries):
                    raise BadRowError(
                        f"row {first_row + i}: column {name!r}: a header with a null value"
                    )
                out.append(tuple(entries) if entries else ())
            return out
        # Kafka's array<struct<key, value>>: values may be binary, and must be UTF-8 here.
        for i, entries in enumerate(column.to_pylist()):
            if not entries:
                out.append(())
                continue
            pairs = []
            for entry in entries:
                key, value = entry["key"], entry["value"]
                if key is None or value is None:
                    raise BadRowError(
                        f"row {first_row + i}: column {name!r}: a header with a null key or "
                        "value"
                    )
                if isinstance(value, bytes):
                    try:
                        value = value.decode("utf-8")
                    except UnicodeDecodeError:
                        raise BadRowError(
                            f"row {first_row + i}: column {name!r}: header {key!r} is not "
                            "UTF-8 (lmq headers are text)"
                        ) from None
                pairs.append((key, value))
            out.append(tuple(pairs))
        return out

    def _delays(self, batch: Any, name: str, first_row: int) -> list[int]:
        column = batch.column(name)
        if len(column) and (pc.min(column).as_py() or 0) < 0:
            row = first_row + _first_true(pc.less(column, 0))
            raise BadRowError(f"row {row} has a negative {name!r}: delays are milliseconds >= 0")
        default = self.options.defer_ms
        return [default if d is None else d for d in column.to_pylist()]



class BadRowError(ValueError):
    """A row that cannot become a message; the writer turns it into an ``LmqSinkError``."""


def _first_true(mask: Any) -> int:
    index: int = pc.index(mask, True).as_py()
    return index

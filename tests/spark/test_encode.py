"""RowEncoder: Arrow record batches (as Spark hands them to a task) -> bodies and delays.

No Spark session: the batches are built with pyarrow in the types Spark's Arrow writer path
uses (string, binary, int64, timestamp[us, tz], map<...> and so on).
"""

from __future__ import annotations

import base64
import datetime
import decimal
import json
import re

import pyarrow as pa  # type: ignore[import-untyped]
import pytest

from lmq_client.spark import SinkOptions
from lmq_client.spark.encode import BadRowError, RowEncoder, json_default


def _encode(encoder: RowEncoder, batch: object, first_row: int = 0
            ) -> tuple[list[bytes], list[int] | None]:  # fmt: skip
    """``encode`` with the bodies as a list (the encoder keeps them in Arrow)."""
    bodies, delays = encoder.encode(batch, first_row)
    assert bodies.type == pa.binary()
    return bodies.to_pylist(), delays


def _encoder(**kwargs: object) -> RowEncoder:
    return RowEncoder(SinkOptions(addresses=("h:1",), topic="t", **kwargs))  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", [pa.string(), pa.large_string(), pa.binary(), pa.large_binary()])
def test_body_column_becomes_bytes(kind: object) -> None:
    values = ["a", "héllo", "x" * 300]
    array = pa.array(values if str(kind).endswith("string") else [v.encode() for v in values],
                     type=kind)
    batch = pa.record_batch([pa.array([1, 2, 3]), array], names=["id", "v"])
    bodies, delays = _encode(_encoder(body_column="v"), batch)
    assert bodies == [b"a", "héllo".encode(), b"x" * 300]
    assert all(type(body) is bytes for body in bodies)
    assert delays is None


def test_a_null_body_names_the_row_within_the_task() -> None:
    batch = pa.record_batch([pa.array(["a", "b", None, None])], names=["v"])
    with pytest.raises(BadRowError, match=r"^row 1002 has a null 'v': a message needs a body$"):
        _encode(_encoder(body_column="v"), batch, first_row=1000)


def test_an_empty_body_names_the_row() -> None:
    batch = pa.record_batch([pa.array([b"a", b"b", b"c", b""])], names=["v"])
    with pytest.raises(BadRowError, match=r"^row 3 has an empty 'v': NSQ accepts no empty mes"):
        _encode(_encoder(body_column="v"), batch)


def test_an_empty_batch_gives_no_bodies() -> None:
    batch = pa.record_batch([pa.array([], type=pa.string())], names=["v"])
    assert _encode(_encoder(body_column="v"), batch) == ([], None)
    assert _encode(_encoder(), batch) == ([], None)


def test_rows_as_json_objects_with_every_common_type() -> None:
    utc = datetime.UTC
    batch = pa.record_batch(
        [
            pa.array([1, None], type=pa.int64()),
            pa.array(["ünï", "b\"q"]),
            pa.array([1.5, None]),
            pa.array([True, False]),
            pa.array([datetime.datetime(2026, 1, 2, 3, 4, 5, 6000, tzinfo=utc), None],
                     type=pa.timestamp("us", tz="Etc/UTC")),
            pa.array([datetime.datetime(2026, 1, 2, 3, 4, 5), None], type=pa.timestamp("us")),
            pa.array([datetime.date(2026, 1, 2), None], type=pa.date32()),
            pa.array([decimal.Decimal("12.30"), None], type=pa.decimal128(10, 2)),
            pa.array([b"\x00\xff", None], type=pa.binary()),
            pa.array([[1, 2], []], type=pa.list_(pa.int32())),
            pa.array([{"a": 1, "b": "x"}, None],
                     type=pa.struct([("a", pa.int32()), ("b", pa.string())])),
            pa.array([[("k", 1)], None], type=pa.map_(pa.string(), pa.int64())),
        ],
        names=["id", "s", "f", "ok", "ts", "ntz", "d", "dec", "bin", "arr", "st", "m"],
    )
    bodies, delays = _encode(_encoder(), batch)
    assert delays is None
    assert bodies[0] == (
        '{"id":1,"s":"ünï","f":1.5,"ok":true,"ts":"2026-01-02T03:04:05.006000+00:00",'
        '"ntz":"2026-01-02T03:04:05","d":"2026-01-02","dec":"12.30","bin":"AP8=",'
        '"arr":[1,2],"st":{"a":1,"b":"x"},"m":{"k":1}}'
    ).encode()
    assert json.loads(bodies[1]) == {
        "id": None, "s": 'b"q', "f": None, "ok": False, "ts": None, "ntz": None, "d": None,
        "dec": None, "bin": None, "arr": [], "st": None, "m": None,
    }


def test_json_rows_leave_out_the_delay_column() -> None:
    batch = pa.record_batch([pa.array(["a", "b"]), pa.array([5, None])], names=["v", "wait"])
    bodies, delays = _encode(_encoder(defer_column="wait", defer_ms=7), batch)
    assert bodies == [b'{"v":"a"}', b'{"v":"b"}']
    assert delays == [5, 7]  # null: the deferMs option


def test_a_batch_with_only_the_delay_column_sends_empty_objects() -> None:
    batch = pa.record_batch([pa.array([1, 2])], names=["wait"])
    assert _encode(_encoder(defer_column="wait"), batch) == ([b"{}", b"{}"], [1, 2])


def test_delays_from_a_column_next_to_a_body_column() -> None:
    batch = pa.record_batch(
        [pa.array(["a", "b", "c"]), pa.array([0, 250, None], type=pa.int32())],
        names=["v", "wait"],
    )
    assert _encode(_encoder(body_column="v", defer_column="wait"), batch) == (
        [b"a", b"b", b"c"], [0, 250, 0]
    )


def test_a_negative_delay_names_the_row() -> None:
    batch = pa.record_batch([pa.array([3, None, -1])], names=["wait"])
    with pytest.raises(BadRowError, match=r"^row 12 has a negative 'wait': delays are"):
        _encode(_encoder(defer_column="wait"), batch, first_row=10)


def test_json_default_for_what_json_lacks() -> None:
    assert json_default(datetime.time(1, 2, 3)) == "01:02:03"
    assert json_default(datetime.timedelta(days=1, milliseconds=5)) == 86400.005
    assert json_default(memoryview(b"ab")) == base64.b64encode(b"ab").decode()
    with pytest.raises(TypeError, match="cannot write object as JSON"):
        json_default(object())


# -- lmq's per-message fields: headers, priority, TTL, dedup ids ------------------------------


def _headers_batch(headers: list[object], kind: object = None) -> pa.RecordBatch:
    kind = kind or pa.map_(pa.string(), pa.string())
    return pa.record_batch(
        [pa.array([f"b{i}" for i in range(len(headers))]), pa.array(headers, type=kind)],
        names=["v", "headers"],
    )


def test_a_headers_map_becomes_each_rows_headers() -> None:
    batch = _headers_batch([[("k", "v"), ("trace", "abc")], None, []])
    exts = _encoder(body_column="v", headers_column="headers").exts(batch)
    assert exts is not None
    assert [e.headers for e in exts] == [(("k", "v"), ("trace", "abc")), (), ()]
    assert [e.dedup_id for e in exts] == [b"", b"", b""]


def test_kafkas_headers_array_is_taken_too_with_utf8_values() -> None:
    kind = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
    batch = _headers_batch([[{"key": "k", "value": "é".encode()}], None], kind)
    exts = _encoder(body_column="v", headers_column="headers").exts(batch)
    assert exts is not None and [e.headers for e in exts] == [(("k", "é"),), ()]
    bad = _headers_batch([None, [{"key": "k", "value": b"\xff"}]], kind)
    with pytest.raises(BadRowError, match=r"^row 8: column 'headers': header 'k' is not UTF-8"):
        _encoder(body_column="v", headers_column="headers").exts(bad, first_row=7)


@pytest.mark.parametrize(
    ("headers", "message"),
    [
        ([("", "v")], "a header key must be 1..255 bytes"),
        ([(f"k{i}", "v") for i in range(65)], "more than 64 headers"),
        ([("k", "x" * 20000)], "headers larger than 16384 bytes"),
        ([("k\n", "v")], "header key 'k\\\\n' has a control character"),
        ([("k", None)], "a header with a null value"),
    ],
)
def test_bad_headers_name_the_row_and_the_column(headers: list[object], message: str) -> None:
    batch = _headers_batch([[("ok", "1")], headers])
    with pytest.raises(BadRowError, match=rf"^row 11: column 'headers': {message}"):
        _encoder(body_column="v", headers_column="headers").exts(batch, first_row=10)


def test_priority_and_ttl_columns_with_nulls_as_none() -> None:
    batch = pa.record_batch(
        [pa.array(["a", "b", "c"]), pa.array([9, None, 0], pa.int32()),
         pa.array([None, 60000, 1], pa.int64())],
        names=["v", "prio", "ttl"],
    )  # fmt: skip
    exts = _encoder(body_column="v", priority_column="prio", ttl_column="ttl").exts(batch)
    assert exts is not None
    assert [(e.priority, e.ttl_ms) for e in exts] == [(9, 0), (0, 60000), (0, 1)]


@pytest.mark.parametrize(
    ("column", "values", "message"),
    [
        ("prio", [1, 10], "row 6: column 'prio': 10 out of range 0..9"),
        ("prio", [None, -1], "row 6: column 'prio': -1 out of range 0..9"),
        ("ttl", [-5, 1], "row 5: column 'ttl': -5 out of range 0..4294967295"),
    ],
)
def test_priority_or_ttl_out_of_range_names_the_row(
    column: str, values: list[int | None], message: str
) -> None:
    batch = pa.record_batch([pa.array(["a", "b"]), pa.array(values, pa.int64())],
                            names=["v", column])  # fmt: skip
    encoder = _encoder(body_column="v", **{f"{'priority' if column == 'prio' else 'ttl'}_column":
                                           column})  # fmt: skip
    with pytest.raises(BadRowError, match=rf"^{re.escape(message)}$"):
        encoder.exts(batch, first_row=5)


def test_dedup_ids_number_the_rows_of_the_task() -> None:
    batch = pa.record_batch([pa.array(["a", "b"])], names=["v"])
    encoder = _encoder(body_column="v")
    assert encoder.exts(batch) is None  # no column, no prefix: nsqd's MPUB
    exts = encoder.exts(batch, first_row=998, dedup_prefix=b"Q:3:1:")
    assert exts is not None and [e.dedup_id for e in exts] == [b"Q:3:1:998", b"Q:3:1:999"]


def test_metadata_columns_are_left_out_of_json_rows() -> None:
    batch = pa.record_batch(
        [pa.array([1]), pa.array([[("k", "v")]], pa.map_(pa.string(), pa.string())),
         pa.array([3])],
        names=["n", "headers", "prio"],
    )  # fmt: skip
    bodies, _ = _encode(_encoder(headers_column="headers", priority_column="prio"), batch)
    assert bodies == [b'{"n":1}']

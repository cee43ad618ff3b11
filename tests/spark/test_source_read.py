"""source_read.record_batch: a ``/topic/read`` answer as Arrow rows, checked against the
daemon's own frame encoder (``lmqd.message.encode_read_frames``). No Spark, no daemon."""

from __future__ import annotations

import datetime

import pytest

from lmq_client.spark.source_read import LOG_APPEND_TIME, arrow_schema, record_batch
from lmqd.message import Message, encode_read_frames
from lmqd.message_ext import MessageExt

STAMP_NS = 1_767_225_600_123_456_789  # 2026-01-01T00:00:00.123456789Z


def _messages(with_block: bool) -> list[tuple[int, Message]]:
    out = []
    for i, body in enumerate([b"a", b"x" * 300, "héllo".encode(), b"\x00" * 70_000]):
        message = Message(b"%016x" % (i + 1), body, STAMP_NS + i * 1000, i)
        if with_block and i == 2:
            message.ext = MessageExt(priority=7, headers=(("k", "v"), ("trace", "t-1")))
        out.append((41 + i, message))
    return out


@pytest.mark.parametrize(("with_ext", "with_block"), [(False, False), (True, False), (True, True)])
@pytest.mark.parametrize("include_headers", [False, True])
def test_every_field_of_every_frame(with_ext: bool, with_block: bool, include_headers: bool
                                    ) -> None:  # fmt: skip
    messages = _messages(with_block)
    data = encode_read_frames(messages, ext=with_ext)
    batch = record_batch(data, "t", "n:1", with_ext=with_ext, include_headers=include_headers)
    assert batch.schema == arrow_schema(include_headers)
    rows = batch.to_pylist()
    assert [r["offset"] for r in rows] == [41, 42, 43, 44]
    assert [r["value"] for r in rows] == [m.body for _, m in messages]
    assert [r["id"] for r in rows] == [m.id.decode() for _, m in messages]
    assert [r["attempts"] for r in rows] == [0, 1, 2, 3]
    assert {(r["key"], r["topic"], r["node"], r["timestampType"]) for r in rows} == {
        (None, "t", "n:1", LOG_APPEND_TIME)
    }
    first = datetime.datetime(2026, 1, 1, 0, 0, 0, 123456, tzinfo=datetime.UTC)
    assert [r["timestamp"] for r in rows] == [
        first + datetime.timedelta(microseconds=i) for i in range(4)
    ]
    headers = [("k", "v"), ("trace", "t-1")] if with_block else None
    assert [r["priority"] for r in rows] == [0, 0, 7 if with_block else 0, 0]
    assert [r["headerMap"] for r in rows] == [None, None, headers, None]
    if include_headers:
        kafka = [{"key": k, "value": v.encode()} for k, v in headers] if headers else None
        assert [r["headers"] for r in rows] == [None, None, kafka, None]


def test_an_empty_answer_is_an_empty_batch() -> None:
    assert record_batch(b"", "t", "n:1", with_ext=True).num_rows == 0


@pytest.mark.parametrize("cut", [1, 10, 39])
def test_a_truncated_answer_is_an_error(cut: int) -> None:
    data = encode_read_frames(_messages(False)[:1], ext=True)
    with pytest.raises(ValueError, match="n:1"):
        record_batch(data[:-cut] if cut < len(data) - 4 else data[:4], "t", "n:1", with_ext=True)

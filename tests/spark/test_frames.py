"""frames.py: the wire items built from Arrow columns are byte for byte what the protocol's own
encoders (``lmqd.protocol``: ``Mpub``, ``encode_xpub``) make of the same messages, and what the
daemon's parser reads back. No Spark, no daemon."""

from __future__ import annotations

import pyarrow as pa  # type: ignore[import-untyped]
import pytest

from lmq_client.spark.frames import NO_BLOCK, blocks_of, dedup_blocks, items_of
from lmqd.message_ext import MessageExt, decode_ext, encode_ext
from lmqd.protocol import Mpub
from lmqd.protocol.extension import XpubMessage, encode_xpub

BODIES = [b"a", b"x" * 300, "héllo".encode(), b"\x00\xff" * 40_000]


def _after_count(command: bytes) -> bytes:
    """A MPUB/XPUB command's messages: what follows its line, body size and count."""
    return command[command.index(b"\n") + 9 :]


def test_mpub_items_are_the_mpub_encoders_bytes() -> None:
    items = items_of(pa.array(BODIES, pa.binary()))
    assert not items.extension and len(items) == 4
    expected = _after_count(Mpub(topic="t", bodies=BODIES).encode())
    assert bytes(items.slice(0, 4)) == expected
    assert b"".join(bytes(items.slice(i, i + 1)) for i in range(4)) == expected
    assert items.size(1, 3) == 4 + 300 + 4 + len("héllo".encode())


@pytest.mark.parametrize(
    "exts",
    [
        [MessageExt()] * 4,
        [MessageExt(priority=3, ttl_ms=5, dedup_id=b"q:1:0:7"), MessageExt(),
         MessageExt(headers=(("k", "v"), ("é", "ü" * 10))), MessageExt(dedup_id=b"z" * 255)],
    ],
)  # fmt: skip
def test_xpub_items_are_the_xpub_encoders_bytes(exts: list[MessageExt]) -> None:
    items = items_of(pa.array(BODIES, pa.binary()), blocks_of(exts))
    assert items.extension
    messages = [XpubMessage(b, e) for b, e in zip(BODIES, exts, strict=True)]
    assert bytes(items.slice(0, 4)) == _after_count(encode_xpub("t", messages))


def test_dedup_blocks_name_each_row_after_the_prefix() -> None:
    blocks = dedup_blocks(b"Q:17:3:", 998, 3)
    assert [decode_ext(b).dedup_id for b in blocks.to_pylist()] == [
        b"Q:17:3:998", b"Q:17:3:999", b"Q:17:3:1000"
    ]  # fmt: skip
    assert blocks.to_pylist() == [encode_ext(MessageExt(dedup_id=b"Q:17:3:%d" % i))
                                  for i in (998, 999, 1000)]  # fmt: skip
    assert dedup_blocks(b"Q:", 0, 0).to_pylist() == []
    with pytest.raises(ValueError, match="longer than 255"):
        dedup_blocks(b"p" * 254, 10, 1)


def test_items_of_a_sliced_column_start_at_its_offset() -> None:
    column = pa.array(BODIES, pa.binary()).slice(1, 2)
    items = items_of(column, pa.array([NO_BLOCK, NO_BLOCK], pa.binary()).slice(0, 2))
    messages = [XpubMessage(b, MessageExt()) for b in BODIES[1:3]]
    assert bytes(items.slice(0, 2)) == _after_count(encode_xpub("t", messages))


def test_fitting_finds_the_last_item_within_a_budget() -> None:
    items = items_of(pa.array([b"x" * 10] * 5, pa.binary()))  # 14 bytes each
    assert items.fitting(0, 5, 42) == 3
    assert items.fitting(1, 5, 41) == 3
    assert items.fitting(0, 5, 13) == 0
    assert items.fitting(2, 4, 10**6) == 4

"""What a primary and its mirrors say: copy frames, fetch sections, offset ranges, followed state.

Rules for this module: pure functions, no I/O; every codec is checked by a round trip and by
what it refuses.
"""

from __future__ import annotations

import pytest

from lmqd.engine.replica import PlainRun, copy_spans
from lmqd.message import Message
from lmqd.message_ext import MessageExt
from lmqd.mirror.frames import decode_copies, encode_copies
from lmqd.mirror.wire import (
    ChannelFollow,
    TopicFollow,
    decode_sections,
    encode_section,
    from_ranges,
    to_ranges,
)
from lmqd.storage import AnchoredTimeBase

PRIMARY = AnchoredTimeBase(100.0, 1_700_000_000 * 10**9)
MIRROR = AnchoredTimeBase(5.0, 1_700_000_000 * 10**9)
"""Two processes' time bases: the same wall clock, different trio origins."""


def test_copy_frames_keep_every_field_and_the_due_time() -> None:
    ext = MessageExt(priority=3, ttl_ms=60_000, dedup_id=b"d-1", headers=(("k", "v"),))
    deferred = Message(b"0123456789abcdef", b"later", 7, 2, deliver_at=160.0)
    plain = Message(b"fedcba9876543210", b"now", 8)
    data = encode_copies([(10, deferred), (12, Message(b"a" * 16, b"x", 9, ext=ext)),
                          (13, plain), (14, Message(b"b" * 16, b"also", 8)),
                          (16, Message(b"c" * 16, b"later", 8))], PRIMARY)  # fmt: skip
    got = decode_copies(data, MIRROR)
    assert copy_spans(got) == [(10, 11), (12, 15), (16, 17)]
    first, second = got[0], got[1]
    assert isinstance(first, tuple) and isinstance(second, tuple)
    m = first[1]
    assert (first[0], m.id, m.body, m.timestamp, m.attempts) == (10, deferred.id, b"later", 7, 2)
    # Due 60 s after the primary's trio time 100 -> 60 s after the mirror's 5, same wall time.
    assert m.deliver_at == pytest.approx(65.0)
    assert second[1].ext == ext
    # Plain messages of one publish (one timestamp, consecutive offsets) come as columns.
    assert got[2] == PlainRun(13, [plain.id, b"b" * 16], [b"now", b"also"], 8)
    assert got[3] == PlainRun(16, [b"c" * 16], [b"later"], 8)


def test_copy_frames_refuse_truncated_and_malformed_data() -> None:
    data = encode_copies([(1, Message(b"0" * 16, b"body", 1))], PRIMARY)
    with pytest.raises(ValueError, match="truncated"):
        decode_copies(data[:20], MIRROR)
    with pytest.raises(ValueError, match="malformed"):
        decode_copies(data[:-1], MIRROR)
    assert decode_copies(b"", MIRROR) == []


def test_sections_round_trip() -> None:
    frames = encode_copies([(4, Message(b"1" * 16, b"b", 1))], PRIMARY)
    data = encode_section("orders", frames, next_offset=5, end=9, earliest=0, since=3,
                          next_ts=77, new_hold=True)  # fmt: skip
    data += encode_section("idle", b"", next_offset=2, end=2, earliest=2, since=0, next_ts=0,
                           new_hold=False)  # fmt: skip
    first, second = decode_sections(data)
    assert (first.topic, first.next_offset, first.end, first.since, first.next_ts) == (
        "orders", 5, 9, 3, 77,
    )
    assert first.new_hold and decode_copies(first.frames, MIRROR) == [PlainRun(4, [b"1" * 16],
                                                                              [b"b"], 1)]
    assert (second.topic, second.frames, second.new_hold) == ("idle", b"", False)
    with pytest.raises(ValueError):
        decode_sections(data[:-3])


@pytest.mark.parametrize(
    ("offsets", "ranges"),
    [([], []), ([5], [[5, 6]]), ([1, 2, 3, 7, 8, 10], [[1, 4], [7, 9], [10, 11]])],
)
def test_ranges(offsets: list[int], ranges: list[list[int]]) -> None:
    assert to_ranges(offsets) == ranges
    assert from_ranges(ranges) == offsets


def test_followed_state_round_trips_and_refuses_bad_offsets() -> None:
    doc = {
        "earliest": 0, "end": 20, "pumped": 18, "paused": True, "policy": {"ttl_ms": 5},
        "channels": {"c": {"position": 15, "skips": [[16, 17]], "unfinished": [[3, 4], [10, 12]],
                           "untracked": 2, "untracked_ids": ["abc"], "paused": False,
                           "policy": {"max_attempts": 3}}},
    }  # fmt: skip
    follow = TopicFollow.from_json(doc)
    channel = follow.channel_map["c"]
    assert channel.oldest == 3
    assert TopicFollow.from_json(follow.to_json()) == follow
    assert ChannelFollow(position=9).oldest == 9
    with pytest.raises(ValueError):
        ChannelFollow.from_json({"position": -1})
    with pytest.raises(ValueError):
        ChannelFollow.from_json({"position": 1, "unfinished": [[5, 2]]})

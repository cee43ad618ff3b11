"""The lmq message extension's codec: blocks, XPUB (single, multi, deferred) on the server's
side and frame type 3 on the client's: exact bytes, whole, byte by byte and with trailing data,
every refusal, fuzzed (hypothesis, as the rest of the protocol's tests)."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lmqd.message import Message
from lmqd.message_ext import (
    MAX_DEDUP_ID,
    MAX_HEADER_BYTES,
    MAX_HEADERS,
    ExtError,
    MessageExt,
    any_set,
    decode_ext,
    encode_ext,
)
from lmqd.protocol import (
    HEARTBEAT_FRAME,
    ClientConnection,
    Limits,
    MessageFrame,
    ProtocolError,
    Response,
    Xpub,
    encode_identify,
    encode_message,
    ext_message_frame_parts,
)
from lmqd.protocol.extension import (
    XpubBlockCache,
    XpubMessage,
    encode_xpub,
    parse_xpub_body,
    parse_xpub_columns,
)

from .feeding import MODES, MSG_ID, client_feed, feed, server, size

MAX_MSG = 1024 * 1024
EXT_ALL = MessageExt(priority=7, ttl_ms=60_000, dedup_id=b"q/1/0/5", headers=(("k", "v"),))


def test_a_block_with_every_field_has_the_documented_bytes() -> None:
    ext = MessageExt(priority=7, ttl_ms=60_000, dedup_id=b"q/1/0/5", headers=(("k", "v"),))
    assert encode_ext(ext) == (
        b"\x0f"  # all four fields
        + b"\x07"
        + struct.pack(">I", 60_000)
        + b"\x07q/1/0/5"
        + b"\x00\x01" + b"\x01k" + b"\x00\x01v"
    )
    assert decode_ext(encode_ext(ext)) == ext


def test_an_empty_extension_is_one_byte() -> None:
    assert encode_ext(MessageExt()) == b"\x00"
    assert decode_ext(b"\x00") == MessageExt()
    assert not MessageExt(ttl_ms=5, dedup_id=b"x").visible
    assert MessageExt(priority=1).visible and MessageExt(headers=(("a", ""),)).visible


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "empty extension block"),
        (b"\x10", "unknown extension flags 0x10"),
        (b"\x01\x0a", "priority 10 out of range"),
        (b"\x01\x00", "priority 0 out of range"),
        (b"\x01", "truncated"),
        (b"\x02\x00\x00\x00\x00", "ttl_ms 0"),
        (b"\x02\x00\x00", "truncated"),
        (b"\x04\x00", "empty dedup id"),
        (b"\x04\x05abc", "truncated dedup id"),
        (b"\x08\x00\x00", "header count 0"),
        (b"\x08\x00\x41", "header count 65"),
        (b"\x08\x00\x01\x00", "bad header key length"),
        (b"\x08\x00\x01\x02a", "bad header key length"),
        (b"\x08\x00\x01\x01a\x00\x05ab", "truncated header value"),
        (b"\x08\x00\x01\x01\xff\x00\x00", "a header key is not UTF-8"),
        (b"\x08\x00\x01\x01\n\x00\x00", "control character"),
        (b"\x08\x00\x01\x01a\x00\x01\xff", "is not UTF-8"),
        (b"\x08\x00\x02\x01a\x00\x00\x01a\x00\x00", "repeated"),
        (b"\x00x", "1 bytes after the extension block"),
    ],
)
def test_malformed_blocks_are_refused_with_what_is_wrong(data: bytes, message: str) -> None:
    with pytest.raises(ExtError, match=message):
        decode_ext(data)


def test_bounds_on_what_a_block_may_carry() -> None:
    with pytest.raises(ExtError, match="dedup id longer"):
        encode_ext(MessageExt(dedup_id=b"x" * (MAX_DEDUP_ID + 1)))
    with pytest.raises(ExtError, match="more than 64 headers"):
        encode_ext(MessageExt(headers=tuple((f"k{i}", "") for i in range(MAX_HEADERS + 1))))
    with pytest.raises(ExtError, match="headers larger"):
        encode_ext(MessageExt(headers=(("k", "v" * MAX_HEADER_BYTES),)))
    with pytest.raises(ExtError, match="priority"):
        encode_ext(MessageExt(priority=-1))
    most = MessageExt(headers=(("k", "v" * (MAX_HEADER_BYTES - 1)),))
    assert decode_ext(encode_ext(most)) == most


def test_an_xpub_round_trips_with_and_without_defer() -> None:
    messages = [
        XpubMessage(b"one", MessageExt(priority=2, headers=(("trace", "abc"),))),
        XpubMessage(b"two", MessageExt()),
    ]
    plain = encode_xpub("orders", messages)
    line, _, rest = plain.partition(b"\n")
    assert line == b"XPUB orders"
    size = struct.unpack(">I", rest[:4])[0]
    assert size == len(rest) - 4
    assert parse_xpub_body(rest[4:], max_msg_size=MAX_MSG) == messages
    deferred = encode_xpub("orders", messages, defer_ms=1500)
    assert deferred.startswith(b"XPUB orders 1500\n")


def _body(*parts: bytes) -> bytes:
    return b"".join(parts)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"", "no message count"),
        (_body(b"\x00\x00\x00\x00"), "invalid message count 0"),
        (_body(b"\xff\xff\xff\xff"), "invalid message count -1"),
        (_body(b"\x00\x00\x00\x02", b"\x00\x01\x00\x00\x00\x00\x01x"), "invalid message count 2"),
        (_body(b"\x00\x00\x00\x01", b"\x00\x01\x00\x00\x00\x00\x00x"), "invalid body size 0"),
        (_body(b"\x00\x00\x00\x01", b"\x00\x01\x00\x00\x00\x00\x05x"), "truncated body"),
        (_body(b"\x00\x00\x00\x01", b"\x00\x02\x00\x00\x00\x00\x00\x01x"), "message 0: 1 bytes"),
        (_body(b"\x00\x00\x00\x01", b"\x00\x01\x00\x00\x00\x00\x01xy"), "1 bytes after"),
        (_body(b"\x00\x00\x00\x01", b"\x00\x01\x20\x00\x00\x00\x01x"), "unknown extension"),
    ],
)
def test_malformed_xpub_bodies_are_refused(body: bytes, message: str) -> None:
    with pytest.raises(ExtError, match=message):
        parse_xpub_body(body, max_msg_size=MAX_MSG)


def test_a_body_over_the_message_size_is_refused() -> None:
    body = _body(b"\x00\x00\x00\x01", b"\x00\x01\x00", struct.pack(">i", 11), b"x" * 11)
    with pytest.raises(ExtError, match="invalid body size 11"):
        parse_xpub_body(body, max_msg_size=10)


_texts = st.text(st.characters(min_codepoint=0x20, codec="utf-8"), max_size=20)
exts = st.builds(
    MessageExt,
    priority=st.integers(0, 9),
    ttl_ms=st.integers(0, 2**32 - 1),
    dedup_id=st.binary(max_size=MAX_DEDUP_ID),
    headers=st.dictionaries(
        _texts.filter(lambda k: 0 < len(k.encode()) <= 255 and "\x7f" not in k), _texts,
        max_size=8,
    ).map(lambda d: tuple(d.items())),
)


@given(exts)
def test_every_valid_block_round_trips(ext: MessageExt) -> None:
    assert decode_ext(encode_ext(ext)) == ext


@given(st.lists(st.one_of(st.none(), exts), max_size=6), st.integers(0, 3))
def test_any_set_says_whether_some_extension_has_the_field(
    extensions: list[MessageExt | None], copies: int
) -> None:
    """The check a publish makes of its extensions (a TTL, a priority, a dedup id anywhere?),
    with some objects shared as a publish's messages share one."""
    extensions = extensions + extensions[:1] * copies
    for field in ("priority", "ttl_ms", "dedup_id", "headers"):
        expected = any(e is not None and bool(getattr(e, field)) for e in extensions)
        assert any_set(extensions, field) is expected


@given(exts, st.binary(min_size=1, max_size=4))
def test_every_cut_of_a_block_and_every_block_with_bytes_after_it_is_refused(
    ext: MessageExt, after: bytes
) -> None:
    """The block's own "byte by byte" and "trailing data": it has no length of its own (XPUB
    and frame type 3 give it one), so a prefix must never pass for a shorter valid block, and
    bytes after it must never be ignored."""
    block = encode_ext(ext)
    for cut in range(len(block)):
        with pytest.raises(ExtError):
            decode_ext(block[:cut])
    with pytest.raises(ExtError):
        decode_ext(block + after)


@given(st.lists(st.tuples(st.binary(min_size=1, max_size=50), exts), min_size=1, max_size=5))
def test_every_valid_xpub_round_trips(items: list[tuple[bytes, MessageExt]]) -> None:
    messages = [XpubMessage(body, ext) for body, ext in items]
    wire = encode_xpub("t", messages)
    body = wire.partition(b"\n")[2][4:]
    assert parse_xpub_body(body, max_msg_size=MAX_MSG) == messages
    # Every cut of a valid body is refused cleanly, never mistaken for a shorter valid one.
    for cut in range(len(body)):
        with pytest.raises(ExtError):
            parse_xpub_body(body[:cut], max_msg_size=MAX_MSG)


@settings(max_examples=300)
@given(st.binary(max_size=200))
def test_random_bytes_are_a_block_or_a_clear_refusal(data: bytes) -> None:
    try:
        ext = decode_ext(data)
    except ExtError:
        return
    assert encode_ext(ext) == data


@settings(max_examples=300)
@given(st.binary(max_size=200))
def test_random_bytes_are_an_xpub_body_or_a_clear_refusal(data: bytes) -> None:
    try:
        messages = parse_xpub_body(data, max_msg_size=MAX_MSG)
    except ExtError:
        return
    assert messages and all(m.body for m in messages)


# -- XPUB through the server's parser, whole, byte by byte and with a command after it ---------

NEGOTIATED = encode_identify({"feature_negotiation": True, "lmq_ext": 1})


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("defer_ms", [None, 0, 2500])
def test_the_server_parses_xpub_in_every_mode(mode: str, defer_ms: int | None) -> None:
    messages = [XpubMessage(b"first", EXT_ALL), XpubMessage(b"second", MessageExt())]
    events, error = feed(server(NEGOTIATED), encode_xpub("t", messages, defer_ms), mode)
    assert error is None
    assert events == [Xpub.of("t", messages, defer_ms or 0)]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    ("setup", "data", "code", "text"),
    [
        (b"", encode_xpub("t", [XpubMessage(b"x", MessageExt())]), "E_INVALID",
         "XPUB needs the lmq extension (IDENTIFY with feature_negotiation, lmq_ext 1)"),
        (NEGOTIATED, b"XPUB\n", "E_INVALID", "XPUB insufficient number of parameters"),
        (NEGOTIATED, b"XPUB t!\n", "E_BAD_TOPIC", 'XPUB topic name "t!" is not valid'),
        (NEGOTIATED, b"XPUB t x\n", "E_INVALID", "DPUB could not parse timeout x"),
        (NEGOTIATED, b"XPUB t\n" + size(0), "E_BAD_BODY", "XPUB invalid body size 0"),
        (NEGOTIATED, b"XPUB t\n" + size(6) + size(1) + b"\x00\x01", "E_BAD_MESSAGE",
         "XPUB invalid message count 1"),
        (NEGOTIATED, b"XPUB t\n" + size(13) + size(1) + b"\x00\x01\x00" + size(5) + b"ab",
         "E_BAD_MESSAGE", "XPUB message 0: truncated body"),
    ],
)
def test_the_server_refuses_bad_xpubs_in_every_mode(
    mode: str, setup: bytes, data: bytes, code: str, text: str
) -> None:
    events, error = feed(server(setup), data, mode)
    assert events == []
    assert error is not None and (error.code, error.text) == (code, text)


@pytest.mark.parametrize("mode", MODES)
def test_the_server_parses_a_single_message_xpub_in_every_mode(mode: str) -> None:
    # Hand-built, so the parser is checked against docs/protocol.md and not against encode_xpub.
    block = b"\x09\x03" + b"\x00\x01" + b"\x01k" + b"\x00\x02vv"  # priority 3, one header
    payload = size(1) + struct.pack(">H", len(block)) + block + size(4) + b"body"
    data = b"XPUB t 250\n" + size(len(payload)) + payload
    events, error = feed(server(NEGOTIATED), data, mode)
    assert error is None
    ext = MessageExt(priority=3, headers=(("k", "vv"),))
    assert events == [Xpub.of("t", [XpubMessage(b"body", ext)], 250)]


@pytest.mark.parametrize("mode", MODES)
def test_two_xpubs_in_one_buffer_are_two_commands(mode: str) -> None:
    first = [XpubMessage(b"a", EXT_ALL)]
    second = [XpubMessage(b"b", MessageExt()), XpubMessage(b"c", MessageExt(priority=9))]
    data = encode_xpub("t", first) + encode_xpub("u", second, 5)
    events, error = feed(server(NEGOTIATED), data, mode)
    assert error is None
    assert events == [
        Xpub.of("t", first),
        Xpub.of("u", second, 5),
    ]


# -- frame type 3 on the client side -----------------------------------------------------------

TS = 1_700_000_000_123_456_789


def _ext_frames(*messages: Message) -> bytes:
    parts: list[bytes] = []
    ext_message_frame_parts(messages, parts)
    return b"".join(parts)


def _with_ext(msg: Message, ext: MessageExt | None) -> Message:
    msg.ext = ext
    return msg


def test_frame_type_3_has_the_documented_bytes() -> None:
    msg = _with_ext(Message(MSG_ID, b"payload", TS, 2), EXT_ALL)
    # Only the priority and the headers travel: flags 0x09, never the TTL or the dedup id.
    block = b"\x09" + b"\x07" + b"\x00\x01" + b"\x01k" + b"\x00\x01v"
    assert _ext_frames(msg) == (
        size(4 + 8 + 2 + 16 + 2 + len(block) + 7)
        + size(3)
        + TS.to_bytes(8, "big")
        + b"\x00\x02"
        + MSG_ID
        + struct.pack(">H", len(block))
        + block
        + b"payload"
    )


def test_messages_without_visible_fields_go_in_nsqd_s_frame_type_2() -> None:
    plain = Message(MSG_ID, b"x", TS, 1)
    hidden = _with_ext(Message(MSG_ID, b"x", TS, 1), MessageExt(ttl_ms=5, dedup_id=b"d"))
    assert _ext_frames(plain) == _ext_frames(hidden) == encode_message(plain)


@pytest.mark.parametrize("mode", MODES)
def test_the_client_decodes_frame_type_3_in_every_mode(mode: str) -> None:
    visible = MessageExt(priority=7, headers=(("k", "v"),))
    data = _ext_frames(
        _with_ext(Message(MSG_ID, b"first", TS, 1), EXT_ALL),
        Message(b"fedcba9876543210", b"second", TS + 1, 3),
        _with_ext(Message(MSG_ID, b"", TS + 2, 65535), MessageExt(headers=(("e", ""),))),
    )
    events, error = client_feed(ClientConnection(), data, mode, trailer=HEARTBEAT_FRAME)
    assert error is None
    if mode == "trailing":
        assert events.pop() == Response(data=b"_heartbeat_")
    assert events == [
        MessageFrame(id=MSG_ID, timestamp=TS, attempts=1, body=b"first", ext=visible),
        MessageFrame(id=b"fedcba9876543210", timestamp=TS + 1, attempts=3, body=b"second"),
        MessageFrame(
            id=MSG_ID, timestamp=TS + 2, attempts=65535, body=b"",
            ext=MessageExt(headers=(("e", ""),)),
        ),
    ]  # fmt: skip


def test_a_type_3_frame_with_the_empty_block_decodes_to_no_fields() -> None:
    # Legal by the layout, though lmqd sends type 2 then: a client must still accept it.
    conn = ClientConnection()
    frame_data = TS.to_bytes(8, "big") + b"\x00\x01" + MSG_ID + b"\x00\x01\x00" + b"b"
    conn.receive_data(size(4 + len(frame_data)) + size(3) + frame_data)
    assert conn.next_events() == [
        MessageFrame(id=MSG_ID, timestamp=TS, attempts=1, body=b"b", ext=MessageExt())
    ]


_visible_exts = exts.map(lambda e: MessageExt(priority=e.priority, headers=e.headers))


@settings(max_examples=150, deadline=None)
@given(
    items=st.lists(
        st.tuples(st.binary(max_size=40), st.one_of(st.none(), _visible_exts)),
        min_size=1, max_size=6,
    ),
    cuts=st.lists(st.integers(min_value=0), max_size=10),
)  # fmt: skip
def test_frames_of_any_fields_decode_whatever_the_receive_boundaries(
    items: list[tuple[bytes, MessageExt | None]], cuts: list[int]
) -> None:
    msgs = [
        _with_ext(Message(b"%016x" % i, body, TS + i, i + 1), ext)
        for i, (body, ext) in enumerate(items)
    ]
    data = _ext_frames(*msgs)
    points = sorted({c % (len(data) + 1) for c in cuts})
    conn = ClientConnection()
    events = []
    for a, b in zip([0, *points], [*points, len(data)], strict=True):
        if a < b:
            conn.receive_data(data[a:b])
            events.extend(conn.next_events())
    expected = [
        MessageFrame(
            id=m.id, timestamp=m.timestamp, attempts=m.attempts, body=m.body,
            ext=m.ext if m.ext is not None and m.ext.visible else None,
        )
        for m in msgs
    ]  # fmt: skip
    assert events == expected


@settings(max_examples=300, deadline=None)
@given(block=st.binary(max_size=60), body=st.binary(max_size=8), declared=st.integers(0, 70))
def test_a_type_3_frame_with_any_block_is_a_message_or_a_protocol_error(
    block: bytes, body: bytes, declared: int
) -> None:
    data = TS.to_bytes(8, "big") + b"\x00\x01" + MSG_ID + struct.pack(">H", declared) + block
    data += body
    conn = ClientConnection()
    conn.receive_data(size(4 + len(data)) + size(3) + data)
    try:
        [frame] = conn.next_events()
    except ProtocolError as exc:
        assert exc.code == "E_BAD_PROTOCOL"
        return
    assert isinstance(frame, MessageFrame) and frame.ext is not None
    # What decoded is exactly what the frame declared: the block re-encodes to its bytes.
    assert encode_ext(frame.ext) == (block + body)[:declared]
    assert frame.body == (block + body)[declared:]


# -- XPUB fuzzed through the server's parser -----------------------------------------------------

_xpub_tokens = st.one_of(
    st.sampled_from([b"XPUB ", b"XPUB t", b"XPUB t 10", b"\n", b" ", b"t", b"NOP\n", b"\x00"]),
    st.integers(-(2**31), 2**31 - 1).map(size),
    st.integers(0, 300).map(size),
    st.integers(0, 300).map(lambda n: struct.pack(">H", n)),
    exts.map(encode_ext),
    st.binary(max_size=8),
)


@settings(max_examples=400, deadline=None)
@given(
    garbage=st.lists(_xpub_tokens, max_size=30).map(b"".join),
    cuts=st.lists(st.integers(min_value=0), max_size=8),
)
def test_xpub_garbage_only_ever_raises_protocol_error(garbage: bytes, cuts: list[int]) -> None:
    conn = server(NEGOTIATED, Limits(max_msg_size=200, max_body_size=300, max_line_length=256))
    points = sorted({c % (len(garbage) + 1) for c in cuts})
    try:
        for a, b in zip([0, *points], [*points, len(garbage)], strict=True):
            if a < b:
                conn.receive_data(garbage[a:b])
                conn.next_events()
        conn.receive_data(b"")
        conn.next_events()
    except ProtocolError as exc:
        assert exc.fatal
        with pytest.raises(ProtocolError):  # errored for good
            conn.next_events()


def test_xpub_messages_that_share_a_block_share_one_extension() -> None:
    shared = MessageExt(headers=(("h0", "v0"), ("h1", "v1")))
    exts = [shared, shared, MessageExt(), shared, EXT_ALL, EXT_ALL]
    bodies = [b"a", b"b", b"c", b"d", b"e", b"f"]
    messages = [XpubMessage(b, e) for b, e in zip(bodies, exts, strict=True)]
    body = encode_xpub("t", messages)[len(b"XPUB t\n") + 4 :]
    got_bodies, got_exts = parse_xpub_columns(body, max_msg_size=MAX_MSG)
    assert got_bodies == bodies
    assert got_exts == [shared, shared, None, shared, EXT_ALL, EXT_ALL]
    assert got_exts[0] is got_exts[1] is got_exts[3] and got_exts[4] is got_exts[5]
    assert parse_xpub_body(body, max_msg_size=MAX_MSG) == messages


def test_an_xpub_cut_after_a_repeated_block_is_refused() -> None:
    messages = [XpubMessage(b"a", EXT_ALL), XpubMessage(b"b", EXT_ALL)]
    body = encode_xpub("t", messages)[len(b"XPUB t\n") + 4 :]
    cut = body[: -len(b"b") - 3]  # the second message: its block, then 1 byte of its size
    with pytest.raises(ExtError, match="message 1: truncated"):
        parse_xpub_columns(cut, max_msg_size=MAX_MSG)


def test_a_connection_reuses_the_blocks_of_its_last_xpub_and_bounds_them() -> None:
    cache = XpubBlockCache()
    shared = MessageExt(headers=(("h0", "v0"),))
    body = encode_xpub("t", [XpubMessage(b"a", shared)])[len(b"XPUB t\n") + 4 :]
    _, [first] = cache.parse(body, max_msg_size=MAX_MSG)
    _, [second] = cache.parse(body, max_msg_size=MAX_MSG)
    assert first == shared and second is first  # decoded once, for both commands
    count = XpubBlockCache.MAX_BLOCKS + 1
    distinct = [XpubMessage(b"m", MessageExt(headers=(("k", str(k)),))) for k in range(count)]
    many = encode_xpub("t", distinct)[len(b"XPUB t\n") + 4 :]
    _, exts = cache.parse(many, max_msg_size=MAX_MSG)
    assert exts == [m.ext for m in distinct]
    assert cache.blocks == {}  # more blocks than it keeps: emptied
    big = MessageExt(headers=(("k", "v" * XpubBlockCache.MAX_BLOCK_BYTES),))
    cache.parse(encode_xpub("t", [XpubMessage(b"b", big)])[len(b"XPUB t\n") + 4 :],
                max_msg_size=MAX_MSG)  # fmt: skip
    assert cache.blocks == {}


def test_blocks_holding_a_dedup_id_alone_are_read_in_place_and_never_kept() -> None:
    """One block per message (the Spark sink's ids): each message gets its own extension with
    its block, equal ids included; neither the command's nor the connection's cache keeps
    them; the blocks around them are decoded and shared as ever."""
    shared = MessageExt(headers=(("h", "v"),))
    exts = [MessageExt(dedup_id=b"q/0"), MessageExt(dedup_id=b"q/1"), MessageExt(dedup_id=b"q/1"),
            shared, MessageExt(dedup_id=b"x" * MAX_DEDUP_ID), shared, EXT_ALL]  # fmt: skip
    messages = [XpubMessage(b"%d" % i, e) for i, e in enumerate(exts)]
    body = encode_xpub("t", messages)[len(b"XPUB t\n") + 4 :]
    cache = XpubBlockCache()
    got_bodies, got = cache.parse(body, max_msg_size=MAX_MSG)
    assert got_bodies == [m.body for m in messages] and got == exts
    assert [e.block if e is not None else None for e in got] == [encode_ext(e) for e in exts]
    assert got[1] is not got[2] and got[3] is got[5]
    assert set(cache.blocks) == {encode_ext(shared), encode_ext(EXT_ALL)}
    # A block that only looks like one (a wrong id length) is decoded, and refused.
    bad = encode_xpub("t", [XpubMessage(b"a", MessageExt(dedup_id=b"ab"))])
    bad = bad.replace(b"\x04\x02ab", b"\x04\x03ab")
    with pytest.raises(ExtError, match="message 0: truncated dedup id"):
        parse_xpub_columns(bad[len(b"XPUB t\n") + 4 :], max_msg_size=MAX_MSG)


def test_a_decoded_extension_keeps_its_block_outside_its_value() -> None:
    for ext in (EXT_ALL, MessageExt(dedup_id=b"only-id"), MessageExt(headers=(("k", "v"),))):
        raw = encode_ext(ext)
        decoded = decode_ext(raw)
        assert decoded.block == raw and encode_ext(decoded) is decoded.block
        assert decoded == ext and hash(decoded) == hash(ext) and ext.block is None
        assert repr(decoded) == repr(ext)

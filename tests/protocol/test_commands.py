"""ServerConnection: every command parsed whole, one byte at a time, and with trailing data."""

from __future__ import annotations

import json

import pytest

from lmqd.protocol import (
    Auth,
    ClientState,
    Cls,
    Dpub,
    Fin,
    Fins,
    Identify,
    Limits,
    Mpub,
    Nop,
    Pub,
    Rdy,
    Req,
    ServerConnection,
    Sub,
    Touch,
)

from .feeding import MAGIC, MODES, MSG_ID, SUBSCRIBE, parse_ok, server, size, sized

SUBSCRIBED = SUBSCRIBE
CLOSING = SUBSCRIBE + b"CLS\n"


@pytest.mark.parametrize("mode", MODES)
def test_nop(mode: str) -> None:
    assert parse_ok(b"NOP\n", mode) == [Nop()]


@pytest.mark.parametrize("mode", MODES)
def test_sub(mode: str) -> None:
    assert parse_ok(b"SUB orders archive#ephemeral\n", mode) == [
        Sub(topic="orders", channel="archive#ephemeral")
    ]


@pytest.mark.parametrize("mode", MODES)
def test_rdy(mode: str) -> None:
    assert parse_ok(b"RDY 2500\n", mode, SUBSCRIBED) == [Rdy(count=2500)]


@pytest.mark.parametrize(
    ("line", "count"),
    [
        (b"RDY\n", 1),  # the count defaults to 1
        (b"RDY \n", 0),  # an empty number parses as 0 (nsqd's ByteToBase10)
        (b"RDY 0\n", 0),
        (b"RDY 007\n", 7),
        (b"RDY 5 extra\n", 5),  # nsqd ignores extra parameters
        (b"RDY 5\r\n", 5),
    ],
)
def test_rdy_count_forms(line: bytes, count: int) -> None:
    assert parse_ok(line, "whole", SUBSCRIBED) == [Rdy(count=count)]


@pytest.mark.parametrize("mode", MODES)
def test_fin(mode: str) -> None:
    assert parse_ok(b"FIN " + MSG_ID + b"\n", mode, SUBSCRIBED) == [Fin(id=MSG_ID)]


@pytest.mark.parametrize("mode", MODES)
def test_fin_crlf(mode: str) -> None:
    assert parse_ok(b"FIN " + MSG_ID + b"\r\n", mode, SUBSCRIBED) == [Fin(id=MSG_ID)]


@pytest.mark.parametrize("mode", MODES)
def test_fin_run(mode: str) -> None:
    ids = [b"%016x" % i for i in range(50)]
    data = b"".join(b"FIN " + i + b"\n" for i in ids)
    events = parse_ok(data, mode, SUBSCRIBED)
    assert events == [Fin(id=i) for i in ids]
    assert all(type(e.id) is bytes for e in events if isinstance(e, Fin))


def test_fin_run_mixed_with_other_commands() -> None:
    ids = [b"%016x" % i for i in range(6)]
    data = (
        b"FIN " + ids[0] + b"\n" + b"FIN " + ids[1] + b"\r\n"  # CRLF leaves the fast path
        b"FIN " + ids[2] + b"\nRDY 3\nFIN " + ids[3] + b"\nFIN " + ids[4] + b"\n"
        b"REQ " + ids[5] + b" 10\nFIN 0123\r56789abcdef\n"  # an id holding "\r" is still 16 bytes
    )
    assert parse_ok(data, "whole", SUBSCRIBED) == [
        Fin(id=ids[0]),
        Fin(id=ids[1]),
        Fin(id=ids[2]),
        Rdy(count=3),
        Fin(id=ids[3]),
        Fin(id=ids[4]),
        Req(id=ids[5], timeout_ms=10),
        Fin(id=b"0123\r56789abcdef"),
    ]


def test_consecutive_fins_in_one_buffer_are_one_event() -> None:
    ids = [b"%016x" % i for i in range(6)]
    conn = server(SUBSCRIBED)
    conn.receive_data(
        b"FIN " + ids[0] + b"\nFIN " + ids[1] + b"\r\nFIN " + ids[2] + b"\n"  # CRLF: line path
        b"RDY 3\nFIN " + ids[3] + b"\nFIN " + ids[4] + b"\nNOP\nFIN " + ids[5] + b"\n"
    )
    events = conn.next_events()
    assert events == [
        Fins(ids=ids[:3]),
        Rdy(count=3),
        Fins(ids=ids[3:5]),
        Nop(),
        Fins(ids=ids[5:]),
    ]
    assert all(type(i) is bytes for e in events if isinstance(e, Fins) for i in e.ids)
    assert Fins(ids=ids[:3]).encode() == b"".join(Fin(id=i).encode() for i in ids[:3])


@pytest.mark.parametrize("mode", MODES)
def test_req(mode: str) -> None:
    assert parse_ok(b"REQ " + MSG_ID + b" 2000\n", mode, SUBSCRIBED) == [
        Req(id=MSG_ID, timeout_ms=2000)
    ]


def test_req_keeps_the_raw_timeout() -> None:
    # REQ is clamped to [0, max_req_timeout] by the server, not refused by the parser.
    events = parse_ok(
        b"REQ " + MSG_ID + b" 99999999999\nREQ " + MSG_ID + b" \n", "whole", SUBSCRIBED
    )
    assert events == [Req(id=MSG_ID, timeout_ms=99999999999), Req(id=MSG_ID, timeout_ms=0)]


@pytest.mark.parametrize("mode", MODES)
def test_touch(mode: str) -> None:
    assert parse_ok(b"TOUCH " + MSG_ID + b"\n", mode, SUBSCRIBED) == [Touch(id=MSG_ID)]


@pytest.mark.parametrize("mode", MODES)
def test_cls(mode: str) -> None:
    assert parse_ok(b"CLS\n", mode, SUBSCRIBED) == [Cls()]


@pytest.mark.parametrize("mode", MODES)
def test_pub(mode: str) -> None:
    body = b"hello\nworld \x00\xff"  # newlines and any bytes are fine inside a body
    events = parse_ok(b"PUB orders\n" + sized(body), mode)
    assert events == [Pub(topic="orders", body=body)]
    assert type(events[0].body) is bytes  # type: ignore[union-attr]


@pytest.mark.parametrize("mode", MODES)
def test_pub_at_max_msg_size(mode: str) -> None:
    body = b"x" * 100
    limits = Limits(max_msg_size=100)
    assert parse_ok(b"PUB t\n" + sized(body), mode, limits=limits) == [Pub(topic="t", body=body)]


@pytest.mark.parametrize("mode", MODES)
def test_dpub(mode: str) -> None:
    assert parse_ok(b"DPUB t 3600000\n" + sized(b"later"), mode) == [
        Dpub(topic="t", defer_ms=3600000, body=b"later")
    ]


@pytest.mark.parametrize("mode", MODES)
def test_mpub(mode: str) -> None:
    bodies = [b"a", b"\n\n", b"x" * 300]
    data = b"MPUB t\n" + sized(size(3) + b"".join(sized(b) for b in bodies))
    events = parse_ok(data, mode)
    assert events == [Mpub(topic="t", bodies=bodies)]
    assert all(type(b) is bytes for b in events[0].bodies)  # type: ignore[union-attr]


@pytest.mark.parametrize("mode", MODES)
def test_mpub_max_count(mode: str) -> None:
    # (max_body_size - 4) // 5 one-byte messages fill the largest body exactly.
    limits = Limits(max_body_size=1004)
    bodies = [b"%d" % (i % 10) for i in range(200)]
    data = b"MPUB t\n" + sized(size(200) + b"".join(sized(b) for b in bodies))
    assert parse_ok(data, mode, limits=limits) == [Mpub(topic="t", bodies=bodies)]


@pytest.mark.parametrize("mode", MODES)
def test_identify(mode: str) -> None:
    body = json.dumps(
        {"client_id": "c1", "hostname": "h", "user_agent": "test/1", "feature_negotiation": True}
    ).encode()
    events = parse_ok(b"IDENTIFY\n" + sized(body), mode)
    assert len(events) == 1
    event = events[0]
    assert isinstance(event, Identify)
    assert event.data == json.loads(body)
    assert event.settings.client_id == "c1"
    assert event.settings.feature_negotiation is True


@pytest.mark.parametrize("mode", MODES)
def test_auth(mode: str) -> None:
    assert parse_ok(b"AUTH\n" + sized(b"s3cret"), mode) == [Auth(secret=b"s3cret")]


def test_consumer_session_in_one_buffer() -> None:
    """A typical consumer start-up and a few deliveries, all in one receive."""
    identify = b'{"feature_negotiation":true,"heartbeat_interval":5000}'
    data = (
        b"IDENTIFY\n" + sized(identify) + b"SUB t c\nRDY 10\nFIN " + MSG_ID + b"\n"
        b"TOUCH " + MSG_ID + b"\nREQ " + MSG_ID + b" 0\nNOP\nCLS\nFIN " + MSG_ID + b"\n"
    )
    events = parse_ok(data, "whole")
    assert [type(e) for e in events] == [Identify, Sub, Rdy, Fin, Touch, Req, Nop, Cls, Fin]


def test_publishes_are_allowed_in_every_state() -> None:
    pub = b"PUB t\n" + sized(b"m") + b"MPUB t\n" + sized(size(1) + sized(b"m"))
    pub += b"DPUB t 5\n" + sized(b"m") + b"NOP\n"
    expected = [
        Pub(topic="t", body=b"m"),
        Mpub(topic="t", bodies=[b"m"]),
        Dpub(topic="t", defer_ms=5, body=b"m"),
        Nop(),
    ]
    for setup in (b"", SUBSCRIBED, CLOSING):
        assert parse_ok(pub, "whole", setup) == expected


def state_of(conn: ServerConnection) -> ClientState:
    return conn.state


def test_state_transitions() -> None:
    conn = server()
    assert state_of(conn) is ClientState.INIT
    conn.receive_data(b"IDENTIFY\n" + sized(b"{}") + b"AUTH\n" + sized(b"x"))
    conn.next_events()
    assert state_of(conn) is ClientState.INIT  # IDENTIFY and AUTH don't change the state
    conn.receive_data(SUBSCRIBE)
    conn.next_events()
    assert state_of(conn) is ClientState.SUBSCRIBED
    conn.receive_data(b"CLS\n")
    conn.next_events()
    assert state_of(conn) is ClientState.CLOSING
    assert int(conn.state) == 4  # the number /stats shows


@pytest.mark.parametrize("mode", MODES)
def test_rdy_is_dropped_after_cls(mode: str) -> None:
    # nsqd ignores RDY in the closing state without even parsing it.
    assert parse_ok(b"RDY 10\nRDY garbage\nRDY 999999\n", mode, CLOSING) == []


@pytest.mark.parametrize("mode", MODES)
def test_settling_is_allowed_after_cls(mode: str) -> None:
    data = b"FIN " + MSG_ID + b"\nREQ " + MSG_ID + b" 1\nTOUCH " + MSG_ID + b"\n"
    assert parse_ok(data, mode, CLOSING) == [
        Fin(id=MSG_ID),
        Req(id=MSG_ID, timeout_ms=1),
        Touch(id=MSG_ID),
    ]


def test_identify_settings_are_kept_on_the_connection() -> None:
    conn = server(b"IDENTIFY\n" + sized(b'{"msg_timeout": 5000}'))
    assert conn.identify is not None
    assert conn.identify.msg_timeout_ms == 5000


def test_magic_alone_and_split() -> None:
    for pieces in ([MAGIC], [b" ", b" V", b"2"], [b"  V2NOP", b"\n"]):
        conn = ServerConnection(Limits())
        events = []
        for piece in pieces:
            conn.receive_data(piece)
            events.extend(conn.next_events())
        assert events == ([Nop()] if b"NOP" in b"".join(pieces) else [])


def test_eof_before_magic_closes_quietly() -> None:
    conn = ServerConnection(Limits())
    conn.receive_data(b"  ")
    assert conn.next_events() == []
    conn.receive_data(b"")
    assert conn.next_events() == []
    assert conn.closed


def test_eof_mid_command_closes_quietly() -> None:
    conn = server()
    conn.receive_data(b"NOP\nPUB t\n" + size(10) + b"abc")
    conn.receive_data(b"")
    assert conn.next_events() == [Nop()]
    assert conn.closed
    assert conn.next_events() == []


def test_eof_after_complete_commands() -> None:
    conn = server()
    assert not conn.closed
    conn.receive_data(b"NOP\n")
    conn.receive_data(b"")
    assert conn.next_events() == [Nop()]
    assert conn.closed


def test_data_after_eof_is_a_programming_error() -> None:
    conn = server()
    conn.receive_data(b"")
    with pytest.raises(RuntimeError):
        conn.receive_data(b"NOP\n")


def test_accepts_bytearray_and_memoryview() -> None:
    conn = server()
    conn.receive_data(bytearray(b"PUB t\n" + sized(b"ab")))
    conn.receive_data(memoryview(b"PUB t\n" + sized(b"cd")))
    events = conn.next_events()
    assert events == [Pub(topic="t", body=b"ab"), Pub(topic="t", body=b"cd")]
    assert all(type(e.body) is bytes for e in events)  # type: ignore[union-attr]


def test_no_data_no_events() -> None:
    conn = server()
    assert conn.next_events() == []
    assert conn.next_events() == []


@pytest.mark.parametrize("mode", MODES)
def test_pub_run(mode: str) -> None:
    """Pipelined PUBs (the fast path for repeated "PUB <topic>") and their variations."""
    data = (
        b"PUB t\n" + sized(b"1") + b"PUB t\n" + sized(b"2") + b"PUB t\r\n" + sized(b"3")
        + b"PUB u\n" + sized(b"4") + b"PUB t\n" + sized(b"5") + b"PUB t extra\n" + sized(b"6")
        + b"PUB t\n" + sized(b"PUB t\n") + b"PUB t\n" + sized(b"8") + b"PUB tt\n" + sized(b"9")
    )  # fmt: skip
    assert parse_ok(data, mode) == [
        Pub(topic="t", body=b"1"),
        Pub(topic="t", body=b"2"),
        Pub(topic="t", body=b"3"),
        Pub(topic="u", body=b"4"),
        Pub(topic="t", body=b"5"),
        Pub(topic="t", body=b"6"),
        Pub(topic="t", body=b"PUB t\n"),
        Pub(topic="t", body=b"8"),
        Pub(topic="tt", body=b"9"),
    ]

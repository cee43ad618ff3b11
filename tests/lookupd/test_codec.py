"""The sans-IO V1 codec (``lmqd.lookup``): parsing, errors, responses, both sides.

Rules for this module (after ``h11/tests/test_io.py``): every parser case runs three ways --
the bytes whole, one byte at a time, and whole followed by another command in the same buffer
("trailing", a PING that must come out as the next event) -- and must give the same result.
Error strings are nsqlookupd v1.3.0's, byte for byte (nsqlookupd-reference.md §1.5).
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys

import pytest

from lmqd.lookup import (
    Command,
    ConnectionClosed,
    Error,
    Identify,
    IdentifyResponse,
    LookupClientConnection,
    LookupProtocolError,
    LookupServerConnection,
    Ok,
    PeerState,
    Ping,
    Register,
    Unregister,
)

MODES = ("whole", "bytewise", "trailing")
MAGIC = b"  V1"
NSQD_BODY = (
    b'{"broadcast_address":"vm","hostname":"vm","http_port":4151,"tcp_port":4150,'
    b'"version":"1.3.0"}'
)
NSQD_IDENTIFY = b"IDENTIFY\n" + struct.pack(">i", len(NSQD_BODY)) + NSQD_BODY
NSQD_PEER = Identify(
    broadcast_address="vm", tcp_port=4150, http_port=4151, version="1.3.0", hostname="vm"
)


def sized(body: bytes) -> bytes:
    return struct.pack(">i", len(body)) + body


def feed(
    data: bytes, mode: str, *, setup: bytes = MAGIC, eof: bool = False
) -> tuple[list[object], LookupProtocolError | None]:
    """Events and error from a fresh connection given ``setup`` (its events dropped), then
    ``data`` in ``mode``, then EOF if asked."""
    conn = LookupServerConnection()
    if setup:
        conn.receive_data(setup)
        conn.next_events()
    pieces = [data[i : i + 1] for i in range(len(data))] if mode == "bytewise" else [data]
    if mode == "trailing":
        pieces = [data + b"PING\n"]
    events: list[object] = []
    try:
        for piece in pieces:
            conn.receive_data(piece)
            events += conn.next_events()
        if eof:
            conn.receive_data(b"")
        events += conn.next_events()
    except LookupProtocolError as exc:
        return events, exc
    if mode == "trailing":
        assert events.pop() == Ping(), events
    return events, None


def parse_ok(data: bytes, mode: str, setup: bytes = MAGIC) -> list[object]:
    events, error = feed(data, mode, setup=setup)
    assert error is None, error
    return events


def parse_error(data: bytes, mode: str, setup: bytes = MAGIC, eof: bool = False) -> bytes:
    """The error frame's payload, asserting no event came before it."""
    events, error = feed(data, mode, setup=setup, eof=eof)
    assert error is not None, events
    assert [e for e in events if not isinstance(e, ConnectionClosed)] == [], events
    frame = error.frame()
    assert struct.unpack(">i", frame[:4])[0] == len(frame) - 4
    return frame[4:]


IDENTIFIED = MAGIC + NSQD_IDENTIFY


# -- commands -----------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_identify_as_nsqd_sends_it(mode: str) -> None:
    assert parse_ok(NSQD_IDENTIFY, mode) == [NSQD_PEER]


@pytest.mark.parametrize("mode", MODES)
def test_magic_then_commands(mode: str) -> None:
    data = MAGIC + NSQD_IDENTIFY + b"REGISTER t c\nREGISTER t\nUNREGISTER t c\nUNREGISTER t\n"
    assert parse_ok(data, mode, setup=b"") == [
        NSQD_PEER,
        Register(topic="t", channel="c"),
        Register(topic="t"),
        Unregister(topic="t", channel="c"),
        Unregister(topic="t"),
    ]


@pytest.mark.parametrize("mode", MODES)
def test_ping_before_identify(mode: str) -> None:
    assert parse_ok(b"PING\n", mode) == [Ping()]


@pytest.mark.parametrize(
    ("line", "event"),
    [
        (b"PING extra args\n", Ping()),  # PING ignores its arguments
        (b"  REGISTER t c \r\n", Register(topic="t", channel="c")),  # TrimSpace, CRLF
        (b"REGISTER t c extra\n", Register(topic="t", channel="c")),  # extra params ignored
        (b"REGISTER t  c\n", Register(topic="t")),  # an empty channel means no channel
        (b"UNREGISTER t#ephemeral c#ephemeral\n",
         Unregister(topic="t#ephemeral", channel="c#ephemeral")),
        (b"REGISTER " + b"a" * 64 + b"\n", Register(topic="a" * 64)),
    ],
)  # fmt: skip
def test_line_forms(line: bytes, event: object) -> None:
    for mode in MODES:
        assert parse_ok(line, mode, setup=IDENTIFIED) == [event]


def test_identify_moves_the_state() -> None:
    conn = LookupServerConnection()
    states: list[PeerState] = [conn.state]
    conn.receive_data(MAGIC)
    assert conn.next_event() is None
    states.append(conn.state)
    conn.receive_data(NSQD_IDENTIFY)
    assert conn.next_event() == NSQD_PEER
    states.append(conn.state)
    assert states == [PeerState.AWAITING_MAGIC, PeerState.ANONYMOUS, PeerState.IDENTIFIED]


def test_eof_is_connection_closed_even_mid_line() -> None:
    for data in [b"", b"  V", MAGIC + b"REGISTER t", MAGIC]:
        conn = LookupServerConnection()
        conn.receive_data(data)
        if data:
            conn.receive_data(b"")
        assert conn.next_events() == [ConnectionClosed()]


def test_commands_before_an_error_come_first() -> None:
    conn = LookupServerConnection()
    conn.receive_data(MAGIC + b"PING\nPING\nFOO\nPING\n")
    assert conn.next_events() == [Ping(), Ping()]
    for _ in range(2):  # and every later call raises again
        with pytest.raises(LookupProtocolError) as info:
            conn.next_events()
        assert info.value.body == b"E_INVALID invalid command FOO"
    conn.receive_data(b"PING\n")  # ignored once the connection is failing
    with pytest.raises(LookupProtocolError):
        conn.next_event()


# -- errors -------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_bad_magic(mode: str) -> None:
    assert parse_error(b"  V2PING\n", mode, setup=b"") == b"E_BAD_PROTOCOL"


ERRORS = [
    (MAGIC, b"FOO\n", b"E_INVALID invalid command FOO"),
    (MAGIC, b"ping\n", b"E_INVALID invalid command ping"),  # case-sensitive
    (MAGIC, b"\n", b"E_INVALID invalid command "),
    (MAGIC, b" \r\n", b"E_INVALID invalid command "),
    (MAGIC, b"REGISTER t\n", b"E_INVALID client must IDENTIFY"),
    (MAGIC, b"UNREGISTER\n", b"E_INVALID client must IDENTIFY"),  # before the params check
    (IDENTIFIED, b"IDENTIFY\n", b"E_INVALID cannot IDENTIFY again"),
    (IDENTIFIED, b"REGISTER\n", b"E_INVALID REGISTER insufficient number of params"),
    (IDENTIFIED, b"UNREGISTER\n", b"E_INVALID UNREGISTER insufficient number of params"),
    (IDENTIFIED, b"REGISTER bad!topic\n",
     b"E_BAD_TOPIC REGISTER topic name 'bad!topic' is not valid"),
    (IDENTIFIED, b"REGISTER  t\n", b"E_BAD_TOPIC REGISTER topic name '' is not valid"),
    (IDENTIFIED, b"UNREGISTER " + b"a" * 65 + b"\n",
     b"E_BAD_TOPIC UNREGISTER topic name '" + b"a" * 65 + b"' is not valid"),
    (IDENTIFIED, b"REGISTER t bad!chan\n",
     b"E_BAD_CHANNEL REGISTER channel name 'bad!chan' is not valid"),
    (IDENTIFIED, b"UNREGISTER t c#ephemeral#x\n",
     b"E_BAD_CHANNEL UNREGISTER channel name 'c#ephemeral#x' is not valid"),
    (MAGIC, b"IDENTIFY\n" + sized(b"not json"), b"E_BAD_BODY IDENTIFY failed to decode JSON body"),
    (MAGIC, b"IDENTIFY\n" + sized(b""), b"E_BAD_BODY IDENTIFY failed to decode JSON body"),
    (MAGIC, b"IDENTIFY\n" + sized(b"[]"), b"E_BAD_BODY IDENTIFY failed to decode JSON body"),
    (MAGIC, b"IDENTIFY\n" + sized(b'{"tcp_port":"4150"}'),
     b"E_BAD_BODY IDENTIFY failed to decode JSON body"),
    (MAGIC, b"IDENTIFY\n" + sized(NSQD_BODY[:-1] + b',"http_port":4151.0}'),
     b"E_BAD_BODY IDENTIFY failed to decode JSON body"),
    (MAGIC, b"IDENTIFY\n" + sized(NSQD_BODY[:-1] + b',"remote_address":1}'),
     b"E_BAD_BODY IDENTIFY failed to decode JSON body"),
    (MAGIC, b"IDENTIFY\n" + sized(NSQD_BODY[:-1] + b',"tcp_port":NaN}'),
     b"E_BAD_BODY IDENTIFY failed to decode JSON body"),
    (MAGIC, b"IDENTIFY\n" + sized(b"null"), b"E_BAD_BODY IDENTIFY missing fields"),
    (MAGIC, b"IDENTIFY\n" + sized(b'{"broadcast_address":"a","tcp_port":1,"http_port":2}'),
     b"E_BAD_BODY IDENTIFY missing fields"),
    (MAGIC, b"IDENTIFY\n" + sized(NSQD_BODY.replace(b"4150", b"0")),
     b"E_BAD_BODY IDENTIFY missing fields"),
    (MAGIC, b"IDENTIFY\n" + struct.pack(">i", -1), b"E_BAD_BODY IDENTIFY invalid body size -1"),
    (MAGIC, b"IDENTIFY\n" + struct.pack(">i", 1024 * 1024 + 1),
     b"E_BAD_BODY IDENTIFY body too big 1048577 > 1048576"),
    (MAGIC, b"REGISTER " + b"x" * 1100, b"E_INVALID command line too long (limit 1024 bytes)"),
    (MAGIC, b"PING" + b" " * 1100 + b"\n", b"E_INVALID command line too long (limit 1024 bytes)"),
]  # fmt: skip


@pytest.mark.parametrize(("setup", "data", "payload"), ERRORS)
@pytest.mark.parametrize("mode", MODES)
def test_errors(mode: str, setup: bytes, data: bytes, payload: bytes) -> None:
    assert parse_error(data, mode, setup=setup) == payload


@pytest.mark.parametrize(
    ("data", "payload"),
    [
        (b"IDENTIFY\n", b"E_BAD_BODY IDENTIFY failed to read body size"),
        (b"IDENTIFY\n\x00\x00", b"E_BAD_BODY IDENTIFY failed to read body size"),
        (b"IDENTIFY\n" + NSQD_IDENTIFY[9:-1], b"E_BAD_BODY IDENTIFY failed to read body"),
    ],
)
@pytest.mark.parametrize("mode", ["whole", "bytewise"])
def test_eof_inside_identify(mode: str, data: bytes, payload: bytes) -> None:
    assert parse_error(data, mode, eof=True) == payload


def test_oversized_identify_is_refused_before_its_body_arrives() -> None:
    conn = LookupServerConnection(max_identify_size=100)
    conn.receive_data(MAGIC + b"IDENTIFY\n" + struct.pack(">i", 101))
    with pytest.raises(LookupProtocolError) as info:
        conn.next_event()
    assert info.value.body == b"E_BAD_BODY IDENTIFY body too big 101 > 100"


# -- IDENTIFY bodies as Go's encoding/json reads them ------------------------------------------


@pytest.mark.parametrize(
    ("body", "peer"),
    [
        # Keys match case-insensitively; unknown keys (nsqd master's topology_*) are ignored.
        (b'{"BROADCAST_ADDRESS":"a","Tcp_Port":1,"http_port":2,"version":"v","x":[{}],'
         b'"topology_zone":"z"}',
         Identify(broadcast_address="a", tcp_port=1, http_port=2, version="v")),
        # The last of a repeated key wins; null leaves the earlier value.
        (b'{"broadcast_address":"a","broadcast_address":"b","tcp_port":1,"tcp_port":null,'
         b'"http_port":2,"version":"v"}',
         Identify(broadcast_address="b", tcp_port=1, http_port=2, version="v")),
        # Negative ports are non-zero; the long s folds onto "s".
        (b'{"broadca\xc5\xbft_address":"a","tcp_port":-1,"http_port":2,"version":"v",'
         b'"hostname":"h\\ud800"}',
         Identify(broadcast_address="a", tcp_port=-1, http_port=2, version="v",
                  hostname="h\ufffd")),
    ],
)  # fmt: skip
def test_identify_json_like_go(body: bytes, peer: Identify) -> None:
    assert parse_ok(b"IDENTIFY\n" + sized(body), "whole") == [peer]


def test_identify_int_out_of_int64_is_a_decode_error() -> None:
    body = NSQD_BODY.replace(b"4150", str(2**63).encode())
    assert parse_error(b"IDENTIFY\n" + sized(body), "whole") == (
        b"E_BAD_BODY IDENTIFY failed to decode JSON body"
    )


# -- responses and the client side ------------------------------------------------------------


def test_response_bytes() -> None:
    assert LookupServerConnection.send(Ok()) == b"\x00\x00\x00\x02OK"
    answer = IdentifyResponse(
        broadcast_address="127.0.0.1", tcp_port=4160, http_port=4161, version="1.3.0",
        hostname="vm",
    )  # fmt: skip
    payload = (
        b'{"broadcast_address":"127.0.0.1","hostname":"vm","http_port":4161,"tcp_port":4160,'
        b'"version":"1.3.0"}'
    )
    # 100 bytes (the reference's sample says 0x66 for this payload; its bytes count 0x64).
    assert LookupServerConnection.send(answer) == b"\x00\x00\x00\x64" + payload
    assert LookupServerConnection.send(Error(code="E_INVALID", text="x y")) == (
        b"\x00\x00\x00\x0dE_INVALID x y"
    )


def test_client_encodes_as_nsqd() -> None:
    conn = LookupClientConnection()
    assert conn.initial_bytes() == MAGIC
    assert conn.send(NSQD_PEER) == NSQD_IDENTIFY
    assert conn.send(Register(topic="t", channel="c")) == b"REGISTER t c\n"
    assert conn.send(Register(topic="t")) == b"REGISTER t\n"
    assert conn.send(Unregister(topic="t", channel="c")) == b"UNREGISTER t c\n"
    assert conn.send(Unregister(topic="t")) == b"UNREGISTER t\n"
    assert conn.send(Ping()) == b"PING\n"
    assert conn.pending == 6


def test_client_body_escapes_like_go() -> None:
    event = Identify(broadcast_address="a<b>&", tcp_port=1, http_port=2, version="v",
                     hostname="h\u2028é")  # fmt: skip
    body = event.encode()[13:]
    assert b"a\\u003cb\\u003e\\u0026" in body
    assert "h\\u2028é".encode() in body
    assert json.loads(body)["hostname"] == "h\u2028é"


@pytest.mark.parametrize("mode", ["whole", "bytewise"])
def test_client_parses_responses_in_command_order(mode: str) -> None:
    conn = LookupClientConnection()
    for command in (NSQD_PEER, Register(topic="t"), Ping(), Register(topic="bad")):
        conn.send(command)
    data = (
        sized(b'{"broadcast_address":"lk","hostname":"h","http_port":4161,"tcp_port":4160,'
              b'"version":"1.3.0","extra":1}')
        + b"\x00\x00\x00\x02OK\x00\x00\x00\x02OK"
        + sized(b"E_BAD_TOPIC REGISTER topic name 'bad' is not valid")
    )  # fmt: skip
    pieces = [data[i : i + 1] for i in range(len(data))] if mode == "bytewise" else [data]
    events: list[object] = []
    for piece in pieces:
        conn.receive_data(piece)
        while (event := conn.next_event()) is not None:
            events.append(event)
    conn.receive_data(b"")
    events.append(conn.next_event())
    assert events == [
        IdentifyResponse(broadcast_address="lk", tcp_port=4160, http_port=4161,
                         version="1.3.0", hostname="h"),
        Ok(),
        Ok(),
        Error(code="E_BAD_TOPIC", text="REGISTER topic name 'bad' is not valid"),
        ConnectionClosed(),
    ]  # fmt: skip
    assert conn.pending == 0


@pytest.mark.parametrize(
    ("command", "payload"),
    [
        (NSQD_PEER, b"OK"),  # nsqd drops a lookupd whose IDENTIFY answer is not JSON
        (NSQD_PEER, b"[1]"),
        (Ping(), b"PONG"),
        (None, b"OK"),  # an answer to nothing
    ],
)
def test_client_rejects_responses_that_are_not_v1(command: Ping | None, payload: bytes) -> None:
    conn = LookupClientConnection()
    if command is not None:
        conn.send(command)
    conn.receive_data(sized(payload))
    for _ in range(2):
        with pytest.raises(LookupProtocolError) as info:
            conn.next_event()
        assert info.value.code == "E_BAD_PROTOCOL"


def test_client_bounds_the_response_size() -> None:
    conn = LookupClientConnection(max_response_size=10)
    conn.send(Ping())
    conn.receive_data(struct.pack(">i", 11))
    with pytest.raises(LookupProtocolError):
        conn.next_event()


def test_client_identify_answer_null_is_empty_info() -> None:
    # nsqd accepts it and then logs the empty broadcast_address; the caller decides.
    conn = LookupClientConnection()
    conn.send(NSQD_PEER)
    conn.receive_data(sized(b"null"))
    assert conn.next_event() == IdentifyResponse(
        broadcast_address="", tcp_port=0, http_port=0, version=""
    )


def test_client_and_server_codecs_round_trip() -> None:
    client = LookupClientConnection()
    server = LookupServerConnection()
    commands: list[Command] = [
        NSQD_PEER, Register(topic="t", channel="c#ephemeral"), Unregister(topic="t"), Ping(),
    ]  # fmt: skip
    server.receive_data(client.initial_bytes() + b"".join(client.send(c) for c in commands))
    assert server.next_events() == commands


@pytest.mark.parametrize("name", ["trio", "socket", "asyncio"])
def test_the_codec_imports_no_io(name: str) -> None:
    code = f"import lmqd.lookup, sys; assert {name!r} not in sys.modules, {name!r}"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr

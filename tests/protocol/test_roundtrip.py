"""Round trips (client.send -> server parse, server frames -> client parse), fuzzing, imports."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lmqd.message import Message
from lmqd.protocol import (
    Auth,
    ClientConnection,
    Cls,
    Command,
    Dpub,
    Fin,
    Identify,
    Limits,
    MessageFrame,
    Mpub,
    Nop,
    ProtocolError,
    Pub,
    Rdy,
    Req,
    ServerConnection,
    Sub,
    Touch,
    encode_messages,
    errors,
    negotiate,
    one_per_command,
)

from .feeding import MAGIC, MSG_ID, SUBSCRIBE, server, size

COMMANDS: list[Command] = [
    Nop(),
    Pub(topic="orders", body=b"one"),
    Mpub(topic="orders#ephemeral", bodies=[b"a", b"b" * 1000]),
    Dpub(topic="t#tmp", defer_ms=1500, body=b"later"),
    Sub(topic="orders", channel="billing"),
    Rdy(count=100),
    Fin(id=MSG_ID),
    Req(id=MSG_ID, timeout_ms=2000),
    Touch(id=MSG_ID),
    Cls(),
    Fin(id=MSG_ID),
]


def test_client_send_to_server_parse() -> None:
    client = ClientConnection()
    identify = {"client_id": "c", "feature_negotiation": True, "heartbeat_interval": 5000}
    wire = client.initial_bytes() + client.send(identify) + client.send(Auth(secret=b"pw"))
    wire += b"".join(client.send(c) for c in COMMANDS)
    conn = ServerConnection(Limits())
    conn.receive_data(wire)
    events = conn.next_events()
    expected_identify = Identify(settings=negotiate(identify, Limits()), data=identify)
    assert one_per_command(events) == [expected_identify, Auth(secret=b"pw"), *COMMANDS]


def test_identify_event_encodes_its_data() -> None:
    data = {"user_agent": "x/1", "msg_timeout": 3000}
    event = Identify(settings=negotiate(data, Limits()), data=data)
    conn = server()
    conn.receive_data(event.encode())
    assert conn.next_events() == [event]


def test_server_frames_to_client_parse() -> None:
    msgs = [
        Message(b"%016x" % i, b"body %d" % i, 1_700_000_000_000_000_000 + i, i) for i in range(5)
    ]
    client = ClientConnection()
    client.receive_data(
        encode_messages(msgs) + errors.fin_failed(MSG_ID, errors.ID_NOT_IN_FLIGHT).frame()
    )
    events = client.next_events()
    assert events[:5] == [
        MessageFrame(id=m.id, timestamp=m.timestamp, attempts=m.attempts, body=m.body) for m in msgs
    ]
    error = events[5]
    assert error.code == "E_FIN_FAILED"  # type: ignore[union-attr]
    assert error.text == "FIN 0123456789abcdef failed ID not in flight"  # type: ignore[union-attr]
    assert not error.fatal  # type: ignore[union-attr]


# -- property tests -----------------------------------------------------------------------------

names = st.from_regex(r"[.a-zA-Z0-9_-]{1,54}(#ephemeral|#tmp)?", fullmatch=True)
# Any 16 bytes without a space or newline, not ending in "\r" (which reads as a line ending).
ids = st.binary(min_size=16, max_size=16).filter(
    lambda b: b" " not in b and b"\n" not in b and not b.endswith(b"\r")
)
bodies = st.binary(min_size=1, max_size=300)
anytime_commands = st.one_of(
    st.builds(Pub, topic=names, body=bodies),
    st.builds(Mpub, topic=names, bodies=st.lists(bodies, min_size=1, max_size=10)),
    st.builds(Dpub, topic=names, defer_ms=st.integers(0, 3_600_000), body=bodies),
    st.just(Nop()),
)
subscribed_commands = st.one_of(
    anytime_commands,
    st.builds(Rdy, count=st.integers(0, 2500)),
    st.builds(Fin, id=ids),
    st.builds(Req, id=ids, timeout_ms=st.integers(0, 2**64 - 1)),
    st.builds(Touch, id=ids),
)


def fed_in_pieces(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    pieces = [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]
    return [p for p in pieces if p]  # b"" would mean EOF


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    commands=st.lists(subscribed_commands, max_size=30),
    cuts=st.lists(st.integers(min_value=0), max_size=20),
)
def test_any_command_sequence_in_any_pieces(commands: list[Command], cuts: list[int]) -> None:
    """Valid commands come back equal whatever the receive boundaries."""
    wire = b"".join(c.encode() for c in commands)
    conn = server(SUBSCRIBE)
    events = []
    for piece in fed_in_pieces(wire, cuts):
        conn.receive_data(piece)
        events.extend(conn.next_events())
    assert one_per_command(events) == commands


# Random bytes rarely spell a command; mixing in the protocol's own tokens reaches the body
# parsers and their error paths too.
tokens = st.one_of(
    st.sampled_from(
        [
            b"PUB ",
            b"MPUB ",
            b"DPUB ",
            b"SUB ",
            b"RDY ",
            b"FIN ",
            b"REQ ",
            b"TOUCH ",
            b"IDENTIFY",
            b"AUTH",
            b"CLS",
            b"NOP",
            b"\n",
            b"\r\n",
            b" ",
            b"t",
            b"c#tmp",
            b"-1",
            b"0",
            b"123",
            b"{}",
            b'{"heartbeat_interval":-1}',
            MSG_ID,
        ]
    ),
    st.integers(-(2**31), 2**31 - 1).map(size),
    st.integers(0, 400).map(size),
    st.binary(max_size=8),
)
garbage_bytes = st.one_of(st.binary(max_size=400), st.lists(tokens, max_size=40).map(b"".join))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    garbage=garbage_bytes,
    setup=st.sampled_from([b"", SUBSCRIBE, SUBSCRIBE + b"CLS\n"]),
    cuts=st.lists(st.integers(min_value=0), max_size=8),
)
def test_garbage_only_ever_raises_protocol_error(
    garbage: bytes, setup: bytes, cuts: list[int]
) -> None:
    conn = server(setup, Limits(max_msg_size=200, max_body_size=300, max_line_length=256))
    try:
        for piece in fed_in_pieces(garbage, cuts):
            conn.receive_data(piece)
            conn.next_events()
        conn.receive_data(b"")
        conn.next_events()
    except ProtocolError as exc:
        assert exc.fatal
        assert exc.frame().endswith(exc.body)
        with pytest.raises(ProtocolError):  # errored for good
            conn.next_events()


@settings(max_examples=200, deadline=None)
@given(garbage=st.binary(max_size=200), cuts=st.lists(st.integers(min_value=0), max_size=8))
def test_garbage_before_magic(garbage: bytes, cuts: list[int]) -> None:
    conn = ServerConnection(Limits())
    try:
        for piece in fed_in_pieces(garbage, cuts):
            conn.receive_data(piece)
            assert conn.next_events() == [] or garbage.startswith(MAGIC)
    except ProtocolError as exc:
        assert exc.code == "E_BAD_PROTOCOL" or garbage.startswith(MAGIC)


@settings(max_examples=200, deadline=None)
@given(garbage=st.binary(max_size=300), cuts=st.lists(st.integers(min_value=0), max_size=8))
def test_client_garbage_only_ever_raises_protocol_error(garbage: bytes, cuts: list[int]) -> None:
    conn = ClientConnection(max_frame_size=256)
    try:
        for piece in fed_in_pieces(garbage, cuts):
            conn.receive_data(piece)
            conn.next_events()
    except ProtocolError as exc:
        assert exc.code == "E_BAD_PROTOCOL"


# -- packaging ----------------------------------------------------------------------------------


def test_importing_the_protocol_does_not_import_trio() -> None:
    code = "import lmqd.protocol, sys; assert 'trio' not in sys.modules, 'trio was imported'"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("name", ["socket", "trio", "asyncio"])
def test_protocol_modules_import_no_io(name: str) -> None:
    code = f"import lmqd.protocol, sys; assert {name!r} not in sys.modules"
    # socket is imported by lmqd.options (Options' defaults), which the protocol must not need.
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr

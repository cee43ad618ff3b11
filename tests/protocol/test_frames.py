"""Frames: the daemon's encoders, and ClientConnection decoding them in every feeding mode."""

from __future__ import annotations

import pytest

from lmqd.message import Message
from lmqd.protocol import (
    CLOSE_WAIT_FRAME,
    FRAME_TYPE_ERROR,
    FRAME_TYPE_MESSAGE,
    FRAME_TYPE_RESPONSE,
    HEARTBEAT_FRAME,
    OK_FRAME,
    ClientConnection,
    Error,
    MessageFrame,
    ProtocolError,
    Response,
    encode_error,
    encode_message,
    encode_messages,
    encode_response,
    errors,
    message_frame_parts,
)

from .feeding import MODES, MSG_ID, client_feed, size

TS = 1_700_000_000_123_456_789


def test_frame_type_numbers() -> None:
    assert (FRAME_TYPE_RESPONSE, FRAME_TYPE_ERROR, FRAME_TYPE_MESSAGE) == (0, 1, 2)


def test_constant_frames() -> None:
    assert OK_FRAME == b"\x00\x00\x00\x06\x00\x00\x00\x00OK"
    assert HEARTBEAT_FRAME == b"\x00\x00\x00\x0f\x00\x00\x00\x00_heartbeat_"
    assert CLOSE_WAIT_FRAME == b"\x00\x00\x00\x0e\x00\x00\x00\x00CLOSE_WAIT"


def test_encode_response_and_error() -> None:
    assert encode_response(b"") == size(4) + size(0)
    assert encode_error(b"E_INVALID x") == size(15) + size(1) + b"E_INVALID x"
    error = errors.invalid_command(b"ASDF")
    assert error.frame() == encode_error(error.body)


def test_encode_message_layout() -> None:
    frame = encode_message(Message(MSG_ID, b"body", TS, 3))
    assert frame == (
        size(4 + 8 + 2 + 16 + 4)
        + size(2)
        + TS.to_bytes(8, "big")
        + (3).to_bytes(2, "big")
        + MSG_ID
        + b"body"
    )


def test_attempts_wrap_as_a_uint16() -> None:
    frame = encode_message(Message(MSG_ID, b"b", TS, 65536 + 7))
    assert frame[16:18] == b"\x00\x07"
    assert encode_messages([Message(MSG_ID, b"b", TS, 65536 + 7)]) == frame


def test_encode_messages_is_the_concatenation() -> None:
    msgs = [Message(b"%016x" % i, b"m" * i, TS + i, i + 1) for i in range(20)]
    assert encode_messages(msgs) == b"".join(encode_message(m) for m in msgs)
    assert encode_messages([]) == b""
    assert encode_messages(iter(msgs[:2])) == encode_message(msgs[0]) + encode_message(msgs[1])


def test_message_frame_parts_appends_and_counts_bytes() -> None:
    msgs = [Message(b"%016x" % i, b"m" * (i + 1), TS + i, i + 1) for i in range(5)]
    parts = [OK_FRAME]  # appended to, after what is already there
    size = message_frame_parts(msgs, parts)
    assert parts[0] == OK_FRAME and len(parts) == 1 + 2 * len(msgs)
    assert b"".join(parts[1:]) == encode_messages(msgs)
    assert size == len(encode_messages(msgs))


# -- decoding --------------------------------------------------------------------------------------

FRAMES: list[tuple[str, bytes, list[object]]] = [
    ("ok", OK_FRAME, [Response(data=b"OK")]),
    ("heartbeat", HEARTBEAT_FRAME, [Response(data=b"_heartbeat_")]),
    ("empty response", encode_response(b""), [Response(data=b"")]),
    ("json", encode_response(b'{"a":1}'), [Response(data=b'{"a":1}')]),
    (
        "error",
        errors.rdy_out_of_range(51, 50).frame(),
        [Error(code="E_INVALID", text="RDY count 51 out of range 0-50")],
    ),
    ("bare error", errors.bad_protocol().frame(), [Error(code="E_BAD_PROTOCOL", text="")]),
    (
        "raw error bytes",
        errors.invalid_command(b"\xff").frame(),
        [Error(code="E_INVALID", text="invalid command \\xff")],
    ),
    (
        "message",
        encode_message(Message(MSG_ID, b"payload\n", TS, 2)),
        [MessageFrame(id=MSG_ID, timestamp=TS, attempts=2, body=b"payload\n")],
    ),
    (
        "empty message body",
        encode_message(Message(MSG_ID, b"", TS, 1)),
        [MessageFrame(id=MSG_ID, timestamp=TS, attempts=1, body=b"")],
    ),
    (
        "batch",
        encode_messages([Message(b"%016d" % i, b"%d" % i, TS, 1) for i in range(3)]) + OK_FRAME,
        [MessageFrame(id=b"%016d" % i, timestamp=TS, attempts=1, body=b"%d" % i) for i in range(3)]
        + [Response(data=b"OK")],
    ),
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("data", "expected"), [f[1:] for f in FRAMES], ids=[f[0] for f in FRAMES])
def test_client_decodes(mode: str, data: bytes, expected: list[object]) -> None:
    events, error = client_feed(ClientConnection(), data, mode, trailer=HEARTBEAT_FRAME)
    assert error is None
    if mode == "trailing":
        assert events[-1] == Response(data=b"_heartbeat_")
        events.pop()
    assert events == expected


def test_decoded_fields_are_bytes_and_ints() -> None:
    conn = ClientConnection()
    conn.receive_data(encode_message(Message(MSG_ID, b"x", TS, 65535)))
    (frame,) = conn.next_events()
    assert isinstance(frame, MessageFrame)
    assert type(frame.id) is bytes and type(frame.body) is bytes
    assert frame.attempts == 65535


def test_error_event_fatality() -> None:
    assert Error(code="E_INVALID", text="x").fatal
    for code in ("E_FIN_FAILED", "E_REQ_FAILED", "E_TOUCH_FAILED"):
        assert not Error(code=code, text="x").fatal


def test_heartbeat_property() -> None:
    assert Response(data=b"_heartbeat_").is_heartbeat
    assert not Response(data=b"OK").is_heartbeat


BAD_FRAMES = [
    ("size below 4", size(3) + b"abc", "invalid frame size 3"),
    ("negative size", size(-1), "invalid frame size -1"),
    ("too big", size(1025) + size(0), "frame too big 1025 > 1024"),
    ("unknown type", size(4) + size(4), "unknown frame type 4"),
    ("short extended message", size(4 + 27) + size(3) + b"x" * 27, "message frame too short (31)"),
    (
        "extension past the frame",
        size(4 + 28) + size(3) + b"x" * 26 + b"\x00\x05",
        "extension block past the frame's end",
    ),
    (
        "bad extension block",
        size(4 + 29) + size(3) + b"x" * 26 + b"\x00\x01\x10",
        "bad extension block: unknown extension flags 0x10",
    ),
    ("short message", size(4 + 25) + size(2) + b"x" * 25, "message frame too short (29)"),
]


@pytest.mark.parametrize("mode", ["whole", "bytewise"])
@pytest.mark.parametrize(
    ("data", "text"), [f[1:] for f in BAD_FRAMES], ids=[f[0] for f in BAD_FRAMES]
)
def test_client_refuses_bad_frames(mode: str, data: bytes, text: str) -> None:
    conn = ClientConnection(max_frame_size=1024)
    events, error = client_feed(conn, data, mode, trailer=b"")
    assert events == []
    assert error is not None
    assert error.code == "E_BAD_PROTOCOL"
    assert error.text == text
    with pytest.raises(ProtocolError):  # and it stays broken
        conn.next_events()


def test_client_refuses_a_huge_size_before_the_frame_arrives() -> None:
    conn = ClientConnection()
    conn.receive_data(size(2**31 - 1))
    with pytest.raises(ProtocolError, match="frame too big 2147483647 > 16777216"):
        conn.next_events()


def test_client_returns_good_frames_before_a_bad_one() -> None:
    conn = ClientConnection()
    conn.receive_data(OK_FRAME + size(4) + size(9))
    assert conn.next_events() == [Response(data=b"OK")]
    with pytest.raises(ProtocolError, match="unknown frame type 9"):
        conn.next_events()


def test_next_event_one_at_a_time() -> None:
    conn = ClientConnection()
    assert conn.next_event() is None
    conn.receive_data(OK_FRAME + HEARTBEAT_FRAME + OK_FRAME[:5])
    assert conn.next_event() == Response(data=b"OK")
    assert conn.next_event() == Response(data=b"_heartbeat_")
    assert conn.next_event() is None
    conn.receive_data(OK_FRAME[5:])
    assert conn.next_event() == Response(data=b"OK")
    assert conn.next_event() is None


def test_client_eof() -> None:
    conn = ClientConnection()
    conn.receive_data(OK_FRAME + OK_FRAME[:3])
    conn.receive_data(b"")
    assert conn.next_event() == Response(data=b"OK")
    assert conn.next_event() is None  # the partial frame is dropped
    assert conn.closed
    with pytest.raises(RuntimeError):
        conn.receive_data(b"more")


def test_client_closed_only_after_pending_events_are_taken() -> None:
    conn = ClientConnection()
    conn.receive_data(OK_FRAME + OK_FRAME)
    conn.receive_data(b"")
    assert conn.next_event() == Response(data=b"OK")
    assert not conn.closed  # one frame is still to be taken
    assert conn.next_event() == Response(data=b"OK")
    assert conn.closed


def test_initial_bytes() -> None:
    assert ClientConnection.initial_bytes() == b"  V2"

"""ServerConnection: every error, with nsqd's exact string, in every feeding mode."""

from __future__ import annotations

import time

import pytest

from lmqd.protocol import Limits, Nop, ProtocolError, Pub, ServerConnection

from .feeding import (
    MAGIC,
    MODES,
    MSG_ID,
    SUBSCRIBE,
    feed,
    parse,
    parse_error,
    server,
    size,
    sized,
)

CLOSING = SUBSCRIBE + b"CLS\n"
SMALL = Limits(max_msg_size=100, max_body_size=1000, max_rdy_count=50)


def body_of(error: ProtocolError) -> bytes:
    assert error.fatal
    return error.body


# -- (command, setup, limits, expected error body) -----------------------------------------------

CASES: list[tuple[str, bytes, bytes, Limits | None, bytes]] = [
    # unknown commands
    ("unknown", b"ASDF\n", b"", None, b"E_INVALID invalid command ASDF"),
    ("empty line", b"\n", b"", None, b"E_INVALID invalid command "),
    ("empty crlf line", b"\r\n", b"", None, b"E_INVALID invalid command "),
    ("lowercase", b"nop\n", b"", None, b"E_INVALID invalid command nop"),
    ("raw bytes", b"\xff\xfe x\n", b"", None, b"E_INVALID invalid command \xff\xfe"),
    ("leading space", b" NOP\n", b"", None, b"E_INVALID invalid command "),
    # state
    ("RDY in init", b"RDY 1\n", b"", None, b"E_INVALID cannot RDY in current state"),
    ("FIN in init", b"FIN " + MSG_ID + b"\n", b"", None, b"E_INVALID cannot FIN in current state"),
    (
        "REQ in init",
        b"REQ " + MSG_ID + b" 1\n",
        b"",
        None,
        b"E_INVALID cannot REQ in current state",
    ),
    ("TOUCH in init", b"TOUCH x\n", b"", None, b"E_INVALID cannot TOUCH in current state"),
    ("CLS in init", b"CLS\n", b"", None, b"E_INVALID cannot CLS in current state"),
    ("CLS twice", b"CLS\n", CLOSING, None, b"E_INVALID cannot CLS in current state"),
    ("SUB twice", b"SUB t c\n", SUBSCRIBE, None, b"E_INVALID cannot SUB in current state"),
    ("SUB closing", b"SUB t c\n", CLOSING, None, b"E_INVALID cannot SUB in current state"),
    (
        "IDENTIFY after SUB",
        b"IDENTIFY\n",
        SUBSCRIBE,
        None,
        b"E_INVALID cannot IDENTIFY in current state",
    ),
    (
        "IDENTIFY twice",
        b"IDENTIFY\n",
        b"IDENTIFY\n" + sized(b"{}"),
        None,
        b"E_INVALID cannot IDENTIFY in current state",
    ),
    ("AUTH after SUB", b"AUTH\n", SUBSCRIBE, None, b"E_INVALID cannot AUTH in current state"),
    (
        "SUB without heartbeats",
        b"SUB t c\n",
        b"IDENTIFY\n" + sized(b'{"heartbeat_interval":-1}'),
        None,
        b"E_INVALID cannot SUB with heartbeats disabled",
    ),
    # parameters
    ("SUB no channel", b"SUB t\n", b"", None, b"E_INVALID SUB insufficient number of parameters"),
    ("SUB no params", b"SUB\n", b"", None, b"E_INVALID SUB insufficient number of parameters"),
    ("PUB no topic", b"PUB\n", b"", None, b"E_INVALID PUB insufficient number of parameters"),
    ("MPUB no topic", b"MPUB\n", b"", None, b"E_INVALID MPUB insufficient number of parameters"),
    ("DPUB no defer", b"DPUB t\n", b"", None, b"E_INVALID DPUB insufficient number of parameters"),
    ("FIN no id", b"FIN\n", SUBSCRIBE, None, b"E_INVALID FIN insufficient number of params"),
    (
        "REQ no timeout",
        b"REQ " + MSG_ID + b"\n",
        SUBSCRIBE,
        None,
        b"E_INVALID REQ insufficient number of params",
    ),
    ("TOUCH no id", b"TOUCH\n", SUBSCRIBE, None, b"E_INVALID TOUCH insufficient number of params"),
    ("AUTH with a param", b"AUTH x\n", b"", None, b"E_INVALID AUTH invalid number of parameters"),
    ("AUTH trailing space", b"AUTH \n", b"", None, b"E_INVALID AUTH invalid number of parameters"),
    # message IDs
    ("FIN short id", b"FIN abc\n", SUBSCRIBE, None, b"E_INVALID invalid message ID"),
    ("FIN long id", b"FIN " + MSG_ID + b"0\n", SUBSCRIBE, None, b"E_INVALID invalid message ID"),
    (
        "FIN id with cr",
        b"FIN 0123456789abcde\r\n",
        SUBSCRIBE,
        None,
        b"E_INVALID invalid message ID",
    ),
    ("REQ bad id", b"REQ abc 10\n", SUBSCRIBE, None, b"E_INVALID invalid message ID"),
    ("TOUCH bad id", b"TOUCH abc\n", SUBSCRIBE, None, b"E_INVALID invalid message ID"),
    # numbers: unsigned decimal only
    ("RDY negative", b"RDY -1\n", SUBSCRIBE, None, b"E_INVALID RDY could not parse count -1"),
    ("RDY hex", b"RDY 0x10\n", SUBSCRIBE, None, b"E_INVALID RDY could not parse count 0x10"),
    ("RDY plus", b"RDY +5\n", SUBSCRIBE, None, b"E_INVALID RDY could not parse count +5"),
    (
        "RDY unicode digit",
        "RDY \u0661\n".encode(),
        SUBSCRIBE,
        None,
        b"E_INVALID RDY could not parse count \xd9\xa1",
    ),
    ("RDY too many", b"RDY 51\n", SUBSCRIBE, SMALL, b"E_INVALID RDY count 51 out of range 0-50"),
    (
        "RDY default max",
        b"RDY 2501\n",
        SUBSCRIBE,
        None,
        b"E_INVALID RDY count 2501 out of range 0-2500",
    ),
    # nsqd converts the uint64 to int64: 2**64-1 shows as -1
    (
        "RDY uint64 max",
        b"RDY 18446744073709551615\n",
        SUBSCRIBE,
        None,
        b"E_INVALID RDY count -1 out of range 0-2500",
    ),
    (
        "REQ negative",
        b"REQ " + MSG_ID + b" -1\n",
        SUBSCRIBE,
        None,
        b"E_INVALID REQ could not parse timeout -1",
    ),
    ("DPUB negative", b"DPUB t -1\n", b"", None, b"E_INVALID DPUB could not parse timeout -1"),
    (
        "DPUB too late",
        b"DPUB t 3600001\n",
        b"",
        None,
        b"E_INVALID DPUB timeout 3600001 out of range 0-3600000",
    ),
    # names (quoted like Go's %q)
    ("SUB bad topic", b"SUB t! c\n", b"", None, b'E_BAD_TOPIC SUB topic name "t!" is not valid'),
    (
        "SUB bad channel",
        b"SUB t c$\n",
        b"",
        None,
        b'E_BAD_CHANNEL SUB channel name "c$" is not valid',
    ),
    ("SUB empty topic", b"SUB  c\n", b"", None, b'E_BAD_TOPIC SUB topic name "" is not valid'),
    (
        "SUB long topic",
        b"SUB " + b"t" * 65 + b" c\n",
        b"",
        None,
        b'E_BAD_TOPIC SUB topic name "' + b"t" * 65 + b'" is not valid',
    ),
    (
        "SUB bad suffix",
        b"SUB t#other c\n",
        b"",
        None,
        b'E_BAD_TOPIC SUB topic name "t#other" is not valid',
    ),
    ("PUB bad topic", b"PUB a\tb\n", b"", None, b'E_BAD_TOPIC PUB topic name "a\\tb" is not valid'),
    (
        "PUB quote topic",
        b'PUB a"b\n',
        b"",
        None,
        b'E_BAD_TOPIC PUB topic name "a\\"b" is not valid',
    ),
    (
        "PUB utf8 topic",
        "PUB caf\u00e9\n".encode(),
        b"",
        None,
        'E_BAD_TOPIC PUB topic name "caf\u00e9" is not valid'.encode(),
    ),
    (
        "PUB invalid utf8 topic",
        b"PUB a\xff\n",
        b"",
        None,
        b'E_BAD_TOPIC PUB topic name "a\\xff" is not valid',
    ),
    ("DPUB bad topic", b"DPUB a* 1\n", b"", None, b'E_BAD_TOPIC DPUB topic name "a*" is not valid'),
    (
        "MPUB bad topic",
        b"MPUB x!\n",
        b"",
        None,
        b'E_BAD_TOPIC E_BAD_TOPIC MPUB topic name "x!" is not valid',
    ),
    # PUB / DPUB sizes
    (
        "PUB size 0",
        b"PUB t\n" + size(0),
        b"",
        None,
        b"E_BAD_MESSAGE PUB invalid message body size 0",
    ),
    (
        "PUB size -1",
        b"PUB t\n" + b"\xff\xff\xff\xff",
        b"",
        None,
        b"E_BAD_MESSAGE PUB invalid message body size -1",
    ),
    (
        "PUB too big",
        b"PUB t\n" + size(105),
        b"",
        SMALL,
        b"E_BAD_MESSAGE PUB message too big 105 > 100",
    ),
    (
        "PUB huge",
        b"PUB t\n" + size(2**31 - 1),
        b"",
        None,
        b"E_BAD_MESSAGE PUB message too big 2147483647 > 1048576",
    ),
    (
        "DPUB size 0",
        b"DPUB t 1\n" + size(0),
        b"",
        None,
        b"E_BAD_MESSAGE DPUB invalid message body size 0",
    ),
    (
        "DPUB too big",
        b"DPUB t 1\n" + size(101),
        b"",
        SMALL,
        b"E_BAD_MESSAGE DPUB message too big 101 > 100",
    ),
    # MPUB
    ("MPUB body size 0", b"MPUB t\n" + size(0), b"", None, b"E_BAD_BODY MPUB invalid body size 0"),
    (
        "MPUB body size -5",
        b"MPUB t\n" + size(-5),
        b"",
        None,
        b"E_BAD_BODY MPUB invalid body size -5",
    ),
    (
        "MPUB body too big",
        b"MPUB t\n" + size(1148),
        b"",
        SMALL,
        b"E_BAD_BODY MPUB body too big 1148 > 1000",
    ),
    (
        "MPUB count 0",
        b"MPUB t\n" + size(100) + size(0),
        b"",
        None,
        b"E_BAD_BODY MPUB invalid message count 0",
    ),
    (
        "MPUB count -1",
        b"MPUB t\n" + size(100) + size(-1),
        b"",
        None,
        b"E_BAD_BODY MPUB invalid message count -1",
    ),
    (
        "MPUB count too high",
        b"MPUB t\n" + size(1000) + size(200),
        b"",
        SMALL,
        b"E_BAD_BODY MPUB invalid message count 200",
    ),
    (
        "MPUB message(5) empty",
        b"MPUB t\n" + sized(size(6) + b"".join(sized(b"m") for _ in range(5)) + size(0)),
        b"",
        None,
        b"E_BAD_MESSAGE MPUB invalid message(5) body size 0",
    ),
    (
        "MPUB message(0) negative",
        b"MPUB t\n" + sized(size(1) + size(-2) + b"xx"),
        b"",
        None,
        b"E_BAD_MESSAGE MPUB invalid message(0) body size -2",
    ),
    (
        "MPUB message too big",
        b"MPUB t\n" + sized(size(1) + sized(b"m" * 101)),
        b"",
        SMALL,
        b"E_BAD_MESSAGE MPUB message too big 101 > 100",
    ),
    # lmq: the parts must fill the declared body exactly
    (
        "MPUB body too short for count",
        b"MPUB t\n" + size(3) + b"abc",
        b"",
        None,
        b"E_BAD_BODY MPUB messages do not add up to body size 3",
    ),
    (
        "MPUB trailing bytes",
        b"MPUB t\n" + sized(size(1) + sized(b"m") + b"zz"),
        b"",
        None,
        b"E_BAD_BODY MPUB messages do not add up to body size 11",
    ),
    (
        "MPUB part overruns",
        b"MPUB t\n" + sized(size(1) + size(5) + b"abc"),
        b"",
        None,
        b"E_BAD_BODY MPUB messages do not add up to body size 11",
    ),
    (
        "MPUB missing part",
        b"MPUB t\n" + sized(size(2) + sized(b"m")),
        b"",
        None,
        b"E_BAD_BODY MPUB messages do not add up to body size 9",
    ),
    (
        "MPUB size cut",
        b"MPUB t\n" + sized(size(2) + sized(b"m") + b"\x00\x00"),
        b"",
        None,
        b"E_BAD_BODY MPUB messages do not add up to body size 11",
    ),
    # IDENTIFY / AUTH bodies
    (
        "IDENTIFY too big",
        b"IDENTIFY\n" + size(1001),
        b"",
        SMALL,
        b"E_BAD_BODY IDENTIFY body too big 1001 > 1000",
    ),
    (
        "IDENTIFY size 0",
        b"IDENTIFY\n" + size(0),
        b"",
        None,
        b"E_BAD_BODY IDENTIFY invalid body size 0",
    ),
    # nsqd checks "too big" before "<= 0" for IDENTIFY and AUTH (the opposite of MPUB)
    (
        "IDENTIFY negative",
        b"IDENTIFY\n" + size(-1),
        b"",
        None,
        b"E_BAD_BODY IDENTIFY invalid body size -1",
    ),
    (
        "IDENTIFY bad json",
        b"IDENTIFY\n" + sized(b"{"),
        b"",
        None,
        b"E_BAD_BODY IDENTIFY failed to decode JSON body",
    ),
    (
        "IDENTIFY bad field",
        b"IDENTIFY\n" + sized(b'{"msg_timeout":5}'),
        b"",
        None,
        b"E_BAD_BODY IDENTIFY msg timeout (5) is invalid",
    ),
    (
        "AUTH too big",
        b"AUTH\n" + size(1001),
        b"",
        SMALL,
        b"E_BAD_BODY AUTH body too big 1001 > 1000",
    ),
    ("AUTH size 0", b"AUTH\n" + size(0), b"", None, b"E_BAD_BODY AUTH invalid body size 0"),
    (
        "AUTH twice",
        b"AUTH\n" + sized(b"b"),
        b"AUTH\n" + sized(b"a"),
        None,
        b"E_INVALID AUTH already set",
    ),
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    ("data", "setup", "limits", "expected"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_error(
    mode: str, data: bytes, setup: bytes, limits: Limits | None, expected: bytes
) -> None:
    error = parse_error(data, mode, setup, limits)
    assert body_of(error) == expected
    code, _, text = expected.partition(b" ")
    assert error.code == code.decode()
    assert error.text == text.decode("utf-8", "backslashreplace")


def test_error_frame_bytes() -> None:
    error = parse_error(b"ASDF\n", "whole")
    assert error.frame() == size(len(error.body) + 4) + size(1) + b"E_INVALID invalid command ASDF"


@pytest.mark.parametrize("magic", [b"  V1", b"GET ", b"\x00\x00\x00\x00", b"V2  "])
@pytest.mark.parametrize("mode", MODES)
def test_bad_magic(magic: bytes, mode: str) -> None:
    conn = ServerConnection(Limits())
    error = None
    data = magic + b"NOP\n"
    pieces = [data[i : i + 1] for i in range(len(data))] if mode == "bytewise" else [data]
    with pytest.raises(ProtocolError) as info:
        for piece in pieces:
            conn.receive_data(piece)
            assert conn.next_events() == []
    error = info.value
    assert error.code == "E_BAD_PROTOCOL"
    assert error.body == b"E_BAD_PROTOCOL"
    assert error.frame() == b"\x00\x00\x00\x12\x00\x00\x00\x01E_BAD_PROTOCOL"


def test_valid_commands_before_an_error_come_first() -> None:
    conn = server()
    conn.receive_data(b"NOP\nPUB t\n" + sized(b"x") + b"ASDF\nNOP\n")
    assert conn.next_events() == [Nop(), Pub(topic="t", body=b"x")]
    with pytest.raises(ProtocolError, match="invalid command ASDF"):
        conn.next_events()
    # The connection stays errored: every later call raises the same error, data is ignored.
    conn.receive_data(b"NOP\n")
    with pytest.raises(ProtocolError) as again:
        conn.next_events()
    assert again.value.body == b"E_INVALID invalid command ASDF"


def test_state_change_before_an_error_in_the_same_buffer() -> None:
    # SUB is applied at parse time, so a RDY right after it is legal and a second SUB is not.
    events, error = parse(b"SUB t c\nRDY 1\nSUB t c\n", "whole")
    assert len(events) == 2
    assert error is not None and error.body == b"E_INVALID cannot SUB in current state"


# -- limits on buffering -----------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["whole", "bytewise"])
def test_huge_declared_sizes_fail_before_the_body(mode: str) -> None:
    """The size alone is enough to refuse: nothing of the body is needed (or buffered)."""
    for data in (
        b"PUB t\n" + size(2**31 - 1),
        b"DPUB t 0\n" + size(2**31 - 1),
        b"MPUB t\n" + size(2**31 - 1),
        b"IDENTIFY\n" + size(2**31 - 1),
        b"AUTH\n" + size(2**31 - 1),
    ):
        error = parse_error(data, mode)
        assert error.code in ("E_BAD_MESSAGE", "E_BAD_BODY")


def test_line_too_long_without_newline() -> None:
    limits = Limits()
    conn = server()
    conn.receive_data(b"X" * (limits.max_line_length - 1))
    assert conn.next_events() == []  # still could be a (long) line
    conn.receive_data(b"X")
    with pytest.raises(ProtocolError) as info:
        conn.next_events()
    assert info.value.code == "E_INVALID"
    assert info.value.text == "command line too long (limit 16384 bytes)"


def test_line_too_long_in_one_buffer() -> None:
    # 16383 bytes + "\n" fits nsqd's 16 KiB read buffer; one byte more does not.
    fits = b"X" * 16383 + b"\n"
    assert parse_error(fits, "whole").text == "invalid command " + "X" * 16383
    too_long = b"X" * 16384 + b"\n"
    assert parse_error(too_long, "whole").text.startswith("command line too long")


def test_line_limit_is_configurable() -> None:
    limits = Limits(max_line_length=32)
    conn = server(limits=limits)
    conn.receive_data(b"PUB " + b"t" * 40)
    with pytest.raises(ProtocolError, match="too long"):
        conn.next_events()


def test_trickled_body_is_not_quadratic() -> None:
    """A 256 KiB body arriving one byte at a time: O(1) work per byte, one copy at the end."""
    body = bytes(range(256)) * 1024
    data = b"PUB t\n" + sized(body)
    conn = server()
    start = time.perf_counter()
    for i in range(len(data) - 1):
        conn.receive_data(data[i : i + 1])
        assert conn.next_events() == []
    conn.receive_data(data[-1:])
    assert conn.next_events() == [Pub(topic="t", body=body)]
    # Linear is well under a second even on a loaded box; re-joining the buffer on every byte
    # would copy ~34 GB.
    assert time.perf_counter() - start < 20


def test_trickled_line_is_not_rescanned() -> None:
    """A long line arriving one byte at a time only ever searches the new byte for a newline."""
    conn = server()
    line = b"PUB " + b"t" * 10000
    for i in range(len(line)):
        conn.receive_data(line[i : i + 1])
        assert conn.next_events() == []
    # The pending bytes were never joined: still one chunk per byte.
    assert conn._chunks_len == len(line)  # internal, but it is the property under test
    conn.receive_data(b"\n")
    with pytest.raises(ProtocolError, match=r'PUB topic name "t+" is not valid'):
        conn.next_events()


def test_magic_then_everything_in_one_chunk() -> None:
    conn = ServerConnection(Limits())
    conn.receive_data(MAGIC + b"ASDF\n")
    with pytest.raises(ProtocolError, match="ASDF"):
        conn.next_events()


def test_feed_helper_reports_trailing_events() -> None:
    # Guards the helper the other tests rely on: trailing mode really parses the trailer.
    conn = server()
    events, error = feed(conn, b"NOP\n", "trailing")
    assert error is None and events == [Nop()]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "bad_line",
    [
        b"FIN 0123456 89abcdef\n",  # a space splits the id
        b"FIN 0123456789abcde\r\n",  # the "\r" is a line ending, leaving 15 bytes
        b"FIN 0123456789abcdef0\n",
        b"FIN  0123456789abcde\n",
    ],
)
def test_bad_fin_inside_a_run_of_fins(mode: str, bad_line: bytes) -> None:
    """The run fast path must refuse exactly what the line-by-line path refuses."""
    good = b"FIN " + MSG_ID + b"\n"
    events, error = parse(good * 3 + bad_line + good, mode, SUBSCRIBE)
    assert len(events) == 3
    assert error is not None
    assert error.body == b"E_INVALID invalid message ID"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    ("bad", "expected"),
    [
        (b"PUB t\n" + size(0), b"E_BAD_MESSAGE PUB invalid message body size 0"),
        (b"PUB t\n" + size(-3), b"E_BAD_MESSAGE PUB invalid message body size -3"),
        (b"PUB t\n" + size(101), b"E_BAD_MESSAGE PUB message too big 101 > 100"),
        (b"PUB t!\n" + sized(b"x"), b'E_BAD_TOPIC PUB topic name "t!" is not valid'),
    ],
)
def test_bad_pub_inside_a_run_of_pubs(mode: str, bad: bytes, expected: bytes) -> None:
    good = b"PUB t\n" + sized(b"ok")
    events, error = parse(good * 3 + bad + good, mode, limits=SMALL)
    assert events == [Pub(topic="t", body=b"ok")] * 3
    assert error is not None
    assert error.body == expected

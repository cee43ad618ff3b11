"""Names, the state table, and the error constructors' exact strings."""

from __future__ import annotations

import pytest

from lmqd.protocol import LEGAL_STATES, ClientState, ProtocolError, errors, is_ephemeral, valid_name
from lmqd.protocol.errors import go_quote


@pytest.mark.parametrize(
    "name",
    [
        "a",
        "orders",
        "a.b-c_D9",
        "t" * 64,
        "t" * 54 + "#ephemeral",
        "t" * 60 + "#tmp",
        "x#ephemeral",
        "x#tmp",
        "...",
    ],
)
def test_valid_names(name: str) -> None:
    assert valid_name(name)


@pytest.mark.parametrize(
    "name",
    [
        "",
        "t" * 65,
        "t" * 55 + "#ephemeral",  # the suffix counts towards 64
        "#ephemeral",
        "#tmp",
        "a#b",
        "a#ephemeral#tmp",
        "a b",
        "a\n",  # no $-before-newline loophole
        "caf\u00e9",
        "a/b",
        "a:b",
    ],
)
def test_invalid_names(name: str) -> None:
    assert not valid_name(name)


def test_ephemeral() -> None:
    assert is_ephemeral("a#ephemeral")
    assert is_ephemeral("a#tmp")
    assert not is_ephemeral("a")
    assert not is_ephemeral("a#ephemeralx")


@pytest.mark.parametrize(
    ("raw", "quoted"),
    [
        (b"abc", '"abc"'),
        (b"", '""'),
        (b'a"b\\c', '"a\\"b\\\\c"'),
        (b"\t\n\r\a\b\f\v", '"\\t\\n\\r\\a\\b\\f\\v"'),
        (b"\x00\x1f\x7f", '"\\x00\\x1f\\x7f"'),
        (b"\xff\xfe", '"\\xff\\xfe"'),  # invalid UTF-8, byte by byte
        (b"\xed\xa0\x80", '"\\xed\\xa0\\x80"'),  # an encoded surrogate is invalid UTF-8 too
        ("caf\u00e9 \u4e16".encode(), '"caf\u00e9 \u4e16"'),  # printable runes stay
        ("\u00a0\u200b".encode(), '"\\u00a0\\u200b"'),  # non-printable runes
        ("\U000e0001".encode(), '"\\U000e0001"'),
        ("\U0001f600".encode(), '"\U0001f600"'),
    ],
)
def test_go_quote(raw: bytes, quoted: str) -> None:
    assert go_quote(raw) == quoted


def test_protocol_error_attributes() -> None:
    error = ProtocolError("E_INVALID", "invalid message ID")
    assert (error.code, error.text, error.fatal) == ("E_INVALID", "invalid message ID", True)
    assert error.body == b"E_INVALID invalid message ID"
    assert str(error) == "E_INVALID invalid message ID"
    assert error.frame() == b"\x00\x00\x00\x20\x00\x00\x00\x01E_INVALID invalid message ID"
    assert ProtocolError("E_BAD_PROTOCOL").body == b"E_BAD_PROTOCOL"


def test_raw_bytes_stay_raw_in_the_body() -> None:
    error = errors.invalid_command(b"\xff\x00X")
    assert error.body == b"E_INVALID invalid command \xff\x00X"
    assert error.text == "invalid command \\xff\x00X"


@pytest.mark.parametrize(
    ("error", "body", "fatal"),
    [
        (
            errors.fin_failed(b"0123456789abcdef", errors.ID_NOT_IN_FLIGHT),
            b"E_FIN_FAILED FIN 0123456789abcdef failed ID not in flight",
            False,
        ),
        (
            errors.req_failed(b"0123456789abcdef", errors.CLIENT_DOES_NOT_OWN_MESSAGE),
            b"E_REQ_FAILED REQ 0123456789abcdef failed client does not own message",
            False,
        ),
        (
            errors.touch_failed(b"0123456789abcdef", errors.ID_NOT_IN_FLIGHT),
            b"E_TOUCH_FAILED TOUCH 0123456789abcdef failed ID not in flight",
            False,
        ),
        (errors.publish_failed("PUB", errors.EXITING), b"E_PUB_FAILED PUB failed exiting", True),
        (errors.pub_failed("MPUB", "disk full"), b"E_MPUB_FAILED MPUB failed disk full", True),
        (errors.publish_failed("DPUB", "x"), b"E_DPUB_FAILED DPUB failed x", True),
        (errors.sub_failed(errors.EXITING), b"E_SUB_FAILED SUB failed exiting", True),
        (
            errors.sub_too_many_consumers("t", "c", 3),
            b"E_SUB_FAILED SUB failed consumers for t:c exceeds limit of 3",
            True,
        ),
        (errors.sub_deleted(), b"E_SUB_FAILED SUB failed to deleted topic/channel", True),
        (errors.identify_failed("tls: bad"), b"E_IDENTIFY_FAILED IDENTIFY failed tls: bad", True),
        (errors.auth_disabled(), b"E_AUTH_DISABLED AUTH disabled", True),
        (errors.auth_failed(), b"E_AUTH_FAILED AUTH failed", True),
        (errors.auth_no_authorizations(), b"E_UNAUTHORIZED AUTH no authorizations found", True),
        (
            errors.auth_unauthorized("SUB", "t", "c"),
            b'E_UNAUTHORIZED AUTH failed for SUB on "t" "c"',
            True,
        ),
        (
            errors.auth_unauthorized("PUB", "t", ""),
            b'E_UNAUTHORIZED AUTH failed for PUB on "t" ""',
            True,
        ),
        (errors.auth_first("PUB"), b"E_AUTH_FIRST AUTH required before PUB", True),
        (errors.auth_error("boom"), b"E_AUTH_ERROR AUTH error boom", True),
        (
            errors.tls_required(b"SUB"),
            b"E_INVALID cannot SUB in current state (TLS required)",
            True,
        ),
        (
            errors.failed_to_read_body_size("MPUB"),
            b"E_BAD_BODY MPUB failed to read body size",
            True,
        ),
        (errors.failed_to_read_body("AUTH"), b"E_BAD_BODY AUTH failed to read body", True),
        (errors.mpub_failed_to_read_count(), b"E_BAD_BODY MPUB failed to read message count", True),
        (
            errors.mpub_failed_to_read_message_size(2),
            b"E_BAD_MESSAGE MPUB failed to read message(2) body size",
            True,
        ),
        (
            errors.message_failed_to_read_size("PUB"),
            b"E_BAD_MESSAGE PUB failed to read message body size",
            True,
        ),
        (
            errors.message_failed_to_read_body("DPUB"),
            b"E_BAD_MESSAGE DPUB failed to read message body",
            True,
        ),
    ],
)
def test_daemon_side_errors(error: ProtocolError, body: bytes, fatal: bool) -> None:
    assert error.body == body
    assert error.fatal is fatal


def test_state_numbers_are_nsqds() -> None:
    assert [int(s) for s in ClientState] == [0, 1, 2, 3, 4]
    assert [s.name for s in ClientState] == [
        "INIT",
        "DISCONNECTED",
        "CONNECTED",
        "SUBSCRIBED",
        "CLOSING",
    ]


def test_state_table_covers_every_command() -> None:
    assert set(LEGAL_STATES) == {
        "IDENTIFY", "AUTH", "SUB", "RDY", "FIN", "REQ", "TOUCH", "CLS", "PUB", "MPUB", "DPUB",
        "NOP", "XPUB",
    }  # fmt: skip
    assert LEGAL_STATES["FIN"] == {ClientState.SUBSCRIBED, ClientState.CLOSING}
    assert LEGAL_STATES["NOP"] == set(ClientState)

"""Bad sizes: bodies over the limits, absurd declared sizes, zero and negative sizes.

Rules for this module (see STYLE.md, Tests):
- one real ``lmqd`` subprocess shared by the module, with small limits (``LMQD_ARGS``) so that
  "too big" is cheap to send; 127.0.0.1, port 0; blocking sockets with timeouts on every read;
- every case gets nsqd's exact error frame and the connection closed, and afterwards the
  ``daemon`` fixture checks that a fresh publisher and subscriber are still served;
- a declared size is checked before the body is read: a size of 0x7fffffff with no body following
  is answered at once, and the daemon's memory does not grow by the declared amount.
"""

from __future__ import annotations

import struct
import time

import pytest

from tests.support.process import LmqdProcess
from tests.support.rawbytes import NsqSocket, dpub, identify, mpub, pub, size_prefixed, unique

MAX_MSG_SIZE = 100
MAX_BODY_SIZE = 1000
LMQD_ARGS = (f"--max-msg-size={MAX_MSG_SIZE}", f"--max-body-size={MAX_BODY_SIZE}")

# Answering a bad size must not wait for the body that was announced.
PROMPT_S = 2.0


def test_pub_at_the_limit_then_over_it(daemon: LmqdProcess) -> None:
    topic = unique("limit")
    with NsqSocket(daemon.tcp_address) as conn:
        conn.send(pub(topic, b"x" * MAX_MSG_SIZE))
        conn.expect_response()
        conn.send(pub(topic, b"x" * 105))
        conn.expect_fatal_error(b"E_BAD_MESSAGE PUB message too big 105 > 100")


@pytest.mark.parametrize(
    ("command", "error"),
    [
        pytest.param(
            dpub("t", 10, b"x" * 101),
            b"E_BAD_MESSAGE DPUB message too big 101 > 100",
            id="dpub",
        ),
        pytest.param(
            mpub("t", [b"a", b"x" * 101]),
            b"E_BAD_MESSAGE MPUB message too big 101 > 100",
            id="mpub-message",
        ),
        pytest.param(
            mpub("t", [b"x" * 50] * 20),
            b"E_BAD_BODY MPUB body too big 1084 > 1000",
            id="mpub-body",
        ),
        pytest.param(
            identify(client_id="x" * 1000),
            b"E_BAD_BODY IDENTIFY body too big 1017 > 1000",
            id="identify-body",
        ),
    ],
)
def test_body_over_the_limit(daemon: LmqdProcess, command: bytes, error: bytes) -> None:
    with NsqSocket(daemon.tcp_address) as conn:
        conn.send(command)
        conn.expect_fatal_error(error)


@pytest.mark.parametrize(
    ("header", "error"),
    [
        pytest.param(
            b"PUB t\n" + struct.pack(">L", 0x7FFFFFFF),
            b"E_BAD_MESSAGE PUB message too big 2147483647 > 100",
            id="pub-2GiB",
        ),
        pytest.param(
            b"DPUB t 1000\n" + struct.pack(">L", 0x7FFFFFFF),
            b"E_BAD_MESSAGE DPUB message too big 2147483647 > 100",
            id="dpub-2GiB",
        ),
        pytest.param(
            b"MPUB t\n" + struct.pack(">L", 0x7FFFFFFF),
            b"E_BAD_BODY MPUB body too big 2147483647 > 1000",
            id="mpub-2GiB",
        ),
        pytest.param(
            # lmqd reads a whole MPUB body (at most --max-body-size) before checking its parts.
            b"MPUB t\n" + struct.pack(">LLL", 20, 1, 0x7FFFFFFF) + b"x" * 12,
            b"E_BAD_MESSAGE MPUB message too big 2147483647 > 100",
            id="mpub-part-2GiB",
        ),
        pytest.param(
            b"IDENTIFY\n" + struct.pack(">L", 0x7FFFFFFF),
            b"E_BAD_BODY IDENTIFY body too big 2147483647 > 1000",
            id="identify-2GiB",
        ),
        # Sizes are signed 32-bit on the wire (nsqd's readLen): 0xffffffff is -1.
        pytest.param(
            b"PUB t\n" + struct.pack(">L", 0xFFFFFFFF),
            b"E_BAD_MESSAGE PUB invalid message body size -1",
            id="pub-negative",
        ),
        pytest.param(
            b"PUB t\n" + struct.pack(">L", 0x80000000),
            b"E_BAD_MESSAGE PUB invalid message body size -2147483648",
            id="pub-most-negative",
        ),
        pytest.param(
            b"PUB t\n" + struct.pack(">L", 0),
            b"E_BAD_MESSAGE PUB invalid message body size 0",
            id="pub-empty",
        ),
        pytest.param(
            b"DPUB t 10\n" + struct.pack(">L", 0),
            b"E_BAD_MESSAGE DPUB invalid message body size 0",
            id="dpub-empty",
        ),
        pytest.param(
            b"MPUB t\n" + struct.pack(">L", 0),
            b"E_BAD_BODY MPUB invalid body size 0",
            id="mpub-empty",
        ),
        pytest.param(
            b"MPUB t\n" + struct.pack(">L", 0xFFFFFFFE),
            b"E_BAD_BODY MPUB invalid body size -2",
            id="mpub-negative",
        ),
        pytest.param(
            b"IDENTIFY\n" + struct.pack(">L", 0),
            b"E_BAD_BODY IDENTIFY invalid body size 0",
            id="identify-empty",
        ),
    ],
)
def test_declared_size_is_checked_before_the_body(
    daemon: LmqdProcess, header: bytes, error: bytes
) -> None:
    before = daemon.rss_bytes()
    with NsqSocket(daemon.tcp_address) as conn:
        start = time.monotonic()
        conn.send(header)  # and nothing more: the body never comes
        conn.expect_fatal_error(error, timeout=PROMPT_S)
        assert time.monotonic() - start < PROMPT_S
    # The daemon did not reserve room for the announced body.
    assert daemon.rss_bytes() - before < 16 * 1024 * 1024


def test_size_split_across_sends(daemon: LmqdProcess) -> None:
    # The 4 size bytes arrive one per send; the limit check still happens when they are complete.
    with NsqSocket(daemon.tcp_address) as conn:
        conn.send(b"PUB t\n")
        for byte in struct.pack(">L", 0x7FFFFFFF):
            time.sleep(0.02)
            conn.send(bytes([byte]))
        conn.expect_fatal_error(b"E_BAD_MESSAGE PUB message too big 2147483647 > 100")


def test_identify_that_is_not_json(daemon: LmqdProcess) -> None:
    with NsqSocket(daemon.tcp_address) as conn:
        conn.send(b"IDENTIFY\n" + size_prefixed(b"\xff{not json"))
        conn.expect_fatal_error(b"E_BAD_BODY IDENTIFY failed to decode JSON body")


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        pytest.param(
            {"heartbeat_interval": 999},
            b"E_BAD_BODY IDENTIFY heartbeat interval (999) is invalid",
            id="heartbeat-too-small",
        ),
        pytest.param(
            {"heartbeat_interval": 60001},
            b"E_BAD_BODY IDENTIFY heartbeat interval (60001) is invalid",
            id="heartbeat-too-big",
        ),
        pytest.param(
            {"msg_timeout": 999},
            b"E_BAD_BODY IDENTIFY msg timeout (999) is invalid",
            id="msg-timeout-too-small",
        ),
        pytest.param(
            {"sample_rate": 100},
            b"E_BAD_BODY IDENTIFY sample rate (100) is invalid",
            id="sample-rate",
        ),
    ],
)
def test_identify_values_out_of_range(
    daemon: LmqdProcess, fields: dict[str, int], error: bytes
) -> None:
    with NsqSocket(daemon.tcp_address) as conn:
        conn.send(identify(**fields))
        conn.expect_fatal_error(error)

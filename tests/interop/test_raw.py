"""The invalid-command case byte for byte over a raw socket (what every client library parses).

Rules for this module (see STYLE.md, Tests): one fresh ``lmqd`` subprocess per test
(``lmqd_server``), 127.0.0.1, port 0; a blocking socket with a timeout on every read; frames are
read by their size prefix, never by read boundaries (nsqio/nsq#1250).
"""

from __future__ import annotations

import socket
import struct

import pytest

from tests.support.process import LmqdProcess

pytestmark = pytest.mark.interop


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise EOFError(f"connection closed after {len(data)} of {n} bytes")
        data += chunk
    return data


def test_invalid_command_gets_nsqds_exact_error_then_close(lmqd_server: LmqdProcess) -> None:
    with socket.create_connection(lmqd_server.tcp_host_port, timeout=5) as sock:
        sock.sendall(b"  V2ASDF\n")
        size, frame_type = struct.unpack(">ii", recv_exactly(sock, 8))
        body = recv_exactly(sock, size - 4)
        assert (frame_type, body) == (1, b"E_INVALID invalid command ASDF")
        assert size == 4 + len(b"E_INVALID invalid command ASDF")
        assert sock.recv(1) == b""  # fatal: the daemon closes the connection

"""lmqd and the real nsqd v1.3.0 asked the same things: the answers must be the same.

Rules for this module: one nsqd and one lmqd (127.0.0.1, port 0, data in temp dirs) get the
same requests in the same order; what each answered is compared after normalizing what must
differ (ports, the host name, start times, memory figures, lmq's extra stats keys). Nothing here
hard-codes an answer nsqd gives: nsqd gives it. Skipped without ``LMQ_NSQ_BIN``.
"""

from __future__ import annotations

import socket
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.procs import http

from .conftest import Started
from .programs import HARNESS_VERSION, Daemon, lmqd, nsqd, program, requires_nsq

pytestmark = [pytest.mark.interop, requires_nsq]


@pytest.fixture(scope="module")
def pair(started: Started, tmp_path_factory: pytest.TempPathFactory) -> tuple[Daemon, Daemon]:
    base = tmp_path_factory.mktemp("side-by-side")
    return started(nsqd(base / "nsqd")), started(lmqd(base / "lmqd"))


# -- the command line ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("theirs", "ours"), [("nsqd", "lmqd"), ("nsqlookupd", "lmqd.lookupd")]
)
def test_version_lines_parse_as_nsqs_do(theirs: str, ours: str) -> None:
    # gnsq's integration harness (and others) read NAME vX.Y.Z (built w/TOKEN).
    lines = [
        subprocess.run(command, capture_output=True, text=True, timeout=30, check=True).stdout
        for command in ([program(theirs), "--version"], [sys.executable, "-m", ours, "--version"])
    ]
    parsed = [HARNESS_VERSION.fullmatch(line.strip()) for line in lines]
    assert parsed[0] is not None and parsed[1] is not None, lines
    assert parsed[0].group(1, 2) == parsed[1].group(1, 2)  # the same name and version


def test_a_negative_mem_queue_size_starts_as_it_does_for_nsqd(tmp_path: Path) -> None:
    # nsqd v1.3.0 starts with -mem-queue-size=-1 and reports it (its first topic then panics);
    # lmqd starts, reports it the same way, and runs with no memory queue.
    theirs = nsqd(tmp_path / "nsqd", "-mem-queue-size=-1")
    ours = lmqd(tmp_path / "lmqd", "-mem-queue-size=-1")
    try:
        for path in ("/ping", "/config/mem_queue_size"):
            assert http(ours.http, "GET", path) == http(theirs.http, "GET", path)
        assert http(ours.http, "GET", "/config/mem_queue_size") == (200, -1)
        assert http(ours.http, "POST", "/mpub?topic=t", b"a\nb") == (200, "OK")
        [topic] = http(ours.http, "GET", "/stats?format=json&topic=t")[1]["topics"]
        assert (topic["depth"], topic["backend_depth"]) == (2, 2)  # nothing kept in memory
        assert "--mem-queue-size=-1 keeps no message in memory" in ours.output()
    finally:
        ours.check_stop()
        theirs.check_stop()


# -- HTTP ----------------------------------------------------------------------------------------

HTTP_REQUESTS: list[tuple[str, str, bytes | None]] = [
    ("GET", "/ping", None), ("GET", "/info", None), ("GET", "/nope", None), ("POST", "/ping", None),
    ("POST", "/topic/create", None), ("POST", "/topic/create?topic=", None),
    ("POST", "/topic/create?topic=bad!", None), ("POST", "/topic/create?topic=t", None),
    ("GET", "/topic/create?topic=t", None), ("POST", "/topic/create?topic=t", None),
    ("POST", "/channel/create?topic=t", None),
    ("POST", "/channel/create?topic=t&channel=bad!", None),
    ("POST", "/channel/create?topic=missing&channel=c", None),
    ("POST", "/channel/create?topic=t&channel=c", None),
    ("POST", "/pub", b"x"), ("POST", "/pub?topic=t", b""), ("POST", "/pub?topic=t", b"hello"),
    ("GET", "/pub?topic=t", b"hello"), ("POST", "/pub?topic=t&defer=100", b"later"),
    ("POST", "/pub?topic=t&defer=-1", b"x"), ("POST", "/pub?topic=t&defer=x", b"x"),
    ("POST", "/pub?topic=t&defer=3600001", b"x"), ("POST", "/mpub?topic=t", b"a\nb\n\nc"),
    ("POST", "/mpub?topic=t&binary=true", b"\x00\x00\x00\x01\x00\x00\x00\x01a"),
    ("POST", "/mpub?topic=t&binary=true", b"\x00\x00"), ("POST", "/mpub?topic=t", b""),
    ("POST", "/topic/pause?topic=t", None), ("POST", "/topic/pause?topic=missing", None),
    ("POST", "/topic/unpause?topic=t", None), ("POST", "/channel/pause?topic=t&channel=c", None),
    ("POST", "/channel/pause?topic=t&channel=missing", None),
    ("POST", "/channel/unpause?topic=t&channel=c", None),
    ("GET", "/stats?format=json&topic=t&channel=c", None),
    ("POST", "/channel/empty?topic=t&channel=c", None), ("POST", "/topic/empty?topic=t", None),
    ("POST", "/channel/delete?topic=t&channel=missing", None),
    ("GET", "/config/mem_queue_size", None), ("GET", "/config/nope", None),
    ("GET", "/config/max_msg_size", None), ("GET", "/config/msg_timeout", None),
    ("GET", "/config/nsqlookupd_tcp_addresses", None), ("GET", "/config/log_level", None),
    ("PUT", "/config/log_level", b"debug"), ("PUT", "/config/log_level", b"loud"),
    ("PUT", "/config/mem_queue_size", b"5"), ("GET", "/config/tls_required", None),
    ("GET", "/config/e2e_processing_latency_percentiles", None),
    ("GET", "/stats?format=json&topic=t&channel=c", None),
    ("GET", "/stats?format=json&topic=missing", None),
    ("GET", "/stats?format=json&include_clients=false", None),
    ("POST", "/channel/delete?topic=t&channel=c", None), ("POST", "/topic/delete?topic=t", None),
    ("POST", "/topic/delete?topic=t", None),
]  # fmt: skip
"""nsqd's HTTP API, right and wrong, in an order where each request finds the state the ones
before it left."""

PER_NODE = frozenset({"start_time", "memory", "hostname", "http_port", "tcp_port"})
"""Keys whose values belong to one daemon process, not to what it was asked."""


def comparable(answer: tuple[int, Any], nsqd_keys: dict[str, set[str]]) -> tuple[int, Any]:
    """An answer with the per-process values left out and, in ``/stats``, only the keys
    nsqd has (lmq adds its own: ``nsqd_keys`` collects nsqd's per level)."""
    status, body = answer

    def keep(value: Any, level: str) -> Any:
        if isinstance(value, dict):
            keys = nsqd_keys.setdefault(level, set(value)) if level not in nsqd_keys else None
            allowed = nsqd_keys[level] if keys is None else keys
            return {
                k: keep(v, f"{level}.{k}") for k, v in sorted(value.items())
                if k in allowed and k not in PER_NODE
            }  # fmt: skip
        if isinstance(value, list):
            return [keep(v, level) for v in value]
        return value

    return status, keep(body, "")


def test_the_http_api_answers_as_nsqd_does(pair: tuple[Daemon, Daemon]) -> None:
    theirs, ours = pair
    nsqd_keys: dict[str, set[str]] = {}
    for method, path, body in HTTP_REQUESTS:
        expected = comparable(http(theirs.http, method, path, body), nsqd_keys)
        got = comparable(http(ours.http, method, path, body), nsqd_keys)
        assert got == expected, (method, path)


# -- TCP -----------------------------------------------------------------------------------------


def _size(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data


TCP_EXCHANGES: list[bytes] = [
    b"  V2ASDF\n", b"  V1", b"XXXX", b"  V2NOP\n", b"  V2PUB t\n" + _size(b""),
    b"  V2PUB bad!\n" + _size(b"x"), b"  V2PUB t\n" + _size(b"hi"),
    b"  V2MPUB t\n" + struct.pack(">II", 4, 0), b"  V2DPUB t 100\n" + _size(b"x"),
    b"  V2DPUB t -1\n" + _size(b"x"), b"  V2DPUB t x\n" + _size(b"x"), b"  V2RDY 1\n",
    b"  V2FIN 0123456789abcdef\n", b"  V2SUB t c\n", b"  V2SUB t c\nRDY 1000000\n",
    b"  V2SUB t c\nSUB t c\n", b"  V2SUB bad! c\n", b"  V2SUB t\n",
    b"  V2SUB t c\nFIN 0123456789abcdef\n", b"  V2SUB t c\nREQ 0123456789abcdef 0\n",
    b"  V2SUB t c\nTOUCH 0123456789abcdef\n", b"  V2SUB t c\nREQ 0123456789abcdef x\n",
    b"  V2SUB t c\nFIN short\n", b"  V2CLS\n", b"  V2SUB t c\nCLS\n",
    b"  V2IDENTIFY\n" + _size(b"{}"), b"  V2IDENTIFY\n" + _size(b"not json"),
    b"  V2IDENTIFY\n" + _size(b'{"heartbeat_interval": 10}'),
    b"  V2IDENTIFY\n" + _size(b'{"output_buffer_size": 1}'),
    b"  V2IDENTIFY\n" + _size(b'{"sample_rate": 101}'),
    b"  V2IDENTIFY\n" + _size(b'{"msg_timeout": 10}'),
    b"  V2IDENTIFY\n" + _size(b'{"deflate": true, "snappy": true}'),
    b"  V2AUTH\n" + _size(b"secret"), b"  V2PUB t\n" + _size(b"x" * 10) + b"PUB t\n" + _size(b"y"),
    b"  V2REQ 0123456789abcdef 0\n", b"  V2pub t\n" + _size(b"x"), b"  V2PUB t \n" + _size(b"x"),
    b"  V2PUB  t\n" + _size(b"x"), b"  V2MPUB t\n" + struct.pack(">III", 8, 1, 0),
]  # fmt: skip
"""Byte exchanges on a fresh connection each: commands right and wrong, in and out of order."""

QUIET_S = 0.3
"""How long an exchange waits for more after the last byte: nsqd answers in microseconds; a
connection it keeps open (no error) ends the exchange this long after its last answer."""


def exchange(address: str, data: bytes) -> bytes:
    """Everything the daemon sends back for ``data`` on a fresh connection, ``<EOF>`` if it
    closed the connection."""
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(data)
        sock.settimeout(QUIET_S)
        out = b""
        try:
            while chunk := sock.recv(65536):
                out += chunk
            out += b"<EOF>"
        except TimeoutError:
            pass
    return out


def test_the_tcp_protocol_answers_as_nsqd_does(pair: tuple[Daemon, Daemon]) -> None:
    theirs, ours = pair
    for data in TCP_EXCHANGES:
        assert exchange(ours.tcp, data) == exchange(theirs.tcp, data), data

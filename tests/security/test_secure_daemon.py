"""A real lmqd (subprocess) with TLS required or an auth server: plaintext and unauthorised
requests are refused, over TCP and HTTP, and the refusal never depends on the auth server being up.

Rules for this module (STYLE.md):
- One ``lmqd`` subprocess per test (``tests/conftest.py``'s ``start_lmqd``/``stop_lmqd``) on
  127.0.0.1 with port 0; certificates made by the test; the auth server is a thread in the test
  (``authserver_thread.py``).
- Raw sockets with timeouts for TCP (the bytes are nsqd's), ``http.client`` for HTTP(S).
"""

from __future__ import annotations

import http.client
import json
import re
import socket
import ssl
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from lmqd.transport.compression import SnappyStream
from tests.support.process import LmqdProcess as LmqdServer
from tests.support.process import start_lmqd, stop_lmqd
from tests.transport.certs import Certs, make_certs

from .authserver_thread import auth_server, deny_all, publish_on

SOCKET_TIMEOUT_S = 10.0
# gnsq's integration harness finds the ports with this pattern (tests/integration_server.py).
HARNESS_LINE = re.compile(
    r"(?P<protocol>[A-Z]+): listening on "
    r"(?P<address>(?:[0-9]{1,3}\.){3}[0-9]{1,3}):(?P<port>[0-9]+)"
)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture
def daemon_factory(tmp_path: Path) -> Iterator[list[LmqdServer]]:
    started: list[LmqdServer] = []
    yield started
    for server in started:
        stop_lmqd(server)


def start(started: list[LmqdServer], tmp_path: Path, *flags: str) -> LmqdServer:
    server = start_lmqd(tmp_path / f"data{len(started)}", ["--https-address=127.0.0.1:0", *flags])
    started.append(server)
    return server


def ports(server: LmqdServer) -> dict[str, int]:
    assert server.http_address is not None  # waits for the HTTP line, which comes last
    found = {}
    for line in server.output_lines():
        m = HARNESS_LINE.search(line)
        if m:
            found[m.group("protocol")] = int(m.group("port"))
    return found


class Wire:
    """A blocking raw V2 connection."""

    def __init__(self, server: LmqdServer) -> None:
        self.sock = socket.create_connection(server.tcp_host_port, timeout=SOCKET_TIMEOUT_S)
        self.sock.sendall(b"  V2")
        self.buffer = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def frame(self) -> tuple[int, bytes]:
        while (
            len(self.buffer) < 4 or len(self.buffer) < 4 + struct.unpack(">i", self.buffer[:4])[0]
        ):
            chunk = self.sock.recv(65536)
            if not chunk:
                raise EOFError(self.buffer)
            self.buffer += chunk
        size = struct.unpack(">i", self.buffer[:4])[0]
        frame_type = struct.unpack(">i", self.buffer[4:8])[0]
        data, self.buffer = self.buffer[8 : 4 + size], self.buffer[4 + size :]
        return frame_type, data

    def closed(self) -> bool:
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True

    def close(self) -> None:
        self.sock.close()


def cmd(line: str, body: bytes | None = None) -> bytes:
    data = line.encode() + b"\n"
    return data if body is None else data + struct.pack(">i", len(body)) + body


def identify() -> bytes:
    return cmd("IDENTIFY", json.dumps({"feature_negotiation": True}).encode())


def http_request(
    port: int, method: str, path: str, body: bytes = b"", context: ssl.SSLContext | None = None
) -> tuple[int, bytes]:
    if context is None:
        conn: http.client.HTTPConnection = http.client.HTTPConnection(
            "127.0.0.1", port, timeout=SOCKET_TIMEOUT_S
        )
    else:
        conn = http.client.HTTPSConnection(
            "127.0.0.1", port, timeout=SOCKET_TIMEOUT_S, context=context
        )
    try:
        conn.request(method, path, body=body)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def test_tls_required_refuses_plaintext_pub_and_http_publishing(
    daemon_factory: list[LmqdServer], tmp_path: Path, certs: Certs
) -> None:
    server = start(
        daemon_factory,
        tmp_path,
        f"--tls-cert={certs.server.cert_file}",
        f"--tls-key={certs.server.key_file}",
        "--tls-required=true",
    )
    found = ports(server)
    assert set(found) == {"TCP", "HTTP", "HTTPS"}  # what NSQ client harnesses wait for

    wire = Wire(server)
    wire.send(cmd("PUB plain", b"must not be stored"))
    assert wire.frame() == (1, b"E_INVALID cannot PUB in current state (TLS required)")
    assert wire.closed()
    wire.close()

    status, body = http_request(found["HTTP"], "POST", "/pub?topic=plain", b"nope")
    assert status == 403
    assert body == b'{"message": "TLS_REQUIRED", "https_port": %d}' % found["HTTPS"]
    status, _ = http_request(found["HTTP"], "POST", "/topic/delete?topic=plain")
    assert status == 403

    # HTTPS serves the API, with the daemon's certificate.
    https = ssl.create_default_context(cafile=certs.ca_file)
    assert http_request(found["HTTPS"], "POST", "/pub?topic=secure", b"ok", https) == (200, b"OK")
    status, body = http_request(found["HTTPS"], "GET", "/stats?format=json", context=https)
    topics = {t["topic_name"]: t for t in json.loads(body)["topics"]}
    assert set(topics) == {"secure"} and topics["secure"]["message_count"] == 1


def test_tcp_https_leaves_plain_http_open(
    daemon_factory: list[LmqdServer], tmp_path: Path, certs: Certs
) -> None:
    server = start(
        daemon_factory,
        tmp_path,
        f"--tls-cert={certs.server.cert_file}",
        f"--tls-key={certs.server.key_file}",
        "--tls-required=tcp-https",
    )
    found = ports(server)
    assert http_request(found["HTTP"], "POST", "/pub?topic=t", b"m") == (200, b"OK")
    wire = Wire(server)
    wire.send(cmd("NOP"))
    assert wire.frame() == (1, b"E_INVALID cannot NOP in current state (TLS required)")
    wire.close()


def test_deny_all_auth_server_refuses_pub_and_sub_and_is_asked(
    daemon_factory: list[LmqdServer], tmp_path: Path
) -> None:
    with auth_server(deny_all) as auth:
        server = start(daemon_factory, tmp_path, f"--auth-http-address={auth.address}")
        for command in (cmd("PUB t", b"x"), cmd("SUB t c")):
            wire = Wire(server)
            wire.send(identify())
            frame_type, answer = wire.frame()
            assert frame_type == 0 and json.loads(answer)["auth_required"] is True
            wire.send(command)  # without AUTH
            assert wire.frame()[1] in (
                b"E_AUTH_FIRST AUTH required before PUB",
                b"E_AUTH_FIRST AUTH required before SUB",
            )
            assert wire.closed()
            wire.close()
            wire = Wire(server)
            wire.send(identify())
            wire.frame()
            wire.send(cmd("AUTH", b"any secret") + command)
            assert wire.frame() == (1, b"E_UNAUTHORIZED AUTH no authorizations found")
            assert wire.closed()
            wire.close()
        assert len(auth.queries) == 2
        assert auth.queries[0]["secret"] == "any secret"
        assert auth.queries[0]["remote_ip"] == "127.0.0.1"
        # nsqd's HTTP API is not behind AUTH (nsqd v1.3.0 checks nothing there): lmqd does the
        # same, documented in docs/operations.md. Only TLS requirements apply to HTTP.
        http_port = int(server.http_address.rpartition(":")[2]) if server.http_address else 0
        assert http_request(http_port, "POST", "/topic/create?topic=t") == (200, b"")
        _, body = http_request(http_port, "GET", "/stats?format=json")
        assert {t["topic_name"] for t in json.loads(body)["topics"]} == {"t"}
        assert len(auth.queries) == 2


def test_publish_on_one_topic_and_auth_server_down(
    daemon_factory: list[LmqdServer], tmp_path: Path
) -> None:
    with auth_server(publish_on("^granted$")) as auth:
        server = start(daemon_factory, tmp_path, f"--auth-http-address={auth.address}")
        wire = Wire(server)
        wire.send(identify())
        wire.frame()
        wire.send(cmd("AUTH", b"k") + cmd("PUB granted", b"1"))
        assert json.loads(wire.frame()[1])["identity"] == "publisher"
        assert wire.frame() == (0, b"OK")
        wire.send(cmd("PUB elsewhere", b"2"))
        assert wire.frame() == (1, b'E_UNAUTHORIZED AUTH failed for PUB on "elsewhere" ""')
        wire.close()
        address = auth.address
    # The auth server is gone now: AUTH is refused, not admitted.
    wire = Wire(server)
    wire.send(identify())
    wire.frame()
    wire.send(cmd("AUTH", b"k") + cmd("PUB granted", b"3"))
    assert wire.frame() == (1, b"E_AUTH_FAILED AUTH failed")
    assert wire.closed()
    wire.close()
    assert any(f"AUTH({address}): failed" in line for line in server.output_lines())


def test_bad_input_on_upgraded_connections_closes_them_and_the_daemon_carries_on(
    daemon_factory: list[LmqdServer], tmp_path: Path, certs: Certs
) -> None:
    server = start(
        daemon_factory,
        tmp_path,
        f"--tls-cert={certs.server.cert_file}",
        f"--tls-key={certs.server.key_file}",
    )

    def identified(**fields: object) -> Wire:
        wire = Wire(server)
        wire.send(cmd("IDENTIFY", json.dumps({"feature_negotiation": True, **fields}).encode()))
        frame_type, answer = wire.frame()
        assert frame_type == 0, answer
        return wire

    def rest_of_stream(wire: Wire) -> bytes:
        received = wire.buffer
        try:
            while chunk := wire.sock.recv(65536):
                received += chunk
        except ConnectionResetError:
            pass
        return received

    # Garbage where the TLS ClientHello should be: nsqd's error, in plaintext, then EOF.
    wire = identified(tls_v1=True)
    wire.send(b"this is not TLS\n" * 8)
    assert b"\x00\x00\x00\x01E_IDENTIFY_FAILED IDENTIFY failed " in rest_of_stream(wire)
    wire.close()

    # A snappy stream cut inside a chunk, then the client half-closes: dropped, nothing applied.
    wire = identified(snappy=True)
    codec = SnappyStream()
    whole = codec.compress(cmd("PUB cut", b"y" * 1000))
    wire.send(whole[: len(whole) // 2])
    wire.sock.shutdown(socket.SHUT_WR)
    ok = SnappyStream().decompress(rest_of_stream(wire))
    assert ok == b"\x00\x00\x00\x06\x00\x00\x00\x00OK"  # the upgrade's OK, then EOF
    wire.close()

    # Bytes that are not deflate at all.
    wire = identified(deflate=True)
    wire.send(b"\xff\xff\xff\xff definitely not deflate")
    rest_of_stream(wire)  # ends: the daemon closed the connection
    wire.close()

    # The daemon carries on, and the cut PUB was never applied.
    wire = Wire(server)
    wire.send(cmd("PUB fine", b"ok"))
    assert wire.frame() == (0, b"OK")
    wire.close()
    http_port = int(server.http_address.rpartition(":")[2]) if server.http_address else 0
    _, body = http_request(http_port, "GET", "/stats?format=json")
    assert {t["topic_name"] for t in json.loads(body)["topics"]} == {"fine"}


@pytest.mark.parametrize("policy", ["require", "require-verify"])
def test_client_certificate_policy_applies_to_https_too(
    daemon_factory: list[LmqdServer], tmp_path: Path, certs: Certs, policy: str
) -> None:
    server = start(
        daemon_factory,
        tmp_path,
        f"--tls-cert={certs.server.cert_file}",
        f"--tls-key={certs.server.key_file}",
        f"--tls-root-ca-file={certs.ca_file}",
        f"--tls-client-auth-policy={policy}",
    )
    found = ports(server)
    # The policy implies --tls-required=true: plain HTTP is refused...
    assert http_request(found["HTTP"], "GET", "/ping")[0] == 403
    # ...HTTPS without a client certificate fails the handshake...
    anonymous = ssl.create_default_context(cafile=certs.ca_file)
    with pytest.raises((ssl.SSLError, ConnectionResetError, BrokenPipeError)):
        http_request(found["HTTPS"], "GET", "/ping", context=anonymous)
    # ...and with one it is served.
    mutual = ssl.create_default_context(cafile=certs.ca_file)
    mutual.load_cert_chain(certs.client.cert_file, certs.client.key_file)
    assert http_request(found["HTTPS"], "GET", "/ping", context=mutual) == (200, b"OK")

"""pynsq and gnsq with TLS, snappy, deflate and AUTH against a real lmqd, as against nsqd.

Rules for this module (see STYLE.md, Tests):
- ``lmqd`` subprocesses on 127.0.0.1, port 0 (``tests/conftest.py``'s ``start_lmqd``), with a
  certificate made by the test (``tests/transport/certs.py``); one daemon per module where the
  cases only read what they wrote, a fresh one where the daemon's flags differ.
- Each client library runs in its own interpreter (``clients/*_secure_client.py``) with a hard
  time limit, and the libraries upgrade their own sockets: the assertions are on what the
  library saw (its IDENTIFY answer, the socket classes it wrapped, the bodies it got back).
- The auth server is a thread in the test (``tests/security/authserver_thread.py``).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.security.authserver_thread import auth_server, grant
from tests.support.process import LmqdProcess as LmqdServer
from tests.support.process import start_lmqd, stop_lmqd
from tests.transport.certs import Certs, make_certs

from .runner import run_client

pytestmark = pytest.mark.interop


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


def tls_flags(certs: Certs) -> list[str]:
    return [f"--tls-cert={certs.server.cert_file}", f"--tls-key={certs.server.key_file}"]


@pytest.fixture(scope="module")
def tls_daemon(tmp_path_factory: pytest.TempPathFactory, certs: Certs) -> Iterator[LmqdServer]:
    # gnsq's harness starts nsqd with exactly these TLS flags and an HTTPS listener.
    server = start_lmqd(
        tmp_path_factory.mktemp("lmqd-data"), [*tls_flags(certs), "--https-address=127.0.0.1:0"]
    )
    try:
        yield server
    finally:
        stop_lmqd(server)


# -- pynsq ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tls", "codec"),
    [(True, None), (False, "snappy"), (False, "deflate"), (True, "snappy"), (True, "deflate")],
)
def test_pynsq_reader_and_writer_over_upgraded_connections(
    tls_daemon: LmqdServer, certs: Certs, tls: bool, codec: str | None
) -> None:
    conn: dict[str, object] = {"tls_v1": tls}
    if codec == "snappy":
        conn["snappy"] = True
    if codec == "deflate":
        conn.update(deflate=True, deflate_level=3)
    topic = f"pynsq-{'tls' if tls else 'plain'}-{codec or 'none'}"
    result = run_client(
        "pynsq_secure",
        "pubsub",
        timeout=60,
        address=tls_daemon.tcp_address,
        topic=topic,
        count=400,
        conn=conn,
        ca_file=certs.ca_file,
    )
    assert result["responses"] == {"OK": 4 + 200}, result["stderr"]
    assert (result["received"], result["distinct"]) == (400, 400)
    expected_socket = {"snappy": "SnappySocket", "deflate": "DeflateSocket"}.get(codec or "")
    for layers in result["writer_layers"] + result["reader_layers"]:
        assert layers["ssl_stream"] is tls, layers
        if expected_socket:
            assert layers["socket"] == expected_socket, layers
            assert layers["inner_ssl"] is tls, layers


def test_pynsq_auth_secret_publish_and_subscribe_where_granted(
    tmp_path: Path, certs: Certs
) -> None:
    answer = grant(
        {"topic": "^granted$", "channels": [".*"], "permissions": ["publish"]},
        {"topic": "^granted$", "channels": ["^c$"], "permissions": ["subscribe"]},
    )
    with auth_server(answer) as auth:
        server = start_lmqd(
            tmp_path / "data",
            [
                *tls_flags(certs),
                "--https-address=127.0.0.1:0",
                f"--auth-http-address={auth.address}",
            ],
        )
        try:
            result = run_client(
                "pynsq_secure",
                "auth",
                timeout=40,
                address=server.tcp_address,
                allowed_topic="granted",
                refused_topic="forbidden",
                allowed_channel="c",
                refused_channel="other",
                reader_wait_s=1.0,
                conn={"tls_v1": True, "auth_secret": "pynsq-secret"},
                ca_file=certs.ca_file,
            )
        finally:
            stop_lmqd(server)
    assert result["allowed"] == "OK", result["stderr"]
    # pynsq hands the error frame to the publish callback.
    assert result["refused"].startswith("error: "), result["refused"]
    assert 'E_UNAUTHORIZED AUTH failed for PUB on "forbidden" ""' in result["refused"]
    # Both Readers AUTH; the one on channel "c" may subscribe and gets the message.
    assert result["reader_got"] == {"c": ["granted"], "other": []}
    assert 'E_UNAUTHORIZED AUTH failed for SUB on "granted" "other"' in result["stderr"]
    assert auth.queries and {q["secret"] for q in auth.queries} == {"pynsq-secret"}
    assert {q["tls"] for q in auth.queries} == {"true"}


# -- gnsq ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tls", "deflate", "snappy"), list(itertools.product((True, False), repeat=3))
)
def test_gnsq_socket_upgrades(
    tls_daemon: LmqdServer, certs: Certs, tls: bool, deflate: bool, snappy: bool
) -> None:
    topic = f"gnsq-{int(tls)}{int(deflate)}{int(snappy)}"
    result = run_client(
        "gnsq_secure",
        "upgrades",
        timeout=40,
        address=tls_daemon.tcp_address,
        topic=topic,
        tls=tls,
        deflate=deflate,
        snappy=snappy,
        tls_cert=certs.server.cert_file,
        tls_key=certs.server.key_file,
    )
    if deflate and snappy:
        # nsqd refuses both at once; gnsq has no class for E_IDENTIFY_FAILED and raises the
        # error frame as its generic NSQErrorCode, which is what its own test expects.
        assert result["identify_error"]["class"] == "NSQErrorCode", result
        assert (
            "cannot enable both deflate and snappy compression"
            in (result["identify_error"]["message"])
        )
        return
    assert result["identify"] == {"tls_v1": tls, "deflate": deflate, "snappy": snappy}, result
    sockets = result["socket_is"]
    if tls and (deflate or snappy):
        assert sockets["inner_ssl"], result  # compression wraps the TLS socket
    elif tls:
        assert sockets["ssl"], result
    assert sockets["deflate"] is deflate and sockets["snappy"] is snappy, result
    assert result["publish"] == [0, "OK"]
    assert result["subscribe"] == [0, "OK"]
    assert result["message"] == [2, "sup"]

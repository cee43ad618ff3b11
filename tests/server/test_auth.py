"""AUTH on lmqd's TCP connections against a real (tiny, in-test) auth server.

Rules for this module (STYLE.md):
- A real ``LmqDaemon`` (127.0.0.1, port 0); clients over ``trio.testing.memory_stream_pair()``.
- The auth server is ``tests/transport/authserver.py``'s ``FakeAuthServer`` on 127.0.0.1 port 0,
  answering what each test decides; it records every request. Real sockets, so the clock is
  trio's real one (the ttl test waits 1.1 s for a 1 s ttl).
- Every test is bounded by ``trio.fail_after``.
"""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from lmqd.options import Options
from lmqd.server import TcpConnection
from lmqd.service import LmqDaemon
from lmqd.transport.tls import client_context
from tests.transport.authserver import AuthRequest, FakeAuthServer, grant
from tests.transport.certs import Certs, make_certs

from .secure_wire import MAGIC, WireClient, auth, command, pub

TIMEOUT = 20

ORDERS_ONLY = grant(
    identity="orders-writer",
    identity_url="http://auth.invalid/<orders>",
    authorizations=[{"topic": "^orders$", "channels": [".*"], "permissions": ["publish"]}],
)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


class Setup:
    def __init__(self, nursery: trio.Nursery, tmp_path: Path, certs: Certs) -> None:
        self.nursery = nursery
        self.tmp_path = tmp_path
        self.certs = certs
        self.daemon: LmqDaemon | None = None
        self.count = 0

    async def auth_server(self, answer: Callable[[AuthRequest], Any]) -> tuple[FakeAuthServer, str]:
        server = FakeAuthServer(answer)
        address: str = await self.nursery.start(server.run)
        return server, address

    async def start(self, *auth_addresses: str, **extra: Any) -> LmqDaemon:
        options = Options(
            tcp_address="127.0.0.1:0",
            http_address="",
            https_address="",  # nsqd's default 0.0.0.0:4152 would listen with a certificate
            data_path=str(self.tmp_path),
            auth_http_addresses=auth_addresses,
            **extra,
        )
        self.daemon = LmqDaemon(options)
        await self.nursery.start(self.daemon.run)
        return self.daemon

    async def connect(self) -> WireClient:
        assert self.daemon is not None
        self.count += 1
        client_end, server_end = trio.testing.memory_stream_pair()
        connection = TcpConnection(
            self.daemon.broker, server_end, f"10.0.0.{self.count}:5000", self.daemon.security
        )

        async def serve() -> None:
            try:
                await connection.serve()
            finally:
                await server_end.aclose()

        self.nursery.start_soon(serve)
        client = WireClient(client_end)
        await client.send(MAGIC)
        return client

    def client_stats(self) -> list[dict[str, Any]]:
        assert self.daemon is not None
        return [c.statistics().to_dict() for c in self.daemon.broker.clients.values()]


@pytest.fixture
async def setup(nursery: trio.Nursery, tmp_path: Path, certs: Certs) -> AsyncIterator[Setup]:
    s = Setup(nursery, tmp_path, certs)
    yield s
    if s.daemon is not None:
        s.daemon.shutdown()


def closed_port() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


@pytest.mark.parametrize(
    ("cmd", "data"),
    [
        ("PUB", pub("orders", b"x")),
        ("MPUB", command("MPUB orders", b"\x00\x00\x00\x01\x00\x00\x00\x01x")),
        ("DPUB", command("DPUB orders 10", b"x")),
        ("SUB", command("SUB orders ch")),
    ],
)
async def test_auth_required_before_publish_and_subscribe(
    setup: Setup, cmd: str, data: bytes
) -> None:
    with trio.fail_after(TIMEOUT):
        server, address = await setup.auth_server(lambda r: (200, ORDERS_ONLY))
        await setup.start(address)
        client = await setup.connect()
        assert (await client.identify())["auth_required"] is True
        await client.send(data)
        assert await client.error() == f"E_AUTH_FIRST AUTH required before {cmd}".encode()
        assert await client.closed()
        assert server.requests == []


async def test_grant_publish_on_one_topic_only(setup: Setup) -> None:
    with trio.fail_after(TIMEOUT):
        server, address = await setup.auth_server(lambda r: (200, ORDERS_ONLY))
        daemon = await setup.start(address)
        client = await setup.connect()
        await client.identify()
        await client.send(auth(b"s3cret"))
        answer = await client.response()
        # nsqd's answer, encoded as Go's json.Marshal (<> escaped).
        assert answer == (
            b'{"identity":"orders-writer","identity_url":"http://auth.invalid/\\u003corders\\u003e",'
            b'"permission_count":1}'
        )
        (request,) = server.requests
        assert request.method == "GET" and request.path == "/auth"
        assert request.query == {
            "common_name": "",
            "remote_ip": "10.0.0.1",
            "secret": "s3cret",
            "tls": "false",
        }
        await client.send(pub("orders", b"allowed"))
        assert await client.response() == b"OK"
        (stats,) = setup.client_stats()
        assert (stats["authed"], stats["auth_identity"]) == (True, "orders-writer")
        await client.send(pub("other", b"refused"))
        assert await client.error() == b'E_UNAUTHORIZED AUTH failed for PUB on "other" ""'
        assert await client.closed()
        assert "other" not in daemon.broker.topics

        subscriber = await setup.connect()
        await subscriber.identify()
        await subscriber.send(auth(b"s3cret") + command("SUB orders ch"))  # pipelined
        assert json.loads(await subscriber.response())["identity"] == "orders-writer"
        assert await subscriber.error() == b'E_UNAUTHORIZED AUTH failed for SUB on "orders" "ch"'
        assert await subscriber.closed()
        assert daemon.broker.topics["orders"].channels == {}


async def test_pipelined_auth_and_publishes_wait_for_the_answer(setup: Setup) -> None:
    with trio.fail_after(TIMEOUT):
        _, address = await setup.auth_server(lambda r: (200, ORDERS_ONLY))
        daemon = await setup.start(address)
        client = await setup.connect()
        await client.identify()
        await client.send(auth(b"k") + pub("orders", b"1") + pub("orders", b"2"))
        assert json.loads(await client.response())["permission_count"] == 1
        assert [await client.response(), await client.response()] == [b"OK", b"OK"]
        assert daemon.broker.topics["orders"].statistics(trio.current_time()).message_count == 2


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        ((200, grant(authorizations=[])), b"E_UNAUTHORIZED AUTH no authorizations found"),
        ((500, b"boom"), b"E_AUTH_FAILED AUTH failed"),
        ((200, b"not json"), b"E_AUTH_FAILED AUTH failed"),
        ((200, grant(ttl=0)), b"E_AUTH_FAILED AUTH failed"),
    ],
)
async def test_auth_refusals(setup: Setup, answer: tuple[int, bytes], error: bytes) -> None:
    with trio.fail_after(TIMEOUT):
        _, address = await setup.auth_server(lambda r: answer)
        await setup.start(address)
        client = await setup.connect()
        await client.identify()
        await client.send(auth(b"k"))
        assert await client.error() == error
        assert await client.closed()


async def test_auth_server_down_means_refusal(setup: Setup) -> None:
    with trio.fail_after(TIMEOUT):
        await setup.start(closed_port())
        client = await setup.connect()
        assert (await client.identify())["auth_required"] is True
        await client.send(auth(b"k") + pub("orders", b"never"))
        assert await client.error() == b"E_AUTH_FAILED AUTH failed"
        assert await client.closed()
        assert setup.daemon is not None and setup.daemon.broker.topics == {}


async def test_second_server_answers_when_the_first_is_down(setup: Setup) -> None:
    with trio.fail_after(TIMEOUT):
        server, address = await setup.auth_server(lambda r: (200, ORDERS_ONLY))
        await setup.start(closed_port(), address)
        for _ in range(3):  # whichever the random start, one valid answer is enough
            client = await setup.connect()
            await client.identify()
            await client.send(auth(b"k") + pub("orders", b"x"))
            assert json.loads(await client.response())["identity"] == "orders-writer"
            assert await client.response() == b"OK"
        assert len(server.requests) == 3


async def test_auth_without_auth_servers_is_disabled(setup: Setup) -> None:
    with trio.fail_after(TIMEOUT):
        await setup.start()
        client = await setup.connect()
        assert (await client.identify())["auth_required"] is False
        await client.send(auth(b"k"))
        assert await client.error() == b"E_AUTH_DISABLED AUTH disabled"
        assert await client.closed()


async def test_expired_answer_is_asked_again_and_a_new_refusal_holds(setup: Setup) -> None:
    answers = [ORDERS_ONLY.replace(b'"ttl": 3600', b'"ttl": 1'), grant(authorizations=[])]
    assert b'"ttl": 1,' in answers[0]
    with trio.fail_after(TIMEOUT):
        server, address = await setup.auth_server(
            lambda r: (200, answers[len(server.requests) - 1])
        )
        await setup.start(address)
        client = await setup.connect()
        await client.identify()
        await client.send(auth(b"k") + pub("orders", b"1"))
        await client.response()
        assert await client.response() == b"OK"
        assert len(server.requests) == 1  # the cached answer served the PUB
        await trio.sleep(1.1)  # past the 1 s ttl: the next check asks again
        await client.send(pub("orders", b"2"))
        assert await client.error() == b'E_UNAUTHORIZED AUTH failed for PUB on "orders" ""'
        assert len(server.requests) == 2
        assert await client.closed()


async def test_expired_answer_and_auth_server_gone_means_auth_failed(setup: Setup) -> None:
    with trio.fail_after(TIMEOUT):
        short = ORDERS_ONLY.replace(b'"ttl": 3600', b'"ttl": 1')
        server, address = await setup.auth_server(
            lambda r: (200, short) if len(server.requests) == 1 else (503, b"down")
        )
        await setup.start(address)
        client = await setup.connect()
        await client.identify()
        await client.send(auth(b"k"))
        await client.response()
        await trio.sleep(1.1)
        await client.send(pub("orders", b"late"))
        assert await client.error() == b"E_AUTH_FAILED AUTH failed"
        assert await client.closed()


async def test_tls_and_client_certificate_reach_the_auth_server(setup: Setup, certs: Certs) -> None:
    with trio.fail_after(TIMEOUT):
        server, address = await setup.auth_server(lambda r: (200, ORDERS_ONLY))
        await setup.start(
            address,
            tls_cert=certs.server.cert_file,
            tls_key=certs.server.key_file,
            tls_root_ca_file=certs.ca_file,
            tls_client_auth_policy="require-verify",
        )
        client = await setup.connect()
        answer = await client.identify(tls_v1=True)
        assert (answer["tls_v1"], answer["auth_required"]) == (True, True)
        context = client_context(
            ca_file=certs.ca_file,
            cert_file=certs.client.cert_file,
            key_file=certs.client.key_file,
        )
        await client.start_tls(context)
        await client.send(auth(b"k") + pub("orders", b"x"))
        await client.response()
        assert await client.response() == b"OK"
        (request,) = server.requests
        assert (request.query["tls"], request.query["common_name"]) == ("true", certs.client_cn)

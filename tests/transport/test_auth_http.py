"""Asking auth servers over HTTP: grant, deny, errors, unreachable, timeout, failover, expiry.

Rules for this module: real HTTP over sockets on 127.0.0.1 only (``FakeAuthServer``, port 0);
every test is bounded by ``trio.fail_after``. Timeouts and ttl expiry run on a ``MockClock``
that jumps only after 50 ms of real idleness (loopback I/O must get its chance first: the
usual ``autojump_clock`` would jump while a socket read is merely in progress), and assert
exact virtual times.
"""

from __future__ import annotations

import functools
import random
import socket
import urllib.parse

import pytest
import trio
import trio.testing

from lmqd.protocol.errors import ProtocolError
from lmqd.transport.auth_http import (
    MAX_AUTH_RESPONSE_SIZE,
    AuthQueryError,
    AuthService,
    ConnectionAuth,
    auth_endpoint,
    query_auth_servers,
)
from lmqd.transport.tls import client_context, server_tls

from .authserver import AuthRequest, FakeAuthServer, grant
from .certs import Certs


@pytest.fixture
def idle_jump_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0.05)


def _closed_port_address() -> str:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now: connections are refused
    return f"127.0.0.1:{port}"


def test_endpoints() -> None:
    assert auth_endpoint("127.0.0.1:4181") == "http://127.0.0.1:4181/auth"
    assert auth_endpoint("https://auth.example:443/v1/check") == "https://auth.example:443/v1/check"


async def test_grant_and_the_request_nsqd_sends() -> None:
    server = FakeAuthServer()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            address = await nursery.start(server.run)
            state = await query_auth_servers(
                [address], "10.1.2.3", True, b"s3cret &=+", "client cn"
            )
            nursery.cancel_scope.cancel()
    assert state.identity == "test-user" and state.ttl_s == 3600
    (request,) = server.requests
    assert (request.method, request.path) == ("GET", "/auth")
    assert request.headers["accept"] == "application/vnd.nsq; version=1.0"
    assert request.query == {
        "common_name": "client cn",
        "remote_ip": "10.1.2.3",
        "secret": "s3cret &=+",
        "tls": "true",
    }


async def test_query_string_is_gos_url_values_encode() -> None:
    server = FakeAuthServer()
    raw_targets: list[str] = []

    def answer(request: AuthRequest) -> tuple[int, bytes]:
        raw_targets.append(urllib.parse.urlencode(request.query))
        return 200, grant()

    server.answer = answer
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            address = await nursery.start(server.run)
            await query_auth_servers([address], "127.0.0.1", False, "a b", "")
            nursery.cancel_scope.cancel()
    # keys sorted, space as "+", empty values kept
    assert raw_targets == ["common_name=&remote_ip=127.0.0.1&secret=a+b&tls=false"]


async def test_post_method_sends_the_form_in_the_body() -> None:
    server = FakeAuthServer()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            address = await nursery.start(server.run)
            await query_auth_servers([address], "1.2.3.4", False, "x", "", method="post")
            nursery.cancel_scope.cancel()
    (request,) = server.requests
    assert request.method == "POST"
    assert request.query == {}
    assert request.headers["content-type"] == "application/x-www-form-urlencoded"
    assert request.body == b"common_name=&remote_ip=1.2.3.4&secret=x&tls=false"


@pytest.mark.parametrize(
    ("status", "body", "reason"),
    [
        (403, b'{"message":"denied"}', "got response 403"),
        (500, b"internal error", "got response 500"),
        (200, b"<html>", "invalid JSON"),
        (200, grant(ttl=0), "invalid TTL 0"),
        (200, grant(authorizations=[{"topic": ".*", "permissions": ["all"]}]), "permission all"),
    ],
)
async def test_refusals(status: int, body: bytes, reason: str) -> None:
    server = FakeAuthServer(lambda request: (status, body))
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            address = await nursery.start(server.run)
            with pytest.raises(AuthQueryError, match=reason):
                await query_auth_servers([address], "1.2.3.4", False, "x", "")
            nursery.cancel_scope.cancel()


async def test_oversized_answer_is_refused() -> None:
    huge = b'{"ttl": 60, "identity": "' + b"x" * MAX_AUTH_RESPONSE_SIZE + b'"}'
    server = FakeAuthServer(lambda request: (200, huge))
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            address = await nursery.start(server.run)
            with pytest.raises(AuthQueryError, match="larger than 1048576 bytes"):
                await query_auth_servers([address], "1.2.3.4", False, "x", "")
            nursery.cancel_scope.cancel()


async def test_unreachable_server_is_a_refusal() -> None:
    with trio.fail_after(10), pytest.raises(AuthQueryError, match="cannot connect"):
        await query_auth_servers([_closed_port_address()], "1.2.3.4", False, "x", "")
    with pytest.raises(AuthQueryError, match="no auth server"):
        await query_auth_servers([], "1.2.3.4", False, "x", "")


async def test_silent_server_times_out_at_the_request_timeout(
    idle_jump_clock: trio.testing.MockClock,
) -> None:
    server = FakeAuthServer(lambda request: None)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            address = await nursery.start(server.run)
            start = trio.current_time()
            with pytest.raises(AuthQueryError, match="no answer within 5s"):
                await query_auth_servers([address], "1.2.3.4", False, "x", "")
            assert trio.current_time() - start == 5.0
            with pytest.raises(AuthQueryError, match=r"no answer within 0\.5s"):
                await query_auth_servers([address], "1.2.3.4", False, "x", "", request_timeout=0.5)
            nursery.cancel_scope.cancel()


async def test_servers_are_tried_from_a_random_start_until_one_answers() -> None:
    good = FakeAuthServer()
    dead = _closed_port_address()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            address = await nursery.start(good.run)
            addresses = [dead, address]
            starts = []
            for seed in range(12):
                rng = random.Random(seed)
                starts.append(random.Random(seed).randrange(2))
                state = await query_auth_servers(addresses, "1.2.3.4", False, "x", "", rng=rng)
                assert state.identity == "test-user"
            nursery.cancel_scope.cancel()
    assert set(starts) == {0, 1}  # both orders were exercised
    assert len(good.requests) == 12  # the dead one never stopped the good one


async def test_https_auth_server_verified_with_the_root_ca(certs: Certs) -> None:
    tls = server_tls(cert_file=certs.server.cert_file, key_file=certs.server.key_file)
    server = FakeAuthServer(ssl_context=tls.context)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            address = await nursery.start(server.run)
            url = f"https://{address}/auth"
            state = await query_auth_servers(
                [url], "1.2.3.4", True, "x", "", ssl_context=client_context(ca_file=certs.ca_file)
            )
            assert state.identity == "test-user"
            with pytest.raises(AuthQueryError, match="CERTIFICATE_VERIFY_FAILED"):
                await query_auth_servers([url], "1.2.3.4", True, "x", "")
            nursery.cancel_scope.cancel()


async def test_connection_auth_caches_for_ttl_and_asks_again_after(
    idle_jump_clock: trio.testing.MockClock,
) -> None:
    answers = iter([grant(ttl=60), grant(ttl=60, identity="second")])
    server = FakeAuthServer(lambda request: (200, next(answers)))
    with trio.fail_after(600):
        async with trio.open_nursery() as nursery:
            address = await nursery.start(server.run)
            auth = ConnectionAuth(AuthService([address]), remote_ip="10.0.0.9")
            assert not auth.authed
            start = trio.current_time()
            reply = await auth.auth(b"secret", tls=True, common_name="cn")
            assert reply == (
                b'{"identity":"test-user","identity_url":"http://auth.invalid/test-user",'
                b'"permission_count":1}'
            )
            assert auth.authed
            await trio.sleep_until(start + 60)
            await auth.check("PUB", "t")  # at exactly expires_at: still the cached answer
            assert len(server.requests) == 1
            await trio.sleep_until(start + 60.5)
            assert not auth.check_nowait("SUB", "t", "c", trio.current_time())
            await auth.check("SUB", "t", "c")  # expired: asked again
            assert len(server.requests) == 2
            assert server.requests[1].time == start + 60.5
            assert server.requests[1].query == {
                "common_name": "cn",
                "remote_ip": "10.0.0.9",
                "secret": "secret",
                "tls": "true",
            }
            assert auth.state is not None and auth.state.identity == "second"
            nursery.cancel_scope.cancel()


async def test_connection_auth_errors_are_nsqds() -> None:
    deny = FakeAuthServer(lambda request: (200, grant(authorizations=[])))
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            address = await nursery.start(deny.run)
            auth = ConnectionAuth(AuthService([address]), remote_ip="1.1.1.1")
            with pytest.raises(ProtocolError) as info:
                await auth.check("PUB", "t")
            assert info.value.body == b"E_AUTH_FIRST AUTH required before PUB"
            with pytest.raises(ProtocolError) as info:
                await auth.auth(b"x", tls=False, common_name="")
            assert info.value.body == b"E_UNAUTHORIZED AUTH no authorizations found"

            down = ConnectionAuth(AuthService([_closed_port_address()]), remote_ip="1.1.1.1")
            with pytest.raises(ProtocolError) as info:
                await down.auth(b"x", tls=False, common_name="")
            assert info.value.body == b"E_AUTH_FAILED AUTH failed"  # details only logged
            assert not down.authed

            narrow = FakeAuthServer(
                lambda request: (
                    200,
                    grant(
                        authorizations=[
                            {"topic": "^a$", "channels": [".*"], "permissions": ["publish"]}
                        ]
                    ),
                )
            )
            address = await nursery.start(narrow.run)
            auth = ConnectionAuth(AuthService([address]), remote_ip="1.1.1.1")
            await auth.auth(b"x", tls=False, common_name="")
            await auth.check("PUB", "a")
            with pytest.raises(ProtocolError) as info:
                await auth.check("SUB", "a", "c")
            assert info.value.body == b'E_UNAUTHORIZED AUTH failed for SUB on "a" "c"'
            nursery.cancel_scope.cancel()
    with pytest.raises(ValueError, match="post or get"):
        AuthService(["x:1"], method="put")
    assert not AuthService([]).enabled


async def _silent_listener(*, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
    """Accepts connections and never says a word (nor reads one)."""

    async def hold(stream: trio.abc.Stream) -> None:
        await trio.sleep_forever()

    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    task_status.started(f"127.0.0.1:{listeners[0].socket.getsockname()[1]}")
    await trio.serve_listeners(hold, listeners)


async def test_tls_handshake_counts_against_the_connect_timeout(
    idle_jump_clock: trio.testing.MockClock,
) -> None:
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            address = await nursery.start(_silent_listener)
            start = trio.current_time()
            with pytest.raises(AuthQueryError, match="cannot connect within 2s"):
                await query_auth_servers([f"https://{address}/auth"], "1.2.3.4", True, "x", "")
            assert trio.current_time() - start == 2.0
            nursery.cancel_scope.cancel()


async def test_garbage_instead_of_http_is_a_refusal() -> None:
    async def babble(stream: trio.abc.Stream) -> None:
        await stream.receive_some(65536)
        await stream.send_all(b"E_INVALID this is the NSQ port\n\n\n")
        await stream.aclose()

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(
                functools.partial(trio.serve_tcp, babble, 0, host="127.0.0.1")
            )
            port = listeners[0].socket.getsockname()[1]
            with pytest.raises(AuthQueryError, match="invalid HTTP answer"):
                await query_auth_servers([f"127.0.0.1:{port}"], "1.2.3.4", False, "x", "")
            nursery.cancel_scope.cancel()

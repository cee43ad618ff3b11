"""lmqlookupd's HTTP API: status codes, headers and bodies as nsqlookupd v1.3.0 sends them.

Rules for this module:
- one in-process ``LookupDaemon`` per test (the ``lookupd`` fixture), 127.0.0.1 port 0;
- requests through h11 (``wire.http``), so every header and body byte is the server's own;
- a ``fail_after`` guard per test. Expected answers come from nsqlookupd-reference.md §3.
"""

from __future__ import annotations

import json

import pytest
import trio

from .conftest import RunningLookupd
from .wire import HttpResult, http, post_ok

TIMEOUT_S = 10
JSON = "application/json; charset=utf-8"


def assert_error(result: HttpResult, status: int, message: str) -> None:
    assert result.status == status, result
    assert result.headers["content-type"] == JSON
    assert result.v1
    assert result.body == b'{"message":"%s"}' % message.encode()


@pytest.mark.parametrize(
    ("method", "target", "status", "message"),
    [
        ("GET", "/lookup", 400, "MISSING_ARG_TOPIC"),
        ("GET", "/lookup?topic=%zz", 400, "INVALID_REQUEST"),
        ("GET", "/lookup?topic=a;b", 400, "INVALID_REQUEST"),
        ("GET", "/lookup?topic=nope", 404, "TOPIC_NOT_FOUND"),
        ("GET", "/lookup?topic=", 404, "TOPIC_NOT_FOUND"),
        ("GET", "/channels", 400, "MISSING_ARG_TOPIC"),
        ("GET", "/channels?topic=%", 400, "INVALID_REQUEST"),
        ("POST", "/topic/create", 400, "MISSING_ARG_TOPIC"),
        ("POST", "/topic/create?topic=bad!", 400, "INVALID_ARG_TOPIC"),
        ("POST", "/topic/create?topic=" + "a" * 65, 400, "INVALID_ARG_TOPIC"),
        ("POST", "/topic/create?topic=%zz", 400, "INVALID_REQUEST"),
        ("POST", "/topic/delete", 400, "MISSING_ARG_TOPIC"),
        ("POST", "/channel/create?channel=c", 400, "MISSING_ARG_TOPIC"),
        ("POST", "/channel/create?topic=bad!&channel=c", 400, "INVALID_ARG_TOPIC"),
        ("POST", "/channel/create?topic=t", 400, "MISSING_ARG_CHANNEL"),
        ("POST", "/channel/create?topic=t&channel=bad!", 400, "INVALID_ARG_CHANNEL"),
        ("POST", "/channel/delete?topic=t", 400, "MISSING_ARG_CHANNEL"),
        ("POST", "/channel/delete?topic=t&channel=c", 404, "CHANNEL_NOT_FOUND"),
        ("POST", "/topic/tombstone?node=n:1", 400, "MISSING_ARG_TOPIC"),
        ("POST", "/topic/tombstone?topic=t", 400, "MISSING_ARG_NODE"),
        ("GET", "/nope", 404, "NOT_FOUND"),
        ("GET", "/debug/pprof", 404, "NOT_FOUND"),
        ("GET", "/create_topic?topic=t", 404, "NOT_FOUND"),  # removed in nsqlookupd 1.0
        ("POST", "/tombstone_topic_producer?topic=t&node=n:1", 404, "NOT_FOUND"),
        ("POST", "/lookup/x", 404, "NOT_FOUND"),
    ],
)
async def test_errors(
    lookupd: RunningLookupd, method: str, target: str, status: int, message: str
) -> None:
    with trio.fail_after(TIMEOUT_S):
        assert_error(await http(lookupd.http, method, target), status, message)


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("POST", "/lookup", "GET, OPTIONS"),
        ("PUT", "/nodes", "GET, OPTIONS"),
        ("DELETE", "/ping", "GET, OPTIONS"),
        ("HEAD", "/topics", "GET, OPTIONS"),
        ("GET", "/topic/create", "OPTIONS, POST"),
        ("GET", "/topic/tombstone", "OPTIONS, POST"),
    ],
)
async def test_wrong_method_is_405_with_allow(
    lookupd: RunningLookupd, method: str, path: str, allow: str
) -> None:
    with trio.fail_after(TIMEOUT_S):
        result = await http(lookupd.http, method, path)
        assert result.headers["allow"] == allow
        if method == "HEAD":  # no body for HEAD, the rest as for any method
            assert (result.status, result.body, result.v1) == (405, b"", True)
        else:
            assert_error(result, 405, "METHOD_NOT_ALLOWED")


async def test_options_lists_the_methods(lookupd: RunningLookupd) -> None:
    with trio.fail_after(TIMEOUT_S):
        result = await http(lookupd.http, "OPTIONS", "/lookup")
        assert (result.status, result.body, result.headers["allow"]) == (200, b"", "GET, OPTIONS")
        assert "content-type" not in result.headers and not result.v1
        assert_error(await http(lookupd.http, "OPTIONS", "/nope"), 404, "NOT_FOUND")


@pytest.mark.parametrize(
    ("method", "target", "status", "location"),
    [
        ("GET", "/lookup/?topic=t", 301, "/lookup?topic=t"),
        ("GET", "/LOOKUP?topic=t", 301, "/lookup?topic=t"),
        ("GET", "//topics", 301, "/topics"),
        ("GET", "/Nodes/", 301, "/nodes"),
        ("POST", "/topic/create/?topic=t", 307, "/topic/create?topic=t"),
        ("POST", "/Topic/Create?topic=t", 307, "/topic/create?topic=t"),
    ],
)
async def test_redirects_to_the_canonical_path(
    lookupd: RunningLookupd, method: str, target: str, status: int, location: str
) -> None:
    with trio.fail_after(TIMEOUT_S):
        result = await http(lookupd.http, method, target)
        assert (result.status, result.headers["location"]) == (status, location)
        if method == "GET":
            assert result.body == b'<a href="%s">Moved Permanently</a>.\n\n' % (
                location.encode().replace(b"&", b"&amp;")
            )
        else:
            assert result.body == b""


async def test_success_shapes_and_headers(lookupd: RunningLookupd) -> None:
    with trio.fail_after(TIMEOUT_S):
        ping = await http(lookupd.http, "GET", "/ping")
        assert (ping.status, ping.body, ping.headers["content-type"]) == (
            200, b"OK", "text/plain; charset=utf-8",
        )  # fmt: skip
        assert not ping.v1

        info = await http(lookupd.http, "GET", "/info")
        assert (info.status, info.body, info.v1) == (200, b'{"version":"1.3.0"}', True)
        assert info.headers["content-type"] == JSON

        # POSTs without data: an empty 200 with the V1 header and no Content-Type.
        created = await http(lookupd.http, "POST", "/topic/create?topic=t")
        assert (created.status, created.body, created.v1) == (200, b"", True)
        assert "content-type" not in created.headers
        assert created.headers["content-length"] == "0"

        # Empty lists are [], never null.
        for target, body in [
            ("/lookup?topic=t", b'{"channels":[],"producers":[]}'),
            ("/channels?topic=unknown", b'{"channels":[]}'),
            ("/nodes", b'{"producers":[]}'),
            ("/debug", b"{}"),
            ("/topics", b'{"topics":["t"]}'),
        ]:
            result = await http(lookupd.http, "GET", target)
            assert (result.status, result.body, result.v1) == (200, body, True), target

        # The first of a repeated parameter wins; parameters come from the query only.
        await post_ok(lookupd.http, "/channel/create?topic=t&channel=c1&channel=c2")
        result = await http(lookupd.http, "GET", "/channels?topic=t&topic=other")
        assert json.loads(result.body) == {"channels": ["c1"]}
        # Escapes are decoded before the name check.
        bad = await http(lookupd.http, "POST", "/channel/create?topic=u&channel=c%231")
        assert_error(bad, 400, "INVALID_ARG_CHANNEL")
        await post_ok(lookupd.http, "/channel/create?topic=u&channel=x%23ephemeral")
        result = await http(lookupd.http, "GET", "/channels?topic=u")
        assert result.body == b'{"channels":["x#ephemeral"]}'


async def test_create_and_delete_round_trip(lookupd: RunningLookupd) -> None:
    with trio.fail_after(TIMEOUT_S):
        await post_ok(lookupd.http, "/channel/create?topic=t&channel=c")
        assert (await http(lookupd.http, "GET", "/topics")).body == b'{"topics":["t"]}'
        await post_ok(lookupd.http, "/channel/delete?topic=t&channel=c")
        assert (await http(lookupd.http, "GET", "/channels?topic=t")).body == b'{"channels":[]}'
        await post_ok(lookupd.http, "/topic/delete?topic=t")
        await post_ok(lookupd.http, "/topic/delete?topic=never+existed!")
        assert (await http(lookupd.http, "GET", "/topics")).body == b'{"topics":[]}'
        # Tombstoning a topic nobody produces is a 200 too.
        await post_ok(lookupd.http, "/topic/tombstone?topic=t&node=127.0.0.1:4151")


async def test_status_lines_carry_the_reason_phrase_as_go_writes_them(
    lookupd: RunningLookupd,
) -> None:
    with trio.fail_after(TIMEOUT_S):
        for target, line in ((b"/ping", b"HTTP/1.1 200 OK"),
                             (b"/lookup?topic=nope", b"HTTP/1.1 404 Not Found")):  # fmt: skip
            stream = await trio.open_tcp_stream(*lookupd.http)
            async with stream:
                await stream.send_all(b"GET %s HTTP/1.1\r\nHost: x\r\n\r\n" % target)
                data = b""
                while b"\r\n" not in data:
                    data += await stream.receive_some(4096)
            assert data.partition(b"\r\n")[0] == line

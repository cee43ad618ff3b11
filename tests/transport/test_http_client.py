"""HttpClient against a server that closes connections: a kept connection closed while idle is
replaced once, and a new connection closed before any answer is an ``HttpClientError`` (what a
mirror sees while its primary is killed and restarted), never an internal signal.

Rules for this module: a raw trio TCP server on 127.0.0.1 port 0 whose behaviour per accepted
connection is scripted by the test; every test is bounded by ``trio.fail_after``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
import trio

from lmqd.transport.http_client import HttpClient, HttpClientError

ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"

Behaviour = Callable[[trio.SocketStream], Awaitable[None]]


async def _answer_once(stream: trio.SocketStream) -> None:
    """Read a request and answer it (the connection is closed after: idle, to the client)."""
    await stream.receive_some(65536)
    await stream.send_all(ANSWER)


async def _close_at_once(stream: trio.SocketStream) -> None:
    await stream.receive_some(65536)


async def _server(nursery: trio.Nursery, behaviours: list[Behaviour], accepted: list[int]) -> int:
    """Serve on 127.0.0.1 port 0: the n-th connection runs ``behaviours[n]`` then is closed."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")

    async def handle(stream: trio.SocketStream) -> None:
        index = len(accepted)
        accepted.append(index)
        async with stream:
            await behaviours[min(index, len(behaviours) - 1)](stream)

    nursery.start_soon(trio.serve_listeners, handle, listeners)
    port: int = listeners[0].socket.getsockname()[1]
    return port


async def test_a_kept_connection_closed_while_idle_is_replaced_once() -> None:
    accepted: list[int] = []
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            port = await _server(nursery, [_answer_once], accepted)
            client = HttpClient("127.0.0.1", port)
            assert (await client.request("GET", "/a")).body == b"ok"
            await trio.sleep(0.1)  # the server has closed the kept connection
            assert (await client.request("GET", "/b")).body == b"ok"
            assert accepted == [0, 1]
            await client.aclose()
            nursery.cancel_scope.cancel()


@pytest.mark.parametrize("kept_first", [False, True], ids=["new", "kept-then-new"])
async def test_a_new_connection_closed_before_an_answer_is_an_http_client_error(
    kept_first: bool,
) -> None:
    accepted: list[int] = []
    behaviours: list[Behaviour] = [_answer_once, _close_at_once] if kept_first else [_close_at_once]
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            port = await _server(nursery, behaviours, accepted)
            client = HttpClient("127.0.0.1", port)
            if kept_first:
                assert (await client.request("GET", "/a")).body == b"ok"
                await trio.sleep(0.1)
            with pytest.raises(HttpClientError, match="closed before an answer") as caught:
                await client.request("GET", "/b")
            assert caught.value.unreachable
            # The kept connection was tried, then one new one: no endless retry.
            assert len(accepted) == (2 if kept_first else 1)
            await client.aclose()
            nursery.cancel_scope.cancel()

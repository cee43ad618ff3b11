"""The tests' HTTP/1.1 client: h11 over a trio stream, one request per connection.

A test sees exactly the status, headers and body bytes the server sent (no client library
normalising them), and can also send what a library would refuse to (a ``Content-Length`` with
no body, chunked uploads, odd methods). Reads have no timeout of their own: the caller's
``fail_after`` bounds them.
"""

from __future__ import annotations

import json
from typing import Any

import attrs
import h11
import trio

__all__ = ["HttpResult", "http", "http_headers_only"]

Address = tuple[str, int]

CHUNK_SIZE = 65536
"""Bytes per read, and per chunk of a chunked upload: the tests' large bodies (a few hundred kB)
then go up in several chunks, as a streaming client would send them."""


@attrs.frozen
class HttpResult:
    """One response: status, headers and the whole body."""

    status: int
    headers: dict[str, str]
    """Lower-cased names; the last value of a repeated header."""
    body: bytes

    def json(self) -> Any:
        assert self.headers["content-type"] == "application/json; charset=utf-8", self.headers
        return json.loads(self.body)

    @property
    def v1(self) -> bool:
        """Whether nsqd's ``X-NSQ-Content-Type: nsq; version=1.0`` header is present."""
        return self.headers.get("x-nsq-content-type") == "nsq; version=1.0"


async def _read_response(conn: h11.Connection, stream: trio.SocketStream) -> HttpResult:
    response: h11.Response | None = None
    body = bytearray()
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(await stream.receive_some(CHUNK_SIZE))
            continue
        if isinstance(event, h11.Response):
            response = event
        elif isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
            break
    assert response is not None
    headers = {k.decode().lower(): v.decode() for k, v in response.headers}
    return HttpResult(response.status_code, headers, bytes(body))


async def http(
    address: Address,
    method: str,
    target: str,
    body: bytes | None = None,
    *,
    headers: tuple[tuple[str, str], ...] = (),
    chunked: bool = False,
) -> HttpResult:
    """One request on a fresh connection; ``chunked`` sends the body with chunked encoding."""
    stream = await trio.open_tcp_stream(*address)
    async with stream:
        conn = h11.Connection(h11.CLIENT)
        hdrs = [("Host", f"{address[0]}:{address[1]}"), *headers]
        if chunked:
            hdrs.append(("Transfer-Encoding", "chunked"))
        elif body is not None or method in ("POST", "PUT"):
            hdrs.append(("Content-Length", str(len(body or b""))))
        data = conn.send(h11.Request(method=method, target=target, headers=hdrs))
        if body:
            if chunked:
                for i in range(0, len(body), CHUNK_SIZE):
                    data += conn.send(h11.Data(data=body[i : i + CHUNK_SIZE])) or b""
            else:
                data += conn.send(h11.Data(data=body)) or b""
        data += conn.send(h11.EndOfMessage()) or b""
        await stream.send_all(data or b"")
        return await _read_response(conn, stream)


async def http_headers_only(
    address: Address, method: str, target: str, content_length: int
) -> HttpResult:
    """Send only the request head announcing ``content_length`` bytes, then read the answer: a
    server that rejects by Content-Length answers without waiting for the body."""
    stream = await trio.open_tcp_stream(*address)
    async with stream:
        conn = h11.Connection(h11.CLIENT)
        head = conn.send(h11.Request(method=method, target=target, headers=[
            ("Host", f"{address[0]}:{address[1]}"), ("Content-Length", str(content_length)),
        ]))
        await stream.send_all(head or b"")
        return await _read_response(conn, stream)

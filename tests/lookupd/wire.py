"""Test-side clients for lmqlookupd: an h11 HTTP client and a V1 peer over trio streams.

The HTTP client shows exactly the status, headers and body bytes the server sent (no client
library normalising them); ``V1Peer`` registers like a node does, through the client codec
(``LookupClientConnection``), and can also send raw bytes to test bad input.
"""

from __future__ import annotations

import json
from typing import Any

import attrs
import h11
import trio

from lmqd.lookup import (
    Command,
    ConnectionClosed,
    Identify,
    LookupClientConnection,
    Response,
)

Address = tuple[str, int]


@attrs.frozen
class HttpResult:
    status: int
    headers: dict[str, str]
    """Lower-cased names; the last value of a repeated header."""
    body: bytes

    def json(self) -> Any:
        assert self.headers["content-type"] == "application/json; charset=utf-8", self.headers
        return json.loads(self.body)

    @property
    def v1(self) -> bool:
        """Whether ``X-NSQ-Content-Type: nsq; version=1.0`` is present."""
        return self.headers.get("x-nsq-content-type") == "nsq; version=1.0"


async def http(address: Address, method: str, target: str) -> HttpResult:
    """One request on a fresh connection (no body)."""
    stream = await trio.open_tcp_stream(*address)
    async with stream:
        conn = h11.Connection(h11.CLIENT)
        headers = [("Host", f"{address[0]}:{address[1]}")]
        if method in ("POST", "PUT"):
            headers.append(("Content-Length", "0"))
        await stream.send_all(
            conn.send(h11.Request(method=method, target=target, headers=headers))
            + (conn.send(h11.EndOfMessage()) or b"")
        )
        response: h11.Response | None = None
        body = bytearray()
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await stream.receive_some(65536))
                continue
            if isinstance(event, h11.Response):
                response = event
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
                break
    assert response is not None
    return HttpResult(
        response.status_code,
        {k.decode().lower(): v.decode() for k, v in response.headers},
        bytes(body),
    )


async def get_json(address: Address, target: str) -> Any:
    """GET ``target``, assert a 200, return the decoded JSON."""
    result = await http(address, "GET", target)
    assert result.status == 200, (target, result)
    return result.json()


async def post_ok(address: Address, target: str) -> None:
    """POST ``target``, assert nsqlookupd's empty 200."""
    result = await http(address, "POST", target)
    assert (result.status, result.body) == (200, b""), (target, result)


def identify(port: int, *, address: str = "127.0.0.1", hostname: str = "node") -> Identify:
    """An IDENTIFY as nsqd sends it, for a node whose TCP port is ``port`` (HTTP: +1)."""
    return Identify(
        broadcast_address=address,
        tcp_port=port,
        http_port=port + 1,
        version="1.3.0",
        hostname=hostname,
    )


class V1Peer:
    """A registering node's connection to a lookupd (its V1 TCP port)."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.codec = LookupClientConnection()
        host, port = stream.socket.getsockname()[:2]
        self.local_address = f"{host}:{port}"
        """``ip:port`` of our end: the producer id the lookupd shows as ``remote_address``."""

    @classmethod
    async def connect(cls, address: Address) -> V1Peer:
        stream = await trio.open_tcp_stream(*address)
        peer = cls(stream)
        await stream.send_all(peer.codec.initial_bytes())
        return peer

    async def command(self, *commands: Command) -> list[Response]:
        """Send ``commands`` in one write; their responses, in order."""
        await self.stream.send_all(b"".join(self.codec.send(c) for c in commands))
        responses: list[Response] = []
        while len(responses) < len(commands):
            event = self.codec.next_event()
            if event is None:
                self.codec.receive_data(await self.stream.receive_some(4096))
            elif isinstance(event, ConnectionClosed):
                raise AssertionError(f"closed after {responses}")
            else:
                responses.append(event)
        return responses

    async def aclose(self) -> None:
        await self.stream.aclose()


async def raw_exchange(address: Address, data: bytes, *, eof: bool = False) -> bytes:
    """Send ``data`` (then EOF if asked) on a fresh connection; everything the server sends
    back until it closes."""
    stream = await trio.open_tcp_stream(*address)
    async with stream:
        await stream.send_all(data)
        if eof:
            await stream.send_eof()
        received = bytearray()
        while chunk := await stream.receive_some(65536):
            received += chunk
    return bytes(received)

"""A raw V2 client for the secure-transport tests: bytes out, frames in, and the upgrades.

It speaks the handshake the way a real client does (IDENTIFY, then TLS over the same stream,
then snappy or deflate inside it), using trio's ``SSLStream`` and lmqd's codecs, but checks
every byte itself, so a test sees exactly what the daemon sent and when.
"""

from __future__ import annotations

import json
import ssl
import struct
from typing import Any

import trio

from lmqd.transport.compression import codec_for
from lmqd.transport.streams import CompressedStream, PrefixedStream, start_tls_client

MAGIC = b"  V2"
RESPONSE, ERROR, MESSAGE = 0, 1, 2


def command(line: str, body: bytes | None = None) -> bytes:
    data = line.encode() + b"\n"
    if body is not None:
        data += struct.pack(">i", len(body)) + body
    return data


def identify(**fields: Any) -> bytes:
    fields.setdefault("feature_negotiation", True)
    return command("IDENTIFY", json.dumps(fields).encode())


def pub(topic: str, body: bytes) -> bytes:
    return command(f"PUB {topic}", body)


def auth(secret: bytes) -> bytes:
    return command("AUTH", secret)


class WireClient:
    """One connection's client end; ``stream`` is replaced by each upgrade."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.buffer = bytearray()

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def frame(self) -> tuple[int, bytes]:
        while True:
            if len(self.buffer) >= 4:
                (size,) = struct.unpack(">i", self.buffer[:4])
                if len(self.buffer) >= 4 + size:
                    frame_type = struct.unpack(">i", self.buffer[4:8])[0]
                    data = bytes(self.buffer[8 : 4 + size])
                    del self.buffer[: 4 + size]
                    return frame_type, data
            chunk = await self.stream.receive_some(65536)
            if not chunk:
                raise EOFError(f"connection closed; unread bytes {bytes(self.buffer)!r}")
            self.buffer += chunk

    async def response(self) -> bytes:
        frame_type, data = await self.frame()
        assert frame_type == RESPONSE, (frame_type, data)
        return data

    async def error(self) -> bytes:
        frame_type, data = await self.frame()
        assert frame_type == ERROR, (frame_type, data)
        return data

    async def message_body(self) -> bytes:
        frame_type, data = await self.frame()
        assert frame_type == MESSAGE, (frame_type, data)
        return data[26:]

    async def identify(self, **fields: Any) -> dict[str, Any]:
        await self.send(identify(**fields))
        answer: dict[str, Any] = json.loads(await self.response())
        return answer

    def _take_buffer(self) -> bytes:
        leftover = bytes(self.buffer)
        self.buffer.clear()
        return leftover

    async def start_tls(self, context: ssl.SSLContext, hostname: str = "localhost") -> None:
        """The client side of the ``tls_v1`` upgrade, then the daemon's ``OK`` over TLS."""
        inner = PrefixedStream(self.stream, self._take_buffer())
        self.stream = await start_tls_client(inner, context, server_hostname=hostname)
        assert await self.response() == b"OK"

    async def start_compression(self, name: str, level: int = 6) -> None:
        """Wrap the stream in ``name``'s codec, then the daemon's ``OK`` through it."""
        codec = codec_for(snappy=name == "snappy", deflate=name == "deflate", deflate_level=level)
        assert codec is not None
        self.stream = CompressedStream(PrefixedStream(self.stream, self._take_buffer()), codec)
        assert await self.response() == b"OK"

    async def closed(self) -> bool:
        """True once the daemon has closed the connection (after any frames pending)."""
        try:
            while True:
                await self.frame()
        except (EOFError, trio.BrokenResourceError, trio.ClosedResourceError):
            return True

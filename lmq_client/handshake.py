"""The async clients' handshake, on anyio streams: the magic and IDENTIFY, then the upgrades the
daemon granted, in nsqd's order (TLS, then snappy or deflate, then AUTH; what to do is
``lmq_client.transport.plan_upgrades``'s decision). The blocking clients' twin is
``lmq_client.sync.connection``."""

from __future__ import annotations

import logging
from typing import Any

import anyio
import attrs
from anyio.abc import ByteStream

from lmq_client._util import parse_identify_response
from lmq_client.core.link import RECEIVE_SIZE
from lmq_client.errors import ConnectionFailed
from lmq_client.streams import CompressedStream, PrefixedStream, start_tls
from lmq_client.transport import FrameReader, TransportOptions, parse_auth_answer, plan_upgrades
from lmqd.net import split_address
from lmqd.protocol import MAGIC_V2, Auth, encode_identify

__all__ = ["Handshaken", "handshake"]

log = logging.getLogger("lmq_client.connection")


@attrs.frozen
class Handshaken:
    """What the handshake leaves: the stream to use from now on (TLS and compression around
    the socket, and the bytes already read after the last handshake frame in front), the
    daemon's IDENTIFY answer and its AUTH answer (None if it asked for none)."""

    stream: ByteStream
    server_settings: dict[str, Any]
    auth_identity: dict[str, Any] | None


async def handshake(
    stream: ByteStream, address: str, identify: dict[str, Any], transport: TransportOptions
) -> Handshaken:
    """The handshake on ``stream`` (the caller bounds its time and closes the stream if it
    raises ``ConnectionFailed``, the daemon's ``NSQError``, or an anyio stream error)."""
    reader = FrameReader(address)

    async def frame() -> bytes:
        while True:
            data = reader.next_response()
            if data is not None:
                return data
            try:
                received = await stream.receive(RECEIVE_SIZE)
            except anyio.EndOfStream:
                raise ConnectionFailed(address, "connection closed during the handshake") from None
            reader.receive_data(bytes(received))

    async def expect_ok(upgrade: str) -> None:
        data = await frame()
        if data != b"OK":
            raise ConnectionFailed(address, f"invalid answer {data[:50]!r} after {upgrade}")

    def with_rest(inner: ByteStream) -> ByteStream:
        rest = reader.take_rest()  # bytes that belong to the next layer
        return PrefixedStream(inner, rest) if rest else inner

    await stream.send(MAGIC_V2 + encode_identify(identify))
    settings = parse_identify_response(await frame())
    upgrades = plan_upgrades(transport, settings, address)
    if upgrades.tls:
        host, _ = split_address(address)
        stream = await start_tls(with_rest(stream), transport.ssl_context(), server_hostname=host)
        await expect_ok("TLS")
    if upgrades.codec is not None:
        stream = CompressedStream(with_rest(stream), upgrades.codec)
        await expect_ok(upgrades.codec.name)
    auth_identity = None
    if upgrades.auth_secret is not None:
        await stream.send(Auth(secret=upgrades.auth_secret).encode())
        auth_identity = parse_auth_answer(await frame())
        log.info("NSQD(%s): authenticated as %s", address, auth_identity)
    return Handshaken(with_rest(stream), settings, auth_identity)

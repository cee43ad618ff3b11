"""trio streams for the upgrades after IDENTIFY: TLS on the same socket, then compression.

The order is nsqd's: the IDENTIFY response goes out in plaintext, then the TLS handshake runs
on the same connection (``start_tls_server`` / ``start_tls_client``), then compression wraps
whatever the connection is by then (``CompressedStream``: TLS outside, compression inside).
After each upgrade nsqd sends an ``OK`` frame through the new layer.

Upgrades and buffered bytes: a peer may not send anything after its IDENTIFY (client) or its
IDENTIFY response (server) until it has seen the other side's answer, but bytes it sent
*after* the upgrade can arrive in the same read as the last plaintext frame (a server's snappy
``OK`` right behind its IDENTIFY response, say). The reader must then hand those bytes to the
new layer rather than to the old parser: ``PrefixedStream`` puts them in front of the stream.

``CompressedStream`` turns a ``CompressionError`` into ``trio.BrokenResourceError`` (its
``__cause__`` says why), which every connection loop already treats as "close this
connection". TLS uses ``https_compatible=True``: NSQ peers (nsqd itself, pynsq, gnsq) close
the socket without a TLS ``close_notify``, and NSQ's framing already detects a truncated
stream, so a missing ``close_notify`` is plain EOF.
"""

from __future__ import annotations

import ssl

import trio

from lmqd.transport.compression import CompressionError, StreamCodec
from lmqd.transport.tls import TLS_HANDSHAKE_TIMEOUT_S

__all__ = [
    "CompressedStream",
    "PrefixedStream",
    "start_tls_client",
    "start_tls_server",
]

RECEIVE_SIZE = 256 * 1024
"""Compressed bytes read from the inner stream at a time (the daemon's and the client's socket
read size; ``DEFAULT_MAX_OUTPUT`` bounds what one read can expand to)."""


class PrefixedStream(trio.abc.Stream):
    """``stream`` with ``prefix`` (bytes already read from it) received first."""

    def __init__(self, stream: trio.abc.Stream, prefix: bytes) -> None:
        self.stream = stream
        self._prefix = prefix

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.stream.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.stream.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self._prefix:
            await trio.lowlevel.checkpoint()
            if max_bytes is None or max_bytes >= len(self._prefix):
                data, self._prefix = self._prefix, b""
            else:
                data, self._prefix = self._prefix[:max_bytes], self._prefix[max_bytes:]
            return data
        return bytes(await self.stream.receive_some(max_bytes))

    async def aclose(self) -> None:
        await self.stream.aclose()


class CompressedStream(trio.abc.Stream):
    """``stream`` with ``codec`` applied: every ``send_all`` is compressed (and decodable by the
    peer at once), every ``receive_some`` returns decompressed bytes."""

    def __init__(self, stream: trio.abc.Stream, codec: StreamCodec) -> None:
        self.stream = stream
        self.codec = codec
        self._sending = False
        self._receiving = False
        self._send_broken = False
        self._leftover = b""

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        # The compressor's state moves with every call, so two concurrent sends, or a send
        # cancelled half-way, would desynchronise the peer's decompressor for good.
        if self._sending:
            raise trio.BusyResourceError("another task is sending on this stream")
        if self._send_broken:
            raise trio.BrokenResourceError("an earlier send on this stream was interrupted")
        self._sending = True
        try:
            compressed = self.codec.compress(bytes(data))
            self._send_broken = True
            await self.stream.send_all(compressed)
            self._send_broken = False
        finally:
            self._sending = False

    async def wait_send_all_might_not_block(self) -> None:
        await self.stream.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self._receiving:
            raise trio.BusyResourceError("another task is receiving on this stream")
        self._receiving = True
        try:
            if not self._leftover:
                self._leftover = await self._receive_decompressed()
            else:
                await trio.lowlevel.checkpoint()
            data = self._leftover
            if max_bytes is not None and max_bytes < len(data):
                data, self._leftover = data[:max_bytes], data[max_bytes:]
            else:
                self._leftover = b""
            return data
        finally:
            self._receiving = False

    async def _receive_decompressed(self) -> bytes:
        codec = self.codec
        try:
            while True:
                if codec.has_pending_output:
                    out = codec.decompress(b"")
                    if out:
                        await trio.lowlevel.checkpoint()
                        return out
                data = await self.stream.receive_some(RECEIVE_SIZE)
                if not data:
                    codec.end_of_input()
                    return b""
                out = codec.decompress(bytes(data))
                if out:
                    return out
                # Only part of a chunk or block arrived: b"" would mean EOF, so read on.
        except CompressionError as exc:
            raise trio.BrokenResourceError(str(exc)) from exc

    async def aclose(self) -> None:
        await self.stream.aclose()


async def start_tls_server(
    stream: trio.abc.Stream,
    context: ssl.SSLContext,
    *,
    handshake_timeout_s: float = TLS_HANDSHAKE_TIMEOUT_S,
) -> trio.SSLStream[trio.abc.Stream]:
    """The server side of the ``tls_v1`` upgrade: handshake within ``handshake_timeout_s``
    (nsqd: 5 s).

    Raises ``trio.BrokenResourceError`` for a failed handshake (garbage, wrong certificate, the
    client's certificate refused) and ``trio.TooSlowError`` when it takes too long; either way
    the connection is unusable and must be closed (nsqd answers ``E_IDENTIFY_FAILED IDENTIFY
    failed <reason>`` first, in plaintext, which a TLS client cannot read anyway).
    """
    ssl_stream = trio.SSLStream(stream, context, server_side=True, https_compatible=True)
    with trio.fail_after(handshake_timeout_s):
        await ssl_stream.do_handshake()
    return ssl_stream


async def start_tls_client(
    stream: trio.abc.Stream,
    context: ssl.SSLContext,
    *,
    server_hostname: str | None,
    handshake_timeout_s: float = TLS_HANDSHAKE_TIMEOUT_S,
) -> trio.SSLStream[trio.abc.Stream]:
    """The client side of the ``tls_v1`` upgrade; errors as ``start_tls_server``."""
    ssl_stream = trio.SSLStream(
        stream, context, server_hostname=server_hostname, https_compatible=True
    )
    with trio.fail_after(handshake_timeout_s):
        await ssl_stream.do_handshake()
    return ssl_stream

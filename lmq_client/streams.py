"""anyio byte streams for the client side of the upgrades after IDENTIFY.

The async clients run on anyio, so the same code serves asyncio and trio applications; the
daemon stays on trio and keeps its own trio streams (``lmqd.transport.streams``). Both sides use
the same codecs (``lmqd.transport.compression``) and TLS contexts (``lmqd.transport.tls``), so
they speak the same bytes.

* TLS is anyio's ``TLSStream`` with ``standard_compatible=False``: NSQ daemons (nsqd, lmqd)
  close without a TLS ``close_notify``, and NSQ's framing already detects a truncated stream, so
  a missing ``close_notify`` is plain end of stream (the daemon side does the same with trio's
  ``https_compatible=True``).
* ``PrefixedStream`` puts bytes already read in front of a stream: the daemon sends its
  compressed ``OK`` right behind the plaintext IDENTIFY answer, and those bytes belong to the
  next layer.
* ``CompressedStream`` applies a codec to both directions. A ``CompressionError`` becomes
  ``anyio.BrokenResourceError`` (its ``__cause__`` says why), which the connection already
  treats as a lost connection.
"""

from __future__ import annotations

import ssl

import anyio
import anyio.lowlevel
from anyio.abc import ByteStream
from anyio.streams.tls import TLSStream

from lmqd.transport.compression import CompressionError, StreamCodec

__all__ = ["CompressedStream", "PrefixedStream", "start_tls"]

RECEIVE_SIZE = 256 * 1024
"""Compressed bytes read from the inner stream at a time (the connection's own read size;
the codec's output bound limits what one read can expand to)."""


class PrefixedStream(ByteStream):
    """``stream`` with ``prefix`` (bytes already read from it) received first."""

    def __init__(self, stream: ByteStream, prefix: bytes) -> None:
        self.stream = stream
        self._prefix = prefix

    async def send(self, item: bytes) -> None:
        await self.stream.send(item)

    async def send_eof(self) -> None:
        await self.stream.send_eof()

    async def receive(self, max_bytes: int = 65536) -> bytes:
        if self._prefix:
            await anyio.lowlevel.checkpoint()
            data, self._prefix = self._prefix[:max_bytes], self._prefix[max_bytes:]
            return data
        return await self.stream.receive(max_bytes)

    async def aclose(self) -> None:
        await self.stream.aclose()


class CompressedStream(ByteStream):
    """``stream`` with ``codec`` applied: every ``send`` is compressed (and decodable by the
    peer at once), every ``receive`` returns decompressed bytes."""

    def __init__(self, stream: ByteStream, codec: StreamCodec) -> None:
        self.stream = stream
        self.codec = codec
        self._send_broken = False
        self._leftover = b""

    async def send(self, item: bytes) -> None:
        # The compressor's state moves with every call: a send cancelled half-way would leave
        # the peer's decompressor out of step for good. (The connection sends from one task.)
        if self._send_broken:
            raise anyio.BrokenResourceError("an earlier send on this stream was interrupted")
        compressed = self.codec.compress(bytes(item))
        self._send_broken = True
        await self.stream.send(compressed)
        self._send_broken = False

    async def send_eof(self) -> None:
        await self.stream.send_eof()

    async def receive(self, max_bytes: int = 65536) -> bytes:
        if not self._leftover:
            self._leftover = await self._receive_decompressed()
        else:
            await anyio.lowlevel.checkpoint()
        data, self._leftover = self._leftover[:max_bytes], self._leftover[max_bytes:]
        return data

    async def _receive_decompressed(self) -> bytes:
        codec = self.codec
        try:
            while True:
                if codec.has_pending_output:
                    out = codec.decompress(b"")
                    if out:
                        await anyio.lowlevel.checkpoint()
                        return out
                try:
                    data = await self.stream.receive(RECEIVE_SIZE)
                except anyio.EndOfStream:
                    codec.end_of_input()  # raises if the stream ended inside a block
                    raise
                out = codec.decompress(bytes(data))
                if out:
                    return out
                # Only part of a chunk or block arrived: read on.
        except CompressionError as exc:
            raise anyio.BrokenResourceError(str(exc)) from exc

    async def aclose(self) -> None:
        await self.stream.aclose()


async def start_tls(
    stream: ByteStream, context: ssl.SSLContext, *, server_hostname: str | None
) -> TLSStream:
    """The client side of the ``tls_v1`` upgrade on ``stream`` (the caller bounds the time).

    A failed handshake raises ``ssl.SSLError`` or ``anyio.BrokenResourceError``.
    """
    return await TLSStream.wrap(
        stream,
        server_side=False,
        hostname=server_hostname,
        ssl_context=context,
        standard_compatible=False,
    )

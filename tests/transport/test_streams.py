"""The upgrade streams: compression over a stream, TLS then compression, buffered bytes.

Rules for this module: memory streams only (``trio.testing.memory_stream_pair``), each test
bounded by ``trio.fail_after``; corrupt and truncated input must surface as
``trio.BrokenResourceError`` (what every connection loop treats as "close it").
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import trio
import trio.lowlevel
import trio.testing

from lmqd.transport.compression import (
    CompressionError,
    DeflateStream,
    SnappyStream,
    StreamCodec,
)
from lmqd.transport.streams import (
    CompressedStream,
    PrefixedStream,
    start_tls_client,
    start_tls_server,
)
from lmqd.transport.tls import client_context, server_tls

from .certs import Certs

CODECS = {"snappy": SnappyStream, "deflate": DeflateStream}


async def _receive_exactly(stream: trio.abc.Stream, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = await stream.receive_some()
        if not chunk:
            raise EOFError(f"EOF after {len(data)} of {size} bytes")
        data += chunk
    return data


@pytest.mark.parametrize("name", CODECS)
async def test_both_directions_compressed(name: str) -> None:
    left_raw, right_raw = trio.testing.memory_stream_pair()
    left = CompressedStream(left_raw, CODECS[name]())
    right = CompressedStream(right_raw, CODECS[name]())
    big = os.urandom(1000) + b"\x00" * 3_000_000
    with trio.fail_after(10):
        await left.send_all(b"PUB t\n")
        assert await right.receive_some() == b"PUB t\n"
        await right.send_all(b"OK")
        assert await left.receive_some() == b"OK"
        async with trio.open_nursery() as nursery:
            nursery.start_soon(left.send_all, big)
            received = await _receive_exactly(right, len(big))
        assert received == big
        # receive_some honours max_bytes and keeps the rest
        await left.send_all(b"0123456789")
        assert await right.receive_some(4) == b"0123"
        assert await right.receive_some() == b"456789"
        await left.aclose()
        assert await right.receive_some() == b""


@pytest.mark.parametrize("name", CODECS)
async def test_compressed_bytes_on_the_wire_are_the_codecs(name: str) -> None:
    raw_client, raw_server = trio.testing.memory_stream_pair()
    stream = CompressedStream(raw_client, CODECS[name]())
    with trio.fail_after(10):
        await stream.send_all(b"hello " * 100)
        wire = await raw_server.receive_some()
    assert len(wire) < 600
    assert CODECS[name]().decompress(wire) == b"hello " * 100


@pytest.mark.parametrize("name", CODECS)
async def test_truncated_stream_breaks_the_connection(name: str) -> None:
    raw_client, raw_server = trio.testing.memory_stream_pair()
    receiver = CompressedStream(raw_server, CODECS[name]())
    wire = CODECS[name]().compress(os.urandom(2000))
    with trio.fail_after(10):
        await raw_client.send_all(wire[: len(wire) // 2])
        await raw_client.aclose()
        with pytest.raises(trio.BrokenResourceError, match="truncated") as info:
            while await receiver.receive_some():  # deflate hands over what it could inflate
                pass
        assert isinstance(info.value.__cause__, CompressionError)


@pytest.mark.parametrize("name", CODECS)
async def test_garbage_breaks_the_connection(name: str) -> None:
    raw_client, raw_server = trio.testing.memory_stream_pair()
    receiver = CompressedStream(raw_server, CODECS[name]())
    with trio.fail_after(10):
        await raw_client.send_all(b"\x07IDENTIFY\n\x00\x00\x00\x02{}")
        with pytest.raises(trio.BrokenResourceError, match="corrupt"):
            await receiver.receive_some()


async def test_partial_chunks_are_not_mistaken_for_eof() -> None:
    raw_client, raw_server = trio.testing.memory_stream_pair()
    receiver = CompressedStream(raw_server, SnappyStream())
    wire = SnappyStream().compress(b"one whole write")
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:

            async def trickle() -> None:
                for byte in wire:
                    await raw_client.send_all(bytes([byte]))
                    await trio.lowlevel.checkpoint()

            nursery.start_soon(trickle)
            assert await _receive_exactly(receiver, 15) == b"one whole write"


async def test_concurrent_sends_are_refused() -> None:
    # A second writer would interleave compressor state; trio's rule (one sender) is enforced.
    raw_client, _raw_server = trio.testing.lockstep_stream_pair()  # sends block until read
    stream = CompressedStream(raw_client, DeflateStream())
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(stream.send_all, b"x" * 1000)
            await trio.testing.wait_all_tasks_blocked()
            with pytest.raises(trio.BusyResourceError):
                await stream.send_all(b"y")
            nursery.cancel_scope.cancel()
        # the cancelled send may have left a partial write: the stream refuses to go on
        with pytest.raises(trio.BrokenResourceError):
            await stream.send_all(b"z")


async def test_prefixed_stream_hands_over_bytes_read_too_early() -> None:
    raw_client, raw_server = trio.testing.memory_stream_pair()
    writer = SnappyStream()
    # The IDENTIFY response and the first compressed frame arrived in one read.
    first_read = writer.compress(b"compressed OK")
    stream = CompressedStream(PrefixedStream(raw_server, first_read[:5]), SnappyStream())
    with trio.fail_after(10):
        await raw_client.send_all(first_read[5:] + writer.compress(b" and more"))
        assert await _receive_exactly(stream, 22) == b"compressed OK and more"
        prefixed = PrefixedStream(raw_server, b"abcdef")
        assert await prefixed.receive_some(4) == b"abcd"
        assert await prefixed.receive_some() == b"ef"
        await raw_client.send_all(b"later")
        assert await prefixed.receive_some() == b"later"


@pytest.mark.parametrize("name", CODECS)
async def test_tls_outside_compression_inside(name: str, certs: Certs) -> None:
    tls = server_tls(cert_file=certs.server.cert_file, key_file=certs.server.key_file)
    client_raw, server_raw = trio.testing.memory_stream_pair()
    codec_type: type[StreamCodec] = CODECS[name]
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:

            async def serve() -> None:
                secure = await start_tls_server(server_raw, tls.context)
                stream = CompressedStream(secure, codec_type())
                assert await _receive_exactly(stream, 9) == b"SUB t c\n!"
                await stream.send_all(b"OK")
                await stream.aclose()

            nursery.start_soon(serve)
            secure = await start_tls_client(
                client_raw, client_context(ca_file=certs.ca_file), server_hostname="localhost"
            )
            stream = CompressedStream(secure, codec_type())
            await stream.send_all(b"SUB t c\n!")
            assert await stream.receive_some() == b"OK"
            # The server closed without close_notify-style ceremony mattering: plain EOF.
            assert await stream.receive_some() == b""


def test_sans_io_modules_do_not_import_trio() -> None:
    code = (
        "import sys; import lmqd.transport.compression, lmqd.transport.tls, "
        "lmqd.transport.auth; assert 'trio' not in sys.modules, 'trio was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)

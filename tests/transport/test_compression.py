"""The snappy and deflate stream codecs: round trips, interop, chunking, corruption, bombs.

Rules for this module: no I/O and no trio (the codecs are sans I/O); each stream is fed whole,
one byte at a time, and in pieces; interop is checked against independent implementations
(cramjam's own framed snappy and its Rust deflate, plus a framing encoder written here from the
format description).
"""

from __future__ import annotations

import os
import random
import zlib

import cramjam
import crc32c
import pytest

from lmqd.transport.compression import (
    DEFAULT_MAX_OUTPUT,
    CompressionError,
    DeflateStream,
    SnappyStream,
    StreamCodec,
    codec_for,
)

STREAM_IDENTIFIER = b"\xff\x06\x00\x00sNaPpY"


def _payloads() -> list[bytes]:
    rng = random.Random(12)
    return [
        b"x",
        b"OK",
        b"PUB topic\n\x00\x00\x00\x05hello",
        b"abc" * 1000,
        bytes(rng.getrandbits(8) for _ in range(5000)),  # incompressible
        b"\x00" * 65536,  # exactly one snappy block
        b"z" * 65537,  # one byte into the second block
        os.urandom(70_000) + b"q" * 200_000,
    ]


def _feed(codec: StreamCodec, data: bytes, step: int | None) -> bytes:
    """Feed ``data`` in pieces of ``step`` bytes (None: whole), draining pending output."""
    out = []
    pieces = [data] if step is None else [data[i : i + step] for i in range(0, len(data), step)]
    for piece in pieces:
        out.append(codec.decompress(piece))
        while codec.has_pending_output:
            out.append(codec.decompress(b""))
    return b"".join(out)


# -- snappy ----------------------------------------------------------------------------------------


def _masked(data: bytes) -> bytes:
    # The framing format's checksum, written out independently of the module under test.
    crc = crc32c.crc32c(data)
    rotated = ((crc >> 15) | (crc << 17)) & 0xFFFFFFFF
    return ((rotated + 0xA282EAD8) & 0xFFFFFFFF).to_bytes(4, "little")


def _chunk(kind: int, body: bytes) -> bytes:
    return bytes([kind]) + len(body).to_bytes(3, "little") + body


@pytest.mark.parametrize("payload", _payloads(), ids=lambda p: f"{len(p)}B")
def test_snappy_round_trip_whole_and_in_pieces(payload: bytes) -> None:
    stream = SnappyStream().compress(payload)
    assert stream.startswith(STREAM_IDENTIFIER)
    for step in (None, 7, 4096):
        assert _feed(SnappyStream(), stream, step) == payload


def test_snappy_byte_by_byte_over_several_writes() -> None:
    writer = SnappyStream()
    writes = [b"IDENTIFY", b"", b"\x00" * 3000, b"tail" * 50]
    stream = b"".join(writer.compress(w) for w in writes)
    assert stream.count(STREAM_IDENTIFIER) == 1  # once per stream, not per write
    assert _feed(SnappyStream(), stream, 1) == b"".join(writes)


def test_snappy_each_write_is_decodable_at_once() -> None:
    writer, reader = SnappyStream(), SnappyStream()
    for write in (b"OK", b"a" * 100_000, os.urandom(300)):
        assert reader.decompress(writer.compress(write)) == write
        assert not reader.has_pending_output


def test_snappy_incompressible_blocks_go_uncompressed() -> None:
    noise = os.urandom(1000)
    stream = SnappyStream().compress(noise)
    first = stream[len(STREAM_IDENTIFIER)]
    assert first == 0x01  # an uncompressed chunk: compressing would not save 1/8
    assert stream[len(STREAM_IDENTIFIER) + 8 :] == noise
    squeezable = SnappyStream().compress(b"a" * 1000)
    assert squeezable[len(STREAM_IDENTIFIER)] == 0x00


@pytest.mark.parametrize("payload", _payloads(), ids=lambda p: f"{len(p)}B")
def test_snappy_interop_with_cramjam_framing(payload: bytes) -> None:
    ours = SnappyStream().compress(payload)
    assert bytes(cramjam.snappy.decompress(ours)) == payload
    theirs = bytes(cramjam.snappy.compress(payload))
    assert _feed(SnappyStream(), theirs, None) == payload
    assert _feed(SnappyStream(), theirs, 3) == payload


def test_snappy_decodes_a_streaming_writer_flush_by_flush() -> None:
    compressor = cramjam.snappy.Compressor()
    reader = SnappyStream()
    for write in (b"first", b"second" * 10_000, b"third"):
        compressor.compress(write)
        assert reader.decompress(bytes(compressor.flush())) == write


def test_snappy_spec_stream_with_padding_skippable_and_repeated_identifier() -> None:
    raw = b"hello, " * 20
    stream = b"".join(
        [
            STREAM_IDENTIFIER,
            _chunk(0x01, _masked(b"plain ") + b"plain "),
            _chunk(0xFE, b"\x00" * 10),  # padding
            _chunk(0x80, b"reserved but skippable"),
            STREAM_IDENTIFIER,  # concatenated streams may repeat it
            _chunk(0x00, _masked(raw) + bytes(cramjam.snappy.compress_raw(raw))),
            _chunk(0xFD, b""),
        ]
    )
    for step in (None, 1, 5):
        assert _feed(SnappyStream(), stream, step) == b"plain " + raw


@pytest.mark.parametrize(
    ("stream", "reason"),
    [
        (_chunk(0x01, _masked(b"x") + b"x"), "before the stream identifier"),
        (b"\xff\x06\x00\x00sNaPpX", "bad stream identifier"),
        (b"\xff\x05\x00\x00sNaPp", "bad stream identifier"),
        (STREAM_IDENTIFIER + _chunk(0x01, b"\x00\x00\x00\x00x"), "checksum mismatch"),
        (STREAM_IDENTIFIER + _chunk(0x02, b"x"), "reserved unskippable chunk type 0x02"),
        (STREAM_IDENTIFIER + _chunk(0x7F, b""), "reserved unskippable chunk type 0x7f"),
        (STREAM_IDENTIFIER + _chunk(0x00, b"\x00\x00"), "compressed chunk of 2 bytes"),
        (STREAM_IDENTIFIER + _chunk(0x01, b"\x00\x00\x00"), "uncompressed chunk of 3 bytes"),
        (STREAM_IDENTIFIER + _chunk(0x00, _masked(b"") + b"\x05\xff\xff\xff"), "corrupt"),
        # A block whose header claims 70 000 bytes: more than a chunk may hold.
        (STREAM_IDENTIFIER + _chunk(0x00, b"\x00" * 4 + b"\xf0\xa2\x04" + b"\x00" * 8), "block"),
    ],
)
def test_snappy_corrupt_streams_raise(stream: bytes, reason: str) -> None:
    for step in (None, 1):
        reader = SnappyStream()
        with pytest.raises(CompressionError, match=reason):
            _feed(reader, stream, step)
        with pytest.raises(CompressionError):  # and it stays failed
            reader.decompress(b"")


def test_snappy_oversized_chunk_refused_from_its_header() -> None:
    # The header announces 16 MiB - 1: refused before any of it is buffered.
    reader = SnappyStream()
    with pytest.raises(CompressionError, match="compressed chunk of 16777215 bytes"):
        reader.decompress(STREAM_IDENTIFIER + b"\x00\xff\xff\xff")
    reader = SnappyStream()
    limit_ok = 4 + 76_490  # the largest compressed chunk a valid encoder can write
    assert reader.decompress(STREAM_IDENTIFIER + b"\x00" + limit_ok.to_bytes(3, "little")) == b""
    reader = SnappyStream()
    with pytest.raises(CompressionError, match="compressed chunk"):
        reader.decompress(STREAM_IDENTIFIER + b"\x00" + (limit_ok + 1).to_bytes(3, "little"))


def test_snappy_skippable_chunk_is_not_buffered() -> None:
    reader = SnappyStream()
    big = 10 * 1024 * 1024
    assert reader.decompress(STREAM_IDENTIFIER + b"\x90" + big.to_bytes(3, "little")) == b""
    for _ in range(10):
        assert reader.decompress(b"\x00" * (1024 * 1024)) == b""
    assert len(reader._buf) == 0  # discarded as it arrived
    writer = SnappyStream()
    writer.compress(b"x")  # the identifier was already sent in this stream
    assert reader.decompress(writer.compress(b"after")) == b"after"


def test_snappy_truncated_stream_detected_at_end_of_input() -> None:
    stream = SnappyStream().compress(b"a message that will be cut" * 10)
    complete = SnappyStream()
    complete.decompress(stream)
    complete.end_of_input()  # a whole stream ends cleanly
    SnappyStream().end_of_input()  # so does an empty one
    for cut in (1, 5, len(STREAM_IDENTIFIER) + 3, len(stream) - 1):
        reader = SnappyStream()
        reader.decompress(stream[:cut])
        with pytest.raises(CompressionError, match="truncated"):
            reader.end_of_input()


def test_snappy_output_per_call_is_bounded() -> None:
    payload = b"\x00" * (4 * 1024 * 1024)
    stream = SnappyStream().compress(payload)
    assert len(stream) < 250_000  # 4 MiB of zeros shrink a lot
    reader = SnappyStream()
    first = reader.decompress(stream)
    assert len(first) == DEFAULT_MAX_OUTPUT
    assert reader.has_pending_output
    rest = []
    while reader.has_pending_output:
        out = reader.decompress(b"")
        assert len(out) <= DEFAULT_MAX_OUTPUT
        rest.append(out)
    assert first + b"".join(rest) == payload
    with pytest.raises(ValueError):
        SnappyStream(max_output=1000)


# -- deflate ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("payload", _payloads(), ids=lambda p: f"{len(p)}B")
def test_deflate_round_trip_and_interop(payload: bytes) -> None:
    stream = DeflateStream(6).compress(payload)
    assert stream.endswith(b"\x00\x00\xff\xff")  # every write ends on a sync flush
    for step in (None, 4096):
        assert _feed(DeflateStream(), stream, step) == payload
    # an independent inflater (Rust's miniz_oxide via cramjam) reads our raw deflate; being
    # one-shot, it wants a final block, so one (empty, fixed Huffman: 0x03 0x00) is added ...
    assert bytes(cramjam.deflate.decompress(stream + b"\x03\x00")) == payload
    # ... and we read its (it ends the stream with a final block)
    theirs = bytes(cramjam.deflate.compress(payload))
    reader = DeflateStream()
    assert _feed(reader, theirs, None) == payload
    reader.end_of_input()


def test_deflate_byte_by_byte_and_each_write_decodable_at_once() -> None:
    writer, reader = DeflateStream(9), DeflateStream()
    writes = [b"OK", b"", b"message body " * 300, os.urandom(200)]
    stream = []
    for write in writes:
        compressed = writer.compress(write)
        stream.append(compressed)
        assert reader.decompress(compressed) == write
        assert not reader.has_pending_output
    assert _feed(DeflateStream(), b"".join(stream), 1) == b"".join(writes)


def test_deflate_matches_python_zlib_raw_and_pynsq_style_writer() -> None:
    # pynsq's deflate socket: compressobj(level, DEFLATED, -15) + flush(Z_SYNC_FLUSH) per send.
    pynsq_style = zlib.compressobj(3, zlib.DEFLATED, -15)
    reader = DeflateStream()
    for write in (b"first", b"second " * 500):
        data = pynsq_style.compress(write) + pynsq_style.flush(zlib.Z_SYNC_FLUSH)
        assert reader.decompress(data) == write
    reader.end_of_input()


def test_deflate_level_is_applied_and_validated() -> None:
    rng = random.Random(5)
    letters = b"abcdefghijklmnop"
    words = [bytes(rng.choice(letters) for _ in range(rng.randint(2, 9))) for _ in range(300)]
    text = b" ".join(rng.choice(words) for _ in range(30_000))
    fast, best = DeflateStream(1).compress(text), DeflateStream(9).compress(text)
    assert len(fast) > len(best) * 1.03  # level 1 trades size for speed
    assert DeflateStream().decompress(fast) == DeflateStream().decompress(best) == text
    for bad in (0, 10, -1):
        with pytest.raises(ValueError, match=r"1\.\.9"):
            DeflateStream(bad)


def test_deflate_garbage_and_data_after_final_block_raise() -> None:
    reader = DeflateStream()
    with pytest.raises(CompressionError, match="corrupt deflate stream"):
        reader.decompress(b"\x07garbage")  # block type 3 is reserved
    with pytest.raises(CompressionError):
        reader.decompress(b"")
    final = bytes(cramjam.deflate.compress(b"done"))
    reader = DeflateStream()
    with pytest.raises(CompressionError, match="after the final deflate block"):
        reader.decompress(final + b"more")


def test_deflate_truncated_stream_detected_at_end_of_input() -> None:
    writer = DeflateStream()
    whole = writer.compress(b"first write " * 50)
    second = writer.compress(os.urandom(500))
    reader = DeflateStream()
    reader.decompress(whole)
    reader.end_of_input()  # ends on a write boundary: clean
    DeflateStream().end_of_input()  # nothing sent: clean
    for cut in (1, len(second) // 2, len(second) - 1):
        reader = DeflateStream()
        reader.decompress(whole + second[:cut])
        with pytest.raises(CompressionError, match="truncated"):
            reader.end_of_input()


def test_deflate_bomb_is_drained_in_bounded_steps() -> None:
    payload_size = 64 * 1024 * 1024
    bomb = DeflateStream(9).compress(b"\x00" * payload_size)
    assert len(bomb) < 100_000  # ~1000:1
    reader = DeflateStream()
    total = len(reader.decompress(bomb))
    steps = 1
    assert total == DEFAULT_MAX_OUTPUT
    while reader.has_pending_output:
        out = reader.decompress(b"")
        assert len(out) <= DEFAULT_MAX_OUTPUT
        total += len(out)
        steps += 1
    assert total == payload_size
    assert steps >= payload_size // DEFAULT_MAX_OUTPUT
    small = DeflateStream(max_output=10)
    assert small.decompress(DeflateStream().compress(b"0123456789abcdef")) == b"0123456789"
    assert small.has_pending_output
    assert small.decompress(b"") == b"abcdef"


def test_codec_for_negotiated_settings() -> None:
    assert codec_for(snappy=False, deflate=False, deflate_level=6) is None
    assert isinstance(codec_for(snappy=True, deflate=False, deflate_level=6), SnappyStream)
    deflate = codec_for(snappy=False, deflate=True, deflate_level=3)
    assert isinstance(deflate, DeflateStream) and deflate.level == 3
    with pytest.raises(ValueError, match="both"):
        codec_for(snappy=True, deflate=True, deflate_level=6)

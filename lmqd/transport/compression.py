"""Stream compression negotiated in IDENTIFY: snappy (framing format) and raw deflate.

nsqd wraps the connection (after TLS, if any) in Go's ``golang/snappy`` stream reader/writer or
``compress/flate`` reader/writer, in both directions, right after the IDENTIFY response. The two
codecs here produce and accept the same bytes, sans I/O: the server and the clients call
``compress()`` on every write and ``decompress()`` on every read, and move the bytes themselves.

Theory of operation
-------------------
*Writes.* ``compress(data)`` returns bytes that the peer can decode completely on their own, so
whatever a writer sends is readable at once (a heartbeat or a response must never wait for more
data). Snappy gets that from its format: each write becomes whole chunks (the stream identifier
first, once). Deflate ends each write with a sync flush (``Z_SYNC_FLUSH``: an empty stored
block, ``00 00 ff ff``), as nsqd's ``flate.Writer.Flush`` and pynsq's deflate socket do.

*Reads.* ``decompress(data)`` is incremental: chunks and deflate blocks may be cut anywhere by
the network, even byte by byte. A corrupt stream raises ``CompressionError``; the connection must
then be closed, as nsqd's reader fails the connection on ``ErrCorrupt`` or a flate error.

*Bounded output.* Deflate expands up to about 1000:1, so a small input can become a lot of
output (a decompression bomb). Neither codec ever returns more than ``max_output`` bytes from one
call: input that would produce more stays inside the codec, ``has_pending_output`` becomes True
and the caller calls ``decompress(b"")`` again once it has handled what it got. That is how Go's
readers behave too (they are pulled through a fixed-size ``bufio.Reader``), so nothing that
nsqd accepts is refused here, and memory stays bounded by ``max_output`` plus the compressed
input the caller chose to read. What the decompressed bytes may contain (command sizes, frame
sizes) is the protocol parser's business, with its own limits.

*End of stream.* ``end_of_input()`` is called when the peer closes. A stream that stops inside a
snappy chunk, or after deflate data that was not followed by a sync flush, was truncated and
raises ``CompressionError`` (the peer wrote a partial write and vanished).
"""

from __future__ import annotations

import zlib
from typing import NoReturn, Protocol

import cramjam
import crc32c

__all__ = [
    "DEFAULT_MAX_OUTPUT",
    "CompressionError",
    "DeflateStream",
    "SnappyStream",
    "StreamCodec",
    "codec_for",
]

KiB = 1024

DEFAULT_MAX_OUTPUT = 256 * KiB
"""Most bytes one ``decompress()`` call returns: the size of one socket read in lmqd's server and
in lmq_client (their ``RECEIVE_SIZE``). A decompressing connection then hands its parser no more
per step than a plain one does, so the reader's memory and the work done between two checkpoints
are the same with and without compression, whatever the compression ratio."""


class CompressionError(Exception):
    """A corrupt, truncated or unsupported compressed stream; the connection must be closed."""


class StreamCodec(Protocol):
    """What the connection I/O layers need from a codec (both directions of one connection)."""

    name: str
    """``"snappy"`` or ``"deflate"``, for logs and stats."""

    def compress(self, data: bytes) -> bytes:
        """The compressed form of one write; decodable by the peer as soon as it arrives."""
        ...

    def decompress(self, data: bytes) -> bytes:
        """Feed received bytes (``b""`` to drain); the plaintext available, at most
        ``max_output`` bytes. Raises ``CompressionError`` for a corrupt stream."""
        ...

    @property
    def has_pending_output(self) -> bool:
        """True when ``decompress(b"")`` may return more without new input."""
        ...

    def end_of_input(self) -> None:
        """The peer closed: raise ``CompressionError`` if the stream stopped mid-write."""
        ...


def codec_for(*, snappy: bool, deflate: bool, deflate_level: int) -> StreamCodec | None:
    """The codec IDENTIFY negotiated (None when neither); both at once is a caller bug
    (IDENTIFY refuses it with ``E_IDENTIFY_FAILED`` before any upgrade)."""
    if snappy and deflate:
        raise ValueError("snappy and deflate cannot both be enabled on one connection")
    if snappy:
        return SnappyStream()
    if deflate:
        return DeflateStream(deflate_level)
    return None


# -- snappy framing format -------------------------------------------------------------------------
#
# Each chunk: 1 byte type, 3 bytes little-endian length, then the data. The stream starts with the
# stream identifier chunk; data chunks carry the masked CRC-32C of their uncompressed bytes
# (little-endian) before the data. Types 0x02-0x7f are reserved and must be refused; 0x80-0xfd
# are reserved but skippable, 0xfe is padding.

_CHUNK_COMPRESSED = 0x00
_CHUNK_UNCOMPRESSED = 0x01
_CHUNK_PADDING = 0xFE
_CHUNK_STREAM_IDENTIFIER = 0xFF
_STREAM_IDENTIFIER_BODY = b"sNaPpY"
_STREAM_IDENTIFIER = b"\xff\x06\x00\x00" + _STREAM_IDENTIFIER_BODY
_CHECKSUM_SIZE = 4
_CHUNK_HEADER_SIZE = 4

MAX_SNAPPY_BLOCK = 64 * KiB
"""Largest uncompressed chunk, fixed by the framing format (and golang/snappy's maxBlockSize)."""

_MAX_COMPRESSED_BLOCK = 32 + MAX_SNAPPY_BLOCK + MAX_SNAPPY_BLOCK // 6
"""Snappy's worst-case encoded length of a 64 KiB block (``MaxEncodedLen``): 76 490 bytes.
A compressed chunk longer than that (plus its checksum) cannot come from a valid encoder;
golang/snappy's reader refuses it the same way, which also bounds what one chunk can make us
buffer."""


def _masked_crc(data: bytes) -> int:
    crc = crc32c.crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


class SnappyStream:
    """Snappy's framing format, as golang/snappy's ``Reader``/``Writer`` and python-snappy's
    ``StreamCompressor``/``StreamDecompressor`` speak it. The block codec is cramjam's."""

    name = "snappy"

    def __init__(self, *, max_output: int = DEFAULT_MAX_OUTPUT) -> None:
        if max_output < MAX_SNAPPY_BLOCK:
            # One chunk is the unit of output; a smaller cap could never be honoured.
            raise ValueError(f"max_output must be at least {MAX_SNAPPY_BLOCK}")
        self.max_output = max_output
        self._wrote_identifier = False
        self._buf = bytearray()
        self._pos = 0
        self._skip = 0  # bytes of a skippable chunk still to discard
        self._seen_identifier = False
        self._pending = False
        self._error: CompressionError | None = None

    # -- writing -------------------------------------------------------------------------------

    def compress(self, data: bytes) -> bytes:
        """Whole chunks for ``data`` (preceded by the stream identifier on the first write).

        Like golang/snappy's writer, a block is sent compressed only when that saves at least
        1/8 of it; otherwise (random or tiny data) it goes as an uncompressed chunk.
        """
        if not data:
            return b""
        parts: list[bytes] = []
        if not self._wrote_identifier:
            self._wrote_identifier = True
            parts.append(_STREAM_IDENTIFIER)
        view = memoryview(data)
        for start in range(0, len(data), MAX_SNAPPY_BLOCK):
            block = bytes(view[start : start + MAX_SNAPPY_BLOCK])
            crc = _masked_crc(block).to_bytes(4, "little")
            compressed = bytes(cramjam.snappy.compress_raw(block))
            if len(compressed) < len(block) - len(block) // 8:
                chunk_type, payload = _CHUNK_COMPRESSED, compressed
            else:
                chunk_type, payload = _CHUNK_UNCOMPRESSED, block
            size = _CHECKSUM_SIZE + len(payload)
            parts.append(bytes((chunk_type,)) + size.to_bytes(3, "little") + crc)
            parts.append(payload)
        return b"".join(parts)

    # -- reading -------------------------------------------------------------------------------

    @property
    def has_pending_output(self) -> bool:
        """True when a complete chunk is buffered but was held back by ``max_output``."""
        return self._pending

    def decompress(self, data: bytes) -> bytes:
        """Decode every complete chunk received so far, up to ``max_output`` bytes."""
        if self._error is not None:
            raise self._error
        if data:
            self._buf += data
        try:
            out = self._decode()
        except CompressionError as exc:
            self._error = exc
            raise
        # Drop consumed bytes once per call (not per chunk): the copy is of the unread tail only.
        if self._pos:
            del self._buf[: self._pos]
            self._pos = 0
        return out

    def end_of_input(self) -> None:
        """Raise ``CompressionError`` if the stream ends inside a chunk."""
        left = len(self._buf) - self._pos + self._skip
        if left:
            raise CompressionError(f"snappy stream truncated ({left} bytes of an incomplete chunk)")

    def _decode(self) -> bytes:
        buf = self._buf
        out: list[bytes] = []
        produced = 0
        self._pending = False
        while True:
            if self._skip:
                skipped = min(self._skip, len(buf) - self._pos)
                self._pos += skipped
                self._skip -= skipped
                if self._skip:
                    break
            pos = self._pos
            if len(buf) - pos < _CHUNK_HEADER_SIZE:
                break
            chunk_type = buf[pos]
            length = int.from_bytes(buf[pos + 1 : pos + 4], "little")
            self._check_header(chunk_type, length)
            if chunk_type >= 0x80 and chunk_type != _CHUNK_STREAM_IDENTIFIER:
                # Padding and reserved skippable chunks: discarded as they arrive, never buffered.
                self._pos = pos + _CHUNK_HEADER_SIZE
                self._skip = length
                continue
            end = pos + _CHUNK_HEADER_SIZE + length
            if end > len(buf):
                break
            if chunk_type == _CHUNK_STREAM_IDENTIFIER:
                if buf[pos + _CHUNK_HEADER_SIZE : end] != _STREAM_IDENTIFIER_BODY:
                    raise CompressionError("corrupt snappy stream: bad stream identifier")
                self._seen_identifier = True
                self._pos = end
                continue
            if produced and produced + MAX_SNAPPY_BLOCK > self.max_output:
                # This chunk might not fit in what is left of this call's budget: keep it.
                self._pending = True
                break
            block = self._decode_data_chunk(chunk_type, bytes(buf[pos + _CHUNK_HEADER_SIZE : end]))
            self._pos = end
            out.append(block)
            produced += len(block)
        return b"".join(out)

    def _check_header(self, chunk_type: int, length: int) -> None:
        # Checked as soon as the 4-byte header arrives, so a bad length is refused before we
        # wait for (or buffer) the data it announces.
        if not self._seen_identifier and chunk_type != _CHUNK_STREAM_IDENTIFIER:
            raise CompressionError(
                f"corrupt snappy stream: chunk type 0x{chunk_type:02x} before the stream identifier"
            )
        if chunk_type == _CHUNK_STREAM_IDENTIFIER:
            if length != len(_STREAM_IDENTIFIER_BODY):
                raise CompressionError("corrupt snappy stream: bad stream identifier")
        elif chunk_type == _CHUNK_COMPRESSED:
            if not _CHECKSUM_SIZE <= length <= _CHECKSUM_SIZE + _MAX_COMPRESSED_BLOCK:
                raise CompressionError(f"corrupt snappy stream: compressed chunk of {length} bytes")
        elif chunk_type == _CHUNK_UNCOMPRESSED:
            if not _CHECKSUM_SIZE <= length <= _CHECKSUM_SIZE + MAX_SNAPPY_BLOCK:
                raise CompressionError(
                    f"corrupt snappy stream: uncompressed chunk of {length} bytes"
                )
        elif chunk_type < 0x80:
            raise CompressionError(
                f"unsupported snappy stream: reserved unskippable chunk type 0x{chunk_type:02x}"
            )

    @staticmethod
    def _decode_data_chunk(chunk_type: int, chunk: bytes) -> bytes:
        expected_crc = int.from_bytes(chunk[:_CHECKSUM_SIZE], "little")
        payload = chunk[_CHECKSUM_SIZE:]
        if chunk_type == _CHUNK_COMPRESSED:
            try:
                size = cramjam.snappy.decompress_raw_len(payload)
                if size > MAX_SNAPPY_BLOCK:
                    raise CompressionError(
                        f"corrupt snappy stream: block of {size} bytes > {MAX_SNAPPY_BLOCK}"
                    )
                block = bytes(cramjam.snappy.decompress_raw(payload))
            except cramjam.DecompressionError as exc:
                raise CompressionError(f"corrupt snappy stream: {exc}") from None
        else:
            block = payload
        if _masked_crc(block) != expected_crc:
            raise CompressionError("corrupt snappy stream: checksum mismatch")
        return block


# -- raw deflate -----------------------------------------------------------------------------------

_SYNC_MARKER = b"\x00\x00\xff\xff"
"""How a sync flush ends: the LEN/NLEN of an empty stored block, byte-aligned."""

_RAW_DEFLATE_WBITS = -15
"""Negative window bits: raw deflate, no zlib header or trailer (Go's compress/flate)."""


class DeflateStream:
    """Raw deflate (RFC 1951) with a sync flush per write, as nsqd's compress/flate."""

    name = "deflate"

    def __init__(self, level: int = 6, *, max_output: int = DEFAULT_MAX_OUTPUT) -> None:
        if not 1 <= level <= 9:
            raise ValueError(f"deflate level must be 1..9, not {level}")
        if max_output < 1:
            raise ValueError("max_output must be positive")
        self.level = level
        self.max_output = max_output
        self._compressor = zlib.compressobj(level, zlib.DEFLATED, _RAW_DEFLATE_WBITS)
        self._decompressor = zlib.decompressobj(_RAW_DEFLATE_WBITS)
        self._tail = b""  # the last 4 bytes received: do they end on a sync flush?
        self._pending = False
        self._error: CompressionError | None = None

    def compress(self, data: bytes) -> bytes:
        """Deflate ``data`` and sync-flush, so the peer can inflate all of it at once."""
        if not data:
            return b""
        return self._compressor.compress(data) + self._compressor.flush(zlib.Z_SYNC_FLUSH)

    @property
    def has_pending_output(self) -> bool:
        """True when the last call stopped at ``max_output`` (more may be ready)."""
        return self._pending

    def decompress(self, data: bytes) -> bytes:
        """Inflate what arrived, up to ``max_output`` bytes; the rest waits inside."""
        if self._error is not None:
            raise self._error
        decompressor = self._decompressor
        if data:
            self._tail = (self._tail + data[-len(_SYNC_MARKER) :])[-len(_SYNC_MARKER) :]
        if decompressor.eof:
            if data:
                self._fail("data after the final deflate block")
            return b""
        pending_input = decompressor.unconsumed_tail
        try:
            out = decompressor.decompress(
                pending_input + data if pending_input else data, self.max_output
            )
        except zlib.error as exc:
            self._fail(f"corrupt deflate stream: {exc}")
        if decompressor.unused_data:
            # The peer ended its deflate stream (a final block) and kept sending: nsqd never
            # closes its flate writer, so this is not a stream we can speak.
            self._fail("data after the final deflate block")
        # zlib may hold more output without further input (a long match cut by max_length).
        self._pending = bool(decompressor.unconsumed_tail) or len(out) >= self.max_output
        return out

    def end_of_input(self) -> None:
        """Raise ``CompressionError`` unless the stream ended on a sync flush (or a final
        block, or never started)."""
        if self._decompressor.eof or not self._tail or self._tail == _SYNC_MARKER:
            return
        raise CompressionError("deflate stream truncated (no sync flush at the end)")

    def _fail(self, reason: str) -> NoReturn:
        self._error = CompressionError(reason)
        raise self._error

"""Compression at rest: the codecs a sealed batch may be compressed with, and their names.

A topic's ``compression`` policy (and the daemon's ``--compression`` default) names one of
``none``, ``zstd`` (optionally with a level: ``zstd:1`` .. ``zstd:22``, default 3), ``lz4``,
``snappy`` or ``gzip`` (optionally ``gzip:1`` .. ``gzip:9``, default 6). Every codec comes from
cramjam, one well-kept Rust-backed library that has all four (the daemon already uses it for
NSQ's snappy and deflate sockets), so no C toolchain or second package is needed.

The raw (unframed) form of each codec is stored: the plain length is in the sealed record's
header (``seal.py``), so a frame's own length and checksum would only repeat it (the record's
CRC32C covers the stored bytes, and decompression is checked to give exactly that length).
``lz4`` is LZ4's block format, ``snappy`` Snappy's raw format, ``gzip`` a gzip member (its CRC32
is redundant, kept because cramjam's gzip writes it; the zlib stream inside is what costs).

Cost, 256 KiB batches of 200-byte JSON bodies (docs/benchmarks.md has the figures): zstd:3
~3-5x smaller at ~0.3 us/message to compress; lz4 and snappy faster and ~2x; gzip slowest.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
import cramjam

from lmqd.storage.record import Buffer

NONE = 0
ZSTD = 1
LZ4 = 2
SNAPPY = 3
GZIP = 4

CODEC_NAMES = {NONE: "none", ZSTD: "zstd", LZ4: "lz4", SNAPPY: "snappy", GZIP: "gzip"}
"""Codec ids (the low 3 bits of a sealed record's codec byte) and their names."""
_IDS = {name: codec for codec, name in CODEC_NAMES.items()}
_LEVELS = {ZSTD: (1, 22, 3), GZIP: (1, 9, 6)}
"""The codecs that take a level: (lowest, highest, default)."""


class CompressionError(ValueError):
    """Stored bytes that do not decompress to the length the record says."""


@attrs.frozen
class Compression:
    """A codec and its level (0 where the codec takes none); ``Compression.parse`` reads the
    policy's spelling, ``str()`` writes it back."""

    codec: int = NONE
    level: int = 0

    @classmethod
    def parse(cls, text: str) -> Compression:
        """``none``, ``zstd``, ``zstd:3``, ``lz4``, ``snappy``, ``gzip``, ``gzip:9`` (also
        ``zstd-3``); raises ``ValueError`` with the accepted spellings."""
        name, sep, level_text = text.strip().lower().replace("-", ":").partition(":")
        codec = _IDS.get(name)
        if codec is None:
            raise ValueError(
                f"unknown compression {text!r} (none, zstd[:LEVEL], lz4, snappy, gzip[:LEVEL])"
            )
        bounds = _LEVELS.get(codec)
        if not sep:
            return cls(codec, bounds[2] if bounds else 0)
        if bounds is None:
            raise ValueError(f"compression {name} takes no level")
        try:
            level = int(level_text)
        except ValueError:
            raise ValueError(f"compression level must be an integer, not {level_text!r}") from None
        if not bounds[0] <= level <= bounds[1]:
            raise ValueError(f"{name} level must be {bounds[0]}..{bounds[1]}, not {level}")
        return cls(codec, level)

    def __str__(self) -> str:
        name = CODEC_NAMES[self.codec]
        bounds = _LEVELS.get(self.codec)
        return name if bounds is None or self.level == bounds[2] else f"{name}:{self.level}"

    @property
    def enabled(self) -> bool:
        return self.codec != NONE

    def compressor(self) -> Callable[[Buffer], bytes]:
        """The function that compresses one batch's plain bytes with this codec."""
        codec, level = self.codec, self.level
        if codec == ZSTD:
            return lambda data: bytes(cramjam.zstd.compress(data, level=level))
        if codec == LZ4:
            return lambda data: bytes(cramjam.lz4.compress_block(data, store_size=False))
        if codec == SNAPPY:
            return lambda data: bytes(cramjam.snappy.compress_raw(data))
        if codec == GZIP:
            return lambda data: bytes(cramjam.gzip.compress(data, level=level))
        return bytes


NO_COMPRESSION = Compression()


def decompress(codec: int, data: bytes | memoryview, plain_length: int) -> bytes:
    """``data`` decompressed with ``codec``; it must give exactly ``plain_length`` bytes.
    Raises ``CompressionError`` for bytes that do not decompress so (damage), ``KeyError`` for
    a codec id this build does not know (the caller refuses such a segment before reading)."""
    out: bytes | memoryview | cramjam.Buffer
    try:
        if codec == ZSTD:
            out = cramjam.zstd.decompress(data, output_len=plain_length)
        elif codec == LZ4:
            out = cramjam.lz4.decompress_block(data, output_len=plain_length)
        elif codec == SNAPPY:
            out = cramjam.snappy.decompress_raw(data)
        elif codec == GZIP:
            out = cramjam.gzip.decompress(data, output_len=plain_length)
        elif codec == NONE:
            out = data
        else:
            raise KeyError(codec)
    except cramjam.DecompressionError as exc:
        raise CompressionError(f"{CODEC_NAMES[codec]}: {exc}") from None
    plain = bytes(out)
    if len(plain) != plain_length:
        raise CompressionError(
            f"{CODEC_NAMES[codec]}: {len(plain)} bytes decompressed, {plain_length} expected"
        )
    return plain

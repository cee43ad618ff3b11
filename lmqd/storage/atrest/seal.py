"""Sealed batches: the codec step between the record encoder/decoder and the files.

Theory of operation
-------------------
The encoder (``encoder.py``) frames plain batch records ('B', 'O'); the decoder reads them. When
a store seals (its topic's ``compression`` policy, the daemon's ``--compression`` default or
``--encryption-key-file``), the writer hands each framed plain record to ``Sealer.seal``, which
returns a **sealed record** ('b' for a 'B', 'o' for an 'O') holding the plain record's bytes
compressed, then encrypted; the readers hand each sealed record they frame to
``Opener.open``, which returns the plain record again, and decode that as before. Nothing above
this module knows that a record was sealed, and a store that does not seal writes exactly what
it wrote before (and pays nothing for this module).

Layout (big-endian; docs/storage.md has the table)::

    0   4  length L: bytes after this field, CRC included
    4   1  type: 'b' (0x62, a sealed 'B') or 'o' (0x6F, a sealed 'O')
    5   1  codec: bits 0-2 compression (0 none, 1 zstd, 2 lz4, 3 snappy, 4 gzip),
               bits 4-5 cipher (0 none, 1 AES-256-GCM, 2 ChaCha20-Poly1305), others 0
    6   4  count N of messages (as in the plain record)
   10   8  'o' only: the first offset (as in the plain record)
    h   4  plain length P: the plain record's bytes from its type byte to its CRC
  h+4   4  encrypted only: key id (``keys.key_id``)
  h+8  12  encrypted only: nonce
    .   .  payload: the P plain bytes compressed; encrypted, the ciphertext and its 16-byte tag
    L   4  CRC32C of bytes 4..L

What stays in clear: the type, the codec, the message count, the first offset, the plain
length, the key id and the nonce (and, outside the records, the file names: topic and channel
names, segment numbers, sizes). Message ids, timestamps, attempts, deferral times, bodies and
lmq extension blocks (headers, priority, TTL, dedup ids) are inside the payload. Everything in
clear before the payload, from the type on, is the cipher's associated data: a changed count or
offset fails authentication like a changed body.

Checks, in order: the CRC32C over the stored bytes (so damage is found before any
decompression or decryption, and resynchronisation after a bad region works as for plain
records), then authentication, then decompression to exactly ``P`` bytes, then the plain
record's own structure (its type, count and first offset must be the sealed header's). A
failure of any of them is damage (``SealError``): the record is set aside and counted like a
record with a bad CRC. A key id no key of the ring has, a codec or cipher this build does not
know, or an encrypted batch when no key is given are not damage but a wrong setting:
``check.py`` refuses to start on them before any store is opened (``UnknownSeal``).

A compressor whose output is not smaller than the plain bytes is not used for that batch (the
codec field says none): a sealed record is never more than ``MAX_SEAL_GROWTH`` bytes larger
than its plain record, which is what the writer's plan reserves per batch.
"""

from __future__ import annotations

from collections.abc import Callable

from crc32c import crc32c

from lmqd.storage.atrest.compression import (
    CODEC_NAMES,
    NO_COMPRESSION,
    NONE,
    Compression,
    CompressionError,
    decompress,
)
from lmqd.storage.atrest.keys import (
    CIPHER_NAMES,
    KEY_ID_SIZE,
    NONCE_SIZE,
    TAG_SIZE,
    Keyring,
    decrypt,
)
from lmqd.storage.record import (
    BATCH_HEADER,
    MAX_RECORD_LENGTH,
    PLAIN_TYPE_OF,
    SEALED_TYPE_OF,
    U32,
    Buffer,
    FormatError,
    header_offset_size,
)

CIPHER_SHIFT = 4
COMPRESSION_MASK = 0x07
CIPHER_MASK = 0x30
KNOWN_BITS = COMPRESSION_MASK | CIPHER_MASK
KEY_AT = 4
"""The key id's place after the seal header's plain length."""
SEAL_HEADER = 4
"""The plain length; an encrypted record adds the key id and the nonce."""
CIPHER_HEADER = KEY_ID_SIZE + NONCE_SIZE
MAX_SEAL_GROWTH = SEAL_HEADER + CIPHER_HEADER + TAG_SIZE
"""The most a sealed record is larger than the plain record it holds (36 bytes)."""
_EMPTY_CRC = bytes(4)


class SealError(FormatError):
    """A sealed record that does not open: failed authentication, bytes that do not
    decompress, a plain record inside that disagrees with the header. Damage."""


class UnknownSeal(SealError):
    """A sealed record this daemon cannot open with its settings: a key id no loaded key has,
    no key at all, or a codec or cipher this build does not know. A wrong setting, not damage:
    ``check.py`` refuses to start on it."""


def seal_codec(record: Buffer, pos: int) -> int:
    """The codec byte of the sealed record at ``pos``."""
    return record[pos + 5]


def plain_length(record: Buffer, pos: int) -> int:
    """The plain length in the sealed record's header at ``pos`` (its logical size is this
    plus 8: the length field and the CRC)."""
    return int(U32.unpack_from(record, pos + header_offset_size(record[pos + 4]))[0])


def describe(codec: int) -> str:
    """``zstd+aes-256-gcm``, ``lz4``, ``aes-256-gcm``: a codec byte for log lines."""
    parts = [CODEC_NAMES.get(codec & COMPRESSION_MASK, f"codec {codec & COMPRESSION_MASK}")]
    cipher = (codec & CIPHER_MASK) >> CIPHER_SHIFT
    if cipher:
        parts.append(CIPHER_NAMES.get(cipher, f"cipher {cipher}"))
    return "+".join(p for p in parts if p != "none") or "none"


class Sealer:
    """Seals a store's plain records: its compression, and the keyring's first key if any."""

    __slots__ = ("_compress", "_keyring", "compression")

    def __init__(self, compression: Compression, keyring: Keyring | None) -> None:
        self.compression = compression
        self._keyring = keyring
        self._compress: Callable[[Buffer], bytes] | None = (
            compression.compressor() if compression.enabled else None
        )

    @property
    def encrypts(self) -> bool:
        return self._keyring is not None

    def seal(self, record: Buffer) -> bytes:
        """The sealed record holding the framed plain record ``record`` (one 'B' or 'O')."""
        kind = record[4]
        prefix = header_offset_size(kind)
        with memoryview(record) as whole, whole[4:-4] as plain:
            size = len(plain)
            codec = NONE
            payload: Buffer = plain
            if self._compress is not None:
                packed = self._compress(plain)
                if len(packed) < size:
                    codec = self.compression.codec
                    payload = packed
            head = bytearray(record[:prefix])
            head[4] = SEALED_TYPE_OF[kind]
            head += U32.pack(size)
            keyring = self._keyring
            if keyring is not None:
                cipher = keyring.cipher
                codec |= cipher << CIPHER_SHIFT
                head[5] = codec
                kid = keyring.sealing_id
                nonce = keyring.next_nonce()
                head += kid
                head += nonce
                aead = keyring.aead(kid, cipher)
                assert aead is not None
                payload = aead.encrypt(nonce, bytes(payload), bytes(head[4:]))
            else:
                head[5] = codec
            head += payload
        head += _EMPTY_CRC
        U32.pack_into(head, 0, len(head) - 4)
        with memoryview(head) as view:
            U32.pack_into(head, len(head) - 4, crc32c(view[4:-4]))
        return bytes(head)


class Opener:
    """Opens sealed records with the daemon's keyring (None: no key given)."""

    __slots__ = ("keyring",)

    def __init__(self, keyring: Keyring | None) -> None:
        self.keyring = keyring

    def check(self, record: Buffer, pos: int) -> None:
        """Raise ``UnknownSeal`` if the sealed record at ``pos`` needs what this daemon does not
        have (a key, a codec, a cipher); reads only its header."""
        codec = record[pos + 5]
        if codec & ~KNOWN_BITS or (codec & COMPRESSION_MASK) not in CODEC_NAMES:
            raise UnknownSeal(f"unknown at-rest codec byte 0x{codec:02x}")
        cipher = (codec & CIPHER_MASK) >> CIPHER_SHIFT
        if not cipher:
            return
        if cipher not in CIPHER_NAMES:
            raise UnknownSeal(f"unknown at-rest cipher {cipher}")
        keyring = self.keyring
        if keyring is None:
            raise UnknownSeal("encrypted, and no --encryption-key-file is given")
        at = pos + header_offset_size(record[pos + 4]) + SEAL_HEADER
        kid = bytes(record[at : at + KEY_ID_SIZE])
        if keyring.aead(kid, cipher) is None:
            raise UnknownSeal(f"encrypted with key id {kid.hex()}, which no key file given has")

    def open(self, record: Buffer, pos: int, end: int) -> bytes:
        """The plain record held by the sealed record ``record[pos:end]`` (its CRC checked by
        the caller), framed as written: length, type .. options, and four zero bytes where its
        CRC was (the decoders expect a record whose CRC matched). Raises ``SealError``."""
        kind = record[pos + 4]
        codec = record[pos + 5]
        prefix = header_offset_size(kind)
        at = pos + prefix
        crc_at = end - 4
        if at + SEAL_HEADER > crc_at:
            raise SealError("sealed record shorter than its header")
        size = int(U32.unpack_from(record, at)[0])
        if not 0 < size <= MAX_RECORD_LENGTH:
            raise SealError(f"implausible plain length {size}")
        self.check(record, pos)
        at += SEAL_HEADER
        with memoryview(record) as whole:
            cipher = (codec & CIPHER_MASK) >> CIPHER_SHIFT
            payload: Buffer
            if cipher:
                if at + CIPHER_HEADER + TAG_SIZE > crc_at:
                    raise SealError("encrypted record shorter than its header")
                assert self.keyring is not None
                kid = bytes(whole[at : at + KEY_ID_SIZE])
                nonce = bytes(whole[at + KEY_ID_SIZE : at + CIPHER_HEADER])
                aead = self.keyring.aead(kid, cipher)
                assert aead is not None
                opened = decrypt(
                    aead,
                    nonce,
                    bytes(whole[at + CIPHER_HEADER : crc_at]),
                    bytes(whole[pos + 4 : at + CIPHER_HEADER]),
                )
                if opened is None:
                    raise SealError(f"authentication failed (key id {kid.hex()})")
                payload = opened
            else:
                payload = whole[at:crc_at]
            try:
                plain = decompress(codec & COMPRESSION_MASK, payload, size)
            except CompressionError as exc:
                raise SealError(str(exc)) from None
        if plain[0] != PLAIN_TYPE_OF[kind] or plain[2 : prefix - 4] != bytes(
            record[pos + 6 : pos + prefix]
        ):
            raise SealError("the sealed batch's header disagrees with the batch it holds")
        return b"".join((U32.pack(size + 4), plain, _EMPTY_CRC))


def sealed_count(record: Buffer, pos: int) -> int:
    """The message count in a sealed record's header (as a plain batch's)."""
    return int(BATCH_HEADER.unpack_from(record, pos)[3])


NO_SEALER: Sealer | None = None
"""What a store that does not seal holds: the writer then frames and writes as before."""


class AtRest:
    """The daemon's at-rest settings, shared by every store: the keyring (None: no encryption)
    and the default compression (``--compression``); ``sealer`` gives a store's writer its
    sealing step (None when it neither compresses nor encrypts), ``opener`` every reader's."""

    __slots__ = ("default_compression", "keyring", "opener")

    def __init__(
        self, keyring: Keyring | None = None, default_compression: Compression = NO_COMPRESSION
    ) -> None:
        self.keyring = keyring
        self.default_compression = default_compression
        self.opener = Opener(keyring)

    @property
    def active(self) -> bool:
        """Whether any store seals by default."""
        return self.keyring is not None or self.default_compression.enabled

    def sealer(self, compression: Compression | None = None) -> Sealer | None:
        """The sealing step of a store with ``compression`` (None: the daemon's default)."""
        chosen = self.default_compression if compression is None else compression
        if not chosen.enabled and self.keyring is None:
            return NO_SEALER
        return Sealer(chosen, self.keyring)


PLAIN = AtRest()
"""No encryption, no compression: what a store gets when nobody says otherwise (tests, tools)."""

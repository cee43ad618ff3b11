"""Encryption keys at rest: key files, key ids, the keyring, the ciphers.

A key file holds one 256-bit key: the 32 raw bytes (``head -c 32 /dev/urandom > key``), or those
bytes written as 64 hex digits or as base64 (44 characters), with surrounding whitespace
ignored. ``load_key_file`` refuses anything else, and a file that its group or others may read
(``chmod 600`` or ``400``): a key that other accounts can read protects nothing.

**Key ids.** Each stored batch names the key that sealed it by a 4-byte id: the first 4 bytes of
SHA-256 over ``b"lmq at-rest key id\\0"`` and the key. The id is derived, not chosen, so the
same key always has the same id and a *wrong* key (another file given by mistake) has another:
a batch whose id no loaded key has is refused before anything is read (``check.py``), never
taken for damage. The id tells nothing about the key (a hash prefix).

**Keyring.** ``--encryption-key-file`` repeats: the first key seals every new batch, every key
opens the batches that name it (rotation: give the new key first and the old ones after, then
rewrite the old segments with ``lmqd --rewrite-at-rest`` or ``lmqadmin rewrite``).

**Ciphers.** AES-256-GCM (the default; AES-NI makes it ~1-2 GB/s) or ChaCha20-Poly1305
(``--encryption-cipher=chacha20-poly1305``: as fast without AES instructions), both AEADs from
``cryptography`` (OpenSSL underneath), each with a 96-bit nonce and a 128-bit tag. The cipher is
recorded per batch, so a daemon reads batches of either whatever it writes.

**Nonces never repeat.** A keyring's nonces are an 8-byte prefix drawn from ``os.urandom`` when
it is made, followed by a 4-byte counter incremented per batch; when the counter wraps a new
prefix is drawn. Within one process two batches never share a nonce; across processes and
restarts two share one only if two random 64-bit prefixes collide (with a million restarts of
one key the chance is below 1 in 30 million), and even then only for the batches with equal
counters. Random 96-bit nonces per batch would cost a ``getrandom`` call each and give a weaker
bound (the birthday bound of 96 bits over every batch ever written).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import stat
import struct
from typing import TYPE_CHECKING

import attrs

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM, ChaCha20Poly1305

KEY_SIZE = 32
"""A key's bytes: 256 bits."""
NONCE_SIZE = 12
"""Both ciphers' nonce: 96 bits."""
TAG_SIZE = 16
"""Both ciphers' authentication tag, appended to the ciphertext."""
KEY_ID_SIZE = 4

AES_256_GCM = 1
CHACHA20_POLY1305 = 2
CIPHER_NAMES = {AES_256_GCM: "aes-256-gcm", CHACHA20_POLY1305: "chacha20-poly1305"}
"""Cipher ids (bits 4-5 of a sealed record's codec byte) and their names."""


def _cipher_classes() -> dict[int, type[AESGCM] | type[ChaCha20Poly1305]]:
    """The AEAD classes by cipher id. ``cryptography`` is imported here, by the first keyring:
    a daemon that encrypts nothing never loads it (~7 MB of memory and 40 modules)."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM, ChaCha20Poly1305

    return {AES_256_GCM: AESGCM, CHACHA20_POLY1305: ChaCha20Poly1305}


def decrypt(aead: AESGCM | ChaCha20Poly1305, nonce: bytes, data: bytes, aad: bytes) -> bytes | None:
    """``aead``'s plaintext of ``data``; None if its tag does not authenticate it (a wrong key
    or changed bytes)."""
    from cryptography.exceptions import InvalidTag

    try:
        return aead.decrypt(nonce, data, aad)
    except InvalidTag:
        return None


_COUNTER = struct.Struct(">I")
_ID_CONTEXT = b"lmq at-rest key id\x00"


class KeyFileError(ValueError):
    """A key file that cannot be used: the message names the file and says why."""


def key_id(key: bytes) -> bytes:
    """The 4-byte id stored with every batch ``key`` seals (see the module docstring)."""
    return hashlib.sha256(_ID_CONTEXT + key).digest()[:KEY_ID_SIZE]


def parse_cipher(text: str) -> int:
    """A cipher id from its name (``aes-256-gcm``, ``chacha20-poly1305``)."""
    for cipher, name in CIPHER_NAMES.items():
        if text.strip().lower() == name:
            return cipher
    raise ValueError(f"unknown cipher {text!r} (aes-256-gcm, chacha20-poly1305)")


def load_key_file(path: str) -> bytes:
    """The key in file ``path``; raises ``KeyFileError`` naming the file (missing, readable by
    group or others, not 32 bytes raw, hex or base64)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        raise KeyFileError(f"encryption key file {path}: {exc.strerror or exc}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise KeyFileError(f"encryption key file {path}: not a regular file")
        if mode & 0o077:
            raise KeyFileError(
                f"encryption key file {path}: mode {stat.S_IMODE(mode):04o} lets group or others "
                f"read or write it (chmod 600 {path})"
            )
        data = os.read(fd, 4096)
    finally:
        os.close(fd)
    key = _decode_key(data)
    if key is None:
        raise KeyFileError(
            f"encryption key file {path}: holds {len(data)} bytes, not a 256-bit key (32 raw "
            f"bytes, 64 hex digits or 44 base64 characters)"
        )
    return key


def _decode_key(data: bytes) -> bytes | None:
    if len(data) == KEY_SIZE:
        return data
    text = data.strip()
    if len(text) == 2 * KEY_SIZE:
        try:
            return binascii.unhexlify(text)
        except (binascii.Error, ValueError):
            return None
    try:
        key = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None
    return key if len(key) == KEY_SIZE else None


@attrs.define(slots=True, eq=False)
class Keyring:
    """The daemon's keys: the first seals, all of them open (by key id)."""

    keys: list[bytes]
    cipher: int = AES_256_GCM
    _aeads: dict[tuple[bytes, int], AESGCM | ChaCha20Poly1305] = attrs.field(
        init=False, factory=dict
    )
    _prefix: bytes = attrs.field(init=False, factory=lambda: os.urandom(8))
    _counter: int = attrs.field(init=False, default=0)

    def __attrs_post_init__(self) -> None:
        if not self.keys:
            raise ValueError("a keyring needs at least one key")
        ids = [key_id(k) for k in self.keys]
        if len(set(ids)) != len(ids):
            raise ValueError("the same encryption key is given twice")
        classes = _cipher_classes()
        for key, kid in zip(self.keys, ids, strict=True):
            for cipher, aead in classes.items():
                self._aeads[kid, cipher] = aead(key)

    @classmethod
    def from_files(cls, paths: list[str], cipher: int = AES_256_GCM) -> Keyring:
        """The keys of ``paths`` (first: the sealing key); ``KeyFileError`` names a bad file."""
        keys = [load_key_file(p) for p in paths]
        try:
            return cls(keys, cipher)
        except ValueError as exc:
            raise KeyFileError(f"encryption key files {', '.join(paths)}: {exc}") from None

    @property
    def sealing_id(self) -> bytes:
        """The id of the key new batches are sealed with."""
        return key_id(self.keys[0])

    def ids(self) -> set[bytes]:
        return {kid for kid, _ in self._aeads}

    def next_nonce(self) -> bytes:
        """A nonce no batch sealed by this keyring had (see the module docstring)."""
        counter = self._counter
        if counter > 0xFFFFFFFF:
            self._prefix = os.urandom(8)
            counter = 0
        self._counter = counter + 1
        return self._prefix + _COUNTER.pack(counter)

    def aead(self, kid: bytes, cipher: int) -> AESGCM | ChaCha20Poly1305 | None:
        """The cipher object for key ``kid``; None if no key of the ring has that id."""
        return self._aeads.get((kid, cipher))

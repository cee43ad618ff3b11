"""At rest: compression and encryption of what the stores write, one layer under the records.

* ``compression.py``: the codecs (cramjam's zstd, lz4, snappy, gzip) and their spellings;
* ``keys.py``: key files, key ids, the keyring, the ciphers (``cryptography``'s AEADs);
* ``seal.py``: the sealed record and the two steps, ``Sealer`` (writers) and ``Opener``
  (readers), with ``AtRest``, the daemon's settings every store shares;
* ``check.py``: the start-up check that refuses, touching nothing, a data directory this
  daemon's settings cannot read (a missing or wrong key, an unknown codec);
* ``rewrite.py``: rewriting segments under the first key and the current compression
  (``--rewrite-at-rest``, ``lmqadmin rewrite``).

docs/storage.md ("At rest") has the byte layout and what stays in clear.
"""

from __future__ import annotations

from collections.abc import Sequence

from lmqd.storage.atrest.compression import Compression
from lmqd.storage.atrest.keys import KeyFileError, Keyring, parse_cipher
from lmqd.storage.atrest.seal import PLAIN, AtRest

__all__ = ["PLAIN", "AtRest", "AtRestConfigError", "build_at_rest"]


class AtRestConfigError(ValueError):
    """Settings lmqd cannot start with: a bad key file, compression or cipher, or a data
    directory they cannot read (``check.py``). The message is one line naming the file."""


def build_at_rest(
    compression: str = "none", key_files: Sequence[str] = (), cipher: str = "aes-256-gcm"
) -> AtRest:
    """The daemon's ``AtRest`` from its settings (``--compression``,
    ``--encryption-key-file``, ``--encryption-cipher``); reads the key files. Raises
    ``AtRestConfigError``."""
    try:
        default = Compression.parse(compression)
    except ValueError as exc:
        raise AtRestConfigError(f"--compression: {exc}") from None
    try:
        cipher_id = parse_cipher(cipher)
    except ValueError as exc:
        raise AtRestConfigError(f"--encryption-cipher: {exc}") from None
    keyring = None
    if key_files:
        try:
            keyring = Keyring.from_files(list(key_files), cipher_id)
        except KeyFileError as exc:
            raise AtRestConfigError(str(exc)) from None
    return AtRest(keyring, default)

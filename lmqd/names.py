"""Topic and channel names: nsqd's rule, plus this project's ``#tmp`` ephemeral suffix.

nsqd (``internal/protocol/names.go``) accepts ``^[.a-zA-Z0-9_-]+(#ephemeral)?$`` with a length of
1 to 64 characters, suffix included. lmq also accepts ``#tmp`` as an ephemeral suffix (its tests
use it); note that real NSQ clients reject such names client-side.
"""

from __future__ import annotations

import re

MAX_NAME_LENGTH = 64
"""nsqd's limit (it was 32 before 0.2.28); counts the ``#ephemeral`` suffix too."""

EPHEMERAL_SUFFIXES = ("#ephemeral", "#tmp")

_NAME_RE = re.compile(r"[.a-zA-Z0-9_-]+(?:#ephemeral|#tmp)?")
_NAME_RE_BYTES = re.compile(rb"[.a-zA-Z0-9_-]+(?:#ephemeral|#tmp)?")

# Parsed names are looked up here before the regex runs: a connection publishes to the same few
# topics over and over, so the common case is one dict lookup. Bounded so that a client cycling
# through random names cannot grow it without limit.
_VALID_CACHE_MAX = 4096
_valid_cache: dict[bytes, str] = {}


def valid_name(name: str) -> bool:
    """True if ``name`` is a valid topic or channel name."""
    return 0 < len(name) <= MAX_NAME_LENGTH and _NAME_RE.fullmatch(name) is not None


def is_nsq_name(name: str) -> bool:
    """True if nsqd's own rule accepts ``name`` too: a valid name not ending in lmq's ``#tmp``.

    Real nsqlookupd refuses any other name with a fatal error, so lmqd registers only these.
    """
    return valid_name(name) and not name.endswith("#tmp")


def is_ephemeral(name: str) -> bool:
    """True if ``name`` ends with an ephemeral suffix (``#ephemeral`` or ``#tmp``)."""
    return name.endswith(EPHEMERAL_SUFFIXES)


def decode_name(raw: bytes) -> str | None:
    """The name as ``str`` if ``raw`` is a valid name, else None (the parser's fast path)."""
    name = _valid_cache.get(raw)
    if name is not None:
        return name
    if not 0 < len(raw) <= MAX_NAME_LENGTH or _NAME_RE_BYTES.fullmatch(raw) is None:
        return None
    if len(_valid_cache) >= _VALID_CACHE_MAX:
        _valid_cache.clear()
    name = _valid_cache[raw] = raw.decode("ascii")
    return name

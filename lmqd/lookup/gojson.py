"""JSON as Go's ``encoding/json`` reads and writes it, for the peer-info objects of V1.

nsqlookupd and nsqd exchange small JSON objects (the IDENTIFY body and its reply) and
nsqlookupd's HTTP API answers in JSON, all through Go's ``encoding/json``. The differences from
Python's ``json`` that a peer can see are handled here:

Decoding into a struct (``decode_struct``):

- keys match field names exactly or, failing that, case-insensitively (Go's ``EqualFold``,
  under which the long s U+017F folds to ``s`` and the Kelvin sign U+212A to ``k``); unknown
  keys are ignored; for a repeated key the last one wins;
- ``null`` leaves a field as it was (its zero value, or an earlier key's value); a top-level
  ``null`` is an empty struct;
- an ``int`` field takes only an integer literal within int64 (``1.0``, ``1e3``, ``true`` and
  ``"1"`` are type errors), a ``string`` field only a string;
- ``NaN``/``Infinity`` are not JSON; invalid UTF-8 and lone surrogates become U+FFFD.

Encoding (``dumps``): compact, map keys sorted when asked (Go sorts map keys, writes struct
fields in declaration order), non-ASCII as UTF-8, and ``<``, ``>``, ``&``, U+2028 and U+2029
escaped as ``\\u003c`` and so on, as ``json.Marshal`` does.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

__all__ = ["decode_struct", "dumps"]

_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1

# json.Marshal's HTMLEscape and its line/paragraph separator escapes. Each of these characters
# can only occur inside a JSON string, so replacing them in the encoded text is safe.
_GO_ESCAPES = str.maketrans(
    {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}
)
# The two non-ASCII runes that Go's EqualFold folds onto ASCII letters of field names.
_FOLD = str.maketrans({"\u017f": "s", "\u212a": "k"})


def dumps(value: Any, *, sort_keys: bool = False) -> bytes:
    """``value`` as Go's ``json.Marshal`` writes it (compact, HTML characters escaped)."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, sort_keys=sort_keys)
    return text.translate(_GO_ESCAPES).encode("utf-8")


class _Object(list[tuple[str, Any]]):
    """A decoded JSON object as its (key, value) pairs in order (so repeated keys survive)."""


def _reject_constant(name: str) -> Any:
    raise ValueError(f"invalid JSON constant {name}")


def _clean(text: str) -> str:
    # Python's json keeps a lone surrogate escape ("\ud800") as is; Go writes U+FFFD instead,
    # and a str holding a lone surrogate cannot be encoded back to UTF-8 anyway.
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def _fold(key: str) -> str:
    folded = key.translate(_FOLD)
    return folded.lower() if folded.isascii() else folded


def decode_struct(body: bytes, fields: Mapping[str, type]) -> dict[str, Any]:
    """Decode ``body`` into the fields named in ``fields`` (``str`` or ``int`` each), as Go's
    ``json.Unmarshal`` into a struct does; absent fields get their zero value.

    Raises ValueError when Go would return an error: invalid JSON, a top-level value that is
    not an object (or ``null``), or a known field holding a value of the wrong type.
    """
    try:
        pairs = json.loads(
            body.decode("utf-8", "replace"),
            object_pairs_hook=_Object,
            parse_constant=_reject_constant,
        )
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"invalid JSON: {exc}") from None
    result: dict[str, Any] = {name: kind() for name, kind in fields.items()}
    if pairs is None:
        return result
    if not isinstance(pairs, _Object):
        raise ValueError("not a JSON object")
    folded = {_fold(name): name for name in fields}
    error: str | None = None
    for key, value in pairs:
        name = key if key in fields else folded.get(_fold(key))
        if name is None or value is None:
            continue
        kind = fields[name]
        if kind is int:
            if type(value) is not int or not _INT64_MIN <= value <= _INT64_MAX:
                error = error or f"field {name}: want an int64, got {value!r}"
                continue
        elif kind is str:
            if not isinstance(value, str):
                error = error or f"field {name}: want a string, got {value!r}"
                continue
            value = _clean(value)
        result[name] = value
    # Go reports the first type error but only after decoding everything else.
    if error is not None:
        raise ValueError(error)
    return result

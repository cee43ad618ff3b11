"""Message bodies for people: text, pretty JSON or a hex dump, and the browser's filter.

Pure functions over bytes. Nothing here makes HTML: the templates escape what these return, so
a body is shown as the text it is, whatever it contains.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import attrs

__all__ = ["VIEWS", "BodyFilter", "Shown", "decode_body", "render_body"]

VIEWS = ("text", "json", "hex")

HEX_LIMIT = 64 * 1024
"""Bytes of a body shown in the hex view: a screen of 16-byte lines is read by a person; past
64 KiB the dump says how much more there is (the text views show a body whole)."""


def decode_body(doc: dict[str, Any], *, base64_always: bool = False) -> bytes:
    """A body from lmqd's JSON (``/peek``: text or base64 per ``body_encoding``;
    ``/topic/read?format=json``: base64)."""
    body = doc.get("body", "")
    if base64_always or doc.get("body_encoding") == "base64":
        return base64.b64decode(body)
    return str(body).encode()


@attrs.frozen
class Shown:
    text: str
    note: str = ""


def render_body(body: bytes, view: str) -> Shown:
    """The body as ``view`` shows it (text with U+FFFD for bytes that are not UTF-8)."""
    if view == "hex":
        shown = body[:HEX_LIMIT]
        lines = []
        for start in range(0, len(shown), 16):
            chunk = shown[start : start + 16]
            hexes = " ".join(f"{b:02x}" for b in chunk)
            text = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
            lines.append(f"{start:08x}  {hexes:<47}  {text}")
        more = len(body) - len(shown)
        return Shown("\n".join(lines), f"{more:,} more bytes not shown" if more > 0 else "")
    text = body.decode("utf-8", "replace")
    if view == "json":
        try:
            return Shown(json.dumps(json.loads(body), indent=2, ensure_ascii=False))
        except ValueError:
            return Shown(text, "not JSON: shown as text")
    return Shown(text)


@attrs.frozen
class BodyFilter:
    """Keep messages whose body contains ``contains`` and, with ``field``
    (``path.to.key=value``), whose JSON body has that value at that path."""

    contains: str = ""
    field: str = ""

    @property
    def active(self) -> bool:
        return bool(self.contains or self.field)

    def matches(self, body: bytes) -> bool:
        if self.contains and self.contains.encode() not in body:
            return False
        if self.field:
            path, _, wanted = self.field.partition("=")
            try:
                value: Any = json.loads(body)
            except ValueError:
                return False
            for key in path.strip().split("."):
                if isinstance(value, dict) and key in value:
                    value = value[key]
                elif isinstance(value, list) and key.isdigit() and int(key) < len(value):
                    value = value[int(key)]
                else:
                    return False
            shown = value if isinstance(value, str) else json.dumps(value)
            return shown == wanted.strip()
        return True

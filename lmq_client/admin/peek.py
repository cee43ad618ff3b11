"""``lmqadmin peek``: what a topic or channel holds (lmqd's ``GET /peek``), as a table."""

from __future__ import annotations

import datetime
from typing import Any

from rich.console import Console
from rich.table import Table

__all__ = ["render_peek"]

BODY_WIDTH = 40
"""Characters of a body shown in the table (``--json`` has all of it)."""


def _time(ms: int | None) -> str:
    if ms is None:
        return ""
    moment = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)
    return moment.strftime("%H:%M:%S.%f")[:-3]


def _body(message: dict[str, Any]) -> str:
    body = str(message["body"])
    if message.get("body_encoding") == "base64":
        body = "base64:" + body
    return body if len(body) <= BODY_WIDTH else body[: BODY_WIDTH - 1] + "…"


def render_peek(console: Console, address: str, doc: dict[str, Any]) -> None:
    """One daemon's answer: a title and a row per message."""
    where = doc["topic"] + (f":{doc['channel']}" if doc.get("channel") else "")
    table = Table(title=f"{where} {doc['state']} on {address} ({doc['count']} shown)")
    for column in ("offset", "id", "attempts", "prio", "deliver at", "deadline", "headers",
                   "body"):
        table.add_column(column, justify="right" if column in ("offset", "attempts", "prio")
                         else "left")
    for m in doc["messages"]:
        headers = ", ".join(f"{k}={v}" for k, v in m.get("headers", {}).items())
        table.add_row(
            "" if m["offset"] is None else f"{m['offset']:,}",
            m["id"],
            str(m["attempts"]),
            str(m.get("priority", 0)),
            _time(m["deliver_at"]),
            _time(m["deadline"]),
            headers,
            _body(m),
        )
    console.print(table)

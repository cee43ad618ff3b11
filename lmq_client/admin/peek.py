"""``lmqadmin peek``: what a topic or channel holds (lmqd's ``GET /peek``), as a table.

A column that says nothing for any message shown is left out (no deferred message: no ``deliver
at``; no priority set: no ``prio``; nothing redelivered: no ``attempts``). The short columns
(offset, id, attempts, priority, times) keep their whole width -- an id cut to a few characters
identifies nothing -- and the rest goes to the headers (one per line) and the body (one line),
cut with an ellipsis only where the terminal is too narrow for both: the body keeps at least
half of that rest, the headers take what they need of the other half (``--json`` has
everything). On a terminal too narrow for even that, columns are left out by importance
(``columns.fit``), the id last, and the caption says how many.
"""

from __future__ import annotations

import datetime
from typing import Any

from rich.console import Console
from rich.table import Table

from lmq_client.admin.columns import PADDING_AND_BORDER, Column, fit

__all__ = ["render_peek"]

MIN_FLEX = 12
"""Narrowest a headers or body column is cut to before columns are left out instead: enough for
a header like ``trace=4bf92f3…`` or the start of a JSON body."""

def _time(ms: int | None) -> str:
    if ms is None:
        return ""
    moment = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)
    return moment.strftime("%H:%M:%S.%f")[:-3]


def _body(message: dict[str, Any]) -> str:
    body = str(message["body"])
    if message.get("body_encoding") == "base64":
        body = "base64:" + body
    return " ".join(body.splitlines())  # one line per message


def _cut(text: str, width: int) -> str:
    """Each line of ``text`` cut to ``width`` characters, an ellipsis marking the cut."""
    return "\n".join(
        line if len(line) <= width else line[: max(width - 1, 0)] + "…"
        for line in text.split("\n")
    )


def _columns(messages: list[dict[str, Any]]) -> list[Column]:
    """Every column, priority 0 (the id) first kept; justify as shown."""
    return [
        Column("offset", ["" if m["offset"] is None else f"{m['offset']:,}" for m in messages], 3),
        Column("id", [str(m["id"]) for m in messages], 0, "left"),
        Column("attempts", [str(m["attempts"]) if m["attempts"] else "" for m in messages], 4),
        Column("prio", [str(m["priority"]) if m.get("priority") else "" for m in messages], 5),
        Column("deliver at", [_time(m["deliver_at"]) for m in messages], 6, "left"),
        Column("deadline", [_time(m["deadline"]) for m in messages], 7, "left"),
        Column(
            "headers",
            ["\n".join(f"{k}={v}" for k, v in m.get("headers", {}).items()) for m in messages],
            2, "left",
        ),
        Column("body", [_body(m) for m in messages], 1, "left"),
    ]  # fmt: skip


def _layout(columns: list[Column], width: int) -> tuple[list[Column], int]:
    """The columns to show within ``width`` (headers and body cut to fit) and how many of the
    non-empty ones were left out."""
    shown = [c for c in columns if c.header == "id" or any(c.cells)]
    flex = {"headers", "body"}
    # The flexible columns count at most MIN_FLEX when choosing what fits.
    floor = [
        Column(c.header, [_cut(x, MIN_FLEX) for x in c.cells], c.priority, c.justify)
        if c.header in flex else c
        for c in shown
    ]  # fmt: skip
    kept, hidden = fit(floor, width)
    names = {c.header for c in kept}
    kept = [c for c in shown if c.header in names]
    room = width - 1 - sum(c.width for c in kept if c.header not in flex)
    room -= PADDING_AND_BORDER * sum(c.header in flex for c in kept)
    natural = {c.header: c.width - PADDING_AND_BORDER for c in kept if c.header in flex}
    budget: dict[str, int] = {}
    if "headers" in natural and "body" in natural and sum(natural.values()) > room:
        body = min(natural["body"], max(room // 2, MIN_FLEX))
        budget["headers"] = min(natural["headers"], max(room - body, MIN_FLEX))
        budget["body"] = max(room - budget["headers"], MIN_FLEX)
    elif natural:
        budget = {name: max(min(w, room), MIN_FLEX) for name, w in natural.items()}
    out = [
        Column(c.header, [_cut(x, budget[c.header]) for x in c.cells], c.priority, c.justify)
        if c.header in budget else c
        for c in kept
    ]  # fmt: skip
    return out, hidden


def render_peek(console: Console, address: str, doc: dict[str, Any]) -> None:
    """One daemon's answer: a title and a row per message."""
    where = doc["topic"] + (f":{doc['channel']}" if doc.get("channel") else "")
    columns, hidden = _layout(_columns(doc["messages"]), console.width)
    table = Table(title=f"{where} {doc['state']} on {address} ({doc['count']} shown)")
    if hidden:
        table.caption = f"{hidden} column(s) hidden to fit {console.width} columns; --json has all"
    for column in columns:
        table.add_column(column.header, justify=column.justify, no_wrap=True)  # type: ignore[arg-type]
    for i in range(len(doc["messages"])):
        table.add_row(*(c.cells[i] for c in columns))
    console.print(table)

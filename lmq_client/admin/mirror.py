"""``lmqadmin mirror``: replication (docs/mirrors.md) -- a node's role and its mirrors' or its
primary's state, promotion, and forgetting a mirror.

* ``lmqadmin --http-address M mirror promote``: makes the mirror at ``M`` a primary (``POST
  /mirror/promote``) and prints what it did; exactly one ``--http-address``.
* ``lmqadmin [--http-address A ...] mirror status``: each node's role, epoch and, for a mirror,
  its primary and every followed topic (state, lag in messages and seconds, gap), for a primary,
  its mirrors (in sync or not and since when, lag, last contact, released; per topic the offsets
  each has stored and synced) and, with ``--min-insync-mirrors``, the publishes held, refused
  and timed out.
* ``lmqadmin --http-address P mirror forget MIRROR_ID``: the primary ``P`` drops a mirror and
  what it kept for it.
"""

from __future__ import annotations

import json
import time
from typing import Any

import attrs
import click
from rich.table import Table

from lmq_client.admin.common import (
    EXIT_USAGE,
    Settings,
    emit_json,
    fail,
    handle_errors,
    json_option,
    make_console,
)
from lmq_client.errors import LmqClientError
from lmq_client.http import HTTPClient

__all__ = ["mirror", "mirror_lines"]


@click.group()
def mirror() -> None:
    """Mirrors: promote one, see their state, forget one."""


def _one_address(settings: Settings, what: str) -> HTTPClient:
    addresses = settings.http_addresses()
    if len(addresses) != 1:
        fail(f"{what} needs exactly one --http-address (got {len(addresses)})", EXIT_USAGE)
    options = attrs.evolve(settings.http_options, timeout_s=max(settings.timeout, 30.0))
    return HTTPClient(addresses[0], options=options)


def _json(client: HTTPClient, data: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(data)
    except ValueError:
        raise LmqClientError(f"{client.address}: the answer is not lmqd's JSON") from None
    if not isinstance(doc, dict):
        raise LmqClientError(f"{client.address}: the answer is not lmqd's JSON")
    return doc


@mirror.command()
@json_option
@click.pass_obj
@handle_errors
def promote(settings: Settings) -> None:
    """Make the mirror at --http-address a primary (stops following; its channels resume where
    the primary's stood; it registers with its lookupds)."""
    client = _one_address(settings, "mirror promote")
    summary = _json(client, client.request("POST", "/mirror/promote"))
    if settings.as_json:
        emit_json(summary)
        return
    click.echo(
        f"{client.address}: promoted to primary at epoch {summary.get('epoch')} in "
        f"{summary.get('seconds')}s: {summary.get('topics')} topic(s), "
        f"{summary.get('channels')} channel(s), {summary.get('restored')} unfinished "
        f"message(s) restored, {summary.get('missing')} missing, "
        f"{summary.get('untracked')} untracked"
    )


@mirror.command()
@click.argument("mirror_id", metavar="MIRROR_ID")
@click.pass_obj
@handle_errors
def forget(settings: Settings, mirror_id: str) -> None:
    """On the primary at --http-address: drop mirror MIRROR_ID (its node id, as `mirror
    status` shows it) and release what was kept for it."""
    client = _one_address(settings, "mirror forget")
    client.request("POST", "/mirror/forget", {"mirror": mirror_id})
    click.echo(f"{client.address}: mirror {mirror_id} forgotten")


@mirror.command()
@json_option
@click.pass_obj
@handle_errors
def status(settings: Settings) -> None:
    """Each node's role and epoch; a mirror's primary and followed topics; a primary's
    mirrors."""
    docs = {}
    for client in settings.http_clients():
        docs[client.address] = _json(client, client.request("GET", "/mirror"))
    if settings.as_json:
        emit_json(docs)
        return
    console = make_console()
    for address, doc in docs.items():
        for line in mirror_lines(address, doc):
            console.print(line)
        topics = (doc.get("mirror") or {}).get("topics") or []
        if topics:
            table = Table(box=None, pad_edge=False)
            for column in ("topic", "state", "lag", "lag (s)", "copied", "gap", "channels"):
                table.add_column(column, justify="left" if column in ("topic", "state")
                                 else "right")  # fmt: skip
            for t in topics:
                table.add_row(
                    t["topic_name"], t["state"], str(t["lag_messages"]),
                    f"{t['lag_seconds']:.1f}", str(t["copied_messages"]),
                    str(t["gap_messages"]), str(t["channels"]),
                )  # fmt: skip
            console.print(table)
        holds = [(m["mirror_id"], h) for m in doc.get("mirrors") or [] for h in m.get("holds", ())]
        if holds:
            table = Table(box=None, pad_edge=False)
            for column in ("mirror", "topic", "in sync", "stored", "synced", "end", "lag"):
                table.add_column(column, justify="left" if column in ("mirror", "topic", "in sync")
                                 else "right")  # fmt: skip
            for mirror_id, h in holds:
                table.add_row(
                    mirror_id, h["topic_name"], "yes" if h["in_sync"] else "NO",
                    str(h["stored_offset"]), str(h["synced_offset"]), str(h["end_offset"]),
                    str(h["lag_messages"]),
                )  # fmt: skip
            console.print(table)


def mirror_lines(address: str, doc: dict[str, Any]) -> list[str]:
    """A node's replication in a few lines (``/mirror``, or ``/stats``' ``mirror`` and
    ``mirrors`` keys): shared by ``mirror status`` and ``lmqadmin stats``."""
    lines = []
    m = doc.get("mirror")
    if m:
        contact = m["seconds_since_contact"]
        last = "never" if contact < 0 else f"{contact:.1f}s ago"
        lag = max((t["lag_messages"] for t in m["topics"]), default=0)
        lag_s = max((t["lag_seconds"] for t in m["topics"]), default=0.0)
        gap = sum(t["gap_messages"] for t in m["topics"])
        lines.append(
            f"{address}: mirror of {m['primary']} (epoch {m['epoch']}): {m['state']}, lag "
            f"{lag} msgs / {lag_s:.1f}s, last contact {last}"
            + (f", GAP {gap} msgs" if gap else "")
            + (f", error: {m['last_error']}" if m["last_error"] else "")
        )
    elif "role" in doc:
        took = doc.get("promoted_from")
        lines.append(
            f"{address}: primary (epoch {doc['epoch']})"
            + (f", promoted from {took['address']}" if took else "")
        )
    elif doc.get("mirrors"):
        lines.append(f"{address}: primary with {len(doc['mirrors'])} mirror(s)")
    for link in doc.get("mirrors") or []:
        contact = link["seconds_since_contact"]
        last = "not since start" if contact < 0 else f"{contact:.1f}s ago"
        lines.append(
            f"  mirror {link['mirror_id']} at {link['address'] or link['remote_address']}: "
            f"{_in_sync(link)}, lag {link['lag_messages']} msgs, last contact {last}"
            + (f", released {link['released_messages']}" if link["released_messages"] else "")
        )
    insync = doc.get("min_insync")
    if insync:
        below = insync["topics_below"]
        lines.append(
            f"  --min-insync-mirrors={insync['min_insync_mirrors']}: "
            f"{insync['waiting_publishes']} publish(es) waiting; held "
            f"{insync['held_publishes']}, refused {insync['refused_publishes']}, timed out "
            f"{insync['timed_out_publishes']}"
            + (f"; TOO FEW IN SYNC on {len(below)} topic(s): {', '.join(below[:5])}"
               + (" ..." if len(below) > 5 else "") if below else "")
        )  # fmt: skip
    return lines


def _in_sync(link: dict[str, Any]) -> str:
    """A mirror's in-sync state (docs/mirrors.md) in a few words."""
    if link.get("in_sync"):
        return f"in sync for {max(time.time() - link['in_sync_since'], 0.0):.0f}s"
    return f"NOT in sync ({link.get('topics_in_sync', 0)} of {link['topics']} topic(s))"

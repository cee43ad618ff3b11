"""``lmqadmin stats --clients``: every connection of every daemon, one row each.

nsqadmin's client view, from ``/stats?include_clients=true``: consumers per topic/channel (their
address, user agent, RDY, in flight, delivered, finished, requeued, how long connected, TLS and
compression) and publishers with their per-topic counts. As in ``stats``, a rate needs two
samples: a consumer's ``fin/s`` is the growth of its ``finish_count`` between polls, a
publisher's ``pub/s`` the growth of its total published count, keyed by daemon and remote address
(a reconnecting client gets a new address, so it starts without a rate).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import attrs
from rich.console import Group
from rich.table import Table

from lmq_client.admin.columns import Column, human_count, human_duration, make_table
from lmq_client.http import HTTPClient

__all__ = ["ClientsSnapshot", "clients_json", "render_clients", "sample_clients"]

ConsumerKey = tuple[str, str, str, str]
"""(node, topic, channel, remote address)."""
ProducerKey = tuple[str, str]
"""(node, remote address)."""


@attrs.define
class ClientsSnapshot:
    """One poll of every daemon's connections."""

    taken_at: float
    wall_time: float
    nodes: list[str]
    consumers: dict[ConsumerKey, dict[str, Any]]
    """nsqd's client objects, with ``"rate"`` (FINs per second) added when known."""
    producers: dict[ProducerKey, dict[str, Any]]
    """nsqd's producer objects, with ``"rate"`` (messages published per second) when known."""


def sample_clients(
    clients: Sequence[HTTPClient],
    topic: str | None = None,
    channel: str | None = None,
    previous: ClientsSnapshot | None = None,
) -> ClientsSnapshot:
    """Poll every daemon's /stats with clients once; rates from ``previous`` when given."""
    taken_at = time.monotonic()
    consumers: dict[ConsumerKey, dict[str, Any]] = {}
    producers: dict[ProducerKey, dict[str, Any]] = {}
    for client in clients:
        data = client.stats(topic, channel, include_clients=True)
        for t in data.get("topics") or []:
            for c in t.get("channels") or []:
                for conn in c.get("clients") or []:
                    key = (client.address, t["topic_name"], c["channel_name"],
                           str(conn.get("remote_address", "")))
                    consumers[key] = dict(conn)
        for p in data.get("producers") or []:
            producers[(client.address, str(p.get("remote_address", "")))] = dict(p)
    snap = ClientsSnapshot(taken_at, time.time(), [c.address for c in clients], consumers,
                           producers)
    if previous is not None:
        elapsed = taken_at - previous.taken_at
        for ckey, conn in consumers.items():
            before = previous.consumers.get(ckey)
            if before is not None and elapsed > 0:
                grown = int(conn.get("finish_count", 0)) - int(before.get("finish_count", 0))
                conn["rate"] = max(grown, 0) / elapsed
        for pkey, prod in producers.items():
            earlier = previous.producers.get(pkey)
            if earlier is not None and elapsed > 0:
                conn_rate = _published(prod) - _published(earlier)
                prod["rate"] = max(conn_rate, 0) / elapsed
    return snap


def _published(producer: dict[str, Any]) -> int:
    return sum(int(p.get("count", 0)) for p in producer.get("pub_counts") or [])


def _flags(conn: dict[str, Any]) -> str:
    flags = [name for name in ("tls", "snappy", "deflate") if conn.get(name)]
    if conn.get("tls") and conn.get("tls_version"):
        flags[0] = f"tls ({conn['tls_version']})"
    return ", ".join(flags) or "-"


def _rate(conn: dict[str, Any]) -> str:
    rate = conn.get("rate")
    return "-" if rate is None else f"{rate:,.1f}"


def _connected(conn: dict[str, Any], now: float) -> str:
    ts = conn.get("connect_ts")
    return human_duration(now - float(ts)) if isinstance(ts, int | float) and ts else "-"


def render_clients(snap: ClientsSnapshot, width: int = 200) -> Group:
    """Consumers, then publishers (when there are any), each table fitted to ``width``."""
    several = len(snap.nodes) > 1
    rows = sorted(snap.consumers.items())
    n = human_count
    columns = [
        Column("topic / channel", [f"{k[1]}/{k[2]}" for k, _ in rows], 0, "left"),
        Column("address", [k[3] for k, _ in rows], 1, "left"),
        Column("user agent", [str(c.get("user_agent") or "-") for _, c in rows], 7, "left"),
        Column("RDY", [n(int(c.get("ready_count", 0))) for _, c in rows], 3),
        Column("in-flight", [n(int(c.get("in_flight_count", 0))) for _, c in rows], 2),
        Column("delivered", [n(int(c.get("message_count", 0))) for _, c in rows], 8),
        Column("finished", [n(int(c.get("finish_count", 0))) for _, c in rows], 4),
        Column("fin/s", [_rate(c) for _, c in rows], 5),
        Column("requeued", [n(int(c.get("requeue_count", 0))) for _, c in rows], 6),
        Column("connected", [_connected(c, snap.wall_time) for _, c in rows], 9),
        Column("tls / compression", [_flags(c) for _, c in rows], 10, "left"),
        Column("client id", [str(c.get("client_id") or "-") for _, c in rows], 11, "left"),
    ]
    if several:
        columns.insert(1, Column("node", [k[0] for k, _ in rows], 1, "left"))
    if not rows:
        for column in columns:
            column.cells = ["(no consumers)" if column.priority == 0 else ""]
    tables: list[Table] = [
        make_table(f"lmq consumers: {', '.join(snap.nodes)}", columns, width)
    ]
    if snap.producers:
        prows = sorted(snap.producers.items())
        pcolumns = [
            Column("address", [k[1] for k, _ in prows], 0, "left"),
            Column("published", [n(_published(p)) for _, p in prows], 1),
            Column("pub/s", [_rate(p) for _, p in prows], 2),
            Column("topics", [", ".join(str(c.get("topic")) for c in p.get("pub_counts") or [])
                              or "-" for _, p in prows], 4, "left"),
            Column("user agent", [str(p.get("user_agent") or "-") for _, p in prows], 5, "left"),
            Column("connected", [_connected(p, snap.wall_time) for _, p in prows], 6),
            Column("tls / compression", [_flags(p) for _, p in prows], 7, "left"),
        ]
        if several:
            pcolumns.insert(1, Column("node", [k[0] for k, _ in prows], 3, "left"))
        tables.append(make_table("lmq publishers", pcolumns, width))
    return Group(*tables)


def clients_json(snap: ClientsSnapshot) -> dict[str, Any]:
    """``--json``: every consumer and publisher with its node (and topic/channel), nsqd's fields,
    ``connected_s`` and ``rate`` (null without a second sample)."""
    return {
        "nodes": snap.nodes,
        "consumers": [
            {"node": k[0], "topic": k[1], "channel": k[2], **_with_age(c, snap.wall_time)}
            for k, c in sorted(snap.consumers.items())
        ],
        "producers": [
            {"node": k[0], **_with_age(p, snap.wall_time)}
            for k, p in sorted(snap.producers.items())
        ],
    }


def _with_age(conn: dict[str, Any], now: float) -> dict[str, Any]:
    ts = conn.get("connect_ts")
    age = round(now - float(ts), 3) if isinstance(ts, int | float) and ts else None
    return {**conn, "connected_s": age, "rate": conn.get("rate")}

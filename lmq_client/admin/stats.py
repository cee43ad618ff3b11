"""``lmqadmin stats``: /stats of one or more daemons, per topic and channel, as a table.

A topic with a publish policy (lmqd) adds its counters (``overflow_dropped_count``,
``overflow_refused_count``, ``rate_limited_count``, ``deduplicated_count``): a "policy" column
in the table (shown only when some topic has them) and the same keys in ``--json``.

Rates need two samples: a row's rate is the growth of its ``message_count`` between two polls
divided by the time between them (nsq_stat's ingress column), its out rate the growth of what
has left it: for a channel ``message_count - depth - in_flight - deferred`` (finished, or
emptied), for a topic ``message_count - depth`` (handed to its channels) -- nsq_stat's egress.
Across daemons counts are summed; an e2e latency percentile is the highest any daemon reports (the
conservative choice: nsqadmin averages them, which hides one slow node). With several daemons
the table gets a node column: each topic and channel has its total row, then one row per
daemon that has it.

Storage damage (lmqd's extra ``storage_damage`` key in /stats: corrupt regions set aside,
messages lost, positions rebuilt) is summed like the counts; the table shows it in its caption,
one line per topic or channel that has any, so an operator sees it without a column that is
zero almost always. nsqd has no such key: its rows simply have none.

At rest (lmqd's extra ``stored_bytes`` and ``logical_bytes`` keys of a topic: its log's files as
stored, and what they would take with every batch plain): a "stored" column with the bytes on
disk and the compression ratio (``logical / stored``, ``3.2x``), shown when some daemon reports
them; ``--json`` has both counts and ``compression_ratio``.

Replication (lmqd's ``mirror`` and ``mirrors`` keys, docs/mirrors.md) goes in the caption too: a
mirror's primary, state, lag and gap, a primary's mirrors (``admin/mirror.py``'s lines).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
from rich.markup import escape
from rich.table import Table

from lmq_client.admin.columns import Column, human_bytes, human_count, make_table
from lmq_client.admin.mirror import mirror_lines
from lmq_client.http import HTTPClient

__all__ = ["Row", "Snapshot", "missing", "render_table", "sample", "snapshot_json"]

_COUNTS = (
    "depth",
    "backend_depth",
    "in_flight_count",
    "deferred_count",
    "message_count",
    "requeue_count",
    "timeout_count",
    "client_count",
    # lmqd's channel-policy counters (a topic's are its channels' sums; 0 from nsqd)
    "dead_letter_count",
    "expired_count",
    "max_attempts_dropped_count",
)

POLICY_COUNTS = (
    "overflow_dropped_count",
    "overflow_refused_count",
    "rate_limited_count",
    "deduplicated_count",
)
"""lmqd's topic publish policy counters (absent from nsqd's /stats and for topics without)."""

_POLICY_LABELS = ("dropped", "refused", "rate-limited", "deduplicated")


@attrs.define
class Row:
    """Totals for one topic (``channel`` None) or one channel, over all daemons."""

    topic: str
    channel: str | None
    counts: dict[str, int] = attrs.field(factory=lambda: dict.fromkeys(_COUNTS, 0))
    paused: bool = False
    e2e: dict[float, float] = attrs.field(factory=dict)
    """quantile -> nanoseconds."""
    rate: float | None = None
    """Messages per second into the topic/channel since the previous sample."""
    policy: dict[str, int] | None = None
    """A topic's publish policy counters, summed over the daemons that report them."""
    out_rate: float | None = None
    """Messages per second out of it (finished; a topic's: handed to its channels)."""
    damage: dict[str, int] = attrs.field(factory=dict)
    """lmqd's ``storage_damage`` counters, summed (empty when no daemon reported any)."""
    at_rest: tuple[int, int] | None = None
    """A topic's (stored, logical) bytes of its log, summed (None: no daemon reports them)."""

    @property
    def compression_ratio(self) -> float | None:
        """Logical over stored bytes (None without at-rest figures or with nothing stored)."""
        if self.at_rest is None or not self.at_rest[0]:
            return None
        return self.at_rest[1] / self.at_rest[0]

    @property
    def gone(self) -> int:
        """Messages that have left: all put in, less those still held."""
        c = self.counts
        held = c["depth"]
        if self.channel is not None:
            held += c["in_flight_count"] + c["deferred_count"]
        return c["message_count"] - held


Key = tuple[str, str | None]
"""(topic, None) for a topic, (topic, channel) for a channel."""


@attrs.define
class Snapshot:
    """One poll of every daemon: rows in display order (each topic, then its channels)."""

    taken_at: float
    nodes: list[str]
    rows: dict[Key, Row]
    """Totals over every daemon."""
    per_node: dict[str, dict[Key, Row]] = attrs.field(factory=dict)
    """Each daemon's own rows, by its HTTP address."""
    replication: dict[str, dict[str, Any]] = attrs.field(factory=dict)
    """lmqd's ``mirror`` (a mirror's view of its primary), ``mirrors`` and ``min_insync`` (a
    primary's) keys of each daemon's /stats that has them (docs/mirrors.md)."""


def sample(
    clients: Sequence[HTTPClient],
    topic: str | None = None,
    channel: str | None = None,
    previous: Snapshot | None = None,
) -> Snapshot:
    """Poll every daemon's /stats once; rates from ``previous`` when given."""
    rows: dict[Key, Row] = {}
    per_node: dict[str, dict[Key, Row]] = {}
    replication: dict[str, dict[str, Any]] = {}
    taken_at = time.monotonic()
    for client in clients:
        data = client.stats(topic, channel)
        topics = data.get("topics") or []
        _merge(rows, topics, channel)
        node_rows: dict[Key, Row] = {}
        _merge(node_rows, topics, channel)
        per_node[client.address] = node_rows
        shown = {key: data[key] for key in ("mirror", "mirrors", "min_insync") if data.get(key)}
        if shown:
            replication[client.address] = shown
    snap = Snapshot(
        taken_at=taken_at, nodes=[c.address for c in clients], rows=rows, per_node=per_node,
        replication=replication,
    )  # fmt: skip
    if previous is not None:
        elapsed = taken_at - previous.taken_at
        _rates(rows, previous.rows, elapsed)
        for node, node_rows in per_node.items():
            _rates(node_rows, previous.per_node.get(node, {}), elapsed)
    return dict_sorted(snap)


def _rates(rows: Mapping[Key, Row], before: Mapping[Key, Row], elapsed: float) -> None:
    for key, row in rows.items():
        earlier = before.get(key)
        if earlier is not None and elapsed > 0:
            grown = row.counts["message_count"] - earlier.counts["message_count"]
            row.rate = max(grown, 0) / elapsed
            row.out_rate = max(row.gone - earlier.gone, 0) / elapsed


def missing(snap: Snapshot, topic: str | None, channel: str | None) -> str | None:
    """What ``stats TOPIC [CHANNEL]`` asked for that no daemon has (a one-line message), or None.

    nsqd's ``/stats?topic=`` of an unknown topic answers an empty list rather than an error, so
    this is where "no such topic" is noticed.
    """
    nodes = ", ".join(snap.nodes)
    if topic is not None and (topic, None) not in snap.rows:
        return f"topic {topic} not found on {nodes}"
    if topic is not None and channel is not None and (topic, channel) not in snap.rows:
        return f"channel {topic}/{channel} not found on {nodes}"
    return None


def dict_sorted(snap: Snapshot) -> Snapshot:
    snap.rows = dict(sorted(snap.rows.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")))
    return snap


def _merge(rows: dict[Key, Row], topics: list[Any], channel: str | None) -> None:
    for t in topics:
        name = t["topic_name"]
        row = rows.setdefault((name, None), Row(name, None))
        _add(row, t)
        client_total = 0
        for c in t.get("channels") or []:
            crow = rows.setdefault((name, c["channel_name"]), Row(name, c["channel_name"]))
            _add(crow, c)
            client_total += int(c.get("client_count") or 0)
        row.counts["client_count"] += client_total
        # A topic has no in-flight/deferred of its own: show its channels' totals.
        for key in ("in_flight_count", "deferred_count", "requeue_count", "timeout_count"):
            row.counts[key] += sum(int(c.get(key) or 0) for c in t.get("channels") or [])


def _add(row: Row, data: Mapping[str, Any]) -> None:
    for key in _COUNTS:
        if key == "client_count" and row.channel is None:
            continue
        value = data.get(key)
        if isinstance(value, int):
            row.counts[key] += value
    if row.channel is None and any(key in data for key in POLICY_COUNTS):
        policy = row.policy if row.policy is not None else dict.fromkeys(POLICY_COUNTS, 0)
        for key in POLICY_COUNTS:
            value = data.get(key)
            if isinstance(value, int):
                policy[key] += value
        row.policy = policy
    row.paused = row.paused or bool(data.get("paused"))
    e2e = data.get("e2e_processing_latency") or {}
    for p in e2e.get("percentiles") or []:
        q, v = float(p["quantile"]), float(p["value"])
        row.e2e[q] = max(row.e2e.get(q, 0.0), v)
    stored, logical = data.get("stored_bytes"), data.get("logical_bytes")
    if row.channel is None and isinstance(stored, int) and isinstance(logical, int):
        before = row.at_rest or (0, 0)
        row.at_rest = (before[0] + stored, before[1] + logical)
    damage = data.get("storage_damage")
    if isinstance(damage, Mapping):
        for key, value in damage.items():
            if isinstance(value, int) and value:
                row.damage[key] = row.damage.get(key, 0) + value


def _damage_text(row: Row) -> str:
    d = row.damage
    parts = [
        f"{d.get('regions', 0)} region(s) set aside ({d.get('bytes', 0)} bytes)",
        f"at least {d.get('lost_messages', 0)} message(s) lost",
    ]
    if d.get("missing_segments"):
        parts.append(f"{d['missing_segments']} segment(s) missing")
    if d.get("rebuilt_positions"):
        parts.append(f"positions rebuilt {d['rebuilt_positions']} time(s)")
    where = row.topic if row.channel is None else f"{row.topic}/{row.channel}"
    return f"storage damage in {where}: " + ", ".join(parts)


def _fmt_latency(ns: float) -> str:
    if ns >= 1e9:
        return f"{ns / 1e9:.2f}s"
    if ns >= 1e6:
        return f"{ns / 1e6:.1f}ms"
    return f"{ns / 1e3:.0f}us"


def _e2e_text(e2e: Mapping[float, float]) -> str:
    if not e2e:
        return "-"
    return " ".join(f"p{q * 100:g}={_fmt_latency(v)}" for q, v in sorted(e2e.items()))


# (header, priority): the first kept, the last dropped first on a narrow terminal.
_COLUMNS = (("depth", 2), ("mem", 16), ("disk", 15), ("in-flight", 3), ("deferred", 9),
            ("requeued", 10), ("timed out", 11), ("messages", 6), ("rate/s", 4), ("out/s", 5),
            ("clients", 7), ("dead-lettered", 8), ("expired", 12), ("dropped", 13),
            ("e2e latency", 14))  # fmt: skip


def _cells(row: Row) -> list[str]:
    c = row.counts
    n = human_count
    return [
        n(c["depth"]),
        n(c["depth"] - c["backend_depth"]),
        n(c["backend_depth"]),
        n(c["in_flight_count"]),
        n(c["deferred_count"]),
        n(c["requeue_count"]),
        n(c["timeout_count"]),
        n(c["message_count"]),
        "-" if row.rate is None else f"{row.rate:,.1f}",
        "-" if row.out_rate is None else f"{row.out_rate:,.1f}",
        n(c["client_count"]),
        n(c["dead_letter_count"]),
        n(c["expired_count"]),
        n(c["max_attempts_dropped_count"]),
        _e2e_text(row.e2e),
    ]


def _at_rest_text(row: Row) -> str:
    if row.at_rest is None:
        return "-" if row.channel is None else ""
    ratio = row.compression_ratio
    stored = human_bytes(row.at_rest[0])
    return stored if ratio is None else f"{stored} {ratio:.1f}x"


def _policy_text(row: Row) -> str:
    if row.policy is None:
        return "-" if row.channel is None else ""
    shown = [
        f"{label} {row.policy[key]}"
        for key, label in zip(POLICY_COUNTS, _POLICY_LABELS, strict=True)
        if row.policy[key]
    ]
    return ", ".join(shown) or "0"


POLICY_PRIORITY = 1
"""The policy column, when some topic has publish policies, is kept before the others: it is
what the operator who set a policy came to see."""
AT_REST_PRIORITY = 17
"""The stored column goes first on a narrow terminal (``--json`` always has it)."""


def render_table(snap: Snapshot, width: int = 200) -> Table:
    """The snapshot as a rich table no wider than ``width``: one row per topic, its channels
    indented below it; with several daemons a node column, and under each total row one row per
    daemon; a policy column when some topic has publish policies. Columns that do not fit are
    dropped, least important first (``columns.fit``)."""
    several = len(snap.nodes) > 1
    names: list[str] = []
    nodes: list[str] = []
    bold: list[bool] = []
    cells: list[list[str]] = []
    policy_texts: list[str] = []
    at_rest_texts: list[str] = []
    for key, row in snap.rows.items():
        name = row.topic if row.channel is None else f"  {row.channel}"
        if row.paused:
            name += " (paused)"
        per_node = [(node, rows[key]) for node, rows in snap.per_node.items() if key in rows]
        names.append(name)
        bold.append(row.channel is None)
        nodes.append(f"all ({len(per_node)})")
        cells.append(_cells(row))
        policy_texts.append(_policy_text(row))
        at_rest_texts.append(_at_rest_text(row))
        if several:
            for node, node_row in per_node:
                names.append("")
                bold.append(False)
                nodes.append(node)
                cells.append(_cells(node_row))
                policy_texts.append(_policy_text(node_row))
                at_rest_texts.append(_at_rest_text(node_row))
    if not snap.rows:
        names, bold, nodes = ["(no topics)"], [False], [""]
        cells = [[""] * len(_COLUMNS)]
        policy_texts = [""]
        at_rest_texts = [""]
    columns = [Column("topic / channel", names, 0, "left")]
    if several:
        columns.append(Column("node", nodes, 1, "left"))
    for i, (header, priority) in enumerate(_COLUMNS):
        justify = "left" if header == "e2e latency" else "right"
        columns.append(Column(header, [r[i] for r in cells], priority, justify))
    policies = any(
        row.policy is not None
        for rows in (snap.rows, *snap.per_node.values())
        for row in rows.values()
    )
    if any(row.at_rest is not None for row in snap.rows.values()):
        columns.append(Column("stored", at_rest_texts, AT_REST_PRIORITY, "right"))
    if policies:
        columns.append(Column("policy", policy_texts, POLICY_PRIORITY, "left"))
    table = make_table(f"lmq stats: {', '.join(snap.nodes)}", columns, width, bold_rows=bold)
    damaged = [f"[bold red]{_damage_text(row)}[/bold red]" for row in snap.rows.values()
               if row.damage]  # fmt: skip
    mirrors = [line for node, doc in snap.replication.items() for line in mirror_lines(node, doc)]
    if damaged or mirrors:
        lines = damaged + [escape(line) for line in mirrors]
        if table.caption:
            lines.append(str(table.caption))
        table.caption = "\n".join(lines)
    return table


def snapshot_json(snap: Snapshot) -> dict[str, Any]:
    """The snapshot as JSON-ready data (``--json``): topics with their channels nested, and
    each topic's and channel's rows per daemon under ``"per_node"``."""
    topics: list[dict[str, Any]] = []
    by_topic: dict[str, dict[str, Any]] = {}
    for key, row in snap.rows.items():
        entry = _row_json(row)
        entry["per_node"] = [
            {"node": node, **_row_json(rows[key])}
            for node, rows in snap.per_node.items()
            if key in rows
        ]
        if row.channel is None:
            entry = {"topic": row.topic, **entry, "channels": []}
            by_topic[row.topic] = entry
            topics.append(entry)
        else:
            parent = by_topic.get(row.topic)
            if parent is not None:
                parent["channels"].append({"channel": row.channel, **entry})
    return {"nodes": snap.nodes, "topics": topics, "replication": snap.replication}


def _row_json(row: Row) -> dict[str, Any]:
    return {
        **row.counts,
        **(row.policy or {}),
        "paused": row.paused,
        "rate": row.rate,
        "out_rate": row.out_rate,
        "e2e_processing_latency_ns": {f"{q:g}": v for q, v in sorted(row.e2e.items())},
        "storage_damage": dict(row.damage),
        **(
            {}
            if row.at_rest is None
            else {
                "stored_bytes": row.at_rest[0],
                "logical_bytes": row.at_rest[1],
                "compression_ratio": row.compression_ratio,
            }
        ),
    }

"""What the pages show, computed from one sample of every node's ``/stats``: plain functions
over plain data, no I/O (the sampler fetches, the pages render).

A ``Snapshot`` is one sampling round: each ``Node`` with the ``/stats`` document it answered
(or the error it gave) and its message rates since the round before. The aggregations are
nsqadmin's: a topic or channel is the sum of its rows on every node (``depth`` is memory +
disk, without in-flight and deferred, as nsqd counts it), e2e latency percentiles are averaged
over the nodes that have any (nsqadmin's rule), and the rates are the change of
``message_count`` between two rounds over the time between them. Each aggregate is computed once
per snapshot (``functools.cached_property``), so any number of page views of one round cost one
aggregation.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

from lmqd.net import format_address

__all__ = ["ChannelRow", "ClientRow", "Node", "Snapshot", "StatRow", "TopicRow"]

RateKey = tuple[str, str, str]
"""(node http address, topic, channel or "" for the topic itself)."""


@attrs.frozen
class Node:
    """One lmqd (or nsqd) node, as given or as a lookupd lists it, and what it answered."""

    http_address: str
    hostname: str = ""
    broadcast_address: str = ""
    tcp_port: int | None = None
    version: str = ""
    lookupd_conns: int = 0
    """How many of the console's lookupds list this node (nsqadmin's "Lookupd Conns")."""
    tombstoned: frozenset[str] = frozenset()
    stats: Mapping[str, Any] | None = None
    error: str | None = None

    @property
    def tcp_address(self) -> str | None:
        if self.tcp_port is None:
            return None
        host = self.broadcast_address or self.http_address.rpartition(":")[0].strip("[]")
        return format_address((host, self.tcp_port))

    @property
    def http_port(self) -> int:
        return int(self.http_address.rpartition(":")[2])

    @property
    def topics(self) -> list[Mapping[str, Any]]:
        return list((self.stats or {}).get("topics") or [])


@attrs.define(slots=True)
class StatRow:
    """The counters nsqadmin shows for a topic or channel, on one node or summed."""

    depth: int = 0
    backend_depth: int = 0
    in_flight: int = 0
    deferred: int = 0
    requeued: int = 0
    timed_out: int = 0
    messages: int = 0
    clients: int = 0
    channels: int = 0
    rate: float | None = None
    paused: bool = False
    dead_lettered: int = 0
    expired: int = 0
    e2e: list[tuple[float, float]] = attrs.Factory(list)
    """(quantile, nanoseconds) pairs."""

    @property
    def memory_depth(self) -> int:
        return max(0, self.depth - self.backend_depth)

    def add(self, other: StatRow) -> None:
        for name in ("depth", "backend_depth", "in_flight", "deferred", "requeued", "timed_out",
                     "messages", "clients", "channels", "dead_lettered", "expired"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        if other.rate is not None:
            self.rate = (self.rate or 0.0) + other.rate
        self.paused = self.paused or other.paused


def _e2e(doc: Mapping[str, Any]) -> list[tuple[float, float]]:
    block = doc.get("e2e_processing_latency") or {}
    if not block.get("count"):
        return []
    return [(float(p["quantile"]), float(p["value"])) for p in block.get("percentiles") or []]


def average_e2e(rows: Iterable[StatRow]) -> list[tuple[float, float]]:
    """nsqadmin's aggregate: per quantile, the mean over the rows that have values."""
    sums: dict[float, list[float]] = {}
    for row in rows:
        for quantile, value in row.e2e:
            sums.setdefault(quantile, []).append(value)
    return [(q, sum(v) / len(v)) for q, v in sorted(sums.items())]


def channel_row(doc: Mapping[str, Any], rate: float | None) -> StatRow:
    return StatRow(
        depth=int(doc.get("depth", 0)),
        backend_depth=int(doc.get("backend_depth", 0)),
        in_flight=int(doc.get("in_flight_count", 0)),
        deferred=int(doc.get("deferred_count", 0)),
        requeued=int(doc.get("requeue_count", 0)),
        timed_out=int(doc.get("timeout_count", 0)),
        messages=int(doc.get("message_count", 0)),
        clients=int(doc.get("client_count", 0)),
        rate=rate,
        paused=bool(doc.get("paused")),
        dead_lettered=int(doc.get("dead_letter_count", 0)),
        expired=int(doc.get("expired_count", 0)),
        e2e=_e2e(doc),
    )


def topic_row(doc: Mapping[str, Any], rate: float | None) -> StatRow:
    row = StatRow(
        depth=int(doc.get("depth", 0)),
        backend_depth=int(doc.get("backend_depth", 0)),
        messages=int(doc.get("message_count", 0)),
        rate=rate,
        paused=bool(doc.get("paused")),
        e2e=_e2e(doc),
    )
    channels = doc.get("channels") or []
    row.channels = len(channels)
    for channel in channels:
        row.in_flight += int(channel.get("in_flight_count", 0))
        row.deferred += int(channel.get("deferred_count", 0))
        row.requeued += int(channel.get("requeue_count", 0))
        row.timed_out += int(channel.get("timeout_count", 0))
        row.clients += int(channel.get("client_count", 0))
        row.dead_lettered += int(channel.get("dead_letter_count", 0))
        row.expired += int(channel.get("expired_count", 0))
    return row


@attrs.frozen
class TopicRow:
    """A topic over every node: the total and one row per node that has it."""

    name: str
    total: StatRow
    nodes: list[tuple[Node, StatRow]]
    channels: list[ChannelRow]


@attrs.frozen
class ChannelRow:
    topic: str
    name: str
    total: StatRow
    nodes: list[tuple[Node, StatRow]]
    clients: list[ClientRow]


@attrs.frozen
class ClientRow:
    node: Node
    client_id: str
    hostname: str
    remote_address: str
    user_agent: str
    version: str
    tls: bool
    tls_version: str
    snappy: bool
    deflate: bool
    authed: bool
    auth_identity: str
    ready: int
    in_flight: int
    messages: int
    finished: int
    requeued: int
    connected_for_s: float


def _client(node: Node, doc: Mapping[str, Any], now: float) -> ClientRow:
    connected = float(doc.get("connect_ts", 0) or 0)
    return ClientRow(
        node=node,
        client_id=str(doc.get("client_id", "")),
        hostname=str(doc.get("hostname", "")),
        remote_address=str(doc.get("remote_address", "")),
        user_agent=str(doc.get("user_agent", "")),
        version=str(doc.get("version", "")),
        tls=bool(doc.get("tls")),
        tls_version=str(doc.get("tls_version", "")),
        snappy=bool(doc.get("snappy")),
        deflate=bool(doc.get("deflate")),
        authed=bool(doc.get("authed")),
        auth_identity=str(doc.get("auth_identity", "")),
        ready=int(doc.get("ready_count", 0)),
        in_flight=int(doc.get("in_flight_count", 0)),
        messages=int(doc.get("message_count", 0)),
        finished=int(doc.get("finish_count", 0)),
        requeued=int(doc.get("requeue_count", 0)),
        connected_for_s=max(0.0, now - connected) if connected else 0.0,
    )


@attrs.frozen(kw_only=True)
class Snapshot:
    """One sampling round: the nodes, what each answered, and the rates since the round before."""

    at: float
    """Wall-clock time of the round (seconds since the epoch)."""
    nodes: tuple[Node, ...]
    rates: Mapping[RateKey, float] = attrs.field(factory=dict)
    lookupd_errors: tuple[str, ...] = ()

    @functools.cached_property
    def topics(self) -> dict[str, TopicRow]:
        """Every topic on any node, by name (sorted), with its channels and clients."""
        found: dict[str, list[tuple[Node, Mapping[str, Any]]]] = {}
        for node in self.nodes:
            for doc in node.topics:
                found.setdefault(str(doc["topic_name"]), []).append((node, doc))
        return {name: self._topic(name, found[name]) for name in sorted(found)}

    def _topic(self, name: str, per_node: Sequence[tuple[Node, Mapping[str, Any]]]) -> TopicRow:
        total = StatRow()
        rows = []
        channels: dict[str, list[tuple[Node, Mapping[str, Any]]]] = {}
        for node, doc in per_node:
            row = topic_row(doc, self.rates.get((node.http_address, name, "")))
            rows.append((node, row))
            total.add(row)
            for channel in doc.get("channels") or []:
                channels.setdefault(str(channel["channel_name"]), []).append((node, channel))
        total.e2e = average_e2e(r for _, r in rows)
        return TopicRow(
            name=name, total=total, nodes=rows,
            channels=[self._channel(name, c, channels[c]) for c in sorted(channels)],
        )  # fmt: skip

    def _channel(
        self, topic: str, name: str, per_node: Sequence[tuple[Node, Mapping[str, Any]]]
    ) -> ChannelRow:
        total = StatRow()
        rows = []
        clients: list[ClientRow] = []
        for node, doc in per_node:
            row = channel_row(doc, self.rates.get((node.http_address, topic, name)))
            rows.append((node, row))
            total.add(row)
            clients.extend(_client(node, c, self.at) for c in doc.get("clients") or [])
        total.e2e = average_e2e(r for _, r in rows)
        return ChannelRow(topic=topic, name=name, total=total, nodes=rows, clients=clients)

    def node(self, address: str) -> Node | None:
        for node in self.nodes:
            if node.http_address == address:
                return node
        return None

    def nodes_with(self, topic: str) -> list[Node]:
        row = self.topics.get(topic)
        return [n for n, _ in row.nodes] if row else []

    @functools.cached_property
    def total_messages(self) -> int:
        """nsqadmin's counter: messages every channel of every node has taken."""
        return sum(c.total.messages for t in self.topics.values() for c in t.channels)

    @functools.cached_property
    def total_rate(self) -> float:
        return sum(c.total.rate or 0.0 for t in self.topics.values() for c in t.channels)


def rates_between(previous: Snapshot | None, current_at: float,
                  nodes: Iterable[Node]) -> dict[RateKey, float]:  # fmt: skip
    """Messages per second of every topic and channel on every node since ``previous``."""
    if previous is None:
        return {}
    elapsed = current_at - previous.at
    if elapsed <= 0:
        return {}
    before = message_counts(previous.nodes)
    rates = {}
    for key, count in message_counts(nodes).items():
        old = before.get(key)
        if old is not None and count >= old:
            rates[key] = (count - old) / elapsed
    return rates


def message_counts(nodes: Iterable[Node]) -> dict[RateKey, int]:
    counts: dict[RateKey, int] = {}
    for node in nodes:
        for topic in node.topics:
            name = str(topic["topic_name"])
            counts[(node.http_address, name, "")] = int(topic.get("message_count", 0))
            for channel in topic.get("channels") or []:
                key = (node.http_address, name, str(channel["channel_name"]))
                counts[key] = int(channel.get("message_count", 0))
    return counts

"""The source's offsets: what Spark keeps in the checkpoint, and offsets JSON in options.

A stream's position is one offset per topic and node, ``{"orders": {"10.0.0.1:4151": 1200}}``
(Kafka's shape, the node where Kafka has a partition): the offset the next read starts at.
``SourceOffsets`` is that document; Spark stores it as JSON in the checkpoint's ``offsets/`` log
and shows it in the query's progress (``startOffset``, ``endOffset``).

Lost messages. A query with ``failOnDataLoss=false`` goes on past offsets that are gone and
counts them under ``"#lost"`` (``{"#lost": {"orders": {"10.0.0.1:4151": 470}}}``), the total
since the checkpoint began: Spark's Python data sources cannot report custom metrics in the
progress, and the offsets are what the progress shows of a source. ``#`` is in no topic name.

Older checkpoints (one topic, written before ``subscribe``) hold ``{"node": offset}``; they are
read as the offsets of the query's one topic.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from lmq_client._util import check_name
from lmq_client.spark.nodes import NodeSpellings
from lmqd.net import split_address

__all__ = [
    "EARLIEST",
    "LATEST",
    "LOST_KEY",
    "ByNode",
    "SourceOffsets",
    "parse_by_node",
]

EARLIEST = -2
"""In offsets JSON: the node's earliest offset (Kafka's ``-2``)."""
LATEST = -1
"""In offsets JSON: the node's end, where its next message goes (Kafka's ``-1``)."""
LOST_KEY = "#lost"

ByNode = dict[str, dict[str, int]]
"""Integers by topic and node: offsets, or timestamps in ms."""


@dataclasses.dataclass(frozen=True)
class SourceOffsets:
    """Offsets by topic and node (``positions``) and the lost messages counted so far."""

    positions: Mapping[str, Mapping[str, int]]
    lost: Mapping[str, Mapping[str, int]] = dataclasses.field(default_factory=dict)

    def pairs(self) -> Iterator[tuple[str, str, int]]:
        """``(topic, node, offset)`` of every position."""
        for topic, nodes in self.positions.items():
            for node, offset in nodes.items():
                yield topic, node, offset

    def get(self, topic: str, node: str) -> int | None:
        return self.positions.get(topic, {}).get(node)

    def to_json(self) -> dict[str, Any]:
        """The JSON object Spark keeps (sorted, so equal offsets are equal JSON)."""
        doc: dict[str, Any] = {
            topic: dict(sorted(nodes.items())) for topic, nodes in sorted(self.positions.items())
        }
        lost = {t: dict(sorted(n.items())) for t, n in sorted(self.lost.items()) if n}
        if lost:
            doc[LOST_KEY] = lost
        return doc

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], topics: Sequence[str]) -> SourceOffsets:
        """Offsets as Spark hands them back; ``{"node": offset}`` (an older checkpoint) is
        read as the offsets of the query's one topic (``topics``)."""
        if doc and all(type(v) is int for v in doc.values()):
            if len(topics) != 1:
                raise ValueError(
                    "lmq source: the checkpoint holds offsets of one topic (written by an older "
                    "lmq source) and the query reads several; start it on a new checkpoint"
                )
            return cls({topics[0]: {str(k): int(v) for k, v in doc.items()}})
        positions = {t: n for t, n in doc.items() if t != LOST_KEY}
        return cls(_by_node(positions), _by_node(doc.get(LOST_KEY, {})))

    def respelled(self, spellings: NodeSpellings) -> SourceOffsets:
        """The same offsets keyed by the nodes known now: a key that is another spelling of a
        known node (``localhost:4151`` for ``127.0.0.1:4151``, its TCP address) becomes that
        node (the larger offset wins should two keys name one node)."""

        def respell(by_node: Mapping[str, Mapping[str, int]]) -> ByNode:
            out: ByNode = {}
            for topic, nodes in by_node.items():
                into = out.setdefault(topic, {})
                for key, value in nodes.items():
                    node = spellings.node_of(key) or key
                    into[node] = max(into.get(node, value), value)
            return out

        return SourceOffsets(respell(self.positions), respell(self.lost))


def _by_node(value: Mapping[str, Mapping[str, Any]]) -> ByNode:
    return {str(t): {str(n): int(o) for n, o in nodes.items()} for t, nodes in value.items()}


def parse_by_node(
    name: str, raw: str, topics: Sequence[str] | None, *, minimum: int
) -> ByNode:
    """An option's JSON of integers by topic and node, ``{"topic": {"host:port": n}}``, or
    ``{"host:port": n}`` when the query reads one topic (``topics``: the topics it reads, None
    for a pattern). ``ValueError`` naming the option and what is wrong."""
    try:
        doc = json.loads(raw)
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        raise ValueError(
            f"lmq source: option {name!r} must be a JSON object "
            f'{{"topic": {{"host:port": n}}}}, not {raw!r}'
        )
    if doc and all(not isinstance(v, dict) for v in doc.values()):
        if topics is None or len(topics) != 1:
            raise ValueError(
                f"lmq source: option {name!r} must name topics "
                f'({{"topic": {{"host:port": n}}}}) when the query reads several'
            )
        doc = {topics[0]: doc}
    result: ByNode = {}
    for topic, nodes in doc.items():
        try:
            check_name("topic", topic)
        except ValueError as exc:
            raise ValueError(f"lmq source: option {name!r}: {exc}") from None
        if topics is not None and topic not in topics:
            raise ValueError(
                f"lmq source: option {name!r} names topic {topic!r}, which the query does not "
                f"read ({', '.join(topics)})"
            )
        if not isinstance(nodes, dict):
            raise ValueError(f"lmq source: option {name!r}: topic {topic!r} must map nodes")
        into = result.setdefault(topic, {})
        for node, value in nodes.items():
            try:
                split_address(node)
            except ValueError as exc:
                raise ValueError(f"lmq source: option {name!r}: {exc}") from None
            if type(value) is not int or value < minimum:
                raise ValueError(
                    f"lmq source: option {name!r}: {topic} on {node}: {value!r} is not an "
                    f"integer of at least {minimum}"
                )
            into[node] = value
    return result

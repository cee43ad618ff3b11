"""The driver's view of the source's nodes: which daemons hold which topics, and what they say.

Nodes come three ways: ``httpAddress`` (read as given), ``address`` (the sink's TCP addresses,
whose HTTP API IDENTIFY tells: ``nodes.http_address_of``) and ``lookupdHttpAddress`` (every node
the lookupds' ``GET /nodes`` lists with its topics, tombstoned ones left out). A node given
directly may hold any topic; a node found through a lookupd holds the topics it lists.

The topics are the ``subscribe`` list, or with ``subscribePattern`` those the nodes have whose
whole name matches: found by asking each node for all its topics (``GET /topics/offsets``) and
each lookupd for its nodes, every ``lookupdPollIntervalMs`` (10 s), so a topic created while a
stream runs is read from its earliest offset within that time. In between, each micro-batch asks
each node once for the topics it reads (``GET /topics/offsets?topics=...``), whatever their
number.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Iterable, Mapping

from lmq_client.errors import ConnectionFailed, LmqClientError
from lmq_client.http import HTTPClient, HTTPError
from lmq_client.lookupd import lookup_nodes
from lmq_client.spark.errors import LmqSourceError
from lmq_client.spark.nodes import NodeSpellings, http_address_of, same_host
from lmq_client.spark.offsets import SourceOffsets
from lmq_client.spark.planner import Known
from lmq_client.spark.source_options import SourceOptions
from lmqd.net import split_address

__all__ = ["MAX_LISTED_TOPICS", "NodeAnswer", "NodeDirectory"]

log = logging.getLogger("lmq_client.spark")

MAX_LISTED_TOPICS = 100
"""Topics named in one ``/topics/offsets`` request at most; past that the request asks for all
of the node's topics instead (a URL of 100 names of 64 characters is 6.5 kB, within what any
HTTP server takes)."""

NodeAnswer = dict[str, Known] | None
"""A node's ``/topics/offsets`` answer (topics it does not have are absent), None when it did
not answer."""


class NodeDirectory:
    """The nodes and topics a query reads (see the module docstring); driver only."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self.spellings = NodeSpellings()
        self._given: dict[str, str | None] = dict.fromkeys(options.addresses)
        """``address`` entries and the node each one is (None: not found yet)."""
        self._http: list[str] = []
        """``httpAddress`` entries, one per node (two spellings of one daemon are one)."""
        for address in options.http_addresses:
            if self.spellings.node_of(address) is None:
                self.spellings.add(address)
                self._http.append(address)
        self._listed: dict[str, frozenset[str]] = {}
        """Nodes the lookupds list, with their topics."""
        self._topics: set[str] = set(options.topics)
        """The topics read: the ``subscribe`` list, or those found matching the pattern."""
        self._found_at = -math.inf
        self._unreachable: set[str] = set()
        self.replica_of: dict[str, list[str]] = {}
        """Per node, the nodes whose offsets it has (lmqd's ``replica_of``, docs/mirrors.md: a
        mirror's primary, or the primary a promoted mirror took over from)."""

    # -- which nodes, which topics -------------------------------------------------------------

    def discover(self, *, required: bool = False, force: bool = False) -> None:
        """Find the nodes (and, for a pattern, the topics) again if ``lookupdPollIntervalMs``
        has passed (or ``force``). ``required`` (a batch read, a stream's first plan): a given
        address that cannot be reached, or lookupds none of which answers, raise
        ``LmqClientError``; otherwise they are logged and tried again next time."""
        now = time.monotonic()
        if not force and now - self._found_at < self.options.lookupd_poll_interval_s:
            return
        self._found_at = now
        for address, node in self._given.items():
            if node is not None:
                continue
            try:
                node = http_address_of(address, timeout=self.options.timeout_s)
            except ConnectionFailed as exc:
                if required:
                    raise LmqSourceError(f"lmq source: option 'address': {exc}") from None
                log.warning("SPARK(%s): %s not reached; tried again in %gs",
                            self._name(), address, self.options.lookupd_poll_interval_s)
                continue
            node = self.spellings.node_of(node) or node  # one daemon given twice is one node
            self._given[address] = node
            self.spellings.add(node, address)
        if self.options.lookupd_addresses:
            self._ask_lookupds(required=required)
        if self.options.pattern is not None:
            self._match_topics()

    def _ask_lookupds(self, *, required: bool) -> None:
        listed: dict[str, set[str]] = {}
        failures = []
        for lookupd in self.options.lookupd_addresses:
            try:
                found = lookup_nodes(lookupd, timeout=self.options.timeout_s)
            except LmqClientError as exc:
                log.warning("SPARK(%s): lookupd %s: %s", self._name(), lookupd, exc)
                failures.append(lookupd)
                continue
            for entry in found:
                topics = {t for t in entry.topics if t not in entry.tombstoned}
                node = self.spellings.node_of(entry.http_address) or entry.http_address
                listed.setdefault(node, set()).update(topics)
        if len(failures) == len(self.options.lookupd_addresses):
            if required:
                raise LmqClientError(
                    f"lmq source: {self._name()}: no lookupd answered "
                    f"({', '.join(self.options.lookupd_addresses)})"
                )
            return  # none answered: keep what they said last
        self._listed = {node: frozenset(topics) for node, topics in listed.items()}
        for node in self._listed:
            self.spellings.add(node)

    def _match_topics(self) -> None:
        found = {t for topics in self._listed.values() for t in topics}
        for node in self.direct_nodes():
            answer = self._ask_node(node, None)
            if answer is not None:
                found.update(answer)
        matched = {t for t in found if self.options.reads(t)}
        for topic in sorted(matched - self._topics):
            log.info("SPARK(%s): new topic %r", self._name(), topic)
        self._topics |= matched

    def direct_nodes(self) -> list[str]:
        """The nodes given by address (found so far) and by HTTP address."""
        found = [node for node in self._given.values() if node is not None]
        return list(dict.fromkeys([*found, *self._http]))

    def topics(self) -> set[str]:
        """The topics read, as known now."""
        return set(self._topics)

    def wanted(self) -> dict[str, set[str]]:
        """The topics to ask each node about: every topic read on a node given directly, the
        topics its lookupds list (of those read) on a node found through them."""
        wanted: dict[str, set[str]] = {node: set(self._topics) for node in self.direct_nodes()}
        for node, topics in self._listed.items():
            wanted.setdefault(node, set()).update(t for t in topics if t in self._topics)
        return wanted

    # -- asking the nodes ----------------------------------------------------------------------

    def ask(self, wanted: Mapping[str, Iterable[str]]) -> dict[str, NodeAnswer]:
        """Each node's offsets of the topics wanted (one request per node), None for a node
        that did not answer (logged once when it stops answering and once when it is back)."""
        return {node: self._ask_node(node, list(topics)) for node, topics in wanted.items()}

    def _ask_node(self, node: str, topics: list[str] | None) -> NodeAnswer:
        try:
            result = self.fetch(node, topics)
        except LmqClientError as exc:
            if node not in self._unreachable:
                self._unreachable.add(node)
                log.warning("SPARK(%s): %s does not answer (%s); its offsets stay",
                            self._name(), node, _reason(exc))
            return None
        if node in self._unreachable:
            self._unreachable.discard(node)
            log.info("SPARK(%s): %s answers again", self._name(), node)
        return result

    def require(self, node: str, topics: Iterable[str] | None) -> dict[str, Known]:
        """``fetch``, its error naming where the node came from (a batch read, a stream's
        start: a node given that cannot be read fails the query)."""
        try:
            return self.fetch(node, topics)
        except LmqClientError as exc:
            raise LmqSourceError(f"lmq source: {self.origin(node)}: {exc}") from None

    def origin(self, node: str) -> str:
        """Where ``node`` comes from, as an error names it: the option (and the address given
        there), or the lookupds."""
        given = [a for a, n in self._given.items() if n == node]
        if given:
            return f"option 'address' ({given[0]})" if given[0] != node else "option 'address'"
        if node in self._http:
            return "option 'httpAddress'"
        return "a node the lookupds list"

    def fetch(self, node: str, topics: Iterable[str] | None) -> dict[str, Known]:
        """``node``'s offsets of ``topics`` (None: all its topics), those it has; raises
        ``LmqClientError`` naming the node when it cannot be asked."""
        names = None if topics is None else sorted(topics)
        params = {}
        if names is not None and len(names) <= MAX_LISTED_TOPICS:
            if not names:
                return {}
            params["topics"] = ",".join(names)
        client = HTTPClient(node, timeout=self.options.timeout_s)
        data = client.request("GET", "/topics/offsets", params)
        try:
            doc = json.loads(data)
            offsets = doc["topics"]
            result = {
                str(t): Known(int(o["earliest"]), int(o["end"])) for t, o in offsets.items()
            }
            replicas = [str(a) for a in doc.get("replica_of") or []]
        except (KeyError, TypeError, ValueError, AttributeError):
            raise LmqClientError(f"{node}: its /topics/offsets answer is not lmqd's") from None
        if replicas:
            self.replica_of[node] = replicas
        if names is None:
            return result
        return {t: known for t, known in result.items() if t in names}

    def replicated(self, node: str, topic: str, start: SourceOffsets) -> tuple[str, int] | None:
        """Where a node new to the query continues a node of its ``replica_of`` that the
        query read (``start`` has the pair): that node and its offset. A mirror holds its
        primary's offsets, so a query moved from one to the other goes on exactly there."""
        for former in self.replica_of.get(node, ()):
            try:
                host, port = split_address(former)
            except ValueError:
                continue
            for key, offset in start.positions.get(topic, {}).items():
                if key == node:
                    continue
                try:
                    other_host, other_port = split_address(key)
                except ValueError:
                    continue
                if other_port == port and same_host(host, other_host):
                    return key, offset
        return None

    def offset_at(self, node: str, topic: str, time_ms: int) -> tuple[int, bool]:
        """The offset of ``topic``'s first message on ``node`` published at or after
        ``time_ms``, and whether there is one (else the offset is the end)."""
        client = HTTPClient(node, timeout=self.options.timeout_s)
        answer = client.topic_offsets(topic, at=str(time_ms))
        offset = int(answer["offset"])
        return offset, offset < int(answer["end"])

    def count_loss(self, node: str, topic: str, reader_at: int) -> None:
        """Tell ``node`` the query found the offsets of ``topic`` from ``reader_at`` gone: it
        counts them (``reader_lost_count``, docs/http.md). Best effort: a node that does not
        answer is not asked again."""
        client = HTTPClient(node, timeout=self.options.timeout_s)
        try:
            client.request("GET", "/topic/offsets", {"topic": topic, "from": str(reader_at)})
        except LmqClientError as exc:
            log.info("SPARK(%s): %s: loss not counted there: %s", topic, node, exc)

    def _name(self) -> str:
        return ", ".join(sorted(self._topics)) or self.options.described


def _reason(exc: BaseException) -> str:
    if isinstance(exc, HTTPError) and exc.status == 404:
        return f"{exc}: an lmqd without /topics/offsets (too old for this source?)"
    return str(exc)

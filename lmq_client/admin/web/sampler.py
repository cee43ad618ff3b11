"""``Sampler``: the console's one poller of the daemons.

Theory of operation
-------------------
One task, whatever the number of browsers: every ``sample_interval_s`` it lists the nodes (the
given ``--http-address`` ones, and with lookupds every node their ``/nodes`` lists), asks each
for ``/stats?format=json`` at once (``/info`` too, the first time it sees a node), and publishes
the result as one immutable ``Snapshot`` (``model.py``), recorded in the charts' ``History``.
Pages render the latest snapshot and never ask a daemon for statistics themselves, so the
daemons see one ``/stats`` per node per interval from the console, flat as browsers are added
(docs/benchmarks.md, "Console").

After an action (pause, delete, redrive...) a page calls ``refresh()``: a round at once, so the
page it redirects to shows the change. Rounds never overlap: a ``refresh()`` during a round
waits for the next one, which starts as soon as the running one ends (a round that began
before the action might not see it).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import trio

from lmq_client.admin.web.config import ConsoleConfig
from lmq_client.admin.web.history import History
from lmq_client.admin.web.model import Node, Snapshot, rates_between
from lmq_client.admin.web.upstream import Upstream
from lmq_client.errors import LmqClientError
from lmq_client.lookupd import LookupdNode

__all__ = ["Sampler"]

log = logging.getLogger("lmq_client.admin.web")


class Sampler:
    """Samples every node's ``/stats``; ``latest`` is the last round (module docstring)."""

    def __init__(self, config: ConsoleConfig, upstream: Upstream) -> None:
        self.config = config
        self.upstream = upstream
        self.history = History(config.history_slots)
        self.latest = Snapshot(at=time.time(), nodes=())
        self.rounds = 0
        self.last_round_s = 0.0
        """How long the last round took (its requests and the aggregation), in seconds."""
        self._infos: dict[str, dict[str, Any]] = {}
        self._lock = trio.Lock()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Sample until cancelled; started once the first round is in."""
        await self.sample()
        task_status.started()
        while True:
            await trio.sleep(self.config.sample_interval_s)
            await self.sample()

    async def refresh(self) -> Snapshot:
        """A round started after this call, done (module docstring)."""
        await self.sample()
        return self.latest

    async def sample(self) -> None:
        """One round: nodes, their ``/stats``, the snapshot and its history."""
        async with self._lock:
            started = time.perf_counter()
            nodes, lookupd_errors = await self._discover()
            answered: list[Node] = []
            async with trio.open_nursery() as nursery:
                for node in nodes:
                    nursery.start_soon(self._ask, node, answered)
            order = {n.http_address: i for i, n in enumerate(nodes)}
            answered.sort(key=lambda n: order[n.http_address])
            at = time.time()
            snapshot = Snapshot(
                at=at, nodes=tuple(answered), lookupd_errors=tuple(lookupd_errors),
                rates=rates_between(self.latest if self.rounds else None, at, answered),
            )  # fmt: skip
            # The aggregation (every topic's rows, once per snapshot) is the round's one big
            # computation: done in a worker thread, pages keep being served meanwhile.
            await trio.to_thread.run_sync(lambda: snapshot.topics)
            self.history.record(snapshot)
            self.latest = snapshot
            self.rounds += 1
            self.last_round_s = time.perf_counter() - started

    async def _discover(self) -> tuple[list[Node], list[str]]:
        found: dict[str, Node] = {a: Node(http_address=a) for a in self.config.http_addresses}
        listed: dict[str, list[LookupdNode]] = {}
        errors = []
        for lookupd in self.config.lookupd_http_addresses:
            try:
                for entry in await self.upstream.lookupd_nodes(lookupd):
                    listed.setdefault(entry.http_address, []).append(entry)
            except LmqClientError as exc:
                log.warning("lookupd %s: %s", lookupd, exc)
                errors.append(f"{lookupd}: {exc}")
        for address, entries in listed.items():
            first = entries[0]
            found[address] = Node(
                http_address=address, hostname=first.hostname,
                broadcast_address=first.broadcast_address, tcp_port=first.tcp_port,
                version=first.version, lookupd_conns=len(entries),
                tombstoned=frozenset().union(*(e.tombstoned for e in entries)),
            )  # fmt: skip
        return list(found.values()), errors

    async def _ask(self, node: Node, answered: list[Node]) -> None:
        address = node.http_address
        try:
            if address not in self._infos:
                self._infos[address] = await self.upstream.info(address)
            stats = await self.upstream.stats(address)
        except LmqClientError as exc:
            answered.append(_with_info(node, self._infos.get(address), None, str(exc)))
            return
        answered.append(_with_info(node, self._infos[address], stats, None))


def _with_info(
    node: Node, info: dict[str, Any] | None, stats: dict[str, Any] | None, error: str | None
) -> Node:
    info = info or {}
    return Node(
        http_address=node.http_address,
        hostname=node.hostname or str(info.get("hostname", "")),
        broadcast_address=node.broadcast_address or str(info.get("broadcast_address", "")),
        tcp_port=node.tcp_port if node.tcp_port is not None else info.get("tcp_port"),
        version=node.version or str(info.get("version", "")),
        lookupd_conns=node.lookupd_conns,
        tombstoned=node.tombstoned,
        stats=stats,
        error=error,
    )

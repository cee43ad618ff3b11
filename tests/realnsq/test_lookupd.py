"""Discovery with the real NSQ: lmqd registering with nsqlookupd, nsqd with lmqlookupd.

Rules for this module: one nsqlookupd and one lmqlookupd, and one nsqd and one lmqd node each
registered with both (127.0.0.1, port 0, data in temp dirs). Both nodes are asked the same
things, so within a lookupd their entries compare equal once their addresses are given one
label, and the two lookupds' answers compare equal (lists sorted: Go's map order is random).
Registration is asynchronous: each comparison polls until it holds (bounded). Consumers are
NSQ's own (go-nsq's nsq_tail) and pynsq, finding the nodes only through a lookupd. Skipped
without ``LMQ_NSQ_BIN``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest

from tests.cluster.procs import eventually, http, run_reader

from .conftest import Started
from .programs import (
    Daemon,
    Labels,
    Tool,
    lmqd,
    lmqlookupd,
    normalized,
    nsqd,
    nsqlookupd,
    requires_nsq,
    run_tool,
)

pytestmark = [pytest.mark.interop, requires_nsq]

WITHIN_S = 20.0
"""Bound of every wait for a registration to show (nsqd registers at once; so does lmqd)."""


@attrs.frozen
class Topology:
    nsqlookupd: Daemon
    lmqlookupd: Daemon
    nsqd: Daemon
    lmqd: Daemon
    labels: Labels

    @property
    def lookupds(self) -> tuple[Daemon, Daemon]:
        return self.nsqlookupd, self.lmqlookupd

    @property
    def nodes(self) -> tuple[Daemon, Daemon]:
        return self.nsqd, self.lmqd


@pytest.fixture(scope="module")
def topology(started: Started, tmp_path_factory: pytest.TempPathFactory) -> Topology:
    base = tmp_path_factory.mktemp("lookupd")
    theirs, ours = started(nsqlookupd()), started(lmqlookupd())
    addresses = (theirs.tcp, ours.tcp)
    labels = Labels()
    nodes = started(nsqd(base / "nsqd", lookupds=addresses)), started(
        lmqd(base / "lmqd", lookupds=addresses)
    )
    for node in nodes:
        labels.add("node", node.tcp, node.http)  # the same things done on each: one label
    return Topology(theirs, ours, *nodes, labels)


def on_both_nodes(top: Topology, method: str, path: str, body: bytes | None = None) -> None:
    answers = [http(node.http, method, path, body) for node in top.nodes]
    assert answers[0] == answers[1] and answers[0][0] == 200, (path, answers)


def lookupd_view(top: Topology, lookupd: Daemon, topics: tuple[str, ...]) -> Any:
    """Everything a client can ask ``lookupd`` about ``topics``, normalized."""
    view: dict[str, Any] = {
        path: http(lookupd.http, "GET", path)
        for path in (
            "/topics", "/nodes", *(f"/channels?topic={t}" for t in topics),
            *(f"/lookup?topic={t}" for t in topics),
        )
    }  # fmt: skip
    for node in view["/nodes"][1]["producers"]:
        # topics[i] goes with tombstones[i] (nsqadmin zips them): keep them paired.
        node["topics"] = list(zip(node.pop("topics"), node.pop("tombstones"), strict=True))
    return normalized(view, top.labels)


def settled(top: Topology, topics: tuple[str, ...], check: Callable[[Any], bool]) -> Any:
    """Poll until both lookupds answer alike, and ``check`` holds for the answer; return it."""

    def views() -> tuple[Any, Any]:
        return lookupd_view(top, top.nsqlookupd, topics), lookupd_view(top, top.lmqlookupd, topics)

    found = eventually(views, lambda v: v[0] == v[1] and check(v[0]), WITHIN_S)
    return found[0]


def producers(view: Any, topic: str) -> list[Any]:
    status, body = view[f"/lookup?topic={topic}"]
    return body["producers"] if status == 200 else []


def test_registrations_and_unregistrations_are_seen_alike(topology: Topology) -> None:
    top = topology
    for path in ("/topic/create?topic=reg.a", "/channel/create?topic=reg.a&channel=c1",
                 "/channel/create?topic=reg.a&channel=c2", "/topic/create?topic=reg.b",
                 "/channel/create?topic=reg.b&channel=c1"):  # fmt: skip
        on_both_nodes(top, "POST", path)
    topics = ("reg.a", "reg.b")
    view = settled(top, topics, lambda v: len(producers(v, "reg.b")) == 2)
    # lmqd's registration is nsqd's: their two entries are one, twice.
    for topic in topics:
        first, second = producers(view, topic)
        assert first == second
    assert view["/channels?topic=reg.a"] == (200, {"channels": ["c1", "c2"]})
    # A deleted channel leaves its key (nsqlookupd keeps non-ephemeral keys); a deleted topic
    # takes both nodes out of its producers.
    on_both_nodes(top, "POST", "/channel/delete?topic=reg.a&channel=c2")
    on_both_nodes(top, "POST", "/topic/delete?topic=reg.b")
    view = settled(top, topics, lambda v: producers(v, "reg.b") == [])
    assert view["/channels?topic=reg.a"] == (200, {"channels": ["c1", "c2"]})
    assert len(producers(view, "reg.a")) == 2


def test_ephemeral_channels_come_and_go_alike(topology: Topology) -> None:
    top = topology
    on_both_nodes(top, "POST", "/topic/create?topic=eph")
    topics = ("eph",)
    # An ephemeral channel lives while a consumer is on it: nsq_tail, on each node.
    tails = [
        Tool("nsq_tail", "--topic=eph", "--channel=tails#ephemeral", f"--nsqd-tcp-address={n.tcp}")
        for n in top.nodes
    ]
    try:
        listed = (200, {"channels": ["tails#ephemeral"]})
        view = settled(top, topics, lambda v: v["/channels?topic=eph"] == listed)
        assert len(producers(view, "eph")) == 2
    finally:
        for tail in tails:
            tail.stop()
    # Its last consumer gone, each node deletes it and unregisters it; the key goes with its
    # last producer (an ephemeral key is the one kind a lookupd removes by itself).
    settled(top, topics, lambda v: v["/channels?topic=eph"] == (200, {"channels": []}))


def test_tombstones_hide_each_node_alike(topology: Topology) -> None:
    top = topology
    on_both_nodes(top, "POST", "/topic/create?topic=tomb")
    on_both_nodes(top, "POST", "/channel/create?topic=tomb&channel=c")
    topics = ("tomb",)
    settled(top, topics, lambda v: len(producers(v, "tomb")) == 2)
    for node in top.nodes:  # as nsqadmin does: on every lookupd, by the node's HTTP address
        for lookupd in top.lookupds:
            status, _ = http(lookupd.http, "POST", f"/topic/tombstone?topic=tomb&node={node.http}")
            assert status == 200
    view = settled(top, topics, lambda v: producers(v, "tomb") == [])
    nodes = view["/nodes"][1]["producers"]
    assert [dict(n["topics"])["tomb"] for n in nodes] == [True, True]
    assert view["/channels?topic=tomb"] == (200, {"channels": ["c"]})  # channels unaffected


def test_consumers_find_nsqd_and_lmqd_through_lmqlookupd(topology: Topology) -> None:
    top = topology
    # A topic per consumer: the first channel of a topic gets its backlog, later ones do not.
    readers: dict[str, Daemon | None] = {
        "via.nsqlookupd": top.nsqlookupd, "via.lmqlookupd": top.lmqlookupd, "via.pynsq": None,
    }  # fmt: skip
    published: dict[str, list[str]] = {topic: [] for topic in readers}
    for i, node in enumerate(top.nodes):
        for topic, bodies in published.items():
            batch = [f"{topic}-{i}-{k}" for k in range(25)]
            answer = http(node.http, "POST", f"/mpub?topic={topic}", "\n".join(batch).encode())
            assert answer[0] == 200
            bodies += batch
    settled(top, tuple(readers), lambda v: all(len(producers(v, t)) == 2 for t in readers))
    for topic, lookupd in readers.items():  # go-nsq's nsq_tail, through either lookupd
        if lookupd is None:
            continue
        done = run_tool("nsq_tail", f"--topic={topic}", f"--lookupd-http-address={lookupd.http}",
                        "-n", str(len(published[topic])), timeout=WITHIN_S + 10)  # fmt: skip
        assert done.returncode == 0, done.stderr.decode()
        assert sorted(done.stdout.decode().splitlines()) == sorted(published[topic])
    out = run_reader(
        "pynsq", within_s=WITHIN_S, quiet_s=1.0, topic="via.pynsq", channel="readers",
        lookupd_url=top.lmqlookupd.http, count=50,
    )  # fmt: skip
    assert sorted(out["bodies"]) == sorted(published["via.pynsq"])
    assert sorted(out["connections"]) == sorted(node.tcp for node in top.nodes)


def test_lmqd_registers_again_after_nsqlookupd_restarts(tmp_path: Path) -> None:
    lookupd = nsqlookupd()
    tcp_port, http_port = lookupd.tcp_port, lookupd.http_port
    node = lmqd(tmp_path / "again", lookupds=[lookupd.tcp])
    try:
        assert http(node.http, "POST", "/channel/create?topic=again&channel=c")[0] == 404
        assert http(node.http, "POST", "/topic/create?topic=again")[0] == 200
        assert http(node.http, "POST", "/channel/create?topic=again&channel=c")[0] == 200

        def registered(address: str) -> Any:
            return http(address, "GET", "/lookup?topic=again")

        eventually(lambda: registered(lookupd.http), lambda r: r[0] == 200, WITHIN_S)
        lookupd.check_stop()  # everything it knew is gone with it
        lookupd = restarted(tcp_port, http_port)
        answer = eventually(
            lambda: registered(lookupd.http),
            lambda r: r[0] == 200 and len(r[1]["producers"]) == 1,
            WITHIN_S,
        )
        assert answer[1]["channels"] == ["c"]
        [producer] = answer[1]["producers"]
        assert (producer["tcp_port"], producer["http_port"]) == (node.tcp_port, node.http_port)
    finally:
        node.check_stop()
        lookupd.check_stop()


def restarted(tcp_port: int, http_port: int) -> Daemon:
    """nsqlookupd again on the ports it had (they may take a moment to be free)."""
    deadline = time.monotonic() + WITHIN_S
    while True:
        try:
            return nsqlookupd(tcp_port, http_port)
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)

"""nsqadmin v1.3.0 over lmqlookupd and two lmqd nodes, as over nsqlookupd and two nsqd nodes.

Rules for this module: two clusters (127.0.0.1, port 0, data in temp dirs), each a lookupd, two
nodes registered with it and an nsqadmin pointed at the lookupd: NSQ's own (nsqlookupd, nsqd)
and lmq's (lmqlookupd, lmqd). Both get the same things done in the same order; nsqadmin's JSON
API answers, then the nodes' and the lookupd's state after each of nsqadmin's actions, are
compared between the two after ``programs.normalized`` (addresses labelled per role: node0,
node1, lookupd; times and client ports left out; lmq's extra stats keys dropped). Skipped
without ``LMQ_NSQ_BIN``.
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any

import attrs
import pytest

from tests.cluster.procs import eventually, http

from .conftest import Started
from .programs import (
    Daemon,
    Labels,
    Tool,
    lmqd,
    lmqlookupd,
    normalized,
    nsqadmin,
    nsqd,
    nsqlookupd,
    requires_nsq,
)

pytestmark = [pytest.mark.interop, requires_nsq]

WITHIN_S = 20.0

LMQ_ONLY_KEYS = frozenset({
    "dead_letter_count", "expired_count", "max_attempts_dropped_count", "storage_damage",
    "priority_depths", "publish_policy",
})  # fmt: skip
"""lmq's additions to nsqd's /stats, which nsqadmin passes on as it gets them."""


@attrs.frozen
class Cluster:
    lookupd: Daemon
    nodes: tuple[Daemon, Daemon]
    admin: Daemon
    labels: Labels

    def api(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        return http(self.admin.http, method, path, json.dumps(body).encode() if body else None)

    def view(self, answer: Any) -> Any:
        return normalized(answer, self.labels, drop=LMQ_ONLY_KEYS)

    def state(self) -> Any:
        """What the nodes and the lookupd hold, normalized."""
        nodes = {}
        for i, node in enumerate(self.nodes):
            stats = http(node.http, "GET", "/stats?format=json&include_clients=false")[1]
            nodes[f"node{i}"] = [
                {"topic": t["topic_name"], "depth": t["depth"], "paused": t["paused"],
                 "channels": [(c["channel_name"], c["depth"], c["paused"]) for c in t["channels"]]}
                for t in stats["topics"] or []
            ]  # fmt: skip
        topics = http(self.lookupd.http, "GET", "/topics")[1]["topics"]
        lookupd = {
            topic: (
                http(self.lookupd.http, "GET", f"/channels?topic={topic}")[1],
                http(self.lookupd.http, "GET", f"/lookup?topic={topic}"),
            )
            for topic in topics
        }
        return self.view({"nodes": nodes, "lookupd": lookupd})


def start_cluster(started: Started, base: Path, kind: str) -> Cluster:
    lookupd = started(nsqlookupd() if kind == "nsq" else lmqlookupd())
    start_node = nsqd if kind == "nsq" else lmqd
    nodes = (
        started(start_node(base / f"{kind}0", lookupds=[lookupd.tcp])),
        started(start_node(base / f"{kind}1", lookupds=[lookupd.tcp])),
    )
    admin = started(nsqadmin(lookupd.http))
    labels = Labels()
    labels.add("lookupd", lookupd.tcp, lookupd.http)
    labels.add("admin", admin.http)
    for i, node in enumerate(nodes):
        labels.add(f"node{i}", node.tcp, node.http)
    return Cluster(lookupd, nodes, admin, labels)


@pytest.fixture(scope="module")
def clusters(started: Started, tmp_path_factory: pytest.TempPathFactory) -> tuple[Cluster, Cluster]:
    base = tmp_path_factory.mktemp("nsqadmin")
    pair = start_cluster(started, base, "nsq"), start_cluster(started, base, "lmq")
    for cluster in pair:
        for i, node in enumerate(cluster.nodes):
            assert http(node.http, "POST", "/topic/create?topic=t")[0] == 200
            assert http(node.http, "POST", "/channel/create?topic=t&channel=c")[0] == 200
            body = b"\n".join(b"m%d" % k for k in range(5 + i))  # 5 on node0, 6 on node1
            assert http(node.http, "POST", "/mpub?topic=t", body)[0] == 200
    for cluster in pair:
        eventually(
            lambda c=cluster: http(c.lookupd.http, "GET", "/lookup?topic=t"),
            lambda r: r[0] == 200 and len(r[1]["producers"]) == 2,
            WITHIN_S,
        )
    return pair


def records(value: Any, *, per_node_channels: bool = True) -> set[str]:
    """Every object in ``value`` by its scalar fields, where it is nested and in what order
    left out.

    nsqadmin merges the nodes' answers in the order they arrive (goroutines), so list orders,
    and on a topic's page which node's entries a merged channel keeps, change from run to run,
    with nsqd as with lmqd; the data are the same. Comparing these records compares the data.
    ``per_node_channels=False`` leaves out one node's channel entries (a topic's page: which
    of them nsqadmin keeps is that race; the channel's page has them all)."""
    out: set[str] = set()
    if isinstance(value, dict):
        scalars = {k: v for k, v in value.items() if not isinstance(v, dict | list | tuple)}
        if per_node_channels or "channel_name" not in scalars or scalars.get("node") == "*":
            out.add(json.dumps(scalars, sort_keys=True))
        for item in value.values():
            out |= records(item, per_node_channels=per_node_channels)
    elif isinstance(value, list | tuple):
        for item in value:
            out |= records(item, per_node_channels=per_node_channels)
    return out


def both(
    clusters: tuple[Cluster, Cluster],
    method: str,
    path: str,
    body: Any = None,
    *,
    per_node_channels: bool = True,
) -> Any:
    """Ask both nsqadmins; their normalized answers must hold the same data: nsqd's, then
    lmqd's (``records``). Returns lmqd's answer."""
    theirs, ours = clusters
    expected = theirs.view(theirs.api(method, path.format(node0=theirs.nodes[0].http), body))
    got = ours.view(ours.api(method, path.format(node0=ours.nodes[0].http), body))
    assert got[0] == expected[0], (method, path, expected, got)
    theirs_records, ours_records = (
        records(answer[1], per_node_channels=per_node_channels) for answer in (expected, got)
    )
    assert ours_records == theirs_records, (
        f"{method} {path}: only nsqd's {sorted(theirs_records - ours_records)}, only lmqd's "
        f"{sorted(ours_records - theirs_records)}\n{differences(expected, got)}"
    )
    return got


def differences(expected: Any, got: Any) -> str:
    """A unified diff of two JSON values (nsqd's cluster first)."""
    lines = [json.dumps(v, indent=1, sort_keys=True).splitlines() for v in (expected, got)]
    return "\n".join(difflib.unified_diff(*lines, "nsqd", "lmqd", lineterm="", n=2))


def test_the_json_api_shows_lmqd_as_it_shows_nsqd(clusters: tuple[Cluster, Cluster]) -> None:
    # A go-nsq consumer on each cluster's node0, on a channel of its own made after the
    # messages (so it gets none, and the counts stay put): the channel page shows a client.
    tails = [
        Tool("nsq_tail", "--topic=t", "--channel=watch", f"--nsqd-tcp-address={c.nodes[0].tcp}")
        for c in clusters
    ]
    try:
        for cluster in clusters:
            eventually(
                lambda c=cluster: c.api("GET", "/api/topics/t/watch")[1],
                lambda a: sum(len(n["clients"] or []) for n in a.get("nodes") or []) == 1,
                WITHIN_S,
            )
        topics = both(clusters, "GET", "/api/topics")
        assert topics == (200, {"message": "", "topics": ["t"]})
        nodes = both(clusters, "GET", "/api/nodes")
        assert len(nodes[1]["nodes"]) == 2
        topic = both(clusters, "GET", "/api/topics/t", per_node_channels=False)
        assert topic[1]["depth"] == 0 and topic[1]["message_count"] == 11
        channel = both(clusters, "GET", "/api/topics/t/watch")
        assert channel[1]["client_count"] == 1
        both(clusters, "GET", "/api/topics/t/c")
        both(clusters, "GET", "/api/nodes/{node0}")
        both(clusters, "GET", "/api/counter")
        both(clusters, "GET", "/api/topics/missing")
        both(clusters, "GET", "/api/topics/t/missing")
    finally:
        for tail in tails:
            tail.stop()


ACTIONS: list[tuple[str, str, str, Any]] = [
    ("pause topic", "POST", "/api/topics/t", {"action": "pause"}),
    ("unpause topic", "POST", "/api/topics/t", {"action": "unpause"}),
    ("pause channel", "POST", "/api/topics/t/c", {"action": "pause"}),
    ("unpause channel", "POST", "/api/topics/t/c", {"action": "unpause"}),
    ("empty channel", "POST", "/api/topics/t/c", {"action": "empty"}),
    ("create through the lookupd", "POST", "/api/topics", {"topic": "t2", "channel": "c2"}),
    ("empty topic", "POST", "/api/topics/t", {"action": "empty"}),
    ("delete channel", "DELETE", "/api/topics/t/c", None),
    ("tombstone node0's topic", "DELETE", "/api/nodes/{node0}", {"topic": "t"}),
    ("delete topic", "DELETE", "/api/topics/t", None),
    ("delete the created topic", "DELETE", "/api/topics/t2", None),
]
"""Every action nsqadmin offers, in an order where each one changes something."""


def test_every_action_does_to_lmqd_what_it_does_to_nsqd(
    clusters: tuple[Cluster, Cluster],
) -> None:
    theirs, ours = clusters
    assert ours.state() == theirs.state()
    for label, method, path, body in ACTIONS:
        answer = both(clusters, method, path, body)
        assert answer[0] == 200, (label, answer)
        # nsqadmin's calls are done when it answers; the lookupd's view follows the nodes'
        # (un)registrations, so compare once both have settled.
        expected = eventually(theirs.state, lambda s: s == theirs.state(), WITHIN_S)
        eventually(ours.state, lambda s, e=expected: s == e, WITHIN_S)

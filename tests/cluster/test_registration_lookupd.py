"""lmqd nodes registering with a real ``lmqlookupd``, all in subprocesses, seen through the
lookupd's HTTP API as consumers and nsqadmin see them.

Rules for this module: every daemon is a subprocess on 127.0.0.1 (port 0, except where a
lookupd is restarted on the ports it had), data in ``tmp_path``; each wait polls the lookupd's
HTTP API with a bound (``eventually``); every daemon must exit cleanly on SIGTERM without a
traceback. These run against lmqlookupd, which speaks nsqlookupd's protocol byte for byte
(tests/lookupd); the real nsqlookupd v1.3.0 is in tests/realnsq/test_lookupd.py.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from . import procs
from .procs import Daemon, eventually, http

pytestmark = pytest.mark.interop

# Registration is immediate once connected; after a lookupd restart the node's backoff (1 s,
# then 2 s, 4 s while it is still down) plus a Python start-up bound the wait.
WITHIN_S = 20.0


@pytest.fixture
def lookupd() -> Iterator[Daemon]:
    daemon = procs.lookupd()
    yield daemon
    daemon.check_stop()


@pytest.fixture
def nodes(tmp_path: Path, lookupd: Daemon) -> Iterator[list[Daemon]]:
    started = [procs.lmqd(tmp_path / f"n{i}", f"--lookupd-tcp-address={lookupd.tcp}")
               for i in range(2)]  # fmt: skip
    yield started
    for node in started:
        node.check_stop()


def get(lookupd: Daemon, path: str) -> Any:
    status, body = http(lookupd.http, "GET", path)
    return body if status == 200 else status


def post(node: Daemon, path: str, body: bytes | None = b"") -> None:
    status, answer = http(node.http, "POST", path, body)
    assert status == 200, (path, status, answer)


def peer(node: Daemon) -> dict[str, Any]:
    """A node as /lookup lists it, without its remote address (the lookupd's to choose)."""
    return {"hostname": socket.gethostname(), "broadcast_address": "127.0.0.1",
            "tcp_port": node.tcp_port, "http_port": node.http_port, "version": "1.3.0"}  # fmt: skip


def producers(lookupd: Daemon, topic: str) -> Any:
    answer = get(lookupd, f"/lookup?topic={topic}")
    if not isinstance(answer, dict):
        return answer
    return sorted(
        ({k: v for k, v in p.items() if k != "remote_address"} for p in answer["producers"]),
        key=lambda p: p["tcp_port"],
    )


def node_topics(lookupd: Daemon) -> dict[int, list[str]]:
    return {n["tcp_port"]: sorted(n["topics"]) for n in get(lookupd, "/nodes")["producers"]}


def test_topics_and_channels_appear_and_disappear(lookupd: Daemon, nodes: list[Daemon]) -> None:
    a, b = nodes
    post(a, "/pub?topic=orders", b"first")  # PUB creates the topic on a
    post(a, "/channel/create?topic=orders&channel=billing")
    post(b, "/topic/create?topic=orders")
    post(b, "/channel/create?topic=orders&channel=audit")
    post(b, "/topic/create?topic=b-only")
    both = sorted([peer(a), peer(b)], key=lambda p: p["tcp_port"])
    eventually(lambda: producers(lookupd, "orders"), lambda p: p == both, WITHIN_S)
    assert sorted(get(lookupd, "/topics")["topics"]) == ["b-only", "orders"]
    assert sorted(get(lookupd, "/channels?topic=orders")["channels"]) == ["audit", "billing"]
    assert producers(lookupd, "b-only") == [peer(b)]
    assert node_topics(lookupd) == {a.tcp_port: ["orders"], b.tcp_port: ["b-only", "orders"]}

    # Deleting a topic on one node takes that node out of /lookup and /nodes; the keys stay
    # (nsqlookupd's rule: only #ephemeral keys are removed when their last producer goes).
    post(a, "/topic/delete?topic=orders")
    eventually(lambda: producers(lookupd, "orders"), lambda p: p == [peer(b)], WITHIN_S)
    assert node_topics(lookupd) == {a.tcp_port: [], b.tcp_port: ["b-only", "orders"]}
    assert sorted(get(lookupd, "/channels?topic=orders")["channels"]) == ["audit", "billing"]

    # Ephemeral ones vanish from /topics and /channels with their last producer.
    post(a, "/topic/create?topic=live%23ephemeral")
    post(a, "/channel/create?topic=live%23ephemeral&channel=tail%23ephemeral")
    eventually(lambda: get(lookupd, "/channels?topic=live%23ephemeral"),
               lambda c: c == {"channels": ["tail#ephemeral"]}, WITHIN_S)  # fmt: skip
    post(a, "/channel/delete?topic=live%23ephemeral&channel=tail%23ephemeral")
    eventually(lambda: get(lookupd, "/channels?topic=live%23ephemeral"),
               lambda c: c == {"channels": []}, WITHIN_S)  # fmt: skip
    eventually(lambda: sorted(get(lookupd, "/topics")["topics"]),
               lambda t: t == ["b-only", "orders"], WITHIN_S)  # fmt: skip


def test_a_restarted_lookupd_gets_everything_registered_again(tmp_path: Path) -> None:
    lookupd = procs.lookupd()
    node = procs.lmqd(tmp_path / "n", f"--lookupd-tcp-address={lookupd.tcp}")
    try:
        post(node, "/topic/create?topic=t")
        post(node, "/channel/create?topic=t&channel=c")
        post(node, "/topic/create?topic=bare")
        eventually(lambda: get(lookupd, "/channels?topic=t"),
                   lambda c: c == {"channels": ["c"]}, WITHIN_S)  # fmt: skip
        lookupd.check_stop()
        restarted = procs.lookupd(lookupd.tcp_port, lookupd.http_port)
        try:
            eventually(lambda: producers(restarted, "t"), lambda p: p == [peer(node)], WITHIN_S)
            assert producers(restarted, "bare") == [peer(node)]
            assert get(restarted, "/channels?topic=t") == {"channels": ["c"]}
            assert node_topics(restarted) == {node.tcp_port: ["bare", "t"]}
        finally:
            restarted.check_stop()
    finally:
        node.check_stop()
        lookupd.stop()  # stopped already, unless the test failed early


def test_topics_restored_at_start_are_registered(tmp_path: Path, lookupd: Daemon) -> None:
    data = tmp_path / "n"
    first = procs.lmqd(data)
    post(first, "/topic/create?topic=kept")
    post(first, "/channel/create?topic=kept&channel=c")
    first.check_stop()
    node = procs.lmqd(data, f"--lookupd-tcp-address={lookupd.tcp}")
    try:
        eventually(lambda: producers(lookupd, "kept"), lambda p: p == [peer(node)], WITHIN_S)
        assert get(lookupd, "/channels?topic=kept") == {"channels": ["c"]}
    finally:
        node.check_stop()


def test_tombstoning_a_topic_on_one_node(lookupd: Daemon, nodes: list[Daemon]) -> None:
    a, b = nodes
    for node in nodes:
        post(node, "/topic/create?topic=t")
        post(node, "/channel/create?topic=t&channel=c")
    both = sorted([peer(a), peer(b)], key=lambda p: p["tcp_port"])
    eventually(lambda: producers(lookupd, "t"), lambda p: p == both, WITHIN_S)
    # nsqadmin's flow: tombstone the node's topic on the lookupd, then delete it on the node
    status, _ = http(lookupd.http, "POST", f"/topic/tombstone?topic=t&node=127.0.0.1:{a.http_port}")
    assert status == 200
    assert producers(lookupd, "t") == [peer(b)]
    tombstones = {n["tcp_port"]: n["tombstones"] for n in get(lookupd, "/nodes")["producers"]}
    assert tombstones == {a.tcp_port: [True], b.tcp_port: [False]}
    post(a, "/topic/delete?topic=t")
    eventually(lambda: node_topics(lookupd), lambda t: t[a.tcp_port] == [], WITHIN_S)
    assert producers(lookupd, "t") == [peer(b)]
    # a publish recreates it on a: registered again, as a fresh (untombstoned) producer
    post(a, "/pub?topic=t", b"again")
    eventually(lambda: producers(lookupd, "t"), lambda p: p == both, WITHIN_S)

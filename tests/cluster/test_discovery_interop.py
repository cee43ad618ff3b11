"""Consumers that know only the lookupd receive every message published to two lmqd nodes.

Rules for this module: ``lmqlookupd`` and two ``lmqd`` nodes registering with it, all
subprocesses on 127.0.0.1 port 0, data in ``tmp_path``; the third-party readers (pynsq, ansq) run
unmodified in their own interpreters (``clients/``) under a hard time limit, lmq's trio and
blocking consumers in this process; each test is bounded; "none twice" is checked after a quiet
spell during which a duplicate would have arrived. The real nsqlookupd and nsqd, with go-nsq's
nsq_tail, are in ``tests/realnsq/test_lookupd.py``.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from lmq_client.consumer import Consumer
from lmq_client.lookupd import lookup_nodes, lookup_producers
from lmq_client.message import Message
from lmq_client.sync import Consumer as BlockingConsumer

from . import procs
from .procs import Daemon, eventually, http

pytestmark = pytest.mark.interop

PER_NODE = 50
WITHIN_S = 30.0
QUIET_S = 1.0


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[Daemon, list[Daemon]]]:
    lookupd = procs.lookupd()
    nodes: list[Daemon] = []
    try:
        for i in range(2):
            nodes.append(procs.lmqd(tmp_path / f"n{i}", f"--lookupd-tcp-address={lookupd.tcp}"))
        yield lookupd, nodes
    finally:
        for node in nodes:
            node.check_stop()
        lookupd.check_stop()


def publish_everywhere(lookupd: Daemon, nodes: list[Daemon], topic: str) -> list[str]:
    """``PER_NODE`` messages on each node (no channel yet: the topic keeps them), once the
    lookupd lists both nodes for the topic; the bodies."""
    bodies = []
    for i, node in enumerate(nodes):
        batch = [f"{i}-{j}" for j in range(PER_NODE)]
        status, _ = http(node.http, "POST", f"/mpub?topic={topic}", "\n".join(batch).encode())
        assert status == 200
        bodies += batch
    expected = sorted(node.tcp for node in nodes)
    eventually(lambda: sorted(lookup_producers(lookupd.http, topic)), lambda p: p == expected,
               WITHIN_S)  # fmt: skip
    return bodies


def run_reader(library: str, **params: Any) -> Any:
    return procs.run_reader(library, within_s=WITHIN_S, quiet_s=QUIET_S, **params)


def assert_each_once(received: list[str], published: list[str]) -> None:
    twice = [body for body, n in collections.Counter(received).items() if n > 1]
    assert not twice, f"delivered more than once: {twice[:10]}"
    assert sorted(received) == sorted(published)


@pytest.mark.parametrize("library", ["pynsq", "ansq"])
def test_third_party_readers_find_both_nodes(
    library: str, cluster: tuple[Daemon, list[Daemon]]
) -> None:
    lookupd, nodes = cluster
    published = publish_everywhere(lookupd, nodes, library)
    out = run_reader(
        library, topic=library, channel="readers", lookupd_url=lookupd.http,
        count=len(published),
    )  # fmt: skip
    assert_each_once(out["bodies"], published)
    assert len(out["connections"]) == 2, out["connections"]


def test_trio_consumer_finds_both_nodes(cluster: tuple[Daemon, list[Daemon]]) -> None:
    lookupd, nodes = cluster
    published = publish_everywhere(lookupd, nodes, "trio")

    async def consume() -> tuple[list[str], list[str]]:
        received: list[str] = []
        complete = trio.Event()

        async def handle(message: Message) -> None:
            received.append(message.body.decode())
            if len(received) == len(published):
                complete.set()

        with trio.fail_after(WITHIN_S + QUIET_S):
            async with Consumer("trio", "readers", lookupd_http_addresses=[lookupd.http],
                                handler=handle, max_in_flight=16) as consumer:  # fmt: skip
                await complete.wait()
                await trio.sleep(QUIET_S)
                return received, sorted(consumer.connected_addresses)

    received, connected = trio.run(consume)
    assert_each_once(received, published)
    assert connected == sorted(node.tcp for node in nodes)


def test_blocking_consumer_finds_both_nodes(cluster: tuple[Daemon, list[Daemon]]) -> None:
    lookupd, nodes = cluster
    published = publish_everywhere(lookupd, nodes, "blocking")
    received: list[str] = []
    with BlockingConsumer("blocking", "readers", lookupd_http_addresses=f"http://{lookupd.http}",
                          max_in_flight=16, connect_timeout=5) as consumer:  # fmt: skip
        assert sorted(consumer.connected_addresses) == sorted(node.tcp for node in nodes)
        assert sorted(consumer.rdy_counts().values()) == [8, 8]
        deadline = time.monotonic() + WITHIN_S
        while len(received) < len(published) and time.monotonic() < deadline:
            message = consumer.get(timeout=1)
            if message is not None:
                received.append(message.body.decode())
                message.finish()
        assert consumer.get(timeout=QUIET_S) is None
    assert_each_once(received, published)


def test_lookupd_queries_against_lmqlookupd(cluster: tuple[Daemon, list[Daemon]]) -> None:
    lookupd, nodes = cluster
    publish_everywhere(lookupd, nodes, "listed")
    assert lookup_producers(lookupd.http, "missing") == []  # 404 TOPIC_NOT_FOUND: none
    found = {n.tcp_address: n for n in lookup_nodes(f"http://{lookupd.http}/")}
    assert sorted(found) == sorted(node.tcp for node in nodes)
    for node in nodes:
        assert found[node.tcp].http_address == node.http
        assert found[node.tcp].topics == ("listed",)
        assert found[node.tcp].tombstoned == frozenset()

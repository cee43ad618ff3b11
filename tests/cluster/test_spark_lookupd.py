"""The Spark sink's ``lookupdHttpAddress``: write tasks spread over the nodes a lookupd lists.

Rules for this module: ``write_partition`` is called as an executor's Python worker calls it
(real Arrow record batches, no Spark session, no JVM), against one ``lmqlookupd`` and two
``lmqd`` subprocesses that register with it (127.0.0.1, port 0, data in ``tmp_path``); option
parsing needs no daemon. Waits poll the lookupd with a bound.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]
import pytest

from lmq_client.errors import ConnectionFailed
from lmq_client.http import HTTPClient
from lmq_client.lookupd import LookupdNode
from lmq_client.spark import LmqSinkError, SinkOptions
from lmq_client.spark.publish import daemon_addresses, write_partition

from . import procs
from .procs import Daemon, eventually, http

pytestmark = pytest.mark.interop

WITHIN_S = 20.0


def batches(rows: list[str]) -> list[Any]:
    return [pa.RecordBatch.from_pydict({"value": rows})]


def test_lookupd_option_parses_alone_or_beside_addresses() -> None:
    alone = SinkOptions.parse({"lookupdHttpAddress": "127.0.0.1:4161, http://l2:4161/", "topic":
                               "t"})  # fmt: skip
    assert alone.addresses == ()
    assert alone.lookupd_addresses == ("127.0.0.1:4161", "http://l2:4161/")
    both = SinkOptions.parse({"address": "h:4150", "LOOKUPDHTTPADDRESS": "l:4161", "topic": "t"})
    assert (both.addresses, both.lookupd_addresses) == (("h:4150",), ("l:4161",))
    with pytest.raises(ValueError, match="option 'lookupdHttpAddress': invalid lookupd address"):
        SinkOptions.parse({"lookupdHttpAddress": "ftp://l:1", "topic": "t"})
    with pytest.raises(ValueError, match=r"'address' is required \(or give 'lookupdHttpAddress'"):
        SinkOptions.parse({"topic": "t"})


def test_addresses_are_the_given_ones_then_the_nodes_without_the_topic_tombstoned() -> None:
    nodes = {
        "l1": [LookupdNode("10.0.0.2", 4150, 4151, topics=("t",), tombstoned=frozenset({"t"})),
               LookupdNode("10.0.0.1", 4150, 4151, topics=("t", "u"))],
        "l2": [LookupdNode("10.0.0.3", 4150, 4151), LookupdNode("10.0.0.1", 4150, 4151)],
    }  # fmt: skip

    def lookup(lookupd: str, timeout: float) -> list[LookupdNode]:
        if lookupd == "l3:1":
            raise ConnectionFailed(lookupd, "HTTP API unreachable (refused)")
        return nodes[lookupd.partition(":")[0]]

    options = SinkOptions(addresses=("h:1",), lookupd_addresses=("l1:1", "l2:1", "l3:1"),
                          topic="t")  # fmt: skip
    assert daemon_addresses(options, lookup) == ["h:1", "10.0.0.1:4150", "10.0.0.3:4150"]
    nobody = SinkOptions(lookupd_addresses=("l3:1",), topic="t")
    with pytest.raises(LmqSinkError, match="no daemon to publish to from lookupds l3:1"):
        daemon_addresses(nobody, lookup)


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


def message_count(node: Daemon, topic: str) -> int:
    topics = HTTPClient(node.http).stats(topic)["topics"] or []
    return int(topics[0]["message_count"]) if topics else 0


def test_partitions_spread_over_the_lookupds_nodes(cluster: tuple[Daemon, list[Daemon]]) -> None:
    lookupd, nodes = cluster
    eventually(lambda: len(http(lookupd.http, "GET", "/nodes")[1]["producers"]),
               lambda n: n == 2, WITHIN_S)  # fmt: skip
    options = SinkOptions.parse({"lookupdHttpAddress": lookupd.http, "topic": "spread",
                                 "bodyColumn": "value"})  # fmt: skip
    used = [
        write_partition(options, batches([f"p{p}-{i}" for i in range(10)]), partition_id=p).address
        for p in range(4)
    ]
    ordered = sorted(n.tcp for n in nodes)
    assert used == [ordered[0], ordered[1], ordered[0], ordered[1]]
    assert [message_count(n, "spread") for n in nodes] == [20, 20]

    # nsqadmin's tombstone: the topic is being deleted on one node, so tasks avoid it
    tombstoned = nodes[0]
    status, _ = http(lookupd.http, "POST",
                     f"/topic/tombstone?topic=spread&node=127.0.0.1:{tombstoned.http_port}")
    assert status == 200
    for p in range(2):
        message = write_partition(options, batches(["late"]), partition_id=p)
        assert message.address == nodes[1].tcp
    assert [message_count(n, "spread") for n in nodes] == [20, 22]

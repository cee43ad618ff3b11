"""lmqadmin with ``--lookupd-http-address``: every command against two registered lmqd nodes.

Rules for this module: one ``lmqlookupd`` and two ``lmqd`` subprocesses for the module
(127.0.0.1, port 0, data in a temp dir, each registering with the lookupd); each test uses its
own topic names; lmqadmin runs through click's CliRunner and knows only the lookupd (the
environment gives no daemon address); waits poll the lookupd with a bound.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner, Result

from lmq_client.admin.cli import cli
from lmq_client.http import HTTPClient
from lmq_client.lookupd import lookup_producers

from . import procs
from .procs import Daemon, eventually, http

pytestmark = pytest.mark.interop

WITHIN_S = 20.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Daemon, list[Daemon]]]:
    lookupd = procs.lookupd()
    nodes: list[Daemon] = []
    try:
        data = tmp_path_factory.mktemp("admin-cluster")
        for i in range(2):
            nodes.append(procs.lmqd(data / f"n{i}", f"--lookupd-tcp-address={lookupd.tcp}"))
        # Registration is asynchronous: wait until the lookupd knows both nodes, or a command
        # run at once may find only the first (lmqadmin acts on the nodes the lookupd lists).
        wanted = sorted(n.tcp_port for n in nodes)

        def ports() -> list[int]:
            producers = http(lookupd.http, "GET", "/nodes")[1]["producers"]
            return sorted(p["tcp_port"] for p in producers)

        eventually(ports, lambda found: found == wanted, WITHIN_S)
        yield lookupd, nodes
    finally:
        for node in nodes:
            node.check_stop()
        lookupd.check_stop()


def run(lookupd: Daemon, *args: str) -> Result:
    env = {"LMQ_LOOKUPD_HTTP_ADDRESS": lookupd.http, "LMQ_TCP_ADDRESS": "",
           "LMQ_HTTP_ADDRESS": ""}  # fmt: skip
    return CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)


def node_topic(node: Daemon, topic: str) -> dict[str, Any] | None:
    topics = HTTPClient(node.http).stats(topic)["topics"] or []
    return topics[0] if topics else None


def listed(lookupd: Daemon, topic: str, nodes: list[Daemon]) -> None:
    wanted = sorted(n.tcp for n in nodes)
    eventually(lambda: sorted(lookup_producers(lookupd.http, topic)), lambda p: p == wanted,
               WITHIN_S)  # fmt: skip


def test_topic_actions_reach_every_node(cluster: tuple[Daemon, list[Daemon]]) -> None:
    lookupd, nodes = cluster
    result = run(lookupd, "--json", "topic", "create", "adm")
    assert result.exit_code == 0, result.output
    assert sorted(json.loads(result.output)["nodes"]) == sorted(n.http for n in nodes)
    listed(lookupd, "adm", nodes)
    assert run(lookupd, "channel", "create", "adm", "ch").exit_code == 0
    assert run(lookupd, "topic", "pause", "adm").exit_code == 0
    assert all(node_topic(n, "adm")["paused"] for n in nodes)  # type: ignore[index]
    result = run(lookupd, "topic", "delete", "adm")
    assert result.exit_code == 0, result.output
    assert [node_topic(n, "adm") for n in nodes] == [None, None]
    # as nsqadmin: gone from the lookupd's topics too, not just without producers
    eventually(lambda: http(lookupd.http, "GET", "/topics")[1]["topics"],
               lambda t: "adm" not in t, WITHIN_S)  # fmt: skip
    result = run(lookupd, "topic", "empty", "adm")
    assert result.exit_code == 1
    assert "no node with topic adm" in result.output


def test_stats_one_table_with_a_node_column(cluster: tuple[Daemon, list[Daemon]]) -> None:
    lookupd, nodes = cluster
    for i, node in enumerate(nodes):
        status, _ = http(node.http, "POST", "/mpub?topic=st", b"\n".join([b"m"] * (i + 2)))
        assert status == 200
    listed(lookupd, "st", nodes)
    result = run(lookupd, "stats", "st", "--interval", "0")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    header = next(line for line in lines if "topic / channel" in line)
    assert [c.strip() for c in header.split("┃")[1:3]] == ["topic / channel", "node"]
    rows = {line.split("│")[2].strip(): line.split("│") for line in lines if "│" in line}
    assert rows["all (2)"][1].strip() == "st"
    assert rows["all (2)"][3].strip() == "5"  # depth, summed
    assert rows[nodes[0].http][3].strip() == "2"
    assert rows[nodes[1].http][3].strip() == "3"

    result = run(lookupd, "stats", "st", "--json", "--interval", "0")
    data = json.loads(result.output)
    assert sorted(data["nodes"]) == sorted(n.http for n in nodes)
    (topic,) = data["topics"]
    assert topic["depth"] == 5
    assert {p["node"]: p["depth"] for p in topic["per_node"]} == {
        nodes[0].http: 2, nodes[1].http: 3
    }


def test_pub_then_tail_discovers_every_node(cluster: tuple[Daemon, list[Daemon]]) -> None:
    lookupd, nodes = cluster
    for node in nodes:
        status, _ = http(node.http, "POST", "/pub?topic=tl", node.tcp.encode())
        assert status == 200
    result = run(lookupd, "--json", "pub", "tl", "from-lmqadmin")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["address"] in [n.tcp for n in nodes]
    listed(lookupd, "tl", nodes)
    result = run(lookupd, "tail", "tl", "-n", "3")
    assert result.exit_code == 0, result.output
    assert sorted(result.output.splitlines()) == sorted([*(n.tcp for n in nodes),
                                                         "from-lmqadmin"])  # fmt: skip


def test_bench_publishes_to_every_node_and_reads_through_the_lookupd(
    cluster: tuple[Daemon, list[Daemon]],
) -> None:
    lookupd, nodes = cluster
    result = run(lookupd, "--json", "bench", "--topic", "bn", "--writers", "2", "--readers", "1",
                 "--count", "4000", "--quiet")  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert sorted(report["daemons"]) == sorted(n.tcp for n in nodes)
    assert report["publish"]["messages"] == report["consume"]["messages"] == 4000
    counts = [node_topic(n, "bn")["message_count"] for n in nodes]  # type: ignore[index]
    assert counts == [2000, 2000]  # writer i publishes to node i

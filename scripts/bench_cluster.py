"""Throughput of 1, 2, 4 ... lmqd nodes on this machine, producers spread over the nodes and
consumers finding them through the lookupd.

    .venv/bin/python scripts/bench_cluster.py [--nodes 1,2,4] [--runs 2] [--duration 10]
        [--size 100] [--writers-per-node 1] [--readers 2] [--lmqd-flag=... ...] [--markdown]

For each node count and run: a fresh ``LocalCluster`` (``scripts/cluster.py``: an lmqlookupd and
N lmqd processes, 127.0.0.1 free ports, data in a new temporary directory), then
``lmqadmin --lookupd-http-address=<lookupd> bench --json`` with ``writers-per-node * N``
writer processes (writer ``i`` publishes to node ``i % N``) and ``--readers`` reader processes,
each of which asks the lookupd for the topic's producers and subscribes on all of them. The
daemons' CPU time (user + system, ``/proc/<pid>/stat``, summed over the nodes) is read before
and after and divided by the messages consumed, as ``bench_throughput.py`` does for one node;
"cores busy" is that CPU time over the publishing time. The writers' and readers' own CPU time
(lmqadmin bench reports it) per message consumed is the clients' share: daemons' plus clients'
CPU per message, divided into the machine's cores, is the most any node count can reach here.

Prints one line per run and the medians per node count (a Markdown table with
``--markdown``), with the load average when each run began: on a machine with fewer cores than
processes the figures measure the scheduler as much as lmqd, so read them with the core count
(printed first).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from cluster import REPO, LocalCluster

# The checkout's root on sys.path: the daemon helpers are shared with the tests.
sys.path.insert(0, str(REPO))
from tests.support.process import load_average

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


def run_once(args: argparse.Namespace, nodes: int, index: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="lmq-cluster-bench-", dir=args.dir) as data:
        cluster = LocalCluster(nodes, data, base_port=0, lmqd_flags=args.lmqd_flag, echo=False)
        with cluster:
            assert cluster.lookupd is not None
            writers = args.writers_per_node * nodes
            command = [
                sys.executable, "-m", "lmq_client.admin",
                "--lookupd-http-address", cluster.lookupd.http, "--timeout", "30",
                "bench", "--json", "-q", "--topic", f"bench{index}",
                "--writers", str(writers), "--readers", str(args.readers),
                "--size", str(args.size), "--batch-size", str(args.batch_size),
                "--rdy", str(args.rdy), "--duration", str(args.duration),
            ]  # fmt: skip
            load = load_average()
            pids = [node.pid for node in cluster.nodes]
            cpu0 = sum(cpu_seconds(pid) for pid in pids)
            done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=False)
            cpu1 = sum(cpu_seconds(pid) for pid in pids)
    if done.returncode != 0:
        raise RuntimeError(f"lmqadmin bench failed ({done.returncode}):\n{done.stderr}")
    report = json.loads(done.stdout)
    if report["errors"]:
        raise RuntimeError(f"lmqadmin bench reported errors: {report['errors']}")
    consumed = report["consume"]["messages"] if report["consume"] else 0
    clients_cpu = report["publish"]["client_cpu_s"] + (
        report["consume"]["client_cpu_s"] if report["consume"] else 0.0
    )
    return {
        "nodes": nodes,
        "run": index,
        "load": load,
        "writers": writers,
        "published": report["publish"]["msgs_per_s"],
        "consumed": report["consume"]["msgs_per_s"] if report["consume"] else 0.0,
        "daemon_cpu_us": 1e6 * (cpu1 - cpu0) / consumed if consumed else 0.0,
        "daemon_cores": (cpu1 - cpu0) / report["publish"]["seconds"],
        "clients_cpu_us": 1e6 * clients_cpu / consumed if consumed else 0.0,
        "p99_ms": report["latency_ms"].get("p99"),
    }


def line(r: dict[str, Any]) -> str:
    p99 = "-" if r["p99_ms"] is None else f"{r['p99_ms']:.1f} ms"
    return (
        f"{r['nodes']} node(s) run {r['run']}: load {r['load']}, {r['writers']} writers: "
        f"published {r['published']:,.0f}/s, consumed {r['consumed']:,.0f}/s, daemons "
        f"{r['daemon_cpu_us']:.2f} us/msg ({r['daemon_cores']:.2f} cores), clients "
        f"{r['clients_cpu_us']:.2f} us/msg, p99 {p99}"
    )


def markdown(results: list[dict[str, Any]]) -> str:
    rows = [
        "| nodes | run | load | writers | published msgs/s | consumed msgs/s | daemons' CPU/msg "
        "| daemons' cores busy | clients' CPU/msg | p99 latency |",
        "| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for nodes in sorted({r["nodes"] for r in results}):
        mine = [r for r in results if r["nodes"] == nodes]
        for r in mine:
            p99 = "-" if r["p99_ms"] is None else f"{r['p99_ms']:.1f} ms"
            rows.append(
                f"| {nodes} | {r['run']} | {r['load']} | {r['writers']} | {r['published']:,.0f} "
                f"| {r['consumed']:,.0f} | {r['daemon_cpu_us']:.2f} µs | "
                f"{r['daemon_cores']:.2f} | {r['clients_cpu_us']:.2f} µs | {p99} |"
            )
        rows.append(
            f"| **{nodes}** | **median** | | | "
            f"**{statistics.median(r['published'] for r in mine):,.0f}** | "
            f"**{statistics.median(r['consumed'] for r in mine):,.0f}** | "
            f"**{statistics.median(r['daemon_cpu_us'] for r in mine):.2f} µs** | "
            f"**{statistics.median(r['daemon_cores'] for r in mine):.2f}** | "
            f"**{statistics.median(r['clients_cpu_us'] for r in mine):.2f} µs** | |"
        )
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", default="1,2,4", help="node counts, comma-separated")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=200)
    parser.add_argument("--rdy", type=int, default=2500)
    parser.add_argument("--writers-per-node", type=int, default=1)
    parser.add_argument("--readers", type=int, default=2)
    parser.add_argument("--lmqd-flag", action="append", default=[],
                        help="extra lmqd flag for every node, e.g. --lmqd-flag=--mem-queue-size=0")
    parser.add_argument("--dir", default=None, help="where the temporary data dirs go")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    print(f"{os.cpu_count()} cores, load {load_average()} at start", flush=True)
    results = []
    for nodes in (int(n) for n in args.nodes.split(",")):
        for run in range(1, args.runs + 1):
            result = run_once(args, nodes, run)
            results.append(result)
            print(line(result), flush=True)
    if args.markdown:
        print(markdown(results))


if __name__ == "__main__":
    main()

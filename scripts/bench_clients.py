"""The Python NSQ clients side by side against one lmqd: lmq_client's three front ends, pynsq,
gnsq and ansq, each publishing and consuming the same messages.

    .venv/bin/python scripts/bench_clients.py [--messages 1000000] [--size 100] [--batch 100]
        [--max-in-flight 2500] [--runs 3] [--limit 120] [--client lmq-trio ...] [--markdown]

One ``lmqd`` (``python -m lmqd``, 127.0.0.1 port 0, ``--mem-queue-size`` as large as the
messages, so the daemon serves from memory: the clients are measured, not the disk) serves every
run. Each client runs in its own process (``bench_clients_child.py``): it publishes
``--messages`` bodies of ``--size`` bytes as MPUBs of ``--batch``, one MPUB in flight at a time,
then consumes them on a new channel with ``--max-in-flight`` and FINs each one (a consume phase
stops after ``--limit`` seconds if the messages have not all come by then); what the channel
still holds is then read from ``/stats`` (published minus consumed, when every FIN arrived) and
the topic deleted. Per phase it reports messages per second (wall) and the client's own CPU time per
message (``time.process_time`` of its process: the figure a shared machine moves least).

pynsq, gnsq and ansq are not lmq's dependencies: the script installs them (``pip install
pynsq==0.9.1 gnsq==1.0.2 ansq==0.3.0``) in a scratch virtualenv, ``--venv``
(``/tmp/lmq-bench-clients``), made once and reused. lmq's clients run in the checkout's
virtualenv. ansq's reader keeps ``RDY 1`` per connection; the bench raises it to
``--max-in-flight`` with ansq's own ``connection.rdy()``, as the others get it from their
``max_in_flight``. The clients run in turn, each run starting one client further on in the
list (run 1: lmq-trio first, run 2: lmq-asyncio first...); medians are over the runs.
``--lmq-source DIR`` runs the lmq clients from another tree (an earlier commit's ``git
archive``: before and after).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from lmq_client.http import HTTPClient
from tests.support.process import load_average, start_lmqd, stop_lmqd

LMQ_CLIENTS = ["lmq-trio", "lmq-asyncio", "lmq-blocking"]
OTHER_CLIENTS = {"pynsq": "pynsq==0.9.1", "gnsq": "gnsq==1.0.2", "ansq": "ansq==0.3.0"}
CHILD = Path(__file__).resolve().parent / "bench_clients_child.py"


def scratch_python(venv: Path) -> str:
    """The scratch virtualenv's python, with pynsq, gnsq and ansq installed (made once)."""
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    check = "import nsq, gnsq, ansq"
    if subprocess.run([str(python), "-c", check], capture_output=True).returncode != 0:
        print(f"installing {', '.join(OTHER_CLIENTS.values())} into {venv}", file=sys.stderr)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                        *OTHER_CLIENTS.values()], check=True)  # fmt: skip
    return str(python)


def run_client(python: str, client: str, address: str, topic: str, a: argparse.Namespace
               ) -> dict[str, Any]:  # fmt: skip
    command = [python, str(CHILD), client, address, topic, str(a.messages), str(a.size),
               str(a.batch), str(a.max_in_flight), str(a.limit)]  # fmt: skip
    env = dict(os.environ)
    if a.lmq_source is not None and client in LMQ_CLIENTS:
        env["PYTHONPATH"] = str(a.lmq_source)  # ahead of the checkout's editable install
    done = subprocess.run(command, capture_output=True, text=True, timeout=a.limit * 4 + 300,
                          env=env)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"{client} failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def left_in_channel(http: HTTPClient, topic: str) -> int:
    """Messages the daemon still holds on the bench channel (ready, in flight or deferred): the
    messages published minus those consumed, if every FIN arrived."""
    stats = http.stats(topic=topic, channel="bench")
    return sum(c["depth"] + c["in_flight_count"] + c["deferred_count"]
               for t in stats["topics"] or [] for c in t["channels"])  # fmt: skip


def figures(phase: dict[str, float]) -> tuple[float, float]:
    """(messages per second, client CPU microseconds per message)."""
    n = phase["messages"]
    return n / phase["seconds"], phase["cpu_seconds"] / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--batch", type=int, default=100, help="messages per MPUB")
    parser.add_argument("--max-in-flight", type=int, default=2500)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--limit", type=float, default=120.0,
                        help="seconds a consume phase may take")
    parser.add_argument("--client", action="append", choices=[*LMQ_CLIENTS, *OTHER_CLIENTS],
                        help="only these clients (repeatable; default: all six)")
    parser.add_argument("--venv", type=Path, default=Path("/tmp/lmq-bench-clients"))
    parser.add_argument("--lmq-source", type=Path,
                        help="a directory holding another lmq_client (and lmqd) to run as the lmq "
                        "clients, e.g. an earlier commit's `git archive`")
    parser.add_argument("--markdown", action="store_true")
    a = parser.parse_args()
    clients = a.client or [*LMQ_CLIENTS, *OTHER_CLIENTS]
    other = scratch_python(a.venv) if set(clients) & set(OTHER_CLIENTS) else ""
    results: dict[str, list[dict[str, Any]]] = {c: [] for c in clients}
    with tempfile.TemporaryDirectory(prefix="lmq-bench-clients-") as data:
        daemon = start_lmqd(Path(data), [f"--mem-queue-size={a.messages}"])
        try:
            assert daemon.http_address is not None
            http = HTTPClient(daemon.http_address, timeout=60)
            for run in range(a.runs):
                # Each run starts one client further on, so that no client always runs first
                # (after the daemon freed the last run's topics) or right after the same one.
                for client in clients[run % len(clients):] + clients[:run % len(clients)]:
                    topic = f"bench-{client}-{run}"
                    load = load_average()
                    python = sys.executable if client in LMQ_CLIENTS else other
                    result = run_client(python, client, daemon.tcp_address, topic, a)
                    result["left"] = left_in_channel(http, topic)
                    http.topic_action("delete", topic)
                    time.sleep(1)  # the daemon frees the topic before the next client
                    results[client].append(result)
                    pub_rate, pub_cpu = figures(result["publish"])
                    con_rate, con_cpu = figures(result["consume"])
                    print(f"run {run + 1} {client:13} publish {pub_rate:9,.0f} msgs/s "
                          f"{pub_cpu:5.1f} µs/msg | consume {con_rate:9,.0f} msgs/s "
                          f"{con_cpu:5.1f} µs/msg ({result['consume']['messages']:,} msgs, "
                          f"{result['left']:,} left) load {load}", flush=True)  # fmt: skip
        finally:
            stop_lmqd(daemon)
    print()
    rows = []
    for client in clients:
        pubs = [figures(r["publish"]) for r in results[client]]
        cons = [figures(r["consume"]) for r in results[client]]
        rows.append((client, statistics.median(p[0] for p in pubs),
                     statistics.median(p[1] for p in pubs),
                     statistics.median(c[0] for c in cons),
                     statistics.median(c[1] for c in cons)))  # fmt: skip
    if a.markdown:
        print("| client | publish msgs/s | publish CPU µs/msg | consume msgs/s | "
              "consume CPU µs/msg |")
        print("| --- | ---: | ---: | ---: | ---: |")
        for name, pr, pc, cr, cc in rows:
            print(f"| {name} | {pr:,.0f} | {pc:.1f} | {cr:,.0f} | {cc:.1f} |")
    else:
        print(f"medians of {a.runs} run(s), {a.messages:,} messages of {a.size} bytes:")
        for name, pr, pc, cr, cc in rows:
            print(f"{name:13} publish {pr:9,.0f} msgs/s {pc:5.1f} µs/msg | "
                  f"consume {cr:9,.0f} msgs/s {cc:5.1f} µs/msg")


if __name__ == "__main__":
    main()

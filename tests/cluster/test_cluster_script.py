"""``scripts/cluster.py``: a lookupd and N nodes on one machine, used as a user would.

Rules for this module: the launcher runs as a subprocess with ``--base-port 0`` (free ports on
127.0.0.1) and its data under ``tmp_path``; the test reads the addresses from its summary,
publishes and consumes through the lookupd only, then stops it with SIGINT (Ctrl-C) and expects
every daemon to have shut down cleanly (exit 0, each node's queues written to its own data
directory). Every wait is bounded.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from lmq_client.lookupd import lookup_nodes, lookup_producers
from lmq_client.sync import Consumer, Producer

from .procs import REPO_ROOT, eventually

pytestmark = pytest.mark.interop

START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 30.0


def test_cluster_script_starts_registers_and_stops_cleanly(tmp_path: Path) -> None:
    process = subprocess.Popen(
        [sys.executable, "scripts/cluster.py", "-n", "3", "--base-port", "0",
         "--data-dir", str(tmp_path / "cluster"), "--mem-queue-size=5"],
        cwd=REPO_ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    lines: list[str] = []
    ready = threading.Event()

    def read() -> None:
        assert process.stderr is not None
        for raw in process.stderr:
            lines.append(raw.decode("utf-8", "replace").rstrip("\n"))
            if lines[-1].startswith("Ctrl-C stops"):
                ready.set()
        ready.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        ready.wait(START_TIMEOUT_S)
        output = "\n".join(lines)
        match = re.search(r"lookupd +TCP \S+ +HTTP (\S+)", output)
        assert match, output
        lookupd = match.group(1)
        nodes = re.findall(r"node-\d +TCP (\S+) +HTTP (\S+)", output)
        assert len(nodes) == 3, output
        found = eventually(lambda: lookup_nodes(lookupd), lambda n: len(n) == 3, 20.0)
        assert sorted(n.tcp_address for n in found) == sorted(tcp for tcp, _ in nodes)

        # one topic on every node (the first pub on each creates it), ten messages each
        for tcp, _ in nodes:
            with Producer(tcp) as producer:
                producer.mpub("events", [f"{tcp}-{i}".encode() for i in range(10)])
        eventually(lambda: lookup_producers(lookupd, "events"), lambda p: len(p) == 3, 20.0)
        received: list[str] = []
        with Consumer("events", "all", lookupd_http_addresses=lookupd, max_in_flight=6) as c:
            assert len(c.connected_addresses) == 3
            deadline = time.monotonic() + 20
            while len(received) < 30 and time.monotonic() < deadline:
                message = c.get(timeout=1)
                if message is not None:
                    received.append(message.body.decode())
                    message.finish()
        assert sorted(received) == sorted(f"{tcp}-{i}" for tcp, _ in nodes for i in range(10))
    finally:
        process.send_signal(signal.SIGINT)
        try:
            code = process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            code = process.wait()
        reader.join(5)
        assert process.stderr is not None
        process.stderr.close()
    output = "\n".join(lines)
    assert code == 0, output
    assert "Traceback" not in output and "Aborted" not in output, output
    for i in range(3):  # each node kept its own data directory and wrote its metadata there
        assert (tmp_path / "cluster" / f"node-{i}" / "lmqd.dat").exists()

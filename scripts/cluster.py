"""Several lmqd nodes and one lmqlookupd on this machine, so that one host uses all its cores.

    .venv/bin/python scripts/cluster.py [-n NODES] [--base-port 4150] [--host 127.0.0.1]
        [--data-dir data/cluster] [LMQD FLAGS...]

(``scripts/cluster`` is the same, with the virtualenv set up first, as ``scripts/run``.)

lmqd is one trio thread: one node uses one core. NSQ's answer to more cores is more nodes, and
that is what this starts: an ``lmqlookupd`` and ``NODES`` ``lmqd`` processes (default: one per
core), each with its own data directory (``DATA_DIR/node-<i>``), its own ports and its own
``--node-id``, every one registering with the lookupd. Producers spread over the nodes;
consumers find them all through the lookupd (``lmq_client`` consumers, ``lmqadmin tail``, pynsq,
go-nsq, ``nsq_tail``, nsqadmin: give them ``--lookupd-http-address``).

Ports from ``--base-port`` (B, default 4150, nsqd's): the lookupd listens on B+10 (TCP) and
B+11 (HTTP), nsqlookupd's 4160 and 4161; node ``i`` on B+100*i (TCP) and B+100*i+1 (HTTP):
4150/4151, 4250/4251, 4350/4351 ... ``--base-port 0`` picks free ports (the summary shows them).
Further arguments go to every lmqd (``--mem-queue-size=0``, ``--durable`` ...).

It runs in the foreground and prints where everything listens; the daemons' logs go to this
terminal, each line prefixed with its name. Ctrl-C (or SIGTERM) stops the nodes (gracefully:
they write their queues to disk), then the lookupd; if any daemon exits on its own, the others
are stopped too and the exit status is 1. ``LocalCluster`` is the same thing for other scripts
(``scripts/bench_cluster.py``).
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

__all__ = ["LocalCluster", "Process", "main"]

REPO = Path(__file__).resolve().parent.parent
_LISTENING = re.compile(r"(TCP|HTTP): listening on (\S+)")
# A node recovering a large data directory takes a while to listen.
START_TIMEOUT_S = 60.0
# Nodes write their memory queues to disk on SIGTERM: give them time.
STOP_TIMEOUT_S = 60.0


class Process:
    """One daemon: its output is read by a thread (echoed with a prefix, or kept quiet) and its
    listening addresses are taken from it."""

    def __init__(self, name: str, command: list[str], *, echo: bool) -> None:
        self.name = name
        self.echo = echo
        # A session of its own: Ctrl-C in the terminal reaches only the launcher, which stops
        # the daemons in order (one signal each, not the terminal's and then ours).
        self.process = subprocess.Popen(
            command, cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        self.addresses: dict[str, str] = {}
        self.tail: list[str] = []
        self._both = threading.Event()
        self._reader = threading.Thread(target=self._read, name=f"{name}-output", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for raw in self.process.stdout:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            self.tail = [*self.tail[-19:], line]
            if self.echo:
                sys.stderr.write(f"{self.name:>8} | {line}\n")
            if m := _LISTENING.search(line):
                self.addresses.setdefault(m.group(1), m.group(2))
                if len(self.addresses) == 2:
                    self._both.set()
        self._both.set()

    def wait_listening(self) -> None:
        self._both.wait(START_TIMEOUT_S)
        if len(self.addresses) < 2:
            raise RuntimeError(f"{self.name} did not start; last output:\n" + "\n".join(self.tail))

    @property
    def tcp(self) -> str:
        return self.addresses["TCP"]

    @property
    def http(self) -> str:
        return self.addresses["HTTP"]

    @property
    def pid(self) -> int:
        return self.process.pid

    def signal_stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)

    def wait(self) -> int:
        try:
            self.process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._reader.join(5)
        if self.process.stdout is not None:
            self.process.stdout.close()
        return self.process.returncode


class LocalCluster:
    """An lmqlookupd and ``nodes`` lmqd processes; a context manager that stops them all."""

    def __init__(
        self,
        nodes: int,
        data_dir: str | Path,
        *,
        base_port: int = 4150,
        host: str = "127.0.0.1",
        lmqd_flags: Sequence[str] = (),
        echo: bool = True,
    ) -> None:
        if nodes < 1:
            raise ValueError("a cluster needs at least one node")
        self.count = nodes
        self.data_dir = Path(data_dir)
        self.base_port = base_port
        self.host = host
        self.lmqd_flags = list(lmqd_flags)
        self.echo = echo
        self.lookupd: Process | None = None
        self.nodes: list[Process] = []

    def _port(self, offset: int) -> int:
        return self.base_port + offset if self.base_port else 0

    def start(self) -> LocalCluster:
        """Start the lookupd, then every node; return once all of them listen."""
        python = sys.executable
        try:
            self.lookupd = Process("lookupd", [
                python, "-m", "lmqd.lookupd",
                f"--tcp-address={self.host}:{self._port(10)}",
                f"--http-address={self.host}:{self._port(11)}",
                f"--broadcast-address={self.host}",
            ], echo=self.echo)  # fmt: skip
            self.lookupd.wait_listening()
            for i in range(self.count):
                data = self.data_dir / f"node-{i}"
                data.mkdir(parents=True, exist_ok=True)
                self.nodes.append(Process(f"node-{i}", [
                    python, "-m", "lmqd",
                    f"--tcp-address={self.host}:{self._port(100 * i)}",
                    f"--http-address={self.host}:{self._port(100 * i + 1)}",
                    f"--broadcast-address={self.host}",
                    f"--lookupd-tcp-address={self.lookupd.tcp}",
                    f"--data-path={data}",
                    f"--node-id={i}",  # message ids stay unique across the nodes
                    *self.lmqd_flags,
                ], echo=self.echo))  # fmt: skip
            for node in self.nodes:
                node.wait_listening()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> list[int]:
        """SIGTERM the nodes (in parallel), wait, then the lookupd; the exit codes."""
        for node in self.nodes:
            node.signal_stop()
        codes = [node.wait() for node in self.nodes]
        if self.lookupd is not None:
            self.lookupd.signal_stop()
            codes.append(self.lookupd.wait())
        return codes

    def exited(self) -> Process | None:
        """A daemon that is no longer running, if any."""
        everyone = [*self.nodes, *([self.lookupd] if self.lookupd else [])]
        return next((p for p in everyone if p.process.poll() is not None), None)

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def summary(self) -> str:
        assert self.lookupd is not None
        lines = [
            f"lmq cluster: {self.count} node(s), data in {self.data_dir}",
            f"  lookupd   TCP {self.lookupd.tcp}   HTTP {self.lookupd.http}",
        ]
        lines += [f"  {n.name:<9} TCP {n.tcp}   HTTP {n.http}" for n in self.nodes]
        lookupd = self.lookupd.http
        lines += [
            "try:",
            f"  lmqadmin --lookupd-http-address={lookupd} stats",
            f"  lmqadmin --lookupd-http-address={lookupd} pub events hello",
            f"  lmqadmin --lookupd-http-address={lookupd} tail events",
            "Ctrl-C stops every node, then the lookupd.",
        ]
        return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Start an lmqlookupd and N lmqd nodes on this machine.",
        epilog="Arguments it does not know are passed to every lmqd.",
    )
    parser.add_argument("-n", "--nodes", type=int, default=os.cpu_count() or 1,
                        help="lmqd nodes to start [default: one per core]")
    parser.add_argument("--base-port", type=int, default=4150,
                        help="lookupd on +10/+11, node i on +100*i/+100*i+1; 0: free ports")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on and to register the nodes as")
    parser.add_argument("--data-dir", default=str(REPO / "data" / "cluster"),
                        help="node i keeps its data in DATA_DIR/node-<i>")
    args, lmqd_flags = parser.parse_known_args(argv)
    cluster = LocalCluster(args.nodes, args.data_dir, base_port=args.base_port,
                           host=args.host, lmqd_flags=lmqd_flags)  # fmt: skip
    stopping = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stopping.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        cluster.start()
    except RuntimeError as exc:
        sys.stderr.write(f"cluster: {exc}\n")
        return 1
    sys.stderr.write(cluster.summary() + "\n")
    died = None
    while not stopping.is_set():
        died = cluster.exited()
        if died is not None:
            sys.stderr.write(f"cluster: {died.name} exited ({died.process.returncode}); "
                             "stopping the others\n")
            break
        stopping.wait(0.5)
    sys.stderr.write("cluster: stopping\n")
    codes = cluster.stop()
    return 1 if died is not None or any(codes) else 0


if __name__ == "__main__":
    sys.exit(main())

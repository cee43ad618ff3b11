"""The whole daemon's instructions per message under callgrind: a count, not a time.

    .venv/bin/python scripts/count_daemon.py [--phase pub|all] [--messages 20000 100000]
        [--checkout DIR] [--cache-sim] [--lmqd-flag=... ...]

Runs ``python -m lmqd`` (from this checkout, or ``--checkout``'s with this interpreter) under
``valgrind --tool=callgrind`` twice, with the same fixed workload of two sizes, and divides the
difference of the instruction totals by the difference of the message counts, so start-up and
shutdown cancel out. The workload is NSQ's benchmark made deterministic: over one connection,
MPUBs of 200 bodies of 100 bytes to a topic that has a channel, each ``OK`` awaited (the default
daemon spills past its memory tail, as bench_writer makes it); with ``--phase all`` a consumer
then subscribes with RDY 2500 and FINs every message of each buffer it receives, as
bench_reader does. Everything the daemon does is counted: the protocol, trio, the engine, the
storage, the syscalls' user-space side (not the kernel's). Repeatable to a few instructions a
message for one tree, whatever else the machine runs; the tool to compare trees with
(``git worktree add /work/before <commit>`` and ``--checkout /work/before``).

``--cache-sim`` adds callgrind's cache simulation with a 1 MiB last level (the development VM's
L2): the misses a message costs, which is where a design that keeps messages long in memory
shows (docs/benchmarks.md, "The speed back").
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
BODY = b"x" * 100
BATCH = 200
TIMEOUT_S = 600.0
"""A run under callgrind is ~50 times slower than without; past this it is stuck."""


def _mpub(topic: bytes) -> bytes:
    body = struct.pack(">i", BATCH) + b"".join(
        struct.pack(">i", len(BODY)) + BODY for _ in range(BATCH)
    )
    return b"MPUB " + topic + b"\n" + struct.pack(">i", len(body)) + body


def _frame(sock: socket.socket, buf: bytes) -> tuple[bytes, bytes]:
    while len(buf) < 4:
        buf += sock.recv(1 << 20)
    size = struct.unpack(">i", buf[:4])[0]
    while len(buf) < 4 + size:
        buf += sock.recv(1 << 20)
    return buf[4 : 4 + size], buf[4 + size :]


def _workload(tcp: str, messages: int, consume: bool) -> None:
    host, _, port = tcp.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=TIMEOUT_S) as sock:
        sock.sendall(b"  V2")
        command = _mpub(b"t")
        buf = b""
        for _ in range(messages // BATCH):
            sock.sendall(command)
            frame, buf = _frame(sock, buf)
            if frame[4:] != b"OK":
                raise RuntimeError(f"MPUB answered {frame!r}")
    if not consume:
        return
    with socket.create_connection((host, int(port)), timeout=TIMEOUT_S) as sock:
        sock.sendall(b"  V2SUB t c\n")
        frame, buf = _frame(sock, b"")
        if frame[4:] != b"OK":
            raise RuntimeError(f"SUB answered {frame!r}")
        sock.sendall(b"RDY 2500\n")
        got = 0
        while got < messages:
            buf += sock.recv(1 << 20)
            fins = []
            while len(buf) >= 4:
                size = struct.unpack(">i", buf[:4])[0]
                if len(buf) < 4 + size:
                    break
                frame, buf = buf[4 : 4 + size], buf[4 + size :]
                if struct.unpack(">i", frame[:4])[0] == 2:  # a message frame
                    fins.append(b"FIN " + frame[14:30] + b"\n")
                    got += 1
            if fins:
                sock.sendall(b"".join(fins))
        sock.sendall(b"CLS\n")
        time.sleep(0.5)


def count(args: argparse.Namespace, messages: int) -> dict[str, int]:
    """One run of the daemon under callgrind: its event totals."""
    checkout = Path(args.checkout).resolve() if args.checkout else REPO_ROOT
    with tempfile.TemporaryDirectory(prefix="count-daemon-") as tmp:
        out = os.path.join(tmp, "callgrind.out")
        tool = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"]
        if args.cache_sim:
            tool += ["--cache-sim=yes", "--LL=1048576,16,64"]
        env = dict(os.environ, PYTHONPATH=str(checkout), PYTHONHASHSEED="0")
        daemon = subprocess.Popen(
            [*tool, sys.executable, "-m", "lmqd", "--tcp-address=127.0.0.1:0",
             "--http-address=127.0.0.1:0", f"--data-path={tmp}", *args.lmqd_flag],
            cwd=checkout, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        assert daemon.stdout is not None
        addresses: dict[str, str] = {}
        lines: list[str] = []
        while len(addresses) < 2:
            line = daemon.stdout.readline()
            if not line:
                raise RuntimeError("lmqd did not start:\n" + "".join(lines))
            lines.append(line)
            m = re.search(r"(TCP|HTTP): listening on (\S+)", line)
            if m:
                addresses[m.group(1)] = m.group(2)
        # Read its output to the end: a full pipe would block the daemon.
        threading.Thread(target=daemon.stdout.read, daemon=True).start()
        for path in ("/topic/create?topic=t", "/channel/create?topic=t&channel=c"):
            request = urllib.request.Request(
                f"http://{addresses['HTTP']}{path}", method="POST", data=b""
            )
            urllib.request.urlopen(request, timeout=TIMEOUT_S).read()
        _workload(addresses["TCP"], messages, args.phase == "all")
        daemon.terminate()
        daemon.wait(TIMEOUT_S)
        events: list[str] = []
        totals: list[int] = []
        with open(out) as f:
            for line in f:
                if line.startswith("events:"):
                    events = line.split()[1:]
                elif line.startswith(("summary:", "totals:")):
                    totals = [int(x) for x in line.split()[1:]]
        return dict(zip(events, totals, strict=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--phase", choices=("pub", "all"), default="all")
    parser.add_argument("--messages", type=int, nargs=2, default=[20_000, 100_000])
    parser.add_argument("--checkout", default=None, help="Another checkout of lmqd to count.")
    parser.add_argument("--cache-sim", action="store_true")
    parser.add_argument("--lmqd-flag", action="append", default=[])
    args = parser.parse_args()
    small, large = sorted(args.messages)
    a = count(args, small)
    b = count(args, large)
    per = {k: (b[k] - a[k]) / (large - small) for k in b}
    print(
        f"{args.checkout or 'this checkout'} ({args.phase}): "
        + "  ".join(f"{k} {v:,.1f}" for k, v in per.items())
        + " per message"
    )


if __name__ == "__main__":
    main()

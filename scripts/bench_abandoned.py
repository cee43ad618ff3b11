"""The daemon's memory after clients abandon large uploads: RSS idle, at the peak and after.

    .venv/bin/python scripts/bench_abandoned.py [--uploads 280] [--size-mib 4] [--together]
        [--runs 3] [--flags ...]

A bounded run on loopback (127.0.0.1, port 0, data in a temporary directory). Each client sends
the protocol magic and most of an MPUB whose declared body is ``--size-mib`` MiB (its message
count, then bytes that never complete it, 100 kB short), then closes the connection: nothing of
it can ever be applied. One client after the other by default; with ``--together`` all of them
connect and send first, and close only once every one has sent (the daemon-wide
``--max-buffered-bytes`` bound is what holds them back then). Prints, per run, the daemon's RSS
when idle, its peak (``VmHWM``) and its RSS two seconds after the last client left, in MiB, then
the medians. Issue 30's bound: after 280 abandoned 4 MiB uploads, within 100 MB of idle.
Figures: docs/benchmarks.md ("Abandoned uploads").
"""

from __future__ import annotations

import argparse
import socket
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path

# The checkout's root on sys.path: the lmqd subprocess helper is shared with the tests.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.support.process import start_lmqd

MiB = 1024 * 1024
SHORT = 100_000
"""Bytes of the declared body never sent."""


def run_once(uploads: int, size: int, together: bool, flags: list[str]) -> tuple[float, ...]:
    with tempfile.TemporaryDirectory(prefix="bench-abandoned-") as data:
        daemon = start_lmqd(Path(data), flags, http=False)
        try:
            host, port = daemon.tcp_host_port
            time.sleep(1.0)
            idle = daemon.rss_bytes()
            partial = (
                b"  V2MPUB abandoned\n" + struct.pack(">ii", size, 1000) + b"x" * (size - SHORT)
            )
            open_clients: list[socket.socket] = []
            for _ in range(uploads):
                client = socket.create_connection((host, port), timeout=120)
                client.sendall(partial)
                if together:
                    open_clients.append(client)
                else:
                    client.close()
            for client in open_clients:
                client.close()
            time.sleep(2.0)
            rss, peak = daemon.memory_kb()
            return idle / MiB, peak / 1024, rss / 1024
        finally:
            daemon.terminate()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--uploads", type=int, default=280)
    parser.add_argument("--size-mib", type=int, default=4, help="each MPUB's declared body")
    parser.add_argument("--together", action="store_true", help="all connected at once")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--flags", nargs="*", default=[], help="more lmqd flags")
    args = parser.parse_args()
    results = []
    for _ in range(args.runs):
        idle, peak, after = run_once(args.uploads, args.size_mib * MiB, args.together, args.flags)
        results.append((idle, peak, after))
        print(f"idle {idle:.0f} MiB, peak {peak:.0f} MiB, after {after:.0f} MiB", flush=True)
    idle, peak, after = (statistics.median(r[k] for r in results) for k in range(3))
    print(
        f"medians of {args.runs}: idle {idle:.0f} MiB, peak {peak:.0f} MiB, after {after:.0f} "
        f"MiB (+{after - idle:.0f} MiB) for {args.uploads} abandoned {args.size_mib} MiB uploads"
        f"{' at once' if args.together else ''}"
    )


if __name__ == "__main__":
    main()

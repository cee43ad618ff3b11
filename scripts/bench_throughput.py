"""End-to-end throughput of lmqd under ``lmqadmin bench``, with the daemon's own CPU per message.

    .venv/bin/python scripts/bench_throughput.py [--runs 3] [--duration 10] [--size 100]
        [--writers 1] [--readers 1] [--channels 1] [--lmqd-flag=--mem-queue-size=0 ...]
        [--markdown]

Each run starts a fresh ``lmqd`` (``python -m lmqd``, 127.0.0.1 port 0, HTTP off, data in a new
temporary directory under ``--dir``), then runs ``lmqadmin bench --json`` against it: the
writers and readers are separate processes, started by lmqadmin. The daemon's CPU time
(user + system, ``/proc/<pid>/stat``) is read just before and after the bench and divided by the
messages published, so it covers publish, and delivery and FIN on every channel, of every
message (the bench drains the channels before it returns). CPU per message is the robust
figure on a shared machine: the rates move with whatever else runs, CPU time much less.

Prints one line per run (rates, daemon CPU per message, the daemon's peak RSS, the bytes it wrote
to files -- about 0 unless the backlog spilled to disk -- in all and per message published, and
the load average when the run began) and the medians, as a Markdown table with ``--markdown``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

# The checkout's root on sys.path: the lmqd subprocess helper is shared with the tests.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.support.process import (
    BENCH_SHUTDOWN_TIMEOUT_S,
    REPO_ROOT,
    lmqadmin_command,
    load_average,
    start_lmqd,
)


def run_once(args: argparse.Namespace, index: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="lmq-bench-", dir=args.dir) as data:
        daemon = start_lmqd(Path(data), args.lmqd_flag, http=False)
        try:
            load = load_average()
            command = lmqadmin_command(
                daemon.tcp_address,
                *getattr(args, "admin_flag", []),
                "bench", "--json", "-q",
                "--topic", f"bench{index}",
                "--writers", str(args.writers), "--readers", str(args.readers),
                "--size", str(args.size), "--batch-size", str(args.batch_size),
                "--rdy", str(args.rdy), "--duration", str(args.duration),
                *getattr(args, "bench_flag", []),
                "--channels", str(args.channels),
            )  # fmt: skip
            cpu0 = daemon.cpu_seconds()
            written0 = daemon.bytes_written()
            done = subprocess.run(
                command, cwd=REPO_ROOT, capture_output=True, text=True, check=False
            )
            cpu1 = daemon.cpu_seconds()
            rss, hwm = daemon.memory_kb()
            # What the daemon wrote to files (segments, positions): ~0 unless the backlog spilled.
            spilled = daemon.bytes_written() - written0
        finally:
            daemon.terminate(BENCH_SHUTDOWN_TIMEOUT_S)
    if done.returncode != 0:
        raise RuntimeError(f"lmqadmin bench failed ({done.returncode}):\n{done.stderr}")
    report = json.loads(done.stdout)
    if report["errors"]:
        raise RuntimeError(f"lmqadmin bench reported errors: {report['errors']}")
    consumed = report["consume"]["messages"] if report["consume"] else 0
    published = report["publish"]["messages"]
    # Per message published (with several channels each one is consumed once per channel).
    per_message = (cpu1 - cpu0) / (published or consumed) * 1e6
    return {
        "published_per_s": report["publish"]["msgs_per_s"],
        "consumed_per_s": report["consume"]["msgs_per_s"] if report["consume"] else 0.0,
        "messages": published,
        "cpu_us_per_msg": per_message,
        "daemon_cpu_s": cpu1 - cpu0,
        "writer_cpu_pct": report["publish"]["client_cpu_pct_per_process"],
        "reader_cpu_pct": report["consume"]["client_cpu_pct_per_process"]
        if report["consume"] else 0.0,
        "p99_ms": report["latency_ms"].get("p99"),
        "rss_mb": rss / 1024,
        "peak_rss_mb": hwm / 1024,
        "spilled_mb": spilled / 1e6,
        "written_b_per_msg": spilled / (published or 1),
        "load": load,
    }


COLUMNS = [
    ("published msgs/s", "published_per_s", "{:,.0f}"),
    ("consumed msgs/s", "consumed_per_s", "{:,.0f}"),
    ("daemon CPU/msg", "cpu_us_per_msg", "{:.2f} µs"),
    ("writer CPU", "writer_cpu_pct", "{:.0f}%"),
    ("reader CPU", "reader_cpu_pct", "{:.0f}%"),
    ("p99 latency", "p99_ms", "{:.1f} ms"),
    ("peak RSS", "peak_rss_mb", "{:.1f} MB"),
    ("written to disk", "spilled_mb", "{:.0f} MB"),
    ("written/msg", "written_b_per_msg", "{:.0f} B"),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--writers", type=int, default=1)
    parser.add_argument("--readers", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=200)
    parser.add_argument("--rdy", type=int, default=2500)
    parser.add_argument("--channels", type=int, default=1,
                        help="Channels the readers consume (each message once per channel).")
    parser.add_argument("--lmqd-flag", action="append", default=[],
                        help="A flag for lmqd, e.g. --lmqd-flag=--mem-queue-size=0 (repeatable).")
    parser.add_argument("--admin-flag", action="append", default=[],
                        help="A global lmqadmin flag for the bench clients, e.g. "
                             "--admin-flag=--snappy (repeatable).")
    parser.add_argument("--bench-flag", action="append", default=[],
                        help="An lmqadmin bench flag, e.g. --bench-flag=--incompressible "
                             "(distinct bodies: what a dedup window sees) (repeatable).")
    parser.add_argument("--dir", default=None, help="Where the data directories go (/tmp).")
    parser.add_argument("--markdown", action="store_true", help="Print a Markdown table.")
    args = parser.parse_args()

    results = []
    for i in range(args.runs):
        r = run_once(args, i)
        results.append(r)
        print(
            f"run {i + 1}: load {r['load']}  "
            + "  ".join(f"{label} {fmt.format(r[key])}" for label, key, fmt in COLUMNS
                        if r[key] is not None),
            file=sys.stderr,
            flush=True,
        )
    medians = {key: statistics.median(r[key] for r in results if r[key] is not None)
               for _, key, _ in COLUMNS}
    flags = " ".join(args.lmqd_flag) or "(defaults)"
    if args.markdown:
        print(f"lmqd {flags}; {args.writers} writer(s), {args.readers} reader(s), "
              f"{args.size} B, {args.duration:g} s per run\n")
        print("| run | load | " + " | ".join(label for label, _, _ in COLUMNS) + " |")
        print("| --- | --- | " + " | ".join("---:" for _ in COLUMNS) + " |")
        for i, r in enumerate(results, 1):
            cells = [fmt.format(r[key]) if r[key] is not None else "-" for _, key, fmt in COLUMNS]
            print(f"| {i} | {r['load']} | " + " | ".join(cells) + " |")
        print("| **median** | | "
              + " | ".join(f"**{fmt.format(medians[key])}**" for _, key, fmt in COLUMNS) + " |")
    else:
        print(f"median over {len(results)} runs (lmqd {flags}): "
              + "  ".join(f"{label} {fmt.format(medians[key])}" for label, key, fmt in COLUMNS))


if __name__ == "__main__":
    main()

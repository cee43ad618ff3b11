"""NSQ's own benchmark (bench_writer, then bench_reader) against lmqd and the real nsqd in turn.

    .venv/bin/python scripts/bench_nsq.py [--runs 3] [--duration 10] [--size 100]
        [--batch-size 200] [--rdy 2500] [--channels 1] [--nsq-bin DIR]
        [--flag=--mem-queue-size=0 ...] [--lmqd-flag=--durable ...] [--nsqd-flag=... ...]
        [--compare NAME=CHECKOUT ...] [--only lmqd,nsqd] [--markdown]

What NSQ's ``bench.sh`` does, for each daemon in turn (nsqd, lmqd, then each ``--compare``d
checkout of lmqd, and again, ``--runs`` times): a fresh daemon on 127.0.0.1 ports from the OS with
its data in a new temporary directory, the topic and its channels created over HTTP
(``/topic/create``, ``/channel/create``), ``bench_writer`` (MPUB batches of ``--batch-size``
bodies of ``--size`` bytes, for ``--duration`` seconds), then one ``bench_reader`` per channel
at once (RDY ``--rdy`` on each of its GOMAXPROCS connections, FIN every message, for
``--duration`` seconds). The rates are the ones the two programs print. The daemon's CPU time
(user + system, ``/proc/<pid>/stat``) is read before and after each program and divided by the
messages it published or consumed: the robust figure on a shared machine. ``cpu/msg`` is the two
summed: what one message costs the daemon from MPUB to FIN (on one channel; with
``--channels`` N the consuming side is per delivery).

``--flag`` goes to both daemons (nsqd's flag names are lmqd's), ``--lmqd-flag`` / ``--nsqd-flag``
to one. ``--compare before=/work/before`` also runs ``python -m lmqd`` from another checkout
(e.g. ``git worktree add /work/before 420607a``) with this interpreter, to measure a change.
The programs come from ``--nsq-bin``, else ``$LMQ_NSQ_BIN``, else ``../shared/nsq`` is
extracted into ``.nsq/bin``.

Prints a line per run and the medians with the ratio of each daemon's to nsqd's (throughput:
higher is better; CPU per message: lower is better).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# The checkout's root on sys.path: the daemon subprocess helper is shared with the tests.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.support.process import (
    BENCH_SHUTDOWN_TIMEOUT_S,
    REPO_ROOT,
    DaemonProcess,
    load_average,
)

_RATE = re.compile(r"duration: ([0-9.]+)(m?s) - [0-9.]+mb/s - ([0-9.]+)ops/s")

BENCH_TIMEOUT_S = 120.0
"""A bench program runs for ``--duration`` seconds; past this much more it is stuck."""


def nsq_bin(given: str | None) -> Path:
    """Where NSQ's programs are: ``--nsq-bin``, ``$LMQ_NSQ_BIN``, or extracted from
    ``../shared/nsq`` into ``.nsq/bin``."""
    if given:
        return Path(given)
    env = os.environ.get("LMQ_NSQ_BIN")
    if env:
        return Path(env)
    target = REPO_ROOT / ".nsq" / "bin"
    if not (target / "nsqd").exists():
        install = REPO_ROOT.parent / "shared" / "nsq" / "install"
        if not install.exists():
            sys.exit("bench_nsq: NSQ's programs not found: pass --nsq-bin or set LMQ_NSQ_BIN")
        subprocess.run([str(install), str(target)], check=True, stdout=subprocess.DEVNULL)
    return target


def start(
    kind: str, checkout: Path | None, data: Path, flags: Sequence[str], bins: Path
) -> DaemonProcess:
    addresses = ["--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0", f"--data-path={data}"]
    if kind == "nsqd":
        args = [str(bins / "nsqd"), *addresses, *flags]
        daemon = DaemonProcess(args)
    else:
        args = [sys.executable, "-m", "lmqd", *addresses, *flags]
        daemon = DaemonProcess(args, cwd=checkout or REPO_ROOT)
    daemon.wait_started()
    return daemon


def post(http: str, path: str) -> None:
    request = urllib.request.Request(f"http://{http}{path}", method="POST", data=b"")
    with urllib.request.urlopen(request, timeout=10) as response:
        response.read()


def topic_stats(http: str, topic: str) -> dict[str, Any]:
    url = f"http://{http}/stats?format=json&topic={topic}"
    with urllib.request.urlopen(url, timeout=30) as response:
        body = json.loads(response.read())
    topics = body.get("data", body)["topics"]  # nsqd < 1.0 wrapped it in "data"
    return next(t for t in topics if t["topic_name"] == topic)


def run_program(args: Sequence[str]) -> tuple[float, float]:
    """Run a bench program; its (messages, seconds) from the line it prints."""
    done = subprocess.run(
        args, capture_output=True, text=True, timeout=BENCH_TIMEOUT_S, check=False
    )
    match = _RATE.search(done.stderr + done.stdout)
    if done.returncode != 0 or match is None:
        raise RuntimeError(f"{args[0]} failed ({done.returncode}):\n{done.stderr}{done.stdout}")
    seconds = float(match.group(1)) / (1000 if match.group(2) == "ms" else 1)
    return float(match.group(3)) * seconds, seconds


def run_once(
    kind: str, name: str, checkout: Path | None, args: argparse.Namespace, bins: Path
) -> dict[str, Any]:
    flags = [*args.flag, *(args.nsqd_flag if kind == "nsqd" else args.lmqd_flag)]
    topic = "sub_bench"
    channels = [f"ch{i}" if i else "ch" for i in range(args.channels)]
    with tempfile.TemporaryDirectory(prefix=f"bench-{name}-", dir=args.dir) as data:
        daemon = start(kind, checkout, Path(data), flags, bins)
        try:
            http = daemon.address("HTTP")
            tcp = daemon.address("TCP")
            assert http is not None and tcp is not None
            post(http, f"/topic/create?topic={topic}")
            for channel in channels:
                post(http, f"/channel/create?topic={topic}&channel={channel}")
            load = load_average()
            duration = f"--runfor={args.duration}s"
            common = [f"--nsqd-tcp-address={tcp}", f"--topic={topic}", f"--size={args.size}"]
            cpu0 = daemon.cpu_seconds()
            published, pub_s = run_program(
                [str(bins / "bench_writer"), *common, f"--batch-size={args.batch_size}", duration]
            )
            cpu1 = daemon.cpu_seconds()
            readers = [
                subprocess.Popen(
                    [
                        str(bins / "bench_reader"),
                        *common,
                        f"--channel={channel}",
                        f"--rdy={args.rdy}",
                        duration,
                    ],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                )
                for channel in channels
            ]
            consumed = 0.0
            sub_s = 0.0
            for reader in readers:
                out, _ = reader.communicate(timeout=BENCH_TIMEOUT_S)
                match = _RATE.search(out)
                if reader.returncode != 0 or match is None:
                    raise RuntimeError(f"bench_reader failed ({reader.returncode}):\n{out}")
                seconds = float(match.group(1)) / (1000 if match.group(2) == "ms" else 1)
                consumed += float(match.group(3)) * seconds
                sub_s = max(sub_s, seconds)
            cpu2 = daemon.cpu_seconds()
            stats = topic_stats(http, topic)
            _rss, hwm = daemon.memory_kb()
        finally:
            daemon.terminate(BENCH_SHUTDOWN_TIMEOUT_S)
    if int(stats["message_count"]) < published * 0.99:
        raise RuntimeError(f"{name}: {stats['message_count']} stored of {published:.0f} published")
    pub_us = (cpu1 - cpu0) / published * 1e6
    sub_us = (cpu2 - cpu1) / consumed * 1e6 if consumed else 0.0
    return {
        "daemon": name,
        "published_per_s": published / pub_s,
        "consumed_per_s": consumed / sub_s if sub_s else 0.0,
        "pub_cpu_us": pub_us,
        "sub_cpu_us": sub_us,
        "cpu_us": pub_us + sub_us,
        "peak_rss_mb": hwm / 1024,
        "load": load,
    }


COLUMNS = [
    ("published msgs/s", "published_per_s", "{:,.0f}", True),
    ("consumed msgs/s", "consumed_per_s", "{:,.0f}", True),
    ("cpu/msg pub", "pub_cpu_us", "{:.2f} µs", False),
    ("cpu/msg sub", "sub_cpu_us", "{:.2f} µs", False),
    ("cpu/msg", "cpu_us", "{:.2f} µs", False),
    ("peak RSS", "peak_rss_mb", "{:.0f} MB", None),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--duration", type=int, default=10, help="Seconds per program.")
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=200)
    parser.add_argument("--rdy", type=int, default=2500)
    parser.add_argument(
        "--channels",
        type=int,
        default=1,
        help="Channels, each read by its own bench_reader at once.",
    )
    parser.add_argument(
        "--flag",
        action="append",
        default=[],
        help="A flag for both daemons, e.g. --flag=--mem-queue-size=0.",
    )
    parser.add_argument("--lmqd-flag", action="append", default=[])
    parser.add_argument("--nsqd-flag", action="append", default=[])
    parser.add_argument(
        "--compare",
        action="append",
        default=[],
        metavar="NAME=CHECKOUT",
        help="Also run lmqd from another checkout (repeatable).",
    )
    parser.add_argument("--only", default="", help="Comma-separated: nsqd, lmqd, compare names.")
    parser.add_argument("--nsq-bin", default=None)
    parser.add_argument("--dir", default=None, help="Where the data directories go (/tmp).")
    parser.add_argument("--markdown", action="store_true", help="Print a Markdown table.")
    args = parser.parse_args()
    bins = nsq_bin(args.nsq_bin)

    daemons: list[tuple[str, str, Path | None]] = [("nsqd", "nsqd", None), ("lmqd", "lmqd", None)]
    for spec in args.compare:
        name, _, path = spec.partition("=")
        if not path:
            parser.error(f"--compare takes NAME=CHECKOUT, not {spec!r}")
        daemons.append(("lmqd", name, Path(path).resolve()))
    if args.only:
        wanted = set(args.only.split(","))
        daemons = [d for d in daemons if d[1] in wanted]

    results: dict[str, list[dict[str, Any]]] = {name: [] for _, name, _ in daemons}
    for i in range(args.runs):
        for kind, name, checkout in daemons:
            r = run_once(kind, name, checkout, args, bins)
            results[name].append(r)
            print(
                f"run {i + 1} {name:>8}: load {r['load']}  "
                + "  ".join(f"{label} {fmt.format(r[key])}" for label, key, fmt, _ in COLUMNS),
                file=sys.stderr,
                flush=True,
            )

    medians = {
        name: {key: statistics.median(r[key] for r in runs) for _, key, _, _ in COLUMNS}
        for name, runs in results.items()
    }
    base = medians.get("nsqd")
    header = ["daemon", *(label for label, _, _, _ in COLUMNS)]
    rows = []
    for name, m in medians.items():
        cells = [name]
        for _, key, fmt, higher in COLUMNS:
            cell = fmt.format(m[key])
            if base is not None and name != "nsqd" and higher is not None and base[key]:
                cell += f" ({m[key] / base[key]:.2f}x)"
            cells.append(cell)
        rows.append(cells)
    print(f"medians of {args.runs} runs; (x) = ratio to nsqd")
    if args.markdown:
        print("| " + " | ".join(header) + " |")
        print("| --- |" + " ---: |" * (len(header) - 1))
        for cells in rows:
            print("| " + " | ".join(cells) + " |")
    else:
        widths = [max(len(h), *(len(c[i]) for c in rows)) for i, h in enumerate(header)]
        print("  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True)))
        for cells in rows:
            print("  ".join(c.rjust(w) for c, w in zip(cells, widths, strict=True)))


if __name__ == "__main__":
    main()

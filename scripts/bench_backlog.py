"""lmqd's memory while a channel's backlog sits on disk, and what a queued message costs in memory.

    PYTHONPATH=. .venv/bin/python scripts/bench_backlog.py [--messages 10000000] [--size 100]
        [--writers 1] [--drain] [--overhead-runs 3] [--overhead-messages 1000000]
        [--no-backlog] [--samples FILE.csv] [--markdown]

**Backlog** (issue 7: "RSS stays flat (within 10%) while 10M messages sit in a channel's backlog on
disk"). Starts a fresh ``lmqd`` (default flags, ``--mem-queue-size`` as given, data in a new
temporary directory under ``--dir``; refuses to start with less than 3 GB free there), creates the
topic and its channel over HTTP (``/topic/create``, ``/channel/create``), then publishes
``--messages`` messages with ``lmqadmin bench --readers 0 --count N`` (writers are separate
processes) while a thread samples the daemon's VmRSS (``/proc/<pid>/status``) and the channel's
depth (``/stats``) every ``--interval`` seconds. Nothing consumes, so everything past the memory
queue goes to disk. Reports the RSS as the backlog passes each million, min/max/last, and the
growth from the first sample with the memory queue full (depth >= ``--mem-queue-size``) to the end:
"flat" means max and last within 10% of that baseline. Also the bytes on disk. ``--drain`` then
consumes the backlog with ``lmqadmin bench --writers 0 --readers R --count N`` and reports its rate
and RSS. Both phases report the daemon's CPU time per message (``/proc/<pid>/stat``), which moves
much less than the rates with the machine's load.

**Per-message overhead**. A fresh daemon with a memory queue larger than ``--overhead-messages``
gets that many messages, once into a topic without channels (they stay in the topic's memory
queue) and once into a topic with one channel (the pump moves them to the channel's queue). It
reports ``(RSS after - RSS before) / messages - size``: what one queued message costs beyond its
body. ``--overhead-runs`` runs of each, and the median.

The load average (/proc/loadavg) is printed with every figure: the machine may be shared.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, NamedTuple

# The checkout's root on sys.path: the lmqd subprocess helper is shared with the tests.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.support.process import (
    BENCH_SHUTDOWN_TIMEOUT_S,
    REPO_ROOT,
    LmqdProcess,
    lmqadmin_command,
    load_average,
    start_lmqd,
)

GB = 1000**3
MIN_FREE_BYTES = 3 * GB
# A stored 100-byte message takes ~150 bytes on disk (record header, id, CRC); the topic's and the
# channel's queues may both hold a copy while the pump catches up, so ask for twice that.
DISK_BYTES_PER_MESSAGE = 2 * 60
TOPIC, CHANNEL = "backlog", "backlog"
# Bounds on every wait: the publish of 10M messages takes minutes at ~100k msgs/s.
SECONDS_PER_MILLION = 120.0
SETTLE_TIMEOUT_S = 120.0


class Sample(NamedTuple):
    t: float
    rss_kb: int
    depth: int
    """Channel depth (memory + disk), or the topic's when there is no channel."""
    topic_depth: int
    load: str


def http(daemon: LmqdProcess, method: str, path: str, **params: str) -> bytes:
    url = f"http://{daemon.http_address}{path}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(urllib.request.Request(url, method=method), timeout=10) as r:
        data: bytes = r.read()
        return data


def depths(daemon: LmqdProcess, topic: str, channel: str | None) -> tuple[int, int]:
    """(channel depth or topic depth without a channel, topic depth)."""
    stats = json.loads(http(daemon, "GET", "/stats", format="json", topic=topic,
                            include_clients="false", include_mem="false"))
    topics = stats["topics"] or []
    if not topics:
        return 0, 0
    t = topics[0]
    chans = [c for c in t["channels"] if c["channel_name"] == channel]
    return (chans[0]["depth"] if chans else t["depth"]), t["depth"]


class Sampler:
    """A thread that records a ``Sample`` every ``interval`` seconds until ``stop``."""

    def __init__(
        self, daemon: LmqdProcess, topic: str, channel: str | None, interval: float
    ) -> None:
        self.daemon, self.topic, self.channel, self.interval = daemon, topic, channel, interval
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._t0 = time.monotonic()

    def sample(self) -> Sample:
        rss, _ = self.daemon.memory_kb()
        depth, topic_depth = depths(self.daemon, self.topic, self.channel)
        s = Sample(time.monotonic() - self._t0, rss, depth, topic_depth, load_average())
        self.samples.append(s)
        return s

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)


def bench(daemon: LmqdProcess, timeout: float, *args: str) -> dict[str, Any]:
    """``lmqadmin bench --json -q ARGS``: its report; raises if it failed."""
    command = lmqadmin_command(daemon.tcp_address, "bench", "--json", "-q", *args)
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, check=False,
                          timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"lmqadmin bench failed ({done.returncode}):\n{done.stderr}"
                           f"{done.stdout}")
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def wait_depth(sampler: Sampler, depth: int, topic_depth: int) -> Sample:
    """Sample until the channel (or topic) holds ``depth`` and the topic ``topic_depth``."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while True:
        s = sampler.sample()
        if (s.depth, s.topic_depth) == (depth, topic_depth):
            return s
        if time.monotonic() > deadline:
            raise RuntimeError(f"depth stuck at {s.depth} (topic {s.topic_depth}), "
                               f"expected {depth} ({topic_depth})")
        time.sleep(0.2)


def disk_bytes(path: str) -> int:
    """Bytes allocated under ``path`` (``du -s --block-size=1``)."""
    return sum(
        os.stat(os.path.join(root, name)).st_blocks * 512
        for root, _, names in os.walk(path)
        for name in names
    )


# -- the backlog -------------------------------------------------------------------------------


def run_backlog(args: argparse.Namespace) -> dict[str, Any]:
    n = args.messages
    free = shutil.disk_usage(args.dir or tempfile.gettempdir()).free
    need = max(MIN_FREE_BYTES, n * DISK_BYTES_PER_MESSAGE)
    if free < need:
        sys.exit(f"bench_backlog: {free / GB:.1f} GB free under {args.dir or tempfile.gettempdir()}"
                 f", {need / GB:.1f} GB needed for {n:,} messages: refusing to run")
    with tempfile.TemporaryDirectory(prefix="lmq-backlog-", dir=args.dir) as data:
        daemon = start_lmqd(Path(data), [f"--mem-queue-size={args.mem_queue_size}",
                                         *args.lmqd_flag])
        try:
            http(daemon, "POST", "/topic/create", topic=TOPIC)
            http(daemon, "POST", "/channel/create", topic=TOPIC, channel=CHANNEL)
            with Sampler(daemon, TOPIC, CHANNEL, args.interval) as sampler:
                start = sampler.sample()
                cpu0 = daemon.cpu_seconds()
                publish = bench(daemon, SECONDS_PER_MILLION * (1 + n / 1e6),
                                "--topic", TOPIC, "--writers", str(args.writers), "--readers", "0",
                                "--count", str(n), "--size", str(args.size))["publish"]
                settled = wait_depth(sampler, n, 0)
                publish["daemon_cpu_us"] = (daemon.cpu_seconds() - cpu0) / n * 1e6
                time.sleep(args.settle)
                end = sampler.sample()
                on_disk = disk_bytes(data)
                drain = None
                if args.drain:
                    mark = len(sampler.samples)
                    cpu0 = daemon.cpu_seconds()
                    report = bench(daemon, SECONDS_PER_MILLION * (1 + n / 1e6),
                                   "--topic", TOPIC, "--channel", CHANNEL, "--writers", "0",
                                   "--readers", str(args.readers), "--count", str(n))
                    drained = wait_depth(sampler, 0, 0)
                    drain = {"consume": report["consume"], "errors": report["errors"],
                             "daemon_cpu_us": (daemon.cpu_seconds() - cpu0) / n * 1e6,
                             "samples": sampler.samples[mark:], "first": mark, "end": drained}
        finally:
            daemon.terminate(BENCH_SHUTDOWN_TIMEOUT_S)
    samples = sampler.samples
    full = next((s for s in samples if s.depth >= args.mem_queue_size), None)
    after = [s for s in samples if full is not None and s.t >= full.t and s.t <= end.t]
    return {
        "messages": n, "publish": publish, "start": start, "settled": settled, "end": end,
        "full": full, "after": after, "samples": samples, "disk_bytes": on_disk, "drain": drain,
        "milestones": [(m, next((s for s in samples if s.depth >= m), None))
                       for m in range(args.step, n + 1, args.step)],
    }


def report_backlog(r: dict[str, Any], args: argparse.Namespace) -> None:
    mib = 1 / 1024
    full, after, end = r["full"], r["after"], r["end"]
    base = full.rss_kb if full else 0
    peak = max(s.rss_kb for s in after) if after else 0
    low = min(s.rss_kb for s in after) if after else 0
    pub = r["publish"]
    md = args.markdown
    print(f"{'## ' if md else ''}Backlog: {r['messages']:,} x {args.size} B into "
          f"{TOPIC}/{CHANNEL}, no consumer, --mem-queue-size={args.mem_queue_size}\n")
    print(f"published at {pub['msgs_per_s']:,.0f} msgs/s, daemon CPU "
          f"{pub['daemon_cpu_us']:.2f} µs/msg ({args.writers} writer(s), "
          f"{pub['seconds']:.0f} s); load {r['start'].load} at start, {end.load} at the end")
    print(f"on disk: {r['disk_bytes'] / 1e6:,.0f} MB "
          f"({r['disk_bytes'] / r['messages']:.0f} B per message)\n")
    rows = [("start (empty)", r["start"])]
    if full:
        rows.append((f"memory queue full (depth {full.depth:,})", full))
    rows += [(f"backlog passed {m:,}", s) for m, s in r["milestones"] if s]
    rows.append(("end (publish done, settled)", end))
    if md:
        print("| point | t (s) | channel depth | RSS (MiB) | vs full | load |")
        print("| --- | ---: | ---: | ---: | ---: | --- |")
    for label, s in rows:
        vs = f"{(s.rss_kb - base) / base * 100:+.1f}%" if base else "-"
        if md:
            print(f"| {label} | {s.t:.0f} | {s.depth:,} | {s.rss_kb * mib:.1f} | {vs} | {s.load} |")
        else:
            print(f"  {label:38} t={s.t:6.0f}s depth={s.depth:>11,} RSS {s.rss_kb * mib:7.1f} MiB "
                  f"{vs:>7}  load {s.load}")
    if base:
        growth_end = (end.rss_kb - base) / base * 100
        growth_max = (peak - base) / base * 100
        flat = max(growth_end, growth_max) <= 10
        print(f"\nRSS after the memory queue filled: min {low * mib:.1f} MiB, "
              f"max {peak * mib:.1f} MiB, last {end.rss_kb * mib:.1f} MiB; "
              f"growth {growth_end:+.1f}% (last), "
              f"{growth_max:+.1f}% (max) -> {'FLAT' if flat else 'NOT FLAT'} (within 10%)")
    drain = r["drain"]
    if drain:
        c, rss = drain["consume"], [s.rss_kb * mib for s in drain["samples"]]
        print(f"\ndrain: {c['messages']:,} msgs in {c['seconds']:.1f} s = {c['msgs_per_s']:,.0f} "
              f"msgs/s, daemon CPU {drain['daemon_cpu_us']:.2f} µs/msg (reader CPU "
              f"{c['client_cpu_pct_per_process']:.0f}%); RSS during drain "
              f"min {min(rss):.1f} / max {max(rss):.1f} MiB, "
              f"after {drain['end'].rss_kb * mib:.1f} MiB; load {drain['end'].load}"
              + (f"; errors {drain['errors']}" if drain["errors"] else ""))


# -- per-message overhead ----------------------------------------------------------------------


def run_overhead(args: argparse.Namespace, with_channel: bool) -> dict[str, Any]:
    n = args.overhead_messages
    topic, channel = "overhead", ("overhead" if with_channel else None)
    with tempfile.TemporaryDirectory(prefix="lmq-overhead-", dir=args.dir) as data:
        daemon = start_lmqd(Path(data), [f"--mem-queue-size={2 * n}", *args.lmqd_flag])
        try:
            http(daemon, "POST", "/topic/create", topic=topic)
            if channel:
                http(daemon, "POST", "/channel/create", topic=topic, channel=channel)
            sampler = Sampler(daemon, topic, channel, args.interval)
            before = sampler.sample()
            bench(daemon, SECONDS_PER_MILLION * (1 + n / 1e6), "--topic", topic,
                  "--writers", "1", "--readers", "0", "--count", str(n), "--size", str(args.size))
            wait_depth(sampler, n, 0 if channel else n)
            time.sleep(args.settle)
            after = sampler.sample()
        finally:
            daemon.terminate(BENCH_SHUTDOWN_TIMEOUT_S)
    per_message = (after.rss_kb - before.rss_kb) * 1024 / n
    return {"before_kb": before.rss_kb, "after_kb": after.rss_kb, "per_message": per_message,
            "overhead": per_message - args.size, "load": f"{before.load}/{after.load}"}


def report_overhead(results: dict[str, list[dict[str, Any]]], args: argparse.Namespace) -> None:
    md = args.markdown
    print(f"\n{'## ' if md else ''}In-memory cost of a queued message: "
          f"{args.overhead_messages:,} x {args.size} B, --mem-queue-size="
          f"{2 * args.overhead_messages:,}, no consumer\n")
    if md:
        print("| where | run | RSS before (MiB) | RSS after (MiB) | B/message | beyond body "
              "| load |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | --- |")
    for where, runs in results.items():
        for i, r in enumerate(runs, 1):
            cells = (f"{r['before_kb'] / 1024:.1f}", f"{r['after_kb'] / 1024:.1f}",
                     f"{r['per_message']:.0f}", f"{r['overhead']:.0f}")
            if md:
                print(f"| {where} | {i} | " + " | ".join(cells) + f" | {r['load']} |")
            else:
                print(f"  {where:22} run {i}: RSS {cells[0]} -> {cells[1]} MiB, {cells[2]} B/msg, "
                      f"{cells[3]} B beyond the body  (load {r['load']})")
        med = statistics.median(r["overhead"] for r in runs)
        if md:
            print(f"| {where} | **median** | | | | **{med:.0f}** | |")
        else:
            print(f"  {where:22} median: {med:.0f} B per message beyond its {args.size} B body")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=10_000_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--writers", type=int, default=1)
    parser.add_argument("--readers", type=int, default=1, help="Readers for --drain.")
    parser.add_argument("--mem-queue-size", type=int, default=10_000)
    parser.add_argument("--step", type=int, default=1_000_000, help="Report RSS every STEP.")
    parser.add_argument("--interval", type=float, default=0.5, help="Seconds between samples.")
    parser.add_argument("--settle", type=float, default=5.0,
                        help="Seconds to keep sampling after the backlog is complete.")
    parser.add_argument("--drain", action="store_true", help="Then consume the whole backlog.")
    parser.add_argument("--no-backlog", action="store_true", help="Only the overhead runs.")
    parser.add_argument("--overhead-runs", type=int, default=3)
    parser.add_argument("--overhead-messages", type=int, default=1_000_000)
    parser.add_argument("--lmqd-flag", action="append", default=[],
                        help="A flag for lmqd, e.g. --lmqd-flag=--max-bytes-per-file=... "
                             "(repeatable).")
    parser.add_argument("--dir", default=None, help="Where the data directories go (/tmp).")
    parser.add_argument("--samples", type=Path, help="Write every backlog sample to this CSV.")
    parser.add_argument("--markdown", action="store_true", help="Print Markdown tables.")
    args = parser.parse_args()

    if not args.no_backlog:
        result = run_backlog(args)
        report_backlog(result, args)
        if args.samples:
            with args.samples.open("w", newline="") as f:
                out = csv.writer(f)
                out.writerow(["phase", *Sample._fields])
                drain_from = result["drain"]["first"] if result["drain"] else None
                for i, s in enumerate(result["samples"]):
                    phase = "drain" if drain_from is not None and i >= drain_from else "publish"
                    out.writerow([phase, *s])
        sys.stdout.flush()
    if args.overhead_runs:
        results: dict[str, list[dict[str, Any]]] = {"topic, no channel": [], "one channel": []}
        for i in range(args.overhead_runs):
            for where in results:
                r = run_overhead(args, with_channel=where == "one channel")
                results[where].append(r)
                print(f"overhead run {i + 1} ({where}): {r['overhead']:.0f} B beyond the body "
                      f"(load {r['load']})", file=sys.stderr, flush=True)
        report_overhead(results, args)


if __name__ == "__main__":
    main()

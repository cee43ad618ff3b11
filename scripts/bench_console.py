"""``lmqadmin web`` with 1,000 topics x 3 channels on 2 nodes: page times, the console's CPU,
and its load on the daemons as browsers are added.

    .venv/bin/python scripts/bench_console.py [--topics 1000] [--channels 3] [--browsers 0,1,5]
        [--duration 20] [--runs 3] [--requests 20] [--sample-interval 5] [--markdown]

Starts an lmqlookupd and two lmqd nodes (``LocalCluster``: 127.0.0.1, free ports, a temporary
data directory), creates ``--topics`` topics with ``--channels`` channels each on both nodes
(every topic has a few messages), then ``lmqadmin --lookupd-http-address=... web`` at its
default sampling interval. Then:

1. **Server time** of the streams page (``/``: every topic) and of a topic page
   (``/topics/T``: its nodes and channels): ``--requests`` sequential GETs each over loopback
   from this process, timed from send to the last byte (median and 90th percentile, ms).
2. **Browsers**: for each count in ``--browsers``, that many browser contexts of one headless
   Chromium (Debian's, through Playwright) keep pages open for ``--duration`` seconds -- the
   streams page, a topic page with its charts, a channel page with its charts, the counter,
   the nodes page, in turn -- each refreshing itself every sampling interval as the pages do.
   Measured over that window: the console's CPU (user + system, ``/proc``, in cores), the
   requests it made to the daemons and the lookupd per second and per sampling round (its
   ``/debug/vars`` counters: every ``/stats``, ``/info`` and ``/nodes``), and the two daemons'
   CPU (cores).

Each count is measured ``--runs`` times (in rounds: 0, 1, 5, 0, 1, 5, ...); the medians are
printed (a Markdown table with ``--markdown``). Every load is bounded in count and time and only
talks to 127.0.0.1.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from bench_cluster import cpu_seconds
from cluster import REPO, LocalCluster

sys.path.insert(0, str(REPO))
from tests.support.browser import CHROMIUM, CHROMIUM_FLAGS
from tests.support.process import DaemonProcess, load_average


def post(address: str, path: str, body: bytes = b"") -> None:
    request = urllib.request.Request(f"http://{address}{path}", data=body, method="POST")
    urllib.request.urlopen(request, timeout=30).read()


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.loads(response.read())


def fill(nodes: list[str], topics: int, channels: int) -> None:
    """``topics`` x ``channels`` on every node, 8 requests at a time."""

    def one(name: str) -> None:
        for node in nodes:
            post(node, f"/topic/create?topic={name}")
            for c in range(channels):
                post(node, f"/channel/create?topic={name}&channel=c{c}")
            post(node, f"/mpub?topic={name}", b"one\ntwo\nthree")

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, [f"topic-{i:04d}" for i in range(topics)]))


def page_times(url: str, count: int) -> tuple[float, float]:
    times = []
    for _ in range(count):
        started = time.perf_counter()
        with urllib.request.urlopen(url, timeout=30) as response:
            response.read()
        times.append((time.perf_counter() - started) * 1e3)
    times.sort()
    return statistics.median(times), times[min(len(times) - 1, int(len(times) * 0.9))]


PAGES = ["/", "/topics/topic-0007", "/topics/topic-0007/c1", "/counter", "/nodes"]


def with_browsers(base: str, count: int, duration: float, console: DaemonProcess,
                  daemons: list[int], playwright: Any) -> dict[str, float]:  # fmt: skip
    browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True,
                                         args=CHROMIUM_FLAGS)  # fmt: skip
    contexts = []
    try:
        for i in range(count):
            context = browser.new_context()
            page = context.new_page()
            page.goto(base + PAGES[i % len(PAGES)])
            contexts.append(context)
        before = get_json(base + "/debug/vars")
        cpu0 = cpu_seconds(console.pid)
        daemon0 = sum(cpu_seconds(p) for p in daemons)
        started = time.monotonic()
        time.sleep(duration)  # the pages refresh themselves, in the browser's own processes
        elapsed = time.monotonic() - started
        after = get_json(base + "/debug/vars")
        requests = after["upstream_requests"] - before["upstream_requests"]
        return {
            "console_cores": (cpu_seconds(console.pid) - cpu0) / elapsed,
            "requests_per_s": requests / elapsed,
            "requests_per_round": requests / max(1, after["rounds"] - before["rounds"]),
            "daemon_cores": (sum(cpu_seconds(p) for p in daemons) - daemon0) / elapsed,
        }
    finally:
        for context in contexts:
            context.close()
        browser.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--topics", type=int, default=1000)
    parser.add_argument("--channels", type=int, default=3)
    parser.add_argument("--browsers", default="0,1,5")
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--sample-interval", type=float, default=5.0)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    counts = [int(c) for c in args.browsers.split(",")]
    from playwright.sync_api import sync_playwright

    print(f"cores {os.cpu_count()}, load {load_average()}", flush=True)
    with (tempfile.TemporaryDirectory(prefix="lmq-console-bench-") as data,
          LocalCluster(2, data, base_port=0, echo=False) as cluster):
        assert cluster.lookupd is not None
        nodes = [n.http for n in cluster.nodes]
        started = time.monotonic()
        fill(nodes, args.topics, args.channels)
        print(f"created {args.topics} topics x {args.channels} channels on 2 nodes in "
              f"{time.monotonic() - started:.1f}s", flush=True)
        console = DaemonProcess([
            sys.executable, "-m", "lmq_client.admin", "--lookupd-http-address",
            cluster.lookupd.http, "web", "--listen", "127.0.0.1:0",
            f"--sample-interval={args.sample_interval}",
        ], wanted=("HTTP",))  # fmt: skip
        try:
            console.wait_started(60)
            base = f"http://{console.address('HTTP')}"
            deadline = time.monotonic() + 120
            while get_json(base + "/debug/vars")["topics"] < args.topics:
                if time.monotonic() > deadline:
                    raise SystemExit("the console never saw every topic")
                time.sleep(0.5)
            variables = get_json(base + "/debug/vars")
            print(f"sampling round: {variables['last_round_s'] * 1e3:.0f} ms "
                  f"({variables['topics']} topics, {variables['nodes']} nodes)", flush=True)
            for path in ("/", "/topics/topic-0007"):
                median, p90 = page_times(base + path, args.requests)
                print(f"GET {path}: median {median:.1f} ms, p90 {p90:.1f} ms "
                      f"({args.requests} requests)", flush=True)
            results: dict[int, list[dict[str, float]]] = {c: [] for c in counts}
            daemons = [n.process.pid for n in cluster.nodes]
            with sync_playwright() as playwright:
                for run in range(args.runs):
                    for count in counts:
                        r = with_browsers(base, count, args.duration, console, daemons,
                                          playwright)  # fmt: skip
                        results[count].append(r)
                        print(f"run {run + 1}, {count} browsers: console "
                              f"{r['console_cores']:.3f} cores, {r['requests_per_s']:.2f} "
                              f"requests/s to daemons+lookupd "
                              f"({r['requests_per_round']:.1f} a round), daemons "
                              f"{r['daemon_cores']:.3f} cores", flush=True)
            report(results, args.markdown)
        finally:
            console.terminate()


def report(results: dict[int, list[dict[str, float]]], markdown: bool) -> None:
    def med(rows: list[dict[str, float]], key: str) -> float:
        return statistics.median(r[key] for r in rows)

    if markdown:
        print("| browsers | console CPU (cores) | requests/s to daemons + lookupd "
              "| requests a sampling round | daemons' CPU (cores) |")
        print("| ---: | ---: | ---: | ---: | ---: |")
    for count, rows in results.items():
        values = (med(rows, "console_cores"), med(rows, "requests_per_s"),
                  med(rows, "requests_per_round"), med(rows, "daemon_cores"))  # fmt: skip
        if markdown:
            print(f"| {count} | {values[0]:.3f} | {values[1]:.2f} | {values[2]:.1f} "
                  f"| {values[3]:.3f} |")
        else:
            print(f"median, {count} browsers: console {values[0]:.3f} cores, {values[1]:.2f} "
                  f"requests/s ({values[2]:.1f} a round), daemons {values[3]:.3f} cores")


if __name__ == "__main__":
    main()

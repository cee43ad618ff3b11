"""Benchmark ``--durable`` publishing: acknowledged messages/s and fsync rounds/s, group commit
against nsqd-style per-message fsync.

    .venv/bin/python scripts/bench_durable.py [--publishers 1,8,32,64] [--seconds 5] [--runs 3]

For each publisher count, starts a fresh ``lmqd --durable`` (``python -m lmqd``, 127.0.0.1,
port 0, data in a temporary directory under ``--dir``, which should be on the disk you care
about), opens that many connections and has each publish ``--size``-byte messages to one topic
with ``--window`` PUBs outstanding (1: send, wait for ``OK``, send the next, as a careful
producer does), for ``--seconds``. Then SIGTERM, and the daemon's shutdown line
``SYNCER: <rounds> rounds, <queue syncs> queue syncs ...`` gives the sync rounds.

``--default-mode`` runs the same load without ``--durable`` (``OK`` once the message is in
memory): the ceiling that the clients' and the daemon's CPU put on this load.

One publisher with one PUB outstanding is the **baseline**: every message waits for its own
fsync round, as nsqd with ``--sync-every=1`` would (nsqd fsyncs per message, lmqd per round).
More publishers share rounds: a round covers every PUB that arrived while the previous one ran.

Each round costs, per queue it syncs, one fsync of the segment and one of the positions file
(written temp -> fsync -> rename), plus one fsync of the directory: ``fsyncs = 2 * queue syncs +
rounds`` (metadata writes at topic creation aside). Prints one line per run and the medians.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import trio

from lmqd.protocol import ClientConnection, Pub, Response

# The checkout's root on sys.path: the lmqd subprocess helper is shared with the tests.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.support.process import BENCH_SHUTDOWN_TIMEOUT_S, LmqdProcess, start_lmqd

_SYNCER = re.compile(r"SYNCER: (\d+) rounds, (\d+) queue syncs")


def sync_rounds(daemon: LmqdProcess) -> tuple[int, int]:
    """(sync rounds, queue syncs) from a stopped daemon's shutdown log line."""
    for line in reversed(daemon.output_lines()):
        m = _SYNCER.search(line)
        if m:
            return int(m.group(1)), int(m.group(2))
    raise RuntimeError("no SYNCER line in the daemon's output:\n" + daemon.output())


async def publisher(
    address: tuple[str, int],
    topic: str,
    body: bytes,
    window: int,
    start: trio.Event,
    stop: trio.Event,
    counts: list[int],
    latencies: list[float],
) -> None:
    stream = await trio.open_tcp_stream(*address)
    codec = ClientConnection()
    await stream.send_all(codec.initial_bytes())
    command = Pub(topic=topic, body=body).encode()
    await start.wait()
    sent: list[float] = []
    acked = 0
    try:
        while not stop.is_set():
            while len(sent) - acked < window:
                sent.append(time.perf_counter())
                await stream.send_all(command)
            data = await stream.receive_some(65536)
            if not data:
                raise RuntimeError("lmqd closed the connection")
            codec.receive_data(data)
            now = time.perf_counter()
            for event in codec.next_events():
                if not isinstance(event, Response) or event.data != b"OK":
                    raise RuntimeError(f"unexpected answer {event!r}")
                latencies.append(now - sent[acked])
                acked += 1
    finally:
        counts.append(acked)
        await stream.aclose()


async def measure(
    address: tuple[str, int], publishers: int, window: int, size: int, seconds: float
) -> tuple[int, list[float]]:
    body = b"x" * size
    counts: list[int] = []
    latencies: list[float] = []
    start = trio.Event()
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        for _ in range(publishers):
            nursery.start_soon(
                publisher, address, "bench", body, window, start, stop, counts, latencies
            )
        await trio.sleep(0.2)  # connections open
        start.set()
        await trio.sleep(seconds)
        stop.set()
    return sum(counts), latencies


def run_once(
    directory: str, publishers: int, window: int, size: int, seconds: float, durable: bool
) -> dict[str, float]:
    with tempfile.TemporaryDirectory(dir=directory, prefix="bench-durable-") as data:
        daemon = start_lmqd(Path(data), ["--durable"] if durable else [], http=False)
        try:
            acked, latencies = trio.run(
                measure, daemon.tcp_host_port, publishers, window, size, seconds
            )
        finally:
            daemon.terminate(BENCH_SHUTDOWN_TIMEOUT_S)
        rounds, queue_syncs = sync_rounds(daemon)
    latencies.sort()
    return {
        "msgs_per_s": acked / seconds,
        "rounds_per_s": rounds / seconds,
        "fsyncs_per_s": (2 * queue_syncs + rounds) / seconds,
        "msgs_per_round": acked / max(rounds, 1),
        "p50_ms": 1000 * latencies[len(latencies) // 2] if latencies else 0.0,
        "p99_ms": 1000 * latencies[int(len(latencies) * 0.99)] if latencies else 0.0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--publishers", default="1,8,32,64", help="comma-separated counts")
    parser.add_argument("--window", type=int, default=1, help="PUBs outstanding per publisher")
    parser.add_argument("--size", type=int, default=100, help="message body bytes")
    parser.add_argument("--seconds", type=float, default=5.0, help="measured time per run")
    parser.add_argument("--runs", type=int, default=3, help="runs per publisher count")
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="where the data goes")
    parser.add_argument(
        "--default-mode",
        action="store_true",
        help="without --durable (OK once written to memory): the same load's CPU ceiling",
    )
    args = parser.parse_args()
    mode = "lmqd" if args.default_mode else "lmqd --durable"
    print(
        f"{mode}, {args.size}-byte PUBs, window {args.window}, {args.seconds:g}s x "
        f"{args.runs} runs, data in {args.dir} ({os.cpu_count()} CPUs)"
    )
    header = (
        f"{'publishers':>10} {'msgs/s':>9} {'rounds/s':>9} {'fsyncs/s':>9} "
        f"{'msgs/round':>10} {'p50 ms':>7} {'p99 ms':>7}"
    )
    medians = []
    for n in (int(x) for x in args.publishers.split(",")):
        results = []
        for _ in range(args.runs):
            r = run_once(args.dir, n, args.window, args.size, args.seconds, not args.default_mode)
            results.append(r)
            print(
                f"  run: {n:>4} publishers: {r['msgs_per_s']:9.0f} msgs/s "
                f"{r['rounds_per_s']:7.0f} rounds/s {r['fsyncs_per_s']:7.0f} fsyncs/s "
                f"p50 {r['p50_ms']:.2f} ms p99 {r['p99_ms']:.2f} ms",
                flush=True,
            )
        medians.append((n, {k: statistics.median(r[k] for r in results) for k in results[0]}))
    print("\nmedians")
    print(header)
    for n, m in medians:
        print(
            f"{n:>10} {m['msgs_per_s']:9.0f} {m['rounds_per_s']:9.0f} {m['fsyncs_per_s']:9.0f} "
            f"{m['msgs_per_round']:10.1f} {m['p50_ms']:7.2f} {m['p99_ms']:7.2f}"
        )


if __name__ == "__main__":
    main()

"""Benchmark a topic log's lookups: seek by time and read by offset in a large log.

    .venv/bin/python scripts/bench_log.py [--messages 10000000] [--size 16] [--batch 1000]
        [--seeks 1000] [--dir DIR] [--segment-mb 100]

Builds a ``TopicLog`` of ``--messages`` messages of ``--size`` bytes in a temporary directory
(``--dir``; tmpfs keeps a large build off a shared disk, and a seek reads the page cache either
way), appended in calls of ``--batch``, with timestamps 1 µs apart. Then it closes and reopens
the log (recovery rebuilds the offset and time index from the segments: the time printed is
start-up's cost for this log) and times ``--seeks`` lookups at random points:

* ``offset_for_time``: the first message at or after a time (checked against the expected offset);
* ``read_range(offset, 100)``: a tool's read by offset (the Spark source's call);
* ``create_cursor`` at a time plus its first ``read_many(100)``: a replaying channel's start.

Prints the build rate, the reopen time, the log's size and index entries, and per lookup kind
the median, 99th percentile and maximum in microseconds. Nothing is kept after the run.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time

from lmqd.message import Message
from lmqd.storage import AnchoredTimeBase
from lmqd.storage.log import TopicLog
from lmqd.units import MiB

EPOCH_NS = 1_700_000_000 * 10**9
STEP_NS = 1000


def build(directory: str, count: int, size: int, batch: int, segment: int) -> float:
    """Append ``count`` messages; returns the seconds it took."""
    log = TopicLog(
        "bench", directory, timebase=AnchoredTimeBase.now(0.0), max_bytes_per_file=segment
    )
    body = b"x" * size
    started = time.perf_counter()
    for first in range(0, count, batch):
        end = min(first + batch, count)
        log.append_many(
            [Message(b"%016x" % i, body, EPOCH_NS + i * STEP_NS) for i in range(first, end)]
        )
    log.close()
    return time.perf_counter() - started


def _summary(label: str, micros: list[float]) -> str:
    micros.sort()
    p99 = micros[min(len(micros) - 1, int(len(micros) * 0.99))]
    return (
        f"{label:>28}: median {statistics.median(micros):8.1f} µs, "
        f"p99 {p99:8.1f} µs, max {micros[-1]:8.1f} µs ({len(micros)} lookups)"
    )


def measure(directory: str, count: int, segment: int, seeks: int) -> None:
    started = time.perf_counter()
    log = TopicLog(
        "bench", directory, timebase=AnchoredTimeBase.now(0.0), max_bytes_per_file=segment
    )
    opened = time.perf_counter() - started
    entries = log.index_entries
    print(
        f"reopen (recovery, index rebuilt): {opened:.2f} s; {log.bytes_on_disk / MiB:.0f} MiB in "
        f"{log.segment_count} segments, {entries} index entries"
    )
    rng = random.Random(1)
    by_time: list[float] = []
    by_offset: list[float] = []
    cursors: list[float] = []
    for n in range(seeks):
        target = rng.randrange(count)
        t0 = time.perf_counter()
        found = log.offset_for_time(EPOCH_NS + target * STEP_NS - 1)
        t1 = time.perf_counter()
        assert found == target, (found, target)
        got = log.read_range(target, 100)
        t2 = time.perf_counter()
        assert got[0][0] == target
        cursor = log.create_cursor(f"c{n}", log.offset_for_time(EPOCH_NS + target * STEP_NS))
        first = cursor.read_many(100)
        t3 = time.perf_counter()
        assert first[0][0] == target
        log.delete_cursor(f"c{n}")
        by_time.append((t1 - t0) * 1e6)
        by_offset.append((t2 - t1) * 1e6)
        cursors.append((t3 - t2) * 1e6)
    print(_summary("offset_for_time", by_time))
    print(_summary("read_range(offset, 100)", by_offset))
    print(_summary("cursor at a time + 100 read", cursors))
    log.delete()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--messages", type=int, default=10_000_000)
    parser.add_argument("--size", type=int, default=16)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--seeks", type=int, default=1000)
    parser.add_argument("--segment-mb", type=int, default=100)
    parser.add_argument("--dir", default=None, help="where to build the log (default: tmp)")
    args = parser.parse_args()
    segment = args.segment_mb * MiB
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="lmq-bench-log-") as directory:
        took = build(directory, args.messages, args.size, args.batch, segment)
        print(
            f"built {args.messages:,} messages of {args.size} B in calls of {args.batch}: "
            f"{took:.1f} s ({args.messages / took:,.0f} msg/s)"
        )
        measure(directory, args.messages, segment, args.seeks)


if __name__ == "__main__":
    main()

"""Benchmark the disk queue alone: put_many + read_many of small messages, with and without fsync.

    .venv/bin/python scripts/bench_storage.py [--messages 200000] [--size 100] [--batch 100]
        [--modes no-sync,group,sync-per-batch] [--runs 1]

For each mode, writes ``--messages`` bodies of ``--size`` bytes in batches of ``--batch``
through a fresh ``DiskQueue`` in a temporary directory (``--dir``, default: the system temp
dir, which should be on the disk you care about), reading each batch back right after it is
written, as a channel draining its disk queue does. Modes:

* ``no-sync``: data handed to the OS only (nsqd's default between ``--sync-every`` syncs);
* ``sync-per-batch``: ``prepare_sync()`` + ``SyncJob.run()`` after every batch, i.e. durable
  mode with one publisher and no group commit (the worst case: one fsync round per batch);
* ``group-of-N``: one sync per N batches (what group commit gives N concurrent publishers).

``--daemon-gc`` sets the cyclic GC thresholds lmqd sets (``lmqd.service.GC_THRESHOLDS``); by
default the interpreter's are kept, and the run's 200,000 live messages make the collector a
large part of the cost.

Prints wall-clock and CPU microseconds per message and messages per second for each run, and
with ``--runs N`` (N > 1) the median of the N runs per mode (the machine is shared: compare
medians).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import tempfile
import time

from lmqd.message import GuidFactory, Message
from lmqd.storage import AnchoredTimeBase, DiskQueue


def run(
    directory: str, messages: int, size: int, batch: int, sync_every_batches: int
) -> tuple[float, float, float]:
    """One run; prints it and returns (wall us/msg, CPU us/msg, msg/s)."""
    ids = GuidFactory(1)
    body = b"x" * size
    now = time.time_ns()
    batches = [
        [Message(i, body, now) for i in ids.new_ids(batch)] for _ in range(messages // batch)
    ]
    q = DiskQueue(
        "bench",
        directory,
        timebase=AnchoredTimeBase.now(0.0),
        max_bytes_per_file=100 * 1024 * 1024,
    )
    wall = time.perf_counter()
    cpu = time.process_time()
    done = 0
    for n, msgs in enumerate(batches, 1):
        q.put_many(msgs)
        if sync_every_batches and n % sync_every_batches == 0:
            q.sync()
        done += len(q.read_many(batch))
    q.close()
    wall = time.perf_counter() - wall
    cpu = time.process_time() - cpu
    assert done == len(batches) * batch
    if sync_every_batches == 0:
        label = "no-sync"
    elif sync_every_batches == 1:
        label = "sync-per-batch"
    else:
        label = f"group-of-{sync_every_batches}"
    result = (wall / done * 1e6, cpu / done * 1e6, done / wall)
    print(_line(label, result) + f" ({done} x {size} B, batches of {batch})")
    return result


def _line(label: str, result: tuple[float, float, float]) -> str:
    wall, cpu, rate = result
    return f"{label:>15}: {wall:7.2f} us/msg wall, {cpu:6.2f} us/msg CPU, {rate:9,.0f} msg/s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--dir", default=None, help="where to create the queue (default: tmp)")
    parser.add_argument(
        "--sync-messages",
        type=int,
        default=20_000,
        help="messages for the sync-per-batch run (each costs an fsync round)",
    )
    parser.add_argument(
        "--modes",
        default="no-sync,group,sync-per-batch",
        help="comma-separated: no-sync, group (one sync per 10 batches), sync-per-batch",
    )
    parser.add_argument("--runs", type=int, default=1, help="runs per mode (medians printed)")
    parser.add_argument(
        "--daemon-gc", action="store_true", help="use lmqd's GC thresholds (as the daemon runs)"
    )
    args = parser.parse_args()
    if args.daemon_gc:
        from lmqd.service import GC_THRESHOLDS  # imports trio: only when asked

        gc.set_threshold(*GC_THRESHOLDS)
    modes = {
        "no-sync": (0, args.messages),
        "group": (10, args.messages),
        "sync-per-batch": (1, min(args.messages, args.sync_messages)),
    }
    chosen = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = set(chosen) - set(modes)
    if unknown:
        parser.error(f"unknown mode(s): {', '.join(sorted(unknown))}")
    for mode in chosen:
        every, count = modes[mode]
        results = []
        for _ in range(args.runs):
            with tempfile.TemporaryDirectory(dir=args.dir, prefix="lmq-bench-") as directory:
                results.append(run(directory, count, args.size, args.batch, every))
        if args.runs > 1:
            wall, cpu, rate = (statistics.median(r[i] for r in results) for i in range(3))
            print(_line(f"median {mode}", (wall, cpu, rate)) + f" ({args.runs} runs)")


if __name__ == "__main__":
    main()

"""Benchmark the disk queue alone: put_many + read_many of small messages, with and without fsync.

    .venv/bin/python scripts/bench_storage.py [--messages 200000] [--size 100] [--batch 100]

For each mode, writes ``--messages`` bodies of ``--size`` bytes in batches of ``--batch``
through a fresh ``DiskQueue`` in a temporary directory (``--dir``, default: the system temp
dir, which should be on the disk you care about), reading each batch back right after it is
written, as a channel draining its disk queue does. Modes:

* ``no-sync``: data handed to the OS only (nsqd's default between ``--sync-every`` syncs);
* ``sync-per-batch``: ``prepare_sync()`` + ``SyncJob.run()`` after every batch, i.e. durable
  mode with one publisher and no group commit (the worst case: one fsync round per batch);
* ``group-of-N``: one sync per N batches (what group commit gives N concurrent publishers).

Prints wall-clock and CPU microseconds per message and messages per second.
"""

from __future__ import annotations

import argparse
import tempfile
import time

from lmqd.message import GuidFactory, Message
from lmqd.storage import AnchoredTimeBase, DiskQueue


def run(directory: str, messages: int, size: int, batch: int, sync_every_batches: int) -> None:
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
    print(
        f"{label:>15}: {wall / done * 1e6:7.2f} us/msg wall, {cpu / done * 1e6:6.2f} us/msg CPU, "
        f"{done / wall:9,.0f} msg/s ({done} x {size} B, batches of {batch})"
    )


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
    args = parser.parse_args()
    for every, count in (
        (0, args.messages),
        (10, args.messages),
        (1, min(args.messages, args.sync_messages)),
    ):
        with tempfile.TemporaryDirectory(dir=args.dir, prefix="lmq-bench-") as directory:
            run(directory, count, args.size, args.batch, every)


if __name__ == "__main__":
    main()

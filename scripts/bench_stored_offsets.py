"""Benchmark what a channel's store pays for carrying topic offsets (``record.FLAG_OFFSET``).

    .venv/bin/python scripts/bench_stored_offsets.py [--messages 200000] [--size 100]
        [--batch 1000] [--runs 5]

A primary's channel writes each requeued or deferred message of its topic's log to its own store
with the message's topic offset (docs/mirrors.md: so that after a restart it still tells its
mirrors what it holds by offset), and a restart with a mirror reads those offsets back once
(``DiskQueue.stored_offsets``). For messages with offsets and without (``Message.offset`` -1:
what the store wrote before), each run writes ``--messages`` bodies of ``--size`` bytes in
batches of ``--batch`` to a fresh ``DiskQueue`` in a temporary directory, closes it, reopens it
and then times, per message: the writes, one ``stored_offsets()`` read of the whole queue, and
reading it back (``read_many``, decoded from the files as after a restart), and the bytes on
disk. Prints each run and the medians of ``--runs`` runs (the machine is shared).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from lmqd.message import GuidFactory, Message
from lmqd.storage import AnchoredTimeBase, DiskQueue

Result = tuple[float, float, float, float]
"""Write, offsets read and read-back microseconds per message, bytes on disk per message."""


def run(messages: int, size: int, batch: int, offsets: bool) -> Result:
    ids = GuidFactory(1)
    body = b"x" * size
    now = time.time_ns()
    batches = []
    for first in range(0, messages, batch):
        msgs = [Message(i, body, now) for i in ids.new_ids(batch)]
        if offsets:
            for k, m in enumerate(msgs, first):
                m.offset = k
        batches.append(msgs)
    with tempfile.TemporaryDirectory() as directory:
        timebase = AnchoredTimeBase.now(0.0)
        q = DiskQueue("bench", directory, timebase=timebase)
        started = time.perf_counter()
        for msgs in batches:
            q.put_many(msgs)
        write = time.perf_counter() - started
        on_disk = q.bytes_on_disk
        q.close()
        q = DiskQueue("bench", directory, timebase=timebase)
        started = time.perf_counter()
        found, without = q.stored_offsets()
        scan = time.perf_counter() - started
        assert (len(found), without) == ((messages, 0) if offsets else (0, messages))
        started = time.perf_counter()
        read = 0
        while got := q.read_many(batch):
            read += len(got)
        read_back = time.perf_counter() - started
        assert read == messages
        q.close()
    per = 1e6 / messages
    return write * per, scan * per, read_back * per, on_disk / messages


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    results: dict[bool, list[Result]] = {False: [], True: []}
    for _ in range(args.runs):
        for offsets in (False, True):
            result = run(args.messages, args.size, args.batch, offsets)
            results[offsets].append(result)
            print(f"offsets={offsets!s:5}  write {result[0]:.2f} us/msg  stored_offsets "
                  f"{result[1]:.2f} us/msg  read back {result[2]:.2f} us/msg  "
                  f"{result[3]:.1f} B/msg on disk")  # fmt: skip
    print(f"medians of {args.runs} runs, {args.messages} messages of {args.size} bytes:")
    for offsets, runs in results.items():
        med = [statistics.median(r[i] for r in runs) for i in range(4)]
        print(f"  offsets={offsets!s:5}  write {med[0]:.2f}  stored_offsets {med[1]:.2f}  "
              f"read back {med[2]:.2f} us/msg  {med[3]:.1f} B/msg")  # fmt: skip


if __name__ == "__main__":
    main()

"""What an idle topic and an idle channel cost: GC-tracked objects, bytes, one full collection.

    .venv/bin/python scripts/bench_idle.py [--topics 2000] [--channels 1] [--types 15]
        [--lines 0] [--freeze] [--ephemeral] [--durable]

Deterministic (no throughput, no wall-clock rate): a ``Broker`` over a temporary data directory,
started as the service starts it (its syncer running, topics attached to its nursery, the data
directory scanned so that new topics get fresh logs), creates ``--topics`` topics through
``Broker.get_topic`` and then ``--channels`` channels on each through ``Topic.get_channel``: the
paths HTTP ``/topic/create``, ``/channel/create`` and a TCP ``SUB`` take. No client, no message.
After each phase every task is let run until it blocks, then ``gc.collect()``; the script prints
per topic and per channel the GC-tracked objects (``len(gc.get_objects())``) and the bytes
(``tracemalloc``, Python allocations), the most numerous tracked types each added
(``--types``) and the allocation sites by bytes (``--lines``), and the time of one full
``gc.collect()`` over the whole heap at the end (one call, timed with ``time.perf_counter``:
the pause a client of a daemon this size sees when CPython's generation 2 collection runs);
``--freeze`` times one more after ``gc.freeze()``, as the CLI's daemon does after its restore.

The counts are exact and repeat from run to run; the collection's time depends on the machine
(it is proportional to the objects the collector traverses). docs/benchmarks.md ("Admin floods")
records the figures.
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import time
import tracemalloc
from collections import Counter
from pathlib import Path

import trio
import trio.testing

from lmqd.broker import Broker
from lmqd.options import Options
from lmqd.storage import AnchoredTimeBase

WARM_UP = 20
"""Topics (each with its channels) created before measuring: module-level caches, interned
strings and the syncer's first round are allocated once, not per topic."""


def _tracked_types() -> Counter[str]:
    return Counter(type(o).__name__ for o in gc.get_objects())


class Phase:
    """Objects and bytes before a phase, then what the phase added per unit."""

    def __init__(self, lines: int) -> None:
        gc.collect()
        self.types = _tracked_types()
        self.objects = len(gc.get_objects())
        self.bytes = tracemalloc.get_traced_memory()[0]
        self.lines = lines
        self.snapshot = tracemalloc.take_snapshot() if lines else None

    def report(self, label: str, count: int, top_types: int) -> None:
        gc.collect()
        objects = len(gc.get_objects()) - self.objects
        nbytes = tracemalloc.get_traced_memory()[0] - self.bytes
        print(
            f"{label}: {count} created, {objects / count:.1f} GC-tracked objects and "
            f"{nbytes / count:,.0f} bytes each"
        )
        if top_types:
            added = _tracked_types()
            added.subtract(self.types)
            for name, n in added.most_common(top_types):
                if n <= 0:
                    break
                print(f"    {n / count:6.2f}  {name}")
        if self.snapshot is not None:
            diff = tracemalloc.take_snapshot().compare_to(self.snapshot, "lineno")
            for stat in diff[: self.lines]:
                frame = stat.traceback[0]
                print(f"    {stat.size_diff / count:8,.0f} B  {frame.filename}:{frame.lineno}")


async def measure(args: argparse.Namespace, data_path: str) -> None:
    options = Options(data_path=data_path, durable=args.durable)

    timebase = AnchoredTimeBase.now(trio.current_time())  # one, as the service's data dir
    broker = Broker(options, hold_data_dir=lambda: timebase)
    broker.stores.note_on_disk([])  # as the service's scan: new names get fresh logs
    suffix = "#ephemeral" if args.ephemeral else ""
    async with trio.open_nursery() as nursery:
        broker.attach(nursery)
        await nursery.start(broker.syncer.run)

        def create(first: int, count: int, channels: bool) -> None:
            for i in range(first, first + count):
                topic = broker.get_topic(f"idle-{i}{suffix}")
                if channels:
                    for c in range(args.channels):
                        topic.get_channel(f"ch-{c}{suffix}")

        create(0, WARM_UP, True)
        await trio.testing.wait_all_tasks_blocked()

        before = Phase(args.lines)
        create(WARM_UP, args.topics, False)
        await trio.testing.wait_all_tasks_blocked()
        before.report("topic (no channel)", args.topics, args.types)

        if args.channels:
            before = Phase(args.lines)
            for i in range(WARM_UP, WARM_UP + args.topics):
                topic = broker.get_topic(f"idle-{i}{suffix}")
                for c in range(args.channels):
                    topic.get_channel(f"ch-{c}{suffix}")
            await trio.testing.wait_all_tasks_blocked()
            before.report("channel", args.topics * args.channels, args.types)

        gc.collect()
        total = len(gc.get_objects())
        started = time.perf_counter()
        gc.collect()
        pause = time.perf_counter() - started
        print(
            f"one full gc.collect(): {pause * 1000:.1f} ms over {total:,} tracked objects "
            f"({len(broker.topics)} topics, "
            f"{sum(len(t.channels) for t in broker.topics.values())} channels)"
        )
        if args.freeze:
            # What the CLI's daemon does once its restore is done (``LmqDaemon``'s freeze_gc):
            # the same topics, had they been restored, are then out of the collector's reach.
            gc.freeze()
            started = time.perf_counter()
            gc.collect()
            pause = time.perf_counter() - started
            print(
                f"after gc.freeze(): one full gc.collect(): {pause * 1000:.1f} ms over "
                f"{len(gc.get_objects()):,} tracked objects ({gc.get_freeze_count():,} frozen)"
            )
            gc.unfreeze()
        broker.attach(None)
        nursery.cancel_scope.cancel()
    broker.close_topics()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--topics", type=int, default=2000)
    parser.add_argument("--channels", type=int, default=1, help="channels per topic")
    parser.add_argument("--types", type=int, default=15, help="tracked types listed per phase")
    parser.add_argument(
        "--lines", type=int, default=0, help="allocation sites listed per phase (by bytes)"
    )
    parser.add_argument(
        "--freeze", action="store_true", help="also time a collection after gc.freeze()"
    )
    parser.add_argument("--ephemeral", action="store_true", help="#ephemeral names")
    parser.add_argument("--durable", action="store_true", help="--durable mode")
    args = parser.parse_args(argv)
    if args.topics <= 0 or args.channels < 0:
        parser.error("--topics must be positive, --channels at least 0")
    tracemalloc.start()
    with tempfile.TemporaryDirectory(prefix="bench_idle-") as tmp:
        trio.run(measure, args, str(Path(tmp)))
    tracemalloc.stop()
    sys.stdout.flush()


if __name__ == "__main__":
    main()

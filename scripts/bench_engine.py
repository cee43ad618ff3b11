"""Benchmark the queue engine alone (no sockets, no protocol): publish -> pump -> deliver -> FIN.

    .venv/bin/python scripts/bench_engine.py [--messages 200000] [--batch 100] [--clients 4]
        [--channels 1] [--log] [--mem-queue-size 10000]

Publishes ``--messages`` bodies of ``--size`` bytes in MPUB-sized batches through one topic into
``--channels`` channels, each with ``--clients`` fake subscribers at RDY ``--rdy``; with
``--log`` the topic has a real topic log in a temporary directory (what the daemon gives a
durable topic; ``--mem-queue-size 0`` then sends every message through it), without one the
topic keeps everything in memory. FINs everything in batches,
as the TCP server does: one ``finish_many`` per consumer's batch (``--fin-each``: one ``finish``
call per message, the method of the figures recorded before the restructure), after which the
channel's own task delivers once. Prints CPU microseconds per
message (``time.process_time``) and messages per second. The engine's share of the daemon's
~4 us/message budget should stay well under half of it.
"""

from __future__ import annotations

import argparse
import gc
import inspect
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import trio

from lmqd.engine.backend import BackendQueue, MemoryBackend
from lmqd.engine.topic import Topic
from lmqd.message import GuidFactory, Message
from lmqd.options import Options
from lmqd.stats import ClientStats
from lmqd.storage import AnchoredTimeBase, TopicLog


class BenchClient:
    """A consumer that keeps what it is sent until the benchmark FINs it."""

    def __init__(self, client_id: int, ready: int) -> None:
        self.id = client_id
        self.ready_count = ready
        self.msg_timeout = 60.0
        self.sample_rate = 0
        self.pending: list[Message] = []

    def byte_room(self) -> int:
        return 2**62  # the bench measures the engine, not output bounds

    def write_messages(self, messages: Sequence[Message]) -> None:
        self.pending.extend(messages)

    def close(self) -> None:
        pass

    def statistics(self) -> ClientStats:
        return ClientStats(
            client_id=str(self.id),
            hostname="bench",
            version="V2",
            remote_address="127.0.0.1:1",
            state=3,
            ready_count=self.ready_count,
            in_flight_count=0,
            message_count=0,
            finish_count=0,
            requeue_count=0,
            connect_ts=0,
            sample_rate=0,
            deflate=False,
            snappy=False,
            user_agent="bench",
        )


def _backend(topic: str, channel: str) -> BackendQueue:
    return MemoryBackend()


class Result:
    """CPU seconds in all and by phase, and wall seconds, of one run."""

    def __init__(self) -> None:
        self.cpu = 0.0
        self.wall = 0.0
        self.publish = 0.0  # Topic.publish: ids, Message objects, queueing
        self.finish = 0.0  # FIN of every message (its delivery round runs in the channel task)


def _topic(options: Options, data_path: str | None) -> Topic:
    kwargs: dict[str, Any] = {}
    try:
        from lmqd.engine.context import EngineContext
    except ImportError:  # a checkout from before the engine context
        pass
    else:
        log = None
        if data_path is not None:
            timebase = AnchoredTimeBase.now(trio.current_time())
            log = TopicLog("bench", data_path, timebase=timebase)
        ctx = EngineContext(options=options, guid=GuidFactory(1))
        return Topic(ctx, "bench", log=log)  # type: ignore[call-arg, arg-type]
    if "log" in inspect.signature(Topic).parameters:  # a checkout with topic logs
        if data_path is not None:
            timebase = AnchoredTimeBase.now(trio.current_time())
            kwargs["log"] = TopicLog("bench", data_path, timebase=timebase)
    else:  # before topic logs: the topic's backend queue
        kwargs["backend"] = MemoryBackend()
    return Topic(
        "bench", options, channel_backend_factory=_backend, guid=GuidFactory(1), **kwargs
    )  # type: ignore[call-arg, arg-type]


async def run(
    messages: int,
    batch: int,
    clients: int,
    rdy: int,
    size: int,
    fin_each: bool,
    channels: int = 1,
    mem_queue_size: int = 10_000,
    data_path: str | None = None,
) -> Result:
    options = Options(mem_queue_size=mem_queue_size)
    topic = _topic(options, data_path)
    subs = []
    for k in range(channels):
        channel = topic.get_channel(f"c{k}")
        consumers = [BenchClient(k * clients + i + 1, rdy) for i in range(clients)]
        subs += [(channel, channel.add_consumer(c), c) for c in consumers]
    body = b"x" * size
    bodies = [body] * batch
    finished = 0

    def fin_all() -> int:
        now = trio.current_time()
        done = 0
        for channel, sub, consumer in subs:
            pending = consumer.pending
            if pending:
                if fin_each:
                    finish = channel.finish
                    for m in pending:
                        finish(sub, m.id, now)
                else:
                    channel.finish_many(sub, [m.id for m in pending], now)
                done += len(pending)
                pending.clear()
        return done

    result = Result()
    clock = time.process_time
    async with trio.open_nursery() as nursery:
        await nursery.start(topic.run)
        cpu0 = clock()
        wall0 = time.perf_counter()
        published = 0
        while published < messages:
            n = min(batch, messages - published)
            t0 = clock()
            topic.publish(bodies if n == batch else bodies[:n], trio.current_time())
            t1 = clock()
            published += n
            await trio.lowlevel.checkpoint()  # the pump and the "server" take turns
            t2 = clock()
            finished += fin_all()
            result.publish += t1 - t0
            result.finish += clock() - t2
        while finished < messages * channels:
            await trio.lowlevel.checkpoint()
            t2 = clock()
            finished += fin_all()
            result.finish += clock() - t2
        result.cpu = clock() - cpu0
        result.wall = time.perf_counter() - wall0
        for channel in topic.channels.values():
            assert channel.in_flight_count == 0 and channel.depth == 0
        assert topic.depth == 0
        assert sum(s.finish_count for _, s, _ in subs) == messages * channels
        topic.close()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=100, help="messages per MPUB")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--rdy", type=int, default=2500)
    parser.add_argument("--size", type=int, default=100, help="body bytes")
    parser.add_argument("--repeat", type=int, default=3, help="runs; the best is reported")
    parser.add_argument(
        "--fin-each", action="store_true", help="one finish() call per message, not finish_many()"
    )
    parser.add_argument("--channels", type=int, default=1, help="channels of the topic")
    parser.add_argument("--mem-queue-size", type=int, default=10_000)
    parser.add_argument(
        "--log", action="store_true", help="give the topic a topic log (a temporary directory)"
    )
    args = parser.parse_args()
    results = []
    for _ in range(args.repeat):
        gc.collect()
        with tempfile.TemporaryDirectory() as tmp:
            results.append(
                trio.run(
                    run,
                    args.messages,
                    args.batch,
                    args.clients,
                    args.rdy,
                    args.size,
                    args.fin_each,
                    args.channels,
                    args.mem_queue_size,
                    tmp if args.log else None,
                )
            )
    best = min(results, key=lambda r: r.cpu)
    n = args.messages
    us = 1e6 / n
    print(
        f"engine: {n} msgs x {args.size} B, MPUB {args.batch}, {args.channels} channel(s) x "
        f"{args.clients} clients RDY "
        f"{args.rdy}, best of {args.repeat}: {best.cpu * us:.2f} us CPU/msg, "
        f"{n / best.wall:,.0f} msgs/s ({best.wall:.2f} s wall)\n"
        f"  publish {best.publish * us:.2f} us/msg, FIN {best.finish * us:.2f} us/msg, "
        f"pump + delivery + scheduling {(best.cpu - best.publish - best.finish) * us:.2f} us/msg"
    )


if __name__ == "__main__":
    main()

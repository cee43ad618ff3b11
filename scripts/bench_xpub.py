"""The daemon's side of a message with lmq fields, without sockets: XPUB in, frame type 3 out.

    .venv/bin/python scripts/bench_xpub.py [--mode plain|headers|dedup] [--messages 20000]
        [--batch 200] [--commands-per-read 4] [--spill | --mem-queue-size N] [--backlog]
        [--nsq] [--publish-only] [--daemon-gc] [--profile]

What ``lmqadmin bench --headers 3`` (or ``--dedup-ids``) makes the daemon do, minus the
sockets: a publisher's bytes go through a real ``ServerConnection`` and ``Session`` into a
``Broker`` (``--commands-per-read`` commands per receive buffer, as the bench's pipeline of 4
gives them), the topic's pump hands the messages to a channel, and a consumer that negotiated
the extension gets them encoded as frames (``ext_message_frame_parts``, type 3 for a message
with headers, the output joined as the writer joins it), then FINs them (``finish_many``). Modes:
``plain`` is MPUB, ``headers`` XPUB with three small headers on every message (``h0: v0`` ...,
the bench's), ``dedup`` XPUB with a distinct dedup id on every message. ``--spill`` makes the
topic's memory queue 0 (``--mem-queue-size 0``): every message is written to the topic's log;
with ``--backlog`` the consumer takes nothing until everything is published, so past the log's
cache (``LOG_CACHE_BYTES``) it reads the messages back from the files and decodes them, as a
consumer that lags behind the bench's load does. ``--mem-queue-size 10000 --backlog`` is what
NSQ's own benchmark (bench_writer, then bench_reader) makes a default daemon do: the messages
past the memory tail go to the log, and the consumer reads them back.

Made to be counted, not timed (the machine is shared): run it under callgrind twice with
different ``--messages`` and divide the difference of the instruction totals by the difference
of the message counts (start-up cancels out)::

    PYTHONHASHSEED=0 valgrind --tool=callgrind --callgrind-out-file=/dev/null \\
        .venv/bin/python scripts/bench_xpub.py --mode headers --messages 6000 2>&1 | grep refs

``--daemon-gc`` sets the cyclic GC thresholds lmqd sets (``lmqd.service.GC_THRESHOLDS``): the
interpreter's own make the collector a large part of a run that holds tens of thousands of
messages, which the daemon's do not. ``--profile`` prints cProfile's call counts
(deterministic) and the functions with most own time.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import pstats
import struct
import tempfile
from collections.abc import Sequence

import trio

from lmqd.broker import Broker
from lmqd.engine.channel import Channel
from lmqd.engine.subscription import Subscription
from lmqd.message import Message
from lmqd.message_ext import MessageExt
from lmqd.options import Options
from lmqd.protocol import (
    Limits,
    Mpub,
    ServerConnection,
    ext_message_frame_parts,
    message_frame_parts,
)
from lmqd.protocol.events import encode_identify
from lmqd.protocol.extension import XpubMessage, encode_xpub
from lmqd.server.output import OutputBuffer
from lmqd.server.session import Session
from lmqd.service import GC_THRESHOLDS
from lmqd.stats import ClientStats
from lmqd.storage import AnchoredTimeBase

TOPIC = "bench"
HEADERS = MessageExt(headers=tuple((f"h{k}", f"v{k}") for k in range(3)))


class FrameConsumer:
    """A consumer that negotiated the extension (unless ``nsq``): encodes its messages as the
    session does and joins them as the connection's writer does; FINs them later."""

    def __init__(self, ready: int, *, nsq: bool = False) -> None:
        self.frame_parts = message_frame_parts if nsq else ext_message_frame_parts
        self.id = 1
        self.ready_count = ready
        self.msg_timeout = 60.0
        self.sample_rate = 0
        self.pending: list[bytes] = []
        self.sent_bytes = 0

    def byte_room(self) -> int:
        return 2**62

    def write_messages(self, messages: Sequence[Message]) -> None:
        parts: list[bytes] = []
        self.sent_bytes += self.frame_parts(messages, parts)
        b"".join(parts)
        self.pending += [m.id for m in messages]

    def close(self) -> None:
        pass

    def statistics(self) -> ClientStats:
        return ClientStats(
            client_id="bench", hostname="bench", version="V2", remote_address="127.0.0.1:1",
            state=3, ready_count=self.ready_count, in_flight_count=0, message_count=0,
            finish_count=0, requeue_count=0, connect_ts=0, sample_rate=0, deflate=False,
            snappy=False, user_agent="bench",
        )  # fmt: skip


def commands(mode: str, messages: int, batch: int) -> list[bytes]:
    """The publisher's commands, built at a cost per message that does not count: ``plain`` and
    ``headers`` repeat one encoded command; ``dedup`` (a distinct id per message) joins
    ready-made pieces, and ``--build-only`` counts what that costs, to be subtracted."""
    body = b"x" * 100
    if mode == "plain":
        full = Mpub(topic=TOPIC, bodies=[body] * batch).encode()
    elif mode == "headers":
        full = encode_xpub(TOPIC, [XpubMessage(body, HEADERS)] * batch)
    else:
        return [_dedup_command(first, min(batch, messages - first), body)
                for first in range(0, messages, batch)]  # fmt: skip
    out = [full] * (messages // batch)
    if messages % batch:
        out.append(commands(mode, messages % batch, messages % batch)[0])
    return out


def _dedup_command(first: int, n: int, body: bytes) -> bytes:
    # Each message: [2 block length][block: flags 0x04, id length, id][4 body size][body], the
    # id "0-<number>" as wide as every other (the same command size for every batch).
    tail = struct.pack(">I", len(body)) + body
    ids = [b"0-%010d" % k for k in range(first, first + n)]
    head = struct.pack(">HBB", 2 + len(ids[0]), 0x04, len(ids[0]))
    payload = struct.pack(">i", n) + b"".join([head + i + tail for i in ids])
    return b"XPUB %s\n" % TOPIC.encode() + struct.pack(">I", len(payload)) + payload


async def run(args: argparse.Namespace, data_path: str) -> int:
    memory = 0 if args.spill else args.mem_queue_size
    options = Options(data_path=data_path, mem_queue_size=memory)
    broker = Broker(options, hold_data_dir=lambda: AnchoredTimeBase.now(trio.current_time()))
    consumer = FrameConsumer(0 if args.backlog else 2500, nsq=args.nsq)
    cmds = commands(args.mode, args.messages, args.batch)
    if args.build_only:
        return 0
    reads = [
        b"".join(cmds[k : k + args.commands_per_read])
        for k in range(0, len(cmds), args.commands_per_read)
    ]
    async with trio.open_nursery() as nursery:
        broker.attach(nursery)
        channel: Channel = broker.get_topic(TOPIC).get_channel("c")
        sub: Subscription = channel.add_consumer(consumer)
        output = OutputBuffer(lambda: None)
        session = Session(
            broker, ServerConnection(Limits.from_options(options)), output, "127.0.0.1:2",
            on_close=lambda: None, on_heartbeat_interval=lambda interval, now: None,
        )  # fmt: skip
        features = {"feature_negotiation": True} if args.nsq else {"lmq_ext": 1}
        identify = encode_identify({"feature_negotiation": True, **features})
        session.receive(b"  V2" + identify, trio.current_time())
        profile = cProfile.Profile() if args.profile else None
        if profile is not None:
            profile.enable()
        finished = 0
        for data in reads:
            if not session.receive(data, trio.current_time()):
                raise RuntimeError(output.take())
            output.take()
            output.sent()
            for _ in range(4):  # the pump's batches and the channel's deliveries
                await trio.lowlevel.checkpoint()
            if consumer.pending:
                channel.finish_many(sub, consumer.pending, trio.current_time())
                finished += len(consumer.pending)
                consumer.pending = []
        if args.backlog and not args.publish_only:
            consumer.ready_count = 2500
            channel.consumer_ready()
        while finished < args.messages and not args.publish_only:
            await trio.lowlevel.checkpoint()
            if consumer.pending:
                channel.finish_many(sub, consumer.pending, trio.current_time())
                finished += len(consumer.pending)
                consumer.pending = []
        if profile is not None:
            profile.disable()
            stats = pstats.Stats(profile).sort_stats("tottime")
            stats.print_stats(25)
        nursery.cancel_scope.cancel()
    broker.close_topics()
    return consumer.sent_bytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("plain", "headers", "dedup"), default="headers")
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=200, help="messages per command")
    parser.add_argument("--commands-per-read", type=int, default=4)
    parser.add_argument("--spill", action="store_true", help="--mem-queue-size 0")
    parser.add_argument(
        "--mem-queue-size", type=int, default=10_000_000,
        help="the topic's memory tail (default: everything in memory)",
    )  # fmt: skip
    parser.add_argument(
        "--backlog", action="store_true",
        help="the consumer takes nothing until everything is published (past the log's cache, "
        "it reads the log's files back)",
    )  # fmt: skip
    parser.add_argument(
        "--build-only", action="store_true", help="build the commands and stop (what to subtract)"
    )
    parser.add_argument(
        "--nsq", action="store_true",
        help="an NSQ consumer: no extension negotiated, nsqd's frames (plain mode only)",
    )  # fmt: skip
    parser.add_argument(
        "--publish-only", action="store_true",
        help="with --backlog: stop once everything is published (count the publishing side)",
    )  # fmt: skip
    parser.add_argument(
        "--daemon-gc", action="store_true", help="use lmqd's GC thresholds (as the daemon runs)"
    )
    parser.add_argument("--profile", action="store_true", help="cProfile the run")
    args = parser.parse_args()
    if args.nsq and args.mode != "plain":
        parser.error("--nsq takes --mode plain (an NSQ client publishes no lmq fields)")
    if args.publish_only and not args.backlog:
        parser.error("--publish-only takes --backlog (a consumer that takes nothing meanwhile)")
    if args.daemon_gc:
        gc.set_threshold(*GC_THRESHOLDS)
    with tempfile.TemporaryDirectory() as tmp:
        sent = trio.run(run, args, tmp)
    print(f"{args.mode}{' spill' if args.spill else ''}: {args.messages} messages, {sent} B sent")


if __name__ == "__main__":
    main()

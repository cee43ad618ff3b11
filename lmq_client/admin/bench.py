"""``lmqadmin bench``: writer and reader processes against any NSQ-compatible daemon.

Theory of operation
-------------------
Readers start first (each subscribes to ``topic``/``channel``, or to each of ``channels``
channels, on every daemon with ``RDY rdy``: the daemons given, or with lookupds the producers
they list for the topic) and report ready; then writers publish ``MPUB`` batches, ``pipeline`` of
them in flight per connection (writer ``i`` to daemon ``i`` modulo their number), until
``duration`` has passed or their share of ``count`` is sent. Readers stop once
they have consumed what was published; with no writers they drain an existing backlog, exactly
``count`` messages if it is given, else until nothing arrives for ``DRAIN_IDLE_TIMEOUT``.
Every message carries its send time (``time.time_ns()``, 8 bytes big-endian) at the start of
its body, so a reader computes end-to-end latency on arrival; the wall clock is shared by
processes on one machine, so this is valid as long as writers and readers run on the same host.

The client must not be the bottleneck when this measures a daemon: a batch shares one body
object (the time stamp is per batch), a reader handles each received buffer in one call, answers
it with one write of all its FINs, and keeps latencies in a fixed-size log histogram instead of a
list. Each process reports the CPU time it used, which the report prints next to the rates: a
client process near 100% of a core means the figures measure the client.

Processes are started with ``spawn`` (no fork of a parent that may run threads); counters are
shared ``multiprocessing.Value``s, polled by the parent for the progress display.
"""

from __future__ import annotations

import functools
import math
import multiprocessing
import multiprocessing.synchronize
import os
import queue
import struct
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import attrs
import trio
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from lmq_client.errors import ConnectionFailed
from lmq_client.transport import PLAIN, TransportOptions

__all__ = ["BenchConfig", "LatencyHistogram", "format_report", "run_bench"]

_STAMP = struct.Struct(">q")
# How long consumers may go without receiving anything, once writers are done, before the
# bench stops waiting for the rest (messages lost, or left from another run).
DRAIN_IDLE_TIMEOUT = 5.0
READY_TIMEOUT = 60.0


@attrs.frozen(kw_only=True)
class BenchConfig:
    """Everything a bench run needs (the CLI's options)."""

    tcp: Sequence[str]
    topic: str
    channel: str = "bench"
    channels: int = 1
    """Channels of the topic: ``channel``, or ``channel0`` .. ``channelN-1``; every reader
    subscribes to each of them, so every message is consumed once per channel."""
    writers: int = 1
    readers: int = 1
    batch_size: int = 200
    rdy: int = 2500
    size: int = 100
    duration: float | None = 10.0
    count: int | None = None
    pipeline: int = 4
    timeout: float = 5.0
    transport: TransportOptions = PLAIN
    """TLS, compression, AUTH secret (picklable: writer and reader processes get a copy)."""
    lookupd: Sequence[str] = ()
    """Lookupd HTTP addresses: readers consume from the producers they list (writers still
    publish to ``tcp``, writer ``i`` to ``tcp[i % len(tcp)]``)."""
    incompressible: bool = False
    """Random bodies, all different (one pool of ``INCOMPRESSIBLE_POOL`` per writer), instead of
    one repeated ``x`` padding: what snappy and deflate cost when they cannot shrink anything."""
    headers: int = 0
    """lmq: this many small headers on every message (``h0: v0`` ...), published with XPUB."""
    dedup_ids: bool = False
    """lmq: a distinct dedup id on every message (writer, sequence), published with XPUB."""
    priority: int = 0
    """lmq: this priority (1-9) on every message, published with XPUB: each one goes through
    every channel's priority lanes."""


INCOMPRESSIBLE_POOL = 4096
"""Random bodies a writer cycles through with ``incompressible``: 4096 x 100 B is 400 KiB, more
than deflate's 32 KiB window and snappy's 64 KiB blocks, so no repeat is ever within reach."""


class LatencyHistogram:
    """Latencies in log buckets: 128 linear buckets per power of two, so <1% error, any range.

    Memory is bounded by the range of values (a few thousand buckets), not by the message count.
    """

    __slots__ = ("buckets", "count")

    def __init__(self) -> None:
        self.buckets: Counter[int] = Counter()
        self.count = 0

    @staticmethod
    def key(value_us: int) -> int:
        if value_us < 128:
            return max(value_us, 0)
        shift = value_us.bit_length() - 7
        return (shift << 7) | (value_us >> shift)

    @staticmethod
    def value(key: int) -> float:
        """The middle of a bucket, in microseconds."""
        shift, mantissa = key >> 7, key & 127
        if shift == 0:
            return float(mantissa)
        return ((mantissa << shift) + (1 << (shift - 1))) / 1.0

    def record(self, value_us: int, times: int = 1) -> None:
        """Record ``value_us`` ``times`` times."""
        self.buckets[self.key(value_us)] += times
        self.count += times

    def merge(self, other: LatencyHistogram) -> None:
        self.buckets.update(other.buckets)
        self.count += other.count

    def percentile(self, q: float) -> float | None:
        """The value (µs) below which a fraction ``q`` of the samples fall; None when empty."""
        if not self.count:
            return None
        rank = max(1, math.ceil(q * self.count))
        seen = 0
        for key in sorted(self.buckets):
            seen += self.buckets[key]
            if seen >= rank:
                return self.value(key)
        return self.value(max(self.buckets))


# -- child processes ---------------------------------------------------------------------------


def _report_failure(results: multiprocessing.Queue[Any], who: str, exc: BaseException) -> None:
    # A failure inside a nursery arrives wrapped in an exception group: look inside it.
    found: BaseException = exc
    while isinstance(found, BaseExceptionGroup) and len(found.exceptions) == 1:
        found = found.exceptions[0]
    if isinstance(found, ConnectionFailed):
        results.put(("unreachable", {"address": found.address, "reason": found.reason}))
    else:
        results.put(("error", f"{who}: {type(found).__name__}: {found}"))


def _writer_main(
    config: BenchConfig,
    index: int,
    quota: int | None,
    published: Any,
    results: multiprocessing.Queue[Any],
) -> None:
    try:
        first, last, sent, cpu = trio.run(_write, config, index, quota, published)
        results.put(("writer", {"start": first, "end": last, "messages": sent, "cpu": cpu}))
    except BaseException as exc:  # reported to the parent, which prints it
        _report_failure(results, f"writer {index}", exc)


async def _write(
    config: BenchConfig, index: int, quota: int | None, published: Any
) -> tuple[float, float, int, float]:
    from lmq_client.extension import message_ext, xpub_command
    from lmq_client.producer import Producer
    from lmqd.protocol import Mpub

    address = config.tcp[index % len(config.tcp)]
    ext = message_ext(
        headers={f"h{k}": f"v{k}" for k in range(config.headers)} if config.headers else None,
        priority=config.priority or None,
    )
    pad = b"x" * (config.size - _STAMP.size)
    pool: list[bytes] = []
    if config.incompressible:
        pool = [os.urandom(config.size - _STAMP.size) for _ in range(INCOMPRESSIBLE_POOL)]
    sent = 0
    async with Producer(
        address, connect_timeout=config.timeout, transport=config.transport
    ) as producer:
        conn = await producer.connect()
        in_flight: list[tuple[Any, int]] = []
        start = time.time()
        cpu_start = time.process_time()  # the CPU of the measured window only (not the setup)
        end = start + config.duration if config.duration is not None else math.inf
        while (quota is None or sent < quota) and time.time() < end:
            n = config.batch_size if quota is None else min(config.batch_size, quota - sent)
            stamp = _STAMP.pack(time.time_ns())
            if pool:
                first = sent % INCOMPRESSIBLE_POOL
                pads = (pool[(first + i) % INCOMPRESSIBLE_POOL] for i in range(n))
                bodies = [stamp + p for p in pads]
            else:
                bodies = [stamp + pad] * n
            if ext is None and not config.dedup_ids:
                command = Mpub(topic=config.topic, bodies=bodies).encode()
            else:
                ids = [b"%d-%d" % (index, sent + k) for k in range(n)] if config.dedup_ids else None
                command = xpub_command(config.topic, bodies, ext, dedup_ids=ids)
            in_flight.append((conn.command(command), n))
            sent += n
            if len(in_flight) >= config.pipeline:
                reply, count = in_flight.pop(0)
                await reply.wait()
                published.value += count
        for reply, count in in_flight:
            await reply.wait()
            published.value += count
        return start, time.time(), sent, time.process_time() - cpu_start


def _reader_main(
    config: BenchConfig,
    index: int,
    consumed: Any,
    claimed: Any,
    stop: multiprocessing.synchronize.Event,
    results: multiprocessing.Queue[Any],
) -> None:
    try:
        first, last, received, cpu, hist = trio.run(
            _read, config, index, consumed, claimed, stop, results
        )
        results.put(("reader", {"start": first, "end": last, "messages": received,
                                "cpu": cpu, "latency": dict(hist.buckets),
                                "latency_count": hist.count}))
    except BaseException as exc:
        _report_failure(results, f"reader {index}", exc)


async def _read(
    config: BenchConfig,
    index: int,
    consumed: Any,
    claimed: Any,
    stop: multiprocessing.synchronize.Event,
    results: multiprocessing.Queue[Any],
) -> tuple[float, float, int, float, LatencyHistogram]:
    from lmq_client.connection import Connection
    from lmqd.protocol import Fins, MessageFrame, Rdy, Sub

    hist = LatencyHistogram()
    # The window from the first message to the last, and the process's CPU time at the first
    # (the CPU from there on is the window's: waiting for the others after the last is idle).
    state = {"first": 0.0, "last": 0.0, "received": 0, "cpu_first": 0.0}
    unpack = _STAMP.unpack_from
    quota = config.count or 0  # only used with ``claimed``

    def on_messages(conn: Connection, frames: list[MessageFrame]) -> None:
        if claimed is not None:
            # Draining to a count: FIN only what is left of it; the rest stays in flight and
            # goes back to the channel when the connection closes.
            with claimed.get_lock():
                take = max(0, min(len(frames), quota - claimed.value))
                claimed.value += take
            if take < len(frames):
                conn.write(Rdy(count=0).encode())
                frames = frames[:take]
            if not frames:
                return
        now_ns = time.time_ns()
        now = now_ns / 1e9
        if not state["first"]:
            state["first"] = now
            state["cpu_first"] = time.process_time()
        state["last"] = now
        state["received"] += len(frames)
        # A writer stamps a whole batch with one time: count the stamps, then record each once.
        for stamp, times in Counter([f.body[:8] for f in frames]).items():
            hist.record((now_ns - unpack(stamp)[0]) // 1000, times)
        conn.write(Fins(ids=[f.id for f in frames]).encode())
        consumed.value += len(frames)

    addresses = list(config.tcp)
    if config.lookupd:
        from lmq_client.lookupd import lookup_producers

        found: set[str] = set()
        for lookupd in config.lookupd:
            query = functools.partial(lookup_producers, lookupd, config.topic,
                                      timeout=config.timeout)  # fmt: skip
            found.update(await trio.to_thread.run_sync(query))
        addresses = sorted(found)
    async with trio.open_nursery() as nursery:
        for address in addresses:
            for channel in channel_names(config):
                conn = Connection(
                    address,
                    connect_timeout=config.timeout,
                    on_messages=on_messages,
                    transport=config.transport,
                )
                await nursery.start(conn.run)
                await conn.request(Sub(topic=config.topic, channel=channel).encode())
                conn.write(Rdy(count=config.rdy).encode())
        results.put(("ready", index))
        # The parent always sets stop (also when it fails), so the thread cannot be left over.
        await trio.to_thread.run_sync(stop.wait)
        nursery.cancel_scope.cancel()
    cpu = time.process_time() - state["cpu_first"] if state["first"] else 0.0
    return state["first"], state["last"], int(state["received"]), cpu, hist


def channel_names(config: BenchConfig) -> list[str]:
    """The channels the readers consume (``BenchConfig.channels``)."""
    if config.channels == 1:
        return [config.channel]
    return [f"{config.channel}{k}" for k in range(config.channels)]


# -- the parent --------------------------------------------------------------------------------


def run_bench(config: BenchConfig, console: Console | None = None) -> dict[str, Any]:
    """Run the bench; returns the report (see ``format_report``). ``console``: show progress."""
    ctx = multiprocessing.get_context("spawn")
    results: multiprocessing.Queue[Any] = ctx.Queue()
    stop = ctx.Event()
    published = [ctx.Value("q", 0, lock=False) for _ in range(config.writers)]
    consumed = [ctx.Value("q", 0, lock=False) for _ in range(config.readers)]
    # Without writers, readers share ``count``: one locked counter, taken once per buffer.
    claimed = ctx.Value("q", 0) if not config.writers and config.count is not None else None
    errors: list[str] = []
    writer_results: list[dict[str, Any]] = []
    reader_results: list[dict[str, Any]] = []
    unreachable: dict[str, Any] | None = None

    def collect(block_for: float) -> None:
        nonlocal unreachable
        try:
            kind, payload = results.get(timeout=block_for)
        except queue.Empty:
            return
        if kind == "writer":
            writer_results.append(payload)
        elif kind == "reader":
            reader_results.append(payload)
        elif kind == "ready":
            ready.add(payload)
        elif kind == "unreachable":
            unreachable = payload
        else:
            errors.append(str(payload))

    ready: set[int] = set()
    readers = [
        ctx.Process(target=_reader_main, args=(config, i, consumed[i], claimed, stop, results),
                    name=f"lmq-bench-reader-{i}", daemon=True)
        for i in range(config.readers)
    ]
    quotas: list[int | None] = [None] * config.writers
    if config.count is not None and config.writers:
        share, extra = divmod(config.count, config.writers)
        quotas = [share + (1 if i < extra else 0) for i in range(config.writers)]
    writers = [
        ctx.Process(target=_writer_main, args=(config, i, quotas[i], published[i], results),
                    name=f"lmq-bench-writer-{i}", daemon=True)
        for i in range(config.writers)
    ]
    progress = Progress(
        TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed:,.0f}"),
        TimeElapsedColumn(), console=console, disable=console is None, transient=True,
    )
    try:
        with progress:
            pub_task = progress.add_task("published", total=config.count)
            sub_task = progress.add_task("consumed", total=config.count)
            for p in readers:
                p.start()
            deadline = time.monotonic() + READY_TIMEOUT
            while len(ready) < len(readers) and unreachable is None and not errors:
                if time.monotonic() > deadline:
                    errors.append("readers did not subscribe in time")
                    break
                collect(0.1)
            if unreachable is None and not errors:
                for p in writers:
                    p.start()
            while any(p.is_alive() for p in writers) or len(writer_results) < len(writers):
                if unreachable is not None or errors:
                    break
                collect(0.1)
                progress.update(pub_task, completed=sum(v.value for v in published))
                progress.update(sub_task, completed=sum(v.value for v in consumed))
            # Readers stop at what the writers published or, with no writers (draining a
            # backlog), at ``count``; with neither, when nothing arrives for a while.
            target = (
                sum(r["messages"] for r in writer_results) * config.channels
                if writers
                else config.count
            )
            if readers and unreachable is None and not errors:
                last_seen, last_change = -1, time.monotonic()
                while True:
                    got = sum(v.value for v in consumed)
                    progress.update(sub_task, completed=got)
                    if target is not None and got >= target:
                        break
                    if got != last_seen:
                        last_seen, last_change = got, time.monotonic()
                    elif time.monotonic() - last_change > DRAIN_IDLE_TIMEOUT:
                        if writers:
                            errors.append(f"consumed {got} of {target} messages published")
                        elif target is not None:
                            errors.append(f"consumed {got} of the {target} messages asked for")
                        break
                    collect(0.1)
            stop.set()
            deadline = time.monotonic() + 30
            while len(reader_results) < sum(1 for p in readers if p.pid is not None):
                if unreachable is not None or time.monotonic() > deadline:
                    break
                if not any(p.is_alive() for p in readers) and results.empty():
                    break
                collect(0.1)
    finally:
        stop.set()
        for p in (*writers, *readers):
            if p.pid is not None:
                p.join(5)
                if p.is_alive():
                    p.kill()
                    p.join()
    if unreachable is not None:
        raise ConnectionFailed(unreachable["address"], unreachable["reason"])
    return _report(config, writer_results, reader_results, errors)


def _rate(messages: int, seconds: float, size: int) -> dict[str, float]:
    return {
        "msgs_per_s": round(messages / seconds, 1) if seconds > 0 else 0.0,
        "mb_per_s": round(messages * size / seconds / 1e6, 3) if seconds > 0 else 0.0,
    }


def _side(results: list[dict[str, Any]], size: int) -> dict[str, Any] | None:
    if not results:
        return None
    messages = sum(r["messages"] for r in results)
    starts = [r["start"] for r in results if r["start"]]
    seconds = max(r["end"] for r in results) - min(starts) if starts else 0.0
    cpu = sum(r["cpu"] for r in results)
    return {
        "processes": len(results),
        "messages": messages,
        "seconds": round(seconds, 3),
        **_rate(messages, seconds, size),
        "client_cpu_s": round(cpu, 3),
        "client_cpu_pct_per_process": round(100 * cpu / seconds / len(results), 1)
        if seconds > 0 else 0.0,
    }


def _report(
    config: BenchConfig,
    writers: list[dict[str, Any]],
    readers: list[dict[str, Any]],
    errors: list[str],
) -> dict[str, Any]:
    hist = LatencyHistogram()
    for r in readers:
        part = LatencyHistogram()
        part.buckets.update({int(k): v for k, v in r["latency"].items()})
        part.count = r["latency_count"]
        hist.merge(part)
    latency: dict[str, float | None] = {}
    for name, q in (("p50", 0.5), ("p99", 0.99), ("p99.9", 0.999), ("max", 1.0)):
        value = hist.percentile(q)
        latency[name] = None if value is None else round(value / 1000, 3)
    return {
        "topic": config.topic,
        "channel": config.channel,
        "channels": config.channels,
        "daemons": list(config.tcp),
        "batch_size": config.batch_size,
        "rdy": config.rdy,
        "size": config.size,
        "publish": _side(writers, config.size),
        "consume": _side(readers, config.size),
        "latency_ms": latency,
        "errors": errors,
    }


def format_report(report: dict[str, Any]) -> str:
    """The report as the text lmqadmin prints."""
    lines = [
        f"bench {report['topic']}/{report['channel']} on {', '.join(report['daemons'])}: "
        f"size {report['size']} B, MPUB batch {report['batch_size']}, RDY {report['rdy']}"
    ]
    for label, key in (("publish", "publish"), ("consume", "consume")):
        side = report[key]
        if side is None:
            continue
        lines.append(
            f"{label:8} {side['messages']:>10,} msgs in {side['seconds']:7.2f}s  "
            f"{side['msgs_per_s']:>12,.1f} msgs/s  {side['mb_per_s']:8.2f} MB/s  "
            f"({side['processes']} proc, client CPU {side['client_cpu_pct_per_process']:.0f}% "
            "of a core each)"
        )
    lat = report["latency_ms"]
    if lat.get("p50") is not None:
        lines.append(
            "latency  " + "  ".join(f"{k}={v:.3f}ms" for k, v in lat.items() if v is not None)
        )
    for error in report["errors"]:
        lines.append(f"error: {error}")
    return "\n".join(lines)

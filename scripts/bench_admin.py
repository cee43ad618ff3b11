"""Benchmark admin floods: what creating topics and channels (and ``/debug/freememory``) costs
the daemon's event loop, and what a PUB/SUB client beside the flood sees meanwhile.

    ./scripts/bench_admin [--count 10000] [--http-connections 4] [--tcp-connections 16]

Starts one ``lmqd`` subprocess (``python -m lmqd``, 127.0.0.1, port 0, data in a temporary
directory under ``--dir``) and a **probe**: one connection publishing a timestamped message to
topic ``probe`` every ``--probe-interval`` seconds and one subscribed to it (``RDY 1``, FIN at
once), recording each message's publish-to-delivery latency. Then, one phase after another:

* ``http-ping``: ``--count`` ``GET /ping`` the same way: what an HTTP request costs by itself
  (hypercorn, the ASGI app, the request log line), to subtract from the creations' figures;
* ``http-topic``: ``--count`` ``POST /topic/create`` (keep-alive connections, in parallel);
* ``http-channel``: a channel on each of those topics (``POST /channel/create``);
* ``tcp-sub``: ``--count`` ``SUB`` to new topics and channels, one short connection each (a
  connection may SUB once), so the figure includes a connection's setup and teardown;
* ``freememory``: ``--freememory`` calls of ``POST /debug/freememory``.

Per phase it prints the creations, the wall time, the daemon's CPU per creation (user + system
of the whole process, from ``/proc``: the event loop's cost, since lmqd runs its loop in one
thread; worker-thread fsyncs of the metadata file count too) and the probe's latency
percentiles during the phase, beside a baseline taken before the first phase.

Run it on an otherwise idle machine: the probe's latency is what other clients would see.
"""

from __future__ import annotations

import argparse
import struct
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import h11
import trio

from lmqd.protocol import ClientConnection, Error, Fin, MessageFrame, Nop, Pub, Rdy, Response, Sub

# The checkout's root on sys.path: the lmqd subprocess helper is shared with the tests.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.support.process import BENCH_SHUTDOWN_TIMEOUT_S, LmqdProcess, start_lmqd

Address = tuple[str, int]
_STAMP = struct.Struct(">d")


class Probe:
    """A publisher and a subscriber on topic ``probe``: publish-to-delivery latencies."""

    def __init__(self, address: Address, interval: float) -> None:
        self._address = address
        self._interval = interval
        self.latencies: list[float] = []

    def take(self) -> list[float]:
        """The latencies recorded since the last call (seconds)."""
        taken, self.latencies = self.latencies, []
        return taken

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(self._subscribe)
            task_status.started()
            nursery.start_soon(self._publish)

    async def _publish(self) -> None:
        stream = await trio.open_tcp_stream(*self._address)
        codec = ClientConnection()
        await stream.send_all(codec.initial_bytes())
        while True:
            body = _STAMP.pack(time.perf_counter())
            await stream.send_all(Pub(topic="probe", body=body).encode())
            await _until_ok(stream, codec)
            await trio.sleep(self._interval)

    async def _subscribe(self, *, task_status: trio.TaskStatus[None]) -> None:
        stream = await trio.open_tcp_stream(*self._address)
        codec = ClientConnection()
        await stream.send_all(codec.initial_bytes())
        await stream.send_all(Sub(topic="probe", channel="c").encode())
        await _until_ok(stream, codec)
        await stream.send_all(Rdy(count=1).encode())
        task_status.started()
        while True:
            data = await stream.receive_some(65536)
            if not data:
                raise RuntimeError("lmqd closed the probe's connection")
            codec.receive_data(data)
            now = time.perf_counter()
            answer = b""
            for event in codec.next_events():
                if isinstance(event, MessageFrame):
                    (sent,) = _STAMP.unpack(event.body)
                    self.latencies.append(now - sent)
                    answer += Fin(id=event.id).encode()
                elif isinstance(event, Response) and event.is_heartbeat:
                    answer += Nop().encode()
            if answer:
                await stream.send_all(answer)


async def _until_ok(stream: trio.SocketStream, codec: ClientConnection) -> None:
    """Read until ``OK`` (heartbeats answered); raise on an error frame."""
    while True:
        data = await stream.receive_some(65536)
        if not data:
            raise RuntimeError("lmqd closed the connection")
        codec.receive_data(data)
        for event in codec.next_events():
            if isinstance(event, Error):
                raise RuntimeError(f"lmqd answered {event.code} {event.text}")
            if isinstance(event, Response):
                if event.is_heartbeat:
                    await stream.send_all(Nop().encode())
                elif event.data == b"OK":
                    return


class KeepAlive:
    """One HTTP/1.1 keep-alive connection (h11): requests with empty bodies."""

    def __init__(self, stream: trio.SocketStream, address: Address) -> None:
        self._stream = stream
        self._address = address
        self._host = f"{address[0]}:{address[1]}"
        self._conn = h11.Connection(h11.CLIENT)

    @classmethod
    async def connect(cls, address: Address) -> KeepAlive:
        return cls(await trio.open_tcp_stream(*address), address)

    async def _reconnect(self) -> None:
        # The server ended keep-alive (hypercorn closes a connection after
        # keep_alive_max_requests, 1000 by default): a new connection, as a browser would.
        await self._stream.aclose()
        self._stream = await trio.open_tcp_stream(*self._address)
        self._conn = h11.Connection(h11.CLIENT)

    async def request(self, method: str, target: str) -> int:
        conn = self._conn
        request = h11.Request(
            method=method,
            target=target,
            headers=[("Host", self._host), ("Content-Length", "0")],
        )
        await self._stream.send_all(conn.send(request) + conn.send(h11.EndOfMessage()))
        status = 0
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await self._stream.receive_some(65536))
            elif isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.EndOfMessage):
                if conn.our_state is h11.MUST_CLOSE or conn.their_state is h11.MUST_CLOSE:
                    await self._reconnect()
                else:
                    conn.start_next_cycle()
                return status
            elif isinstance(event, h11.ConnectionClosed):
                raise RuntimeError("lmqd closed the HTTP connection")

    async def aclose(self) -> None:
        await self._stream.aclose()


async def http_flood(
    address: Address, targets: list[str], connections: int, method: str = "POST"
) -> None:
    """Request every target, over ``connections`` keep-alive connections in parallel."""
    pending = iter(targets)

    async def worker() -> None:
        client = await KeepAlive.connect(address)
        try:
            for target in pending:
                status = await client.request(method, target)
                if status != 200:
                    raise RuntimeError(f"{method} {target}: {status}")
        finally:
            await client.aclose()

    async with trio.open_nursery() as nursery:
        for _ in range(connections):
            nursery.start_soon(worker)


async def tcp_sub_flood(address: Address, names: list[tuple[str, str]], connections: int) -> None:
    """One short connection per (topic, channel): SUB, wait for OK, close."""
    pending = iter(names)

    async def worker() -> None:
        for topic, channel in pending:
            stream = await trio.open_tcp_stream(*address)
            codec = ClientConnection()
            try:
                sub = Sub(topic=topic, channel=channel).encode()
                await stream.send_all(codec.initial_bytes() + sub)
                await _until_ok(stream, codec)
            finally:
                await stream.aclose()

    async with trio.open_nursery() as nursery:
        for _ in range(connections):
            nursery.start_soon(worker)


def _ms(values: list[float], q: float) -> str:
    if not values:
        return "-"
    ordered = sorted(values)
    return f"{ordered[min(int(q * len(ordered)), len(ordered) - 1)] * 1e3:.2f}"


def report(name: str, count: int, wall: float, cpu: float, latencies: list[float]) -> None:
    per = f"{cpu / count * 1e6:10.0f}" if count else f"{'-':>10}"
    wall_per = f"{wall / count * 1e6:10.0f}" if count else f"{'-':>10}"
    print(
        f"{name:<13}{count:>8}{wall:>9.2f}{wall_per}{per}"
        f"{_ms(latencies, 0.5):>9}{_ms(latencies, 0.99):>9}"
        f"{(max(latencies) * 1e3 if latencies else 0):>9.2f}{len(latencies):>8}",
        flush=True,
    )


async def run(args: argparse.Namespace, server: LmqdProcess) -> None:
    tcp = server.tcp_host_port
    assert server.http_address is not None
    host, _, port = server.http_address.rpartition(":")
    web = (host, int(port))
    probe = Probe(tcp, args.probe_interval)
    count = args.count
    phases: list[tuple[str, int, Callable[[], Awaitable[None]]]] = [
        ("http-ping", count,
         lambda: http_flood(web, ["/ping"] * count, args.http_connections, "GET")),
        ("http-topic", count,
         lambda: http_flood(web, [f"/topic/create?topic=h{i}" for i in range(count)],
                            args.http_connections)),
        ("http-channel", count,
         lambda: http_flood(web, [f"/channel/create?topic=h{i}&channel=c" for i in range(count)],
                            args.http_connections)),
        ("tcp-sub", count,
         lambda: tcp_sub_flood(tcp, [(f"t{i}", "c") for i in range(count)],
                               args.tcp_connections)),
        ("freememory", args.freememory,
         lambda: http_flood(web, ["/debug/freememory"] * args.freememory, 1)),
    ]  # fmt: skip
    print(
        f"{'phase':<13}{'count':>8}{'wall s':>9}{'wall µs':>10}{'cpu µs':>10}"
        f"{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}{'probes':>8}"
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(probe.run)
        await trio.sleep(args.baseline)
        probe.take()
        started, cpu = time.perf_counter(), server.cpu_seconds()
        await trio.sleep(args.baseline)
        report("baseline", 0, time.perf_counter() - started, server.cpu_seconds() - cpu,
               probe.take())  # fmt: skip
        for name, n, phase in phases:
            started, cpu = time.perf_counter(), server.cpu_seconds()
            await phase()
            report(name, n, time.perf_counter() - started, server.cpu_seconds() - cpu,
                   probe.take())  # fmt: skip
        nursery.cancel_scope.cancel()
    rss, peak = server.memory_kb()
    print(f"daemon RSS {rss // 1024} MiB (peak {peak // 1024} MiB), {3 * count} creations")
    print("cpu µs: the daemon's CPU per request; a creation's own cost is its phase's figure")
    print("minus http-ping's (HTTP) or a SUB connection's setup (tcp-sub)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=10_000, help="topics (and channels) per phase")
    parser.add_argument("--http-connections", type=int, default=4)
    parser.add_argument("--tcp-connections", type=int, default=16)
    parser.add_argument("--freememory", type=int, default=20, help="/debug/freememory calls")
    parser.add_argument("--probe-interval", type=float, default=0.002, help="seconds")
    parser.add_argument("--baseline", type=float, default=2.0, help="seconds of baseline")
    parser.add_argument("--dir", default=None, help="parent of the data directory")
    parser.add_argument("--flag", action="append", default=[], help="extra lmqd flag")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="lmq-bench-admin-", dir=args.dir) as tmp:
        server = start_lmqd(Path(tmp) / "data", args.flag)
        try:
            trio.run(run, args, server)
        finally:
            server.terminate(BENCH_SHUTDOWN_TIMEOUT_S)


if __name__ == "__main__":
    main()

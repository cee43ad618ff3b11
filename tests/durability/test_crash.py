"""Crash tests on a real ``lmqd`` subprocess: SIGTERM under load, and ``kill -9`` with --durable.

Rules for this module (STYLE.md):
- The daemon is ``python -m lmqd`` (``tests.support.process.start_lmqd``) on 127.0.0.1 port 0
  with its data in ``tmp_path``; clients speak V2 (``tests.support.wire.Wire``) from trio tasks.
- A message counts as acknowledged only when its ``OK`` frame was read; FINs are sent only until
  a moment well before the signal, so every FIN counted was applied.
- Bodies carry their own checksum (``body``/``check``): content is verified, not just counted.
- Bounded: each test well under 30 s; every wait has a ``fail_after``/``move_on_after``.
"""

from __future__ import annotations

import functools
import hashlib
import random
import re
import subprocess
import time
from collections import deque
from pathlib import Path

import trio

from lmqd.protocol import Dpub, Error, Mpub, Pub, Response
from tests.support.daemon import eventually
from tests.support.process import REPO_ROOT, LmqdProcess, lmqd_command, start_lmqd, stop_lmqd
from tests.support.wire import ConnectionClosed, Wire

from .conftest import IDENTIFY

OK = Response(data=b"OK")
WINDOW = 8  # commands in flight per publisher: pipelining, as real producers do


def body(tag: str) -> bytes:
    """A message body that proves its own integrity: ``<tag>:<32 hex digits of its hash>``."""
    return f"{tag}:{hashlib.blake2b(tag.encode(), digest_size=16).hexdigest()}".encode()


def check(data: bytes) -> str:
    """The tag of a body made by ``body``; fails the test if the content is damaged."""
    tag, _, digest = data.decode().rpartition(":")
    assert hashlib.blake2b(tag.encode(), digest_size=16).hexdigest() == digest, data
    return tag


async def connect(server: LmqdProcess, **identify: object) -> Wire:
    """A ``Wire`` to ``server`` sending the durability tests' ``IDENTIFY`` (and ``identify``)."""
    return await Wire.connect(server.tcp_host_port, **{**IDENTIFY, **identify})


async def start(data_path: Path, flags: list[str]) -> LmqdProcess:
    return await trio.to_thread.run_sync(start_lmqd, data_path, flags)


async def kill9(server: LmqdProcess) -> None:
    server.process.kill()
    await trio.to_thread.run_sync(server.process.wait)
    server.terminate()  # already dead: only collects its output
    assert "Traceback" not in server.output(), server.output()


class Publisher:
    """Pipelines PUB/MPUB (and DPUB) commands and records what was answered ``OK``."""

    def __init__(self, name: str, topic: str, acked: set[bytes], rng: random.Random) -> None:
        self.name = name
        self.topic = topic
        self.acked = acked
        self.rng = rng
        self.seq = 0
        self.deferred: dict[bytes, tuple[float, float]] = {}
        """DPUB'd body -> (wall time sent, delay s), for the timing checks."""
        self.dpub_every = 0
        self.dpub_delay_ms = 0
        self.dpub_topic = topic

    def _next(self) -> tuple[bytes, list[bytes]]:
        self.seq += 1
        if self.dpub_every and self.seq % self.dpub_every == 0:
            b = body(f"{self.name}.{self.seq}.d")
            self.deferred[b] = (time.time(), self.dpub_delay_ms / 1000)
            return Dpub(topic=self.dpub_topic, defer_ms=self.dpub_delay_ms, body=b).encode(), [b]
        n = self.rng.choice([1, 1, 5, 20])
        bodies = [body(f"{self.name}.{self.seq}.{i}") for i in range(n)]
        if n == 1:
            return Pub(topic=self.topic, body=bodies[0]).encode(), bodies
        return Mpub(topic=self.topic, bodies=bodies).encode(), bodies

    async def run(self, wire: Wire, stop: trio.Event) -> None:
        pending: deque[list[bytes]] = deque()
        try:
            while not (stop.is_set() and not pending):
                while len(pending) < WINDOW and not stop.is_set():
                    command, bodies = self._next()
                    await wire.send(command)
                    pending.append(bodies)
                event = await wire.frame()
                bodies = pending.popleft()
                assert event == OK, event
                self.acked.update(bodies)
        except ConnectionClosed:
            pass


class Reader:
    """Consumes a channel, FINs what it gets until ``hold`` is set, then only records."""

    def __init__(self, fin_every: int = 1) -> None:
        self.fin_every = fin_every
        """FIN one message in this many (the others stay in flight)."""
        self.finished: set[bytes] = set()
        self.received: list[tuple[bytes, float, int]] = []
        """(body, wall time, attempts) of every delivery."""
        self.hold = trio.Event()

    async def run(self, wire: Wire) -> None:
        try:
            while True:
                event = await wire.frame()
                assert not isinstance(event, Error), event
                if isinstance(event, Response):
                    continue
                check(event.body)
                self.received.append((event.body, time.time(), event.attempts))
                if not self.hold.is_set() and len(self.received) % self.fin_every == 0:
                    await wire.fin(event.id)
                    self.finished.add(event.body)
        except ConnectionClosed:
            pass

    @property
    def bodies(self) -> set[bytes]:
        return {b for b, _, _ in self.received}


async def drain(
    server: LmqdProcess, topic: str, channel: str, want: set[bytes], limit: float
) -> Reader:
    """Consume (and FIN) until ``want`` has been delivered or ``limit`` seconds passed."""
    reader = Reader()
    wire = await connect(server)
    try:
        await wire.sub(topic, channel, rdy=500)
        with trio.move_on_after(limit):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(reader.run, wire)
                await eventually(lambda: want <= reader.bodies)
                nursery.cancel_scope.cancel()
    finally:
        await wire.aclose()
    return reader


async def test_sigterm_under_load_loses_nothing_and_deferred_keep_their_time(
    tmp_path: Path,
) -> None:
    flags = ["--mem-queue-size=50", "--msg-timeout=60s"]
    acked: set[bytes] = set()
    rng = random.Random(7)
    with trio.fail_after(25):
        server = await start(tmp_path, flags)
        try:
            reader = Reader()
            consumer = await connect(server, msg_timeout=60000)
            await consumer.sub("load", "c", rdy=40)
            idle = await connect(server)
            await idle.sub("later", "c")  # no backlog: the deferred ones' timing shows
            publishers = [Publisher(f"p{i}", "load", acked, rng) for i in range(4)]
            for publisher, topic in zip(publishers[:2], ("load", "later"), strict=True):
                publisher.dpub_every = 25
                publisher.dpub_delay_ms = 4500
                publisher.dpub_topic = topic
            wires = [idle] + [await connect(server) for _ in publishers]
            stop = trio.Event()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(reader.run, consumer)
                for publisher, wire in zip(publishers, wires[1:], strict=True):
                    nursery.start_soon(publisher.run, wire, stop)
                await trio.sleep(1.0)
                reader.hold.set()  # from here on, what the reader gets stays in flight
                await trio.sleep(0.3)
                # SIGTERM while publishers are still sending (under load).
                clean = await trio.to_thread.run_sync(server.terminate)
                stop.set()
            assert clean, server.output()
            assert "Traceback" not in server.output(), server.output()
        finally:
            server.terminate()
        for wire in [consumer, *wires]:
            await wire.aclose()
        in_flight = reader.bodies - reader.finished
        assert in_flight, "the reader should have held some messages in flight"
        deferred = {b: t for p in publishers for b, t in p.deferred.items() if b in acked}
        later = {b for b in deferred if b in publishers[1].deferred}
        assert later and len(deferred) > len(later), "DPUBs to both topics should be acknowledged"

        server = await start(tmp_path, flags)
        try:
            want = acked - reader.finished - later
            drained: dict[str, Reader] = {}

            async def drain_into(topic: str, want: set[bytes]) -> None:
                drained[topic] = await drain(server, topic, "c", want, limit=15)

            async with trio.open_nursery() as nursery:  # both at once: "later" is not held up
                nursery.start_soon(drain_into, "load", want)
                nursery.start_soon(drain_into, "later", later)
            after, on_time = drained["load"], drained["later"]
            missing = want - after.bodies
            assert not missing, f"{len(missing)} acknowledged messages lost, e.g. {min(missing)!r}"
            assert in_flight <= after.bodies
            assert later <= on_time.bodies
            for b, when, _ in after.received + on_time.received:
                if b in deferred:
                    sent, delay = deferred[b]
                    # Kept its deadline across the restart (nsqd delivers it at once, #1107).
                    assert when >= sent + delay - 0.05, (b, when - sent)
                    if b in later:  # and on time where no backlog is in front of it
                        assert when <= sent + delay + 1.0, (b, when - sent)
            stop_lmqd(server)
        finally:
            server.terminate()


async def test_kill9_in_durable_mode_never_loses_an_acknowledged_message(
    tmp_path: Path,
) -> None:
    flags = ["--durable", "--mem-queue-size=100", "--sync-timeout=300ms"]
    rng = random.Random()
    seed = rng.randrange(1 << 30)
    rng.seed(seed)
    acked: set[bytes] = set()
    channels = ("a", "b")
    finished: dict[str, set[bytes]] = {c: set() for c in channels}
    """FIN'd before a crash (a FIN the crash swallowed is redelivered: counted by the drain)."""
    kill_moments = []
    with trio.fail_after(60):
        for round_number in range(4):
            server = await start(tmp_path, flags)
            try:
                wires = []
                # Channel b finishes every other message: the rest is in flight at the kill.
                readers = [Reader(), Reader(fin_every=2)]
                for channel in channels:
                    wire = await connect(server)
                    await wire.sub("crash", channel, rdy=100)
                    wires.append(wire)
                publishers = [
                    Publisher(f"r{round_number}p{i}", "crash", acked, rng) for i in range(4)
                ]
                publishers[0].dpub_every = 10
                publishers[0].dpub_delay_ms = 200
                pub_wires = [await connect(server) for _ in publishers]
                stop = trio.Event()
                moment = rng.uniform(0.2, 1.5)
                kill_moments.append(round(moment, 3))
                async with trio.open_nursery() as nursery:
                    for reader, wire in zip(readers, wires, strict=True):
                        nursery.start_soon(reader.run, wire)
                    for publisher, wire in zip(publishers, pub_wires, strict=True):
                        nursery.start_soon(publisher.run, wire, stop)
                    await trio.sleep(moment)
                    await kill9(server)  # mid-publish and mid-consume
                    stop.set()
                for channel, reader in zip(channels, readers, strict=True):
                    finished[channel] |= reader.finished
                for wire in wires + pub_wires:
                    await wire.aclose()
            finally:
                server.terminate()
        assert len(acked) > 100, f"too little traffic to test anything ({len(acked)})"

        server = await start(tmp_path, flags)
        try:
            for channel in channels:
                want = acked - finished[channel]
                reader = await drain(server, "crash", channel, want, limit=15)
                missing = want - reader.bodies
                assert not missing, (
                    f"channel {channel}: {len(missing)} of {len(acked)} acknowledged messages "
                    f"lost (seed {seed}, kill moments {kill_moments}), e.g. {min(missing)!r}"
                )
            stop_lmqd(server)
        finally:
            server.terminate()


async def test_a_second_lmqd_on_the_same_data_path_exits_1_with_a_clear_error(
    tmp_path: Path,
) -> None:
    with trio.fail_after(25):
        server = await start(tmp_path, [])
        try:
            second = await trio.to_thread.run_sync(
                functools.partial(
                    subprocess.run,
                    lmqd_command(tmp_path),
                    capture_output=True,
                    text=True,
                    timeout=20,
                    cwd=REPO_ROOT,
                )
            )
            assert second.returncode == 1
            last = second.stderr.splitlines()[-1]
            assert re.fullmatch(
                r"\[lmqd\] \S+ \S+ FATAL: failed to start: data path \S+ is in use by another "
                r"lmqd \(lock file \S+lmqd\.lock\)",
                last,
            ), last
            stop_lmqd(server)  # the first one was not disturbed
        finally:
            server.terminate()

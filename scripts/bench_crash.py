"""What a ``kill -9`` of ``lmqd --durable`` delivers again: duplicates, held messages, attempts.

    .venv/bin/python scripts/bench_crash.py [--kills 5] [--messages 20000] [--held 1]
        [--requeues 2] [--settle 5] [--flags ...]

A bounded run on loopback (127.0.0.1, port 0, data in a temporary directory). Each round, on
one data directory, against ``lmqd --durable`` with the default segment size (100 MiB) unless
``--flags`` says otherwise:

1. a *holder* consumer of channel ``c`` (``msg_timeout`` 15 minutes, nsqd's largest) takes
   ``--held`` messages, requeues each ``--requeues`` times (``REQ 0``: it comes back from the
   channel's own store) and then holds it, never answering;
2. a *worker* on ``c`` finishes everything else as it comes, while a publisher MPUBs
   ``--messages`` messages (batches of 100, four in flight, each counted once its ``OK`` came);
3. once the worker has finished them all, ``--settle`` seconds pass (the daemon syncs), then
   ``kill -9``;
4. the daemon starts again on the same directory and a *reader* takes everything ``c`` delivers
   until nothing came for ``--quiet`` seconds, finishing it (it becomes the next round's daemon).

Per kill it reports the **duplicates** (messages finished before the kill and delivered again),
the messages in flight at the kill (held, and the worker's own window) and how long after the
restart the held ones came back, and the deliveries whose ``attempts`` is not what the crash
owes them: one more than the deliveries seen before the kill (``attempts_wrong``). At the end
every acknowledged message must have been finished (``lost``: must be 0). Exit status 1 if
anything was lost or a held message did not come back. Figures: docs/durability.md
("Replays after a crash").
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import trio

from lmqd.protocol import ClientConnection, MessageFrame, Mpub, Rdy, Response, Sub

# The checkout's root on sys.path: the lmqd subprocess helper is shared with the tests.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.support.process import LmqdProcess, start_lmqd

TOPIC = "crash"
CHANNEL = "c"
BATCH = 100
WINDOW = 4
HOLD_TIMEOUT_MS = 15 * 60 * 1000
"""The holder's msg_timeout: nsqd's largest (``--max-msg-timeout``), as a slow consumer asks."""


class Conn:
    """One V2 connection: commands out, frames in (heartbeats answered)."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.codec = ClientConnection()
        self.frames: collections.deque[object] = collections.deque()

    @classmethod
    async def open(cls, address: tuple[str, int], **identify: object) -> Conn:
        conn = cls(await trio.open_tcp_stream(*address))
        await conn.stream.send_all(conn.codec.initial_bytes())
        await conn.stream.send_all(ClientConnection.send({"heartbeat_interval": 5000, **identify}))
        await conn.response()
        return conn

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def frame(self) -> object:
        while not self.frames:
            data = await self.stream.receive_some(256 * 1024)
            if not data:
                raise EOFError("lmqd closed the connection")
            self.codec.receive_data(data)
            for event in self.codec.next_events():
                if isinstance(event, Response) and event.data == b"_heartbeat_":
                    await self.send(b"NOP\n")
                else:
                    self.frames.append(event)
        return self.frames.popleft()

    async def response(self) -> bytes:
        event = await self.frame()
        if not isinstance(event, Response):
            raise RuntimeError(f"expected a response, got {event!r}")
        return event.data

    async def message(self) -> MessageFrame:
        event = await self.frame()
        if not isinstance(event, MessageFrame):
            raise RuntimeError(f"expected a message, got {event!r}")
        return event

    async def sub(self, rdy: int) -> None:
        await self.send(Sub(topic=TOPIC, channel=CHANNEL).encode())
        if await self.response() != b"OK":
            raise RuntimeError("SUB refused")
        await self.send(Rdy(count=rdy).encode())

    async def aclose(self) -> None:
        await self.stream.aclose()


class Run:
    def __init__(self, args: argparse.Namespace, data: Path) -> None:
        self.args = args
        self.data = data
        self.acked: set[bytes] = set()
        self.finished: set[bytes] = set()
        """Finished (FIN sent well before a kill, or by a reader after a restart)."""
        self.kills: list[dict[str, float]] = []

    def start(self) -> LmqdProcess:
        return start_lmqd(self.data, ["--durable", *self.args.flags], http=False)

    async def publish(self, address: tuple[str, int], bodies: list[bytes]) -> None:
        conn = await Conn.open(address)
        pending: collections.deque[list[bytes]] = collections.deque()
        todo = [bodies[i : i + BATCH] for i in range(0, len(bodies), BATCH)]
        todo.reverse()
        while todo or pending:
            while todo and len(pending) < WINDOW:
                batch = todo.pop()
                await conn.send(Mpub(topic=TOPIC, bodies=batch).encode())
                pending.append(batch)
            if await conn.response() != b"OK":
                raise RuntimeError("MPUB refused")
            self.acked.update(pending.popleft())
        await conn.aclose()

    async def round(self, number: int, daemon: LmqdProcess) -> LmqdProcess:
        args = self.args
        address = daemon.tcp_host_port
        seen: collections.Counter[bytes] = collections.Counter()
        """Deliveries of each message in this round, before the kill."""
        holder = await Conn.open(address, msg_timeout=HOLD_TIMEOUT_MS)
        await holder.sub(args.held)
        held_bodies = [b"r%d-held-%d" % (number, i) for i in range(args.held)]
        await self.publish(address, held_bodies)
        held: set[bytes] = set()
        while len(held) < args.held:
            m = await holder.message()
            seen[m.body] += 1
            if seen[m.body] <= args.requeues:
                await holder.send(b"REQ " + m.id + b" 0\n")
            else:
                held.add(m.body)
        worker = await Conn.open(address)
        await worker.sub(200)
        bodies = [b"r%d-%d" % (number, i) for i in range(args.messages)]
        worker_finished: set[bytes] = set()
        all_finished = trio.Event()

        async def work() -> None:
            while True:
                m = await worker.message()
                seen[m.body] += 1
                await worker.send(b"FIN " + m.id + b"\n")
                worker_finished.add(m.body)
                if len(worker_finished) == len(bodies):
                    all_finished.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(work)
            await self.publish(address, bodies)
            with trio.fail_after(120):
                await all_finished.wait()
            await trio.sleep(args.settle)  # the FINs reach the daemon and its syncs run
            nursery.cancel_scope.cancel()
        in_flight = len(held)
        daemon.process.kill()
        await trio.to_thread.run_sync(daemon.process.wait)
        daemon.terminate()
        for conn in (holder, worker):
            await conn.aclose()
        self.finished |= worker_finished

        restarted_at = time.monotonic()
        daemon = await trio.to_thread.run_sync(self.start)
        started_s = time.monotonic() - restarted_at
        reader = await Conn.open(daemon.tcp_host_port)
        await reader.sub(1000)
        again: collections.Counter[bytes] = collections.Counter()
        wrong_attempts = 0
        held_back_s: list[float] = []
        while True:
            with trio.move_on_after(args.quiet) as idle:
                m = await reader.message()
            if idle.cancelled_caught:
                break
            await reader.send(b"FIN " + m.id + b"\n")
            again[m.body] += 1
            if again[m.body] == 1 and m.body in seen and m.attempts != seen[m.body] + 1:
                wrong_attempts += 1
            if m.body in held and again[m.body] == 1:
                held_back_s.append(time.monotonic() - restarted_at)
            self.finished.add(m.body)
        await reader.aclose()
        duplicates = sum(1 for body in again if body in worker_finished)
        missing_held = held - again.keys()
        self.kills.append(
            {
                "kill": number + 1,
                "duplicates": duplicates,
                "in_flight_at_kill": in_flight,
                "held_back": len(held) - len(missing_held),
                "held_back_after_s": round(max(held_back_s, default=-1.0), 2),
                "restart_s": round(started_s, 2),
                "attempts_wrong": wrong_attempts,
                "redelivered": sum(again.values()),
            }
        )
        print(json.dumps(self.kills[-1]), flush=True)
        return daemon

    async def main(self) -> dict[str, float]:
        daemon = await trio.to_thread.run_sync(self.start)
        try:
            for number in range(self.args.kills):
                daemon = await self.round(number, daemon)
        finally:
            daemon.terminate()
        duplicates = [k["duplicates"] for k in self.kills]
        return {
            "acknowledged": len(self.acked),
            "lost": len(self.acked - self.finished),
            "kills": len(self.kills),
            "duplicates_per_kill_median": statistics.median(duplicates),
            "duplicates_per_kill_max": max(duplicates),
            "duplicates_total": sum(duplicates),
            "held_not_back": sum(k["in_flight_at_kill"] - k["held_back"] for k in self.kills),
            "held_back_after_s_max": max(k["held_back_after_s"] for k in self.kills),
            "attempts_wrong": sum(k["attempts_wrong"] for k in self.kills),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=5, help="rounds, each ending in kill -9")
    parser.add_argument("--messages", type=int, default=20_000, help="published per round")
    parser.add_argument("--held", type=int, default=1, help="messages held per round")
    parser.add_argument(
        "--requeues", type=int, default=2, help="REQs of each held message before holding it"
    )
    parser.add_argument(
        "--settle", type=float, default=5.0,
        help="seconds before each kill (two --sync-timeout: what was finished is on disk)",
    )  # fmt: skip
    parser.add_argument("--quiet", type=float, default=3.0, help="a restart's drain ends idle")
    parser.add_argument(
        "--flags", nargs="*", default=[], help="more lmqd flags (e.g. --max-bytes-per-file=1048576)"
    )
    parser.add_argument("--dir", default=None, help="where the data directory goes")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="lmq-crash-", dir=args.dir) as data:
        report = trio.run(Run(args, Path(data)).main)
    print(json.dumps(report, indent=2))
    sys.exit(1 if report["lost"] or report["held_not_back"] else 0)


if __name__ == "__main__":
    main()

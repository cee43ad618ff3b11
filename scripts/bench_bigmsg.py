"""Big messages to a consumer that never reads: the daemon's memory and other clients' latency.

    .venv/bin/python scripts/bench_bigmsg.py [--messages 300] [--size 1048576] [--rdy 300]
        [--mem-queue-size 16] [--probe-rate 200] [--hold 5] [--no-attack] [--lmqd-flag=...]

Starts an ``lmqd`` subprocess (127.0.0.1, port 0, a temporary data directory) and, in a second
process, the attack: a consumer subscribes with RDY 0 (its channel keeps every message), the
attacker publishes ``--messages`` x ``--size`` (MPUBs within ``--max-body-size``), then the
consumer sends RDY ``--rdy`` and never reads again, so one delivery round could take the whole
window. Beside it, from the first second to the end, a probe client publishes a small message
``--probe-rate`` times a second on another topic and its subscriber measures each one's latency
(publish to receipt, both in this process). The daemon's resident memory is sampled every
50 ms (``VmRSS``) and its peak read at the end (``VmHWM``).

Prints the daemon's RSS at start, its peak and at the end, and the probe's p50 / p99 / max
latency before the attack and while it runs (with how many probes were lost). ``--no-attack``
runs the probe alone (the baseline).

``--mem-queue-size`` defaults to 16: the topic's memory tail is counted in messages (nsqd's
flag), and 10,000 1 MiB messages would be 10 GB by design; what this measures is what the
connections and channels hold. Loopback only; bounded by ``--hold`` and the timeouts.
"""

from __future__ import annotations

import argparse
import multiprocessing
import multiprocessing.process
import multiprocessing.synchronize
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

# The checkout's root on sys.path: the lmqd subprocess helper is shared with the tests.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.support.process import LmqdProcess, start_lmqd, stop_lmqd
from tests.support.rawbytes import (
    FRAME_MESSAGE,
    ConnectionClosed,
    NsqSocket,
    decode_message,
    fin,
    mpub,
    pub,
    rdy,
)

MiB = 1024 * 1024
SAMPLE_S = 0.05  # RSS sampling period: short next to the attack's few seconds
MAX_BODY = 5 * MiB  # lmqd's default --max-body-size: MPUBs are cut to fit it
ARM_TIMEOUT_S = 60.0  # publishing 300 MiB on loopback takes a few seconds


def attack(
    address: str, messages: int, size: int, ready: int, armed: multiprocessing.synchronize.Event
) -> None:
    """The attacker (a child process): a consumer that never reads, and its publisher; sets
    ``armed`` once everything is published and the RDY sent."""
    stuck = NsqSocket(address, rcvbuf=4096, timeout=60)
    stuck.subscribe("big", "stuck", ready=0)
    publisher = NsqSocket(address, timeout=60)
    per_mpub = max(1, (MAX_BODY - 4) // (size + 4))
    body = b"a" * size
    sent = 0
    while sent < messages:
        n = min(per_mpub, messages - sent)
        publisher.send(mpub("big", [body] * n))
        publisher.expect_response(timeout=60)
        sent += n
    stuck.send(rdy(ready))  # and never read again
    armed.set()
    time.sleep(3600)  # held open until the parent ends this process


class Probe:
    """A small PUB every 1/rate seconds on topic ``probe``; its subscriber times each one."""

    def __init__(self, address: str, rate: float) -> None:
        self.rate = rate
        self.publisher = NsqSocket(address, timeout=10)
        self.consumer = NsqSocket(address, timeout=10)
        self.consumer.subscribe("probe", "c", ready=100)
        self.sent: dict[int, float] = {}
        self.latencies: list[tuple[float, float]] = []  # (sent at, latency s)
        self.stop = threading.Event()
        self.errors: list[BaseException] = []

    def publish(self) -> None:
        seq = 0
        period = 1.0 / self.rate
        start = time.monotonic()
        try:
            while not self.stop.is_set():
                now = time.monotonic()
                self.sent[seq] = now
                self.publisher.send(pub("probe", b"%d" % seq))
                seq += 1
                delay = start + seq * period - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
        except (ConnectionClosed, OSError) as exc:
            self.errors.append(exc)

    def read_publisher(self) -> None:
        # Its OKs (and heartbeats) are read so that its output never backs up.
        while not self.stop.is_set():
            try:
                self.publisher.read_frame(timeout=0.5)
            except TimeoutError:
                continue
            except (ConnectionClosed, OSError) as exc:
                if not self.stop.is_set():
                    self.errors.append(exc)
                return

    def consume(self) -> None:
        while not self.stop.is_set():
            try:
                frame = self.consumer.read_frame(timeout=0.5)
            except TimeoutError:
                continue
            except (ConnectionClosed, OSError) as exc:
                if not self.stop.is_set():
                    self.errors.append(exc)
                return
            if frame.type != FRAME_MESSAGE:
                continue  # heartbeats: a 30 s test never misses two
            received = time.monotonic()
            message = decode_message(frame.data)
            sent = self.sent.get(int(message.body))
            if sent is not None:
                self.latencies.append((sent, received - sent))
            self.consumer.send(fin(message.id))


def percentiles(values: list[float]) -> str:
    if not values:
        return "no probes"
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return (
        f"p50 {statistics.median(ordered) * 1000:7.2f} ms  p99 {p99 * 1000:7.2f} ms  "
        f"max {ordered[-1] * 1000:7.2f} ms  ({len(ordered)} probes)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=300)
    parser.add_argument("--size", type=int, default=MiB)
    parser.add_argument("--rdy", type=int, default=300)
    parser.add_argument("--mem-queue-size", type=int, default=16)
    parser.add_argument("--probe-rate", type=float, default=200.0)
    parser.add_argument("--warmup", type=float, default=1.0, help="Probe alone first (s).")
    parser.add_argument("--hold", type=float, default=5.0,
                        help="Seconds to keep probing after the attack's RDY (s).")
    parser.add_argument("--no-attack", action="store_true", help="The probe alone (baseline).")
    parser.add_argument("--lmqd-flag", action="append", default=[],
                        help="Extra lmqd flag (repeatable), e.g. --lmqd-flag=--durable.")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="lmq-bench-bigmsg-") as data:
        server: LmqdProcess = start_lmqd(
            Path(data), [f"--mem-queue-size={args.mem_queue_size}", *args.lmqd_flag]
        )
        attacker: multiprocessing.process.BaseProcess | None = None
        try:
            start_rss, _ = server.memory_kb()
            probe = Probe(server.tcp_address, args.probe_rate)
            threads = [
                threading.Thread(target=probe.publish, daemon=True),
                threading.Thread(target=probe.read_publisher, daemon=True),
                threading.Thread(target=probe.consume, daemon=True),
            ]
            for thread in threads:
                thread.start()
            peak_sampled = start_rss
            deadline = time.monotonic() + args.warmup
            while time.monotonic() < deadline:
                peak_sampled = max(peak_sampled, server.memory_kb()[0])
                time.sleep(SAMPLE_S)
            attack_from = time.monotonic()
            if not args.no_attack:
                context = multiprocessing.get_context("spawn")
                armed = context.Event()
                attacker = context.Process(
                    target=attack,
                    args=(server.tcp_address, args.messages, args.size, args.rdy, armed),
                    daemon=True,
                )
                attacker.start()
                give_up = time.monotonic() + ARM_TIMEOUT_S
                while not armed.is_set() and time.monotonic() < give_up:
                    peak_sampled = max(peak_sampled, server.memory_kb()[0])
                    time.sleep(SAMPLE_S)
                if not armed.is_set():
                    print(f"bench_bigmsg: the attack took over {ARM_TIMEOUT_S:.0f}s",
                          file=sys.stderr)
            deadline = time.monotonic() + args.hold
            while time.monotonic() < deadline:
                peak_sampled = max(peak_sampled, server.memory_kb()[0])
                time.sleep(SAMPLE_S)
            probe.stop.set()
            for thread in threads:
                thread.join(5)
            end_rss, peak = server.memory_kb()
        finally:
            if attacker is not None:
                attacker.terminate()
                attacker.join(10)
            stop_lmqd(server)

    before = [lat for at, lat in probe.latencies if at < attack_from]
    during = [lat for at, lat in probe.latencies if at >= attack_from]
    lost = len(probe.sent) - len(probe.latencies)
    what = "probe alone" if args.no_attack else (
        f"{args.messages} x {args.size} B to RDY {args.rdy} that never reads"
    )
    print(f"bench_bigmsg: {what}, --mem-queue-size={args.mem_queue_size}")
    print(f"  daemon RSS: start {start_rss / 1024:.0f} MiB, peak {peak / 1024:.0f} MiB "
          f"(sampled {peak_sampled / 1024:.0f}), end {end_rss / 1024:.0f} MiB")
    print(f"  probe before: {percentiles(before)}")
    print(f"  probe during: {percentiles(during)}")
    print(f"  probes lost: {lost}" + (f"; errors: {probe.errors}" if probe.errors else ""))


if __name__ == "__main__":
    main()

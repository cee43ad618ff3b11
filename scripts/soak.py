"""Soak lmqd in ``--durable`` mode under faults, then check that nothing acknowledged was lost.

    .venv/bin/python scripts/soak.py [--duration 60] [--publishers 3] [--restart-every 8]

A bounded run on loopback only (127.0.0.1, fixed free ports so clients find the daemon again after
each restart). For ``--duration`` seconds:

* publisher threads MPUB batches of unique bodies to topic ``soak`` (blocking client); a batch
  counts as *acknowledged* only once its ``OK`` came back; a batch that failed (the daemon was
  being killed) is published again, so it may be stored twice, never lost;
* one consumer thread per verified channel (``a``, ``b``, both created before publishing starts)
  finishes most messages, requeues some (``REQ 0`` and ``REQ`` with a delay) and lets some time
  out (``--msg-timeout`` is short), and records every body it finished. Its requeues are the
  soak's deliberate faults, not a struggling consumer: they do not make it back off (``requeue(...,
  backoff=False)``: the client's default backoff pauses it for seconds at every requeue, and it
  could never drain), and it gives nothing up (``max_attempts=0``: crashes redeliver, and every
  redelivery counts in ``attempts``);
* a chaos thread, every ``--restart-every`` seconds, alternately ``kill -9``s the daemon or sends
  it SIGTERM, and starts it again on the same data directory and ports; between restarts it
  creates and deletes scratch channels and calls the HTTP admin and stats endpoints.

Then publishing stops, the consumers drain (bounded by ``--drain-timeout``), the daemon is stopped
with SIGTERM, and the script prints what was acknowledged, what each channel finished, what was
lost (acknowledged but never finished on a channel: must be 0) and how many deliveries were
duplicates (at-least-once: expected after kill -9). Exit status 1 if anything was lost.
Figures are recorded in docs/durability.md ("Soak").
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import random
import socket
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

# The checkout's root on sys.path: the lmqd subprocess helper is shared with the tests.
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from lmq_client.errors import NSQError  # noqa: E402
from lmq_client.sync import Consumer, Producer  # noqa: E402
from tests.support.process import LmqdProcess  # noqa: E402

TOPIC = "soak"
CHANNELS = ("a", "b")
BATCH = 50
# Client-side waits: long enough for a restart (a few seconds), short enough to notice the end.
CLIENT_TIMEOUT_S = 2.0
RETRY_PAUSE_S = 0.2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Soak:
    def __init__(self, args: argparse.Namespace, data: Path) -> None:
        self.args = args
        self.data = data
        self.tcp = f"127.0.0.1:{free_port()}"
        self.http = f"127.0.0.1:{free_port()}"
        self.stop_publishing = threading.Event()
        self.stop_all = threading.Event()
        self.lock = threading.Lock()
        self.acked: set[bytes] = set()
        self.publish_attempts = 0
        self.publish_failures = 0
        self.finished: dict[str, collections.Counter[bytes]] = {
            c: collections.Counter() for c in CHANNELS
        }
        self.requeued = 0
        self.timed_out_on_purpose = 0
        self.kills = 0
        self.terms = 0
        self.admin_calls = 0
        self.daemon: LmqdProcess | None = None

    # -- the daemon ------------------------------------------------------------------------

    def start(self) -> None:
        flags = [
            f"--tcp-address={self.tcp}",
            f"--http-address={self.http}",
            "--durable",
            f"--msg-timeout={self.args.msg_timeout}s",
        ]
        self.daemon = LmqdProcess(self.data, flags)
        self.daemon.wait_started()

    def stop(self, kill: bool) -> None:
        daemon = self.daemon
        assert daemon is not None
        if kill:
            daemon.process.kill()
            daemon.process.wait(10)
            daemon.terminate()  # collects its output
        else:
            if not daemon.terminate():
                raise SystemExit("lmqd did not exit within its shutdown timeout after SIGTERM")
            if daemon.process.returncode != 0:
                raise SystemExit(f"lmqd exited {daemon.process.returncode} after SIGTERM")
        if "Traceback" in daemon.output():
            raise SystemExit(f"lmqd logged a traceback:\n{daemon.output()}")

    def http_call(self, method: str, path: str) -> None:
        request = urllib.request.Request(f"http://{self.http}{path}", method=method)
        # The daemon may be restarting: admin calls are load, not checks.
        with contextlib.suppress(urllib.error.URLError, OSError):
            urllib.request.urlopen(request, timeout=CLIENT_TIMEOUT_S).read()
        self.admin_calls += 1

    # -- threads ---------------------------------------------------------------------------

    def publisher(self, index: int) -> None:
        seq = 0
        producer: Producer | None = None
        while not self.stop_publishing.is_set():
            bodies = [b"p%d-%d" % (index, seq + i) for i in range(BATCH)]
            while not self.stop_all.is_set():
                try:
                    if producer is None:
                        producer = Producer(self.tcp, connect_timeout=CLIENT_TIMEOUT_S,
                                            response_timeout=CLIENT_TIMEOUT_S)
                    self.publish_attempts += 1
                    producer.mpub(TOPIC, bodies)
                except (OSError, NSQError):
                    self.publish_failures += 1
                    if producer is not None:
                        producer.close()
                    producer = None
                    time.sleep(RETRY_PAUSE_S)
                    continue
                with self.lock:
                    self.acked.update(bodies)
                break
            seq += BATCH
            # Paced so the consumers keep up: the soak is about faults, not throughput.
            self.stop_publishing.wait(self.args.batch_interval)
        if producer is not None:
            producer.close()

    def consumer(self, channel: str) -> None:
        rng = random.Random(channel)
        counts = self.finished[channel]
        while not self.stop_all.is_set():
            try:
                with Consumer(
                    TOPIC, channel, self.tcp, max_in_flight=100, connect_timeout=CLIENT_TIMEOUT_S,
                    max_attempts=0,
                ) as consumer:  # fmt: skip
                    while not self.stop_all.is_set():
                        message = consumer.get(timeout=0.5)
                        if message is None:
                            continue
                        roll = rng.random()
                        # Misbehave only on first deliveries, so that the run converges.
                        if message.attempts == 1 and roll < 0.03:
                            message.requeue(0.0, backoff=False)
                            self.requeued += 1
                        elif message.attempts == 1 and roll < 0.05:
                            message.requeue(0.5, backoff=False)
                            self.requeued += 1
                        elif message.attempts == 1 and roll < 0.06:
                            self.timed_out_on_purpose += 1  # never answered: it times out
                        else:
                            message.finish()
                            with self.lock:
                                counts[message.body] += 1
            except (OSError, NSQError):
                time.sleep(RETRY_PAUSE_S)

    def chaos(self) -> None:
        kill = True
        scratch = 0
        next_restart = time.monotonic() + self.args.restart_every
        while not self.stop_publishing.wait(0.5):
            scratch += 1
            channel = f"&channel=scratch{scratch % 3}"
            self.http_call("POST", f"/channel/create?topic={TOPIC}{channel}")
            self.http_call("GET", "/stats?format=json")
            channel = f"&channel=scratch{(scratch + 1) % 3}"
            self.http_call("POST", f"/channel/delete?topic={TOPIC}{channel}")
            if time.monotonic() >= next_restart:
                self.stop(kill=kill)
                if kill:
                    self.kills += 1
                else:
                    self.terms += 1
                kill = not kill
                self.start()
                next_restart = time.monotonic() + self.args.restart_every

    # -- the run ---------------------------------------------------------------------------

    def run(self) -> dict[str, object]:
        self.start()
        self.http_call("POST", f"/topic/create?topic={TOPIC}")
        for channel in CHANNELS:
            self.http_call("POST", f"/channel/create?topic={TOPIC}&channel={channel}")
        threads = [
            threading.Thread(target=self.publisher, args=(i,), daemon=True)
            for i in range(self.args.publishers)
        ]
        threads += [
            threading.Thread(target=self.consumer, args=(c,), daemon=True) for c in CHANNELS
        ]
        chaos = threading.Thread(target=self.chaos, daemon=True)
        started = time.monotonic()
        for t in threads:
            t.start()
        chaos.start()
        time.sleep(self.args.duration)
        self.stop_publishing.set()
        chaos.join(60)
        publish_seconds = time.monotonic() - started
        drain_deadline = time.monotonic() + self.args.drain_timeout
        while time.monotonic() < drain_deadline:  # bounded by --drain-timeout
            with self.lock:
                done = all(self.acked <= set(self.finished[c]) for c in CHANNELS)
            if done:
                break
            time.sleep(0.5)
        self.stop_all.set()
        for t in threads:
            t.join(10)
        self.stop(kill=False)
        with self.lock:
            acked = set(self.acked)
            report: dict[str, object] = {
                "seconds_publishing": round(publish_seconds, 1),
                "acknowledged": len(acked),
                "publish_attempts": self.publish_attempts,
                "publish_failures": self.publish_failures,
                "kill_9": self.kills,
                "sigterm": self.terms,
                "admin_calls": self.admin_calls,
                "requeued": self.requeued,
                "left_to_time_out": self.timed_out_on_purpose,
            }
            for channel in CHANNELS:
                counts = self.finished[channel]
                report[f"{channel}_finished_unique"] = len(counts)
                report[f"{channel}_lost"] = len(acked - set(counts))
                report[f"{channel}_duplicate_deliveries"] = sum(n - 1 for n in counts.values())
        return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of publishing")
    parser.add_argument("--publishers", type=int, default=3)
    parser.add_argument(
        "--batch-interval", type=float, default=0.05,
        help=f"seconds between a publisher's MPUBs of {BATCH} (0.05: 1,000 msgs/s each)",
    )
    parser.add_argument("--restart-every", type=float, default=8.0, help="seconds between restarts")
    parser.add_argument("--msg-timeout", type=float, default=3.0, help="lmqd --msg-timeout, s")
    parser.add_argument("--drain-timeout", type=float, default=120.0)
    parser.add_argument("--dir", default=None, help="where the data directory goes (default: tmp)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="lmq-soak-", dir=args.dir) as data:
        report = Soak(args, Path(data)).run()
    print(json.dumps(report, indent=2))
    lost = sum(int(report[f"{c}_lost"]) for c in CHANNELS)  # type: ignore[call-overload]
    sys.exit(1 if lost else 0)


if __name__ == "__main__":
    main()

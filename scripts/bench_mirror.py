"""Mirrors (docs/mirrors.md): the copy under NSQ's benchmark load, and the cost of a takeover.

    .venv/bin/python scripts/bench_mirror.py load [--runs 3] [--duration 10] [--size 100]
        [--batch-size 200] [--rdy 2500] [--rate N] [--mirror-flag=--durable ...] [--nsq-bin DIR]
    .venv/bin/python scripts/bench_mirror.py takeover [--runs 3] [--rate 2000]
    .venv/bin/python scripts/bench_mirror.py recovery [--messages 10000000] [--size 100]
        [--runs 3] [--keep DIR]
    .venv/bin/python scripts/bench_mirror.py acks [--runs 3] [--duration 10] [--size 100]
        [--batch-size 200] [--primary-flag=--durable ...] [--mirror-flag=--durable ...]

``load``: NSQ's own benchmark (``bench_writer`` for ``--duration`` seconds, then ``bench_reader``;
with ``--rate``, a paced writer of MPUBs of ``--batch-size`` at that rate instead of
``bench_writer``)
against a primary alone and against a primary followed by a mirror (``--mirror-of``), in turn,
``--runs`` times, on 127.0.0.1 ports from the OS. For each: the primary's CPU per message
(``/proc``, user + system, divided by the messages published and consumed: the difference is
what one mirror costs the primary), and with a mirror its lag, sampled every ``SAMPLE_S`` from
the primary's and the mirror's HTTP APIs while the writer runs (the primary's end minus the
copy's, and the age of the newest message copied while some are missing: p50, p99, max), the
time from the writer's start until the copy is complete, the copy rate
(messages published / that time) and the mirror's CPU per message copied.

``takeover``: an lmqlookupd, a primary registered with it and its mirror; a publisher sends
``--rate`` messages a second to the primary and a consumer that knows only the lookupd (lmq's
blocking ``Consumer``, lookupd polled every second) receives them. Then ``kill -9`` of the
primary and, at once, ``POST /mirror/promote`` to the mirror (what an operator's one command
or a failover script does); the publisher moves to the mirror. Reported: the promotion's
duration, and the time from the kill to the first message the promoted mirror delivered.

``recovery``: shared-storage active/passive (docs/mirrors.md): a ``--durable`` data directory
holding ``--messages`` messages of ``--size`` bytes in one topic with one channel (filled by
``bench_writer``, the daemon then killed with ``kill -9``), and the time a new lmqd on it takes
to listen and to deliver the first message to a consumer, ``--runs`` times (each after a
``kill -9`` of the previous one).

``acks``: what ``--min-insync-mirrors=1`` costs a publisher, against asynchronous replication
(a primary and one mirror both times, in turn, each run fresh): the latency of one ``PUB`` at a
time (``LATENCY_COUNT`` of them, raw socket: p50, p99), the rate of a producer pipelining
``PIPELINE_WINDOW`` ``PUB``s, and of ``bench_writer`` (MPUBs of ``--batch-size``, one per
connection at a time, for ``--duration`` seconds), with the primary's CPU per message.

Prints a line per run and the medians.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from scripts.bench_nsq import nsq_bin, post, run_program
from tests.support.process import BENCH_SHUTDOWN_TIMEOUT_S, DaemonProcess, load_average

SAMPLE_S = 0.2
TOPIC = "sub_bench"


def lmqd(data: Path, *flags: str) -> DaemonProcess:
    daemon = DaemonProcess([sys.executable, "-m", "lmqd", "--tcp-address=127.0.0.1:0",
                            "--http-address=127.0.0.1:0", f"--data-path={data}", *flags])
    daemon.wait_started(120)
    return daemon


def get(http: str, path: str) -> Any:
    with urllib.request.urlopen(f"http://{http}{path}", timeout=30) as response:
        return json.loads(response.read())


def followed(mirror_http: str) -> dict[str, Any] | None:
    topics = get(mirror_http, "/stats?format=json")["mirror"]["topics"]
    return next((t for t in topics if t["topic_name"] == TOPIC), None)


def pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


# -- load ------------------------------------------------------------------------------------------


def run_load(args: argparse.Namespace, bins: Path, with_mirror: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-mirror-", dir=args.dir) as tmp:
        primary = lmqd(Path(tmp) / "p")
        mirror = None
        samples: list[tuple[float, float, int, int]] = []
        """(time, lag_seconds, lag_messages, end_offset) of the mirror's topic."""
        stop = threading.Event()
        try:
            http, tcp = primary.address("HTTP"), primary.address("TCP")
            assert http is not None and tcp is not None
            post(http, f"/topic/create?topic={TOPIC}")
            post(http, f"/channel/create?topic={TOPIC}&channel=ch")
            if with_mirror:
                mirror = lmqd(Path(tmp) / "m", f"--mirror-of={http}", *args.mirror_flag)
                mirror_http = mirror.address("HTTP")
                assert mirror_http is not None
                while followed(mirror_http) is None:
                    time.sleep(0.05)

                def sample() -> None:
                    # The lag as an observer sees it: the primary's end now against the copy's,
                    # and the age of the newest message copied while any is missing.
                    while not stop.is_set():
                        try:
                            end = get(http, f"/topic/offsets?topic={TOPIC}")["end"]
                            t = followed(mirror_http)
                        except OSError:  # stopping: the daemons are gone
                            return
                        if t is not None:
                            copied = t["end_offset"]
                            behind = max(end - copied, 0)
                            age = 0.0
                            if behind and copied:
                                last = get(mirror_http, f"/topic/read?topic={TOPIC}&offset="
                                           f"{copied - 1}&count=1&format=json")["messages"]
                                age = (time.time_ns() - last[0]["timestamp"]) / 1e9 if last else 0
                            samples.append((time.monotonic(), age, behind, copied))
                        time.sleep(SAMPLE_S)

                sampler = threading.Thread(target=sample, daemon=True)
                sampler.start()
            load = load_average()
            common = [f"--nsqd-tcp-address={tcp}", f"--topic={TOPIC}", f"--size={args.size}"]
            duration = f"--runfor={args.duration}s"
            cpu0 = primary.cpu_seconds()
            mcpu0 = mirror.cpu_seconds() if mirror else 0.0
            started = time.monotonic()
            if args.rate:
                published = paced_writer(tcp, args.rate, args.duration, args.size,
                                         args.batch_size)  # fmt: skip
            else:
                published, _ = run_program([str(bins / "bench_writer"), *common,
                                            f"--batch-size={args.batch_size}", duration])
            written = time.monotonic()
            cpu1 = primary.cpu_seconds()
            consumed, _ = run_program([str(bins / "bench_reader"), *common, "--channel=ch",
                                       f"--rdy={args.rdy}", duration])  # fmt: skip
            cpu2 = primary.cpu_seconds()
            result: dict[str, Any] = {
                "mirror": with_mirror, "load": load, "published": published,
                "pub_cpu_us": (cpu1 - cpu0) / published * 1e6,
                "sub_cpu_us": (cpu2 - cpu1) / consumed * 1e6 if consumed else 0.0,
                "published_per_s": published / (written - started),
            }  # fmt: skip
            result["cpu_us"] = result["pub_cpu_us"] + result["sub_cpu_us"]
            if mirror is not None:
                mirror_http = mirror.address("HTTP")
                assert mirror_http is not None
                end = get(http, f"/topic/offsets?topic={TOPIC}")["end"]
                while (t := followed(mirror_http)) is None or t["end_offset"] < end:
                    time.sleep(0.02)
                stop.set()
                complete = min((s[0] for s in samples if s[3] >= end), default=time.monotonic())
                during = [s for s in samples if started <= s[0] <= written]
                result.update(
                    copy_s=complete - started,
                    copy_per_s=end / (complete - started),
                    lag_s_p50=pct([s[1] for s in during], 0.5),
                    lag_s_p99=pct([s[1] for s in during], 0.99),
                    lag_s_max=max((s[1] for s in during), default=0.0),
                    lag_msgs_p50=pct([float(s[2]) for s in during], 0.5),
                    lag_msgs_max=max((s[2] for s in during), default=0),
                    mirror_cpu_us=(mirror.cpu_seconds() - mcpu0) / end * 1e6,
                    gap=t["gap_messages"],
                )
            return result
        finally:
            stop.set()
            if mirror is not None:
                mirror.terminate(BENCH_SHUTDOWN_TIMEOUT_S)
            primary.terminate(BENCH_SHUTDOWN_TIMEOUT_S)


def paced_writer(tcp: str, rate: int, seconds: int, size: int, batch: int) -> float:
    """``bench_writer`` at a given rate: MPUBs of ``batch`` bodies, each sent when it is due;
    the messages published."""
    from lmq_client.sync import Producer

    bodies = [b"x" * size] * batch
    sent = 0
    with Producer(tcp) as producer:
        start = time.monotonic()
        while time.monotonic() - start < seconds:
            due = start + sent / rate
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            producer.mpub(TOPIC, bodies)
            sent += batch
    return float(sent)


def compare(
    runs: int, once: Callable[[bool], dict[str, Any]], short: tuple[str, str],
    long: tuple[str, str],
) -> None:
    """``once(False)`` and ``once(True)`` in turn, ``runs`` times: a line per run (stderr,
    labelled ``short``) and the medians (labelled ``long``)."""
    rows: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
    for i in range(runs):
        for which in (False, True):
            r = once(which)
            rows[which].append(r)
            print(f"run {i + 1} {short[which]:>6}: "
                  + json.dumps({k: round(v, 3) if isinstance(v, float) else v
                                for k, v in r.items()}), file=sys.stderr, flush=True)  # fmt: skip
    for which, done in rows.items():
        keys = [k for k, v in done[0].items() if isinstance(v, int | float)
                and not isinstance(v, bool)]  # fmt: skip
        medians = {k: statistics.median(r[k] for r in done) for k in keys}
        print(long[which] + ": " + ", ".join(f"{k} {v:,.3f}" for k, v in medians.items()))


def load_main(args: argparse.Namespace) -> None:
    bins = nsq_bin(args.nsq_bin)
    compare(args.runs, lambda with_mirror: run_load(args, bins, with_mirror),
            ("alone", "mirror"), ("primary alone", "with one mirror"))  # fmt: skip


# -- takeover --------------------------------------------------------------------------------------


def takeover_once(args: argparse.Namespace) -> dict[str, float]:
    from lmq_client.sync import Consumer, Producer

    with tempfile.TemporaryDirectory(prefix="bench-takeover-", dir=args.dir) as tmp:
        lk = DaemonProcess([sys.executable, "-m", "lmqd.lookupd", "--tcp-address=127.0.0.1:0",
                            "--http-address=127.0.0.1:0", "--broadcast-address=127.0.0.1"])
        lk.wait_started()
        lk_tcp, lk_http = lk.address("TCP"), lk.address("HTTP")
        primary = lmqd(Path(tmp) / "p", f"--lookupd-tcp-address={lk_tcp}",
                       "--broadcast-address=127.0.0.1")
        http = primary.address("HTTP")
        mirror = lmqd(Path(tmp) / "m", f"--mirror-of={http}", f"--lookupd-tcp-address={lk_tcp}",
                      "--broadcast-address=127.0.0.1")
        mirror_http, mirror_tcp = mirror.address("HTTP"), mirror.address("TCP")
        assert mirror_http is not None and mirror_tcp is not None
        received: list[tuple[float, str]] = []
        stop = threading.Event()
        target = [primary.address("TCP")]

        def publish() -> None:
            n = 0
            while not stop.is_set():
                try:
                    with Producer(target[0] or "") as producer:
                        while not stop.is_set():
                            address = target[0]
                            producer.publish(TOPIC, b"%d" % n)
                            n += 1
                            time.sleep(1 / (args.rate or 2000))
                            if target[0] != address:
                                break
                except Exception:
                    time.sleep(0.01)

        def consume() -> None:
            with Consumer(TOPIC, "ch", lookupd_http_addresses=[lk_http or ""], max_in_flight=100,
                          lookupd_poll_interval=1.0) as consumer:  # fmt: skip
                while not stop.is_set():
                    message = consumer.get(timeout=0.1)
                    if message is not None:
                        # Which node delivered it (the blocking client's connection knows).
                        source = getattr(message._conn, "address", "")
                        received.append((time.monotonic(), source))
                        message.finish()

        threads = [threading.Thread(target=f, daemon=True) for f in (publish, consume)]
        try:
            post(http or "", f"/topic/create?topic={TOPIC}")
            post(http or "", f"/channel/create?topic={TOPIC}&channel=ch")
            for thread in threads:
                thread.start()
            time.sleep(5)  # steady: consumer connected, mirror following, positions followed
            before = len(received)
            assert before > 0, "nothing received before the kill"
            killed = time.monotonic()
            primary.process.send_signal(signal.SIGKILL)
            request = urllib.request.Request(f"http://{mirror_http}/mirror/promote",
                                             method="POST", data=b"")  # fmt: skip
            with urllib.request.urlopen(request, timeout=60) as response:
                response.read()
            promoted = time.monotonic()
            target[0] = mirror_tcp
            deadline = killed + 60

            def from_mirror() -> float | None:
                return next((t for t, source in received[before:] if source == mirror_tcp), None)

            while (first := from_mirror()) is None and time.monotonic() < deadline:
                time.sleep(0.005)
            if first is None:
                first = float("nan")
            return {"promote_s": promoted - killed, "first_message_s": first - killed}
        finally:
            stop.set()
            for thread in threads:
                thread.join(10)
            for daemon in (mirror, primary, lk):
                daemon.terminate(BENCH_SHUTDOWN_TIMEOUT_S)


def takeover_main(args: argparse.Namespace) -> None:
    rows = []
    for i in range(args.runs):
        r = takeover_once(args)
        rows.append(r)
        print(f"run {i + 1}: load {load_average()} " + json.dumps({k: round(v, 3)
              for k, v in r.items()}), file=sys.stderr, flush=True)  # fmt: skip
    print("takeover medians: " + ", ".join(
        f"{k} {statistics.median(r[k] for r in rows):.3f}" for k in rows[0]))  # fmt: skip


# -- shared-storage recovery -----------------------------------------------------------------------


def recovery_main(args: argparse.Namespace) -> None:
    from lmq_client.sync import Consumer

    bins = nsq_bin(args.nsq_bin)
    base = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench-recovery-",
                                                                    dir=args.dir))
    data = base / "data"
    try:
        if not (data / "lmqd.dat").exists():
            data.mkdir(parents=True, exist_ok=True)
            daemon = lmqd(data, "--durable")
            http, tcp = daemon.address("HTTP"), daemon.address("TCP")
            assert http is not None and tcp is not None
            post(http, f"/topic/create?topic={TOPIC}")
            post(http, f"/channel/create?topic={TOPIC}&channel=ch")
            filled = 0
            seconds = 10.0
            while filled < args.messages:
                before = filled
                run_program([str(bins / "bench_writer"), f"--nsqd-tcp-address={tcp}",
                             f"--topic={TOPIC}", f"--size={args.size}", "--batch-size=200",
                             f"--runfor={seconds:.2f}s"])  # fmt: skip
                filled = get(http, f"/topic/offsets?topic={TOPIC}")["end"]
                rate = max(filled - before, 1) / seconds
                seconds = min(max((args.messages - filled) / rate, 0.05), 20.0)
                print(f"filled {filled:,}", file=sys.stderr, flush=True)
            daemon.process.send_signal(signal.SIGKILL)
            daemon.terminate()
        size = sum(f.stat().st_size for f in data.iterdir() if f.is_file())
        print(f"data directory: {size / 1e9:.2f} GB", file=sys.stderr)
        rows = []
        for i in range(args.runs):
            started = time.monotonic()
            daemon = DaemonProcess([sys.executable, "-m", "lmqd", "--tcp-address=127.0.0.1:0",
                                    "--http-address=127.0.0.1:0", f"--data-path={data}",
                                    "--durable"])  # fmt: skip
            daemon.wait_started(600)
            listening = time.monotonic()
            tcp = daemon.address("TCP")
            with Consumer(TOPIC, "ch", tcp or "") as consumer:
                message = consumer.get(timeout=600)
                first = time.monotonic()
                assert message is not None
            rows.append({"listen_s": listening - started, "first_message_s": first - started})
            print(f"run {i + 1}: load {load_average()} " + json.dumps({k: round(v, 3)
                  for k, v in rows[-1].items()}), file=sys.stderr, flush=True)  # fmt: skip
            daemon.process.send_signal(signal.SIGKILL)
            daemon.terminate()
        print(f"recovery of {size / 1e9:.2f} GB: " + ", ".join(
            f"{k} {statistics.median(r[k] for r in rows):.3f}" for k in rows[0]))  # fmt: skip
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)


# -- acks ------------------------------------------------------------------------------------------

LATENCY_COUNT = 2000
PIPELINE_WINDOW = 32


def _frames(sock: Any, buffer: bytearray, wanted: int) -> int:
    """Read until ``wanted`` OK frames came (an error frame raises); returns how many."""
    import struct

    got = 0
    while got < wanted:
        while len(buffer) >= 8:
            size, kind = struct.unpack_from(">Ii", buffer)
            if len(buffer) < 4 + size:
                break
            frame = bytes(buffer[8 : 4 + size])
            del buffer[: 4 + size]
            if kind != 0:
                raise RuntimeError(frame.decode())
            if frame == b"OK":
                got += 1
            if got == wanted:
                return got
        data = sock.recv(65536)
        if not data:
            raise RuntimeError("EOF")
        buffer += data
    return got


def pub_latencies(tcp: str, size: int, count: int) -> list[float]:
    """One PUB at a time: each one's time to its OK, seconds."""
    import socket
    import struct

    host, _, port = tcp.rpartition(":")
    body = b"x" * size
    command = b"PUB %s\n" % TOPIC.encode() + struct.pack(">I", size) + body
    out = []
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(b"  V2")
        buffer = bytearray()
        for _ in range(count):
            t0 = time.perf_counter()
            sock.sendall(command)
            _frames(sock, buffer, 1)
            out.append(time.perf_counter() - t0)
    return out


def pipelined_rate(tcp: str, size: int, seconds: float) -> float:
    """A producer keeping ``PIPELINE_WINDOW`` PUBs in flight: messages acknowledged a second."""
    import socket
    import struct

    host, _, port = tcp.rpartition(":")
    command = b"PUB %s\n" % TOPIC.encode() + struct.pack(">I", size) + b"x" * size
    acked = 0
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(b"  V2")
        buffer = bytearray()
        sock.sendall(command * PIPELINE_WINDOW)
        start = time.monotonic()
        while time.monotonic() - start < seconds:
            got = _frames(sock, buffer, 1)
            acked += got
            sock.sendall(command * got)
        elapsed = time.monotonic() - start
        _frames(sock, buffer, PIPELINE_WINDOW)
    return acked / elapsed


def acks_once(args: argparse.Namespace, bins: Path, insync: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-acks-", dir=args.dir) as tmp:
        flags = [*args.primary_flag, *(["--min-insync-mirrors=1"] if insync else [])]
        primary = lmqd(Path(tmp) / "p", *flags)
        mirror = None
        try:
            http, tcp = primary.address("HTTP"), primary.address("TCP")
            assert http is not None and tcp is not None
            post(http, f"/topic/create?topic={TOPIC}")
            mirror = lmqd(Path(tmp) / "m", f"--mirror-of={http}", *args.mirror_flag)
            mirror_http = mirror.address("HTTP")
            assert mirror_http is not None
            while followed(mirror_http) is None:
                time.sleep(0.05)
            load = load_average()
            latencies = pub_latencies(tcp, args.size, LATENCY_COUNT)
            pipelined = pipelined_rate(tcp, args.size, args.duration / 2)
            cpu0 = primary.cpu_seconds()
            published, seconds = run_program([
                str(bins / "bench_writer"), f"--nsqd-tcp-address={tcp}", f"--topic={TOPIC}",
                f"--size={args.size}", f"--batch-size={args.batch_size}",
                f"--runfor={args.duration}s",
            ])  # fmt: skip
            cpu1 = primary.cpu_seconds()
            return {
                "insync": insync, "load": load,
                "pub_p50_ms": pct(latencies, 0.5) * 1e3, "pub_p99_ms": pct(latencies, 0.99) * 1e3,
                "pipelined_per_s": pipelined, "bench_writer_per_s": published / seconds,
                "pub_cpu_us": (cpu1 - cpu0) / published * 1e6,
            }  # fmt: skip
        finally:
            if mirror is not None:
                mirror.terminate(BENCH_SHUTDOWN_TIMEOUT_S)
            primary.terminate(BENCH_SHUTDOWN_TIMEOUT_S)


def acks_main(args: argparse.Namespace) -> None:
    bins = nsq_bin(args.nsq_bin)
    compare(args.runs, lambda insync: acks_once(args, bins, insync), ("async", "insync"),
            ("asynchronous", "--min-insync-mirrors=1"))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("load", "takeover", "recovery", "acks"))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--duration", type=int, default=10)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=200)
    parser.add_argument("--rdy", type=int, default=2500)
    parser.add_argument("--rate", type=int, default=0,
                        help="messages per second (load: instead of bench_writer's all it can; "
                             "takeover: default 2000)")
    parser.add_argument("--messages", type=int, default=10_000_000, help="recovery")
    parser.add_argument("--keep", default=None, help="recovery: keep (and reuse) this directory")
    parser.add_argument("--mirror-flag", action="append", default=[])
    parser.add_argument("--primary-flag", action="append", default=[], help="acks")
    parser.add_argument("--nsq-bin", default=None)
    parser.add_argument("--dir", default=None)
    args = parser.parse_args()
    mains = {"load": load_main, "takeover": takeover_main, "recovery": recovery_main,
             "acks": acks_main}  # fmt: skip
    mains[args.what](args)


if __name__ == "__main__":
    main()

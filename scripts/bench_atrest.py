"""At rest: bytes on disk and daemon CPU per message for ~200-byte JSON bodies, with each
compression codec and with encryption, against none (issue 27's measurements).

    .venv/bin/python scripts/bench_atrest.py [--messages 200000] [--runs 3] [--durable]
        [--settings none,zstd,lz4,snappy,gzip,aes,zstd+aes,chacha] [--dir DIR]

NSQ's benchmark, with JSON bodies instead of bench_writer's zero bytes: for each setting a
fresh ``lmqd`` (``python -m lmqd``, 127.0.0.1, port 0, data in a temporary directory under
``--dir``) with its default ``--mem-queue-size`` (10,000: the messages past it go to the topic's
log, as bench_writer makes them) or ``--durable``; a **writer** phase (bench_writer's shape: one
connection, ``MPUB`` of 200 messages, the next once ``OK`` came back) publishes ``--messages``
bodies, then a **reader** phase (bench_reader's: ``SUB`` with ``RDY 2500``, every message FIN'd)
takes them all. The bodies are event records as JSON, ~200 bytes each, every one different
(ids, users, timestamps, paths drawn from a seeded RNG), what the issue's "event data" is.

Per setting it prints: **bytes on disk per message** (the topic's ``stored_bytes`` in /stats
after the writer phase, over ``--messages``: a backlog that passes the memory tail puts every
message in the log, the tail's too; ``logical_bytes`` likewise for the same records plain), and
the **daemon's CPU per
message** (``/proc/<pid>/stat`` user+system, writer and reader phases together, over
``--messages``), median of ``--runs`` runs, and the difference against ``none``. The settings:
``none``; a codec (``zstd``, ``zstd:1``, ``lz4``, ``snappy``, ``gzip``) as ``--compression``;
``aes`` / ``chacha`` an ``--encryption-key-file`` (with ``--encryption-cipher``);
``CODEC+aes`` both.

CPU figures are the daemon's only (the clients run in this process), but a shared 2-core machine
still moves them: compare medians of several runs taken back to back, as the table does.

``--codec-only`` measures the sealing step alone, in this process, without a daemon: each
setting's ``Sealer.seal`` and ``Opener.open`` over the same bodies framed as a topic log frames
them (batches of ``--batch`` messages), best of ``--runs`` timings, in µs per message: what the
at-rest layer adds to writing and reading a message, with no scheduler or disk in the figure.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
from pathlib import Path

import trio

from lmqd.protocol import ClientConnection, Fin, Mpub, Rdy, Sub
from lmqd.protocol.frames import Error, MessageFrame, Response

# The checkout's root on sys.path: the lmqd subprocess helper is shared with the tests.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.support.process import BENCH_SHUTDOWN_TIMEOUT_S, LmqdProcess, start_lmqd

TOPIC = "bench_atrest"
BATCH = 200
"""bench_writer's default --batch-size."""
MEM_QUEUE = 10_000
"""lmqd's (and nsqd's) default --mem-queue-size (not passed: the default is what is measured)."""
PAGES = ["/", "/cart", "/checkout", "/search", "/items/%d", "/account", "/help"]
EVENTS = ["page_view", "click", "add_to_cart", "purchase", "search", "login"]


def json_bodies(count: int, seed: int = 27) -> list[bytes]:
    """``count`` different event records, ~200 bytes of JSON each."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        page = rng.choice(PAGES)
        doc = {
            "event_id": f"{rng.getrandbits(64):016x}",
            "type": rng.choice(EVENTS),
            "user_id": rng.randrange(1, 500_000),
            "session": f"{rng.getrandbits(32):08x}",
            "ts": 1_764_300_000_000 + i * 7 + rng.randrange(5),
            "page": page % rng.randrange(1, 5000) if "%d" in page else page,
            "ua": rng.choice(["Mozilla/5.0 (X11; Linux x86_64)", "Mozilla/5.0 (iPhone)"]),
            "amount": round(rng.uniform(1, 300), 2) if rng.random() < 0.2 else None,
            "geo": rng.choice(["DE", "FR", "US", "GB", "JP", "BR", "IN"]),
            "ref": rng.choice(["search", "email", "direct", "ads"]) + f"-{rng.randrange(100)}",
        }
        out.append(json.dumps(doc, separators=(",", ":")).encode())
    return out


def flags_for(setting: str, key_path: Path) -> list[str]:
    flags = []
    for part in setting.split("+"):
        if part == "none":
            continue
        if part in ("aes", "chacha"):
            flags.append(f"--encryption-key-file={key_path}")
            if part == "chacha":
                flags.append("--encryption-cipher=chacha20-poly1305")
        else:
            flags.append(f"--compression={part}")
    return flags


async def _receive(stream: trio.SocketStream, codec: ClientConnection) -> list[object]:
    data = await stream.receive_some(1 << 20)
    if not data:
        raise RuntimeError("lmqd closed the connection")
    codec.receive_data(data)
    return list(codec.next_events())


async def write_phase(address: tuple[str, int], bodies: list[bytes]) -> None:
    stream = await trio.open_tcp_stream(*address)
    codec = ClientConnection()
    async with stream:
        await stream.send_all(codec.initial_bytes())
        for k in range(0, len(bodies), BATCH):
            await stream.send_all(Mpub(topic=TOPIC, bodies=bodies[k : k + BATCH]).encode())
            while True:
                events = await _receive(stream, codec)
                if any(isinstance(e, Error) for e in events):
                    raise RuntimeError(f"MPUB refused: {events}")
                if any(isinstance(e, Response) and e.data == b"OK" for e in events):
                    break


async def read_phase(address: tuple[str, int], count: int) -> None:
    stream = await trio.open_tcp_stream(*address)
    codec = ClientConnection()
    async with stream:
        await stream.send_all(codec.initial_bytes())
        await stream.send_all(Sub(topic=TOPIC, channel="ch").encode() + Rdy(count=2500).encode())
        got = 0
        while got < count:
            fins = []
            for event in await _receive(stream, codec):
                if isinstance(event, MessageFrame):
                    fins.append(Fin(id=event.id).encode())
                elif isinstance(event, Error):
                    raise RuntimeError(f"error while reading: {event}")
            got += len(fins)
            if fins:
                await stream.send_all(b"".join(fins))


def topic_stats(daemon: LmqdProcess) -> dict[str, int]:
    import urllib.request

    url = f"http://{daemon.http_address}/stats?format=json&topic={TOPIC}"
    with urllib.request.urlopen(url, timeout=30) as answer:
        doc = json.load(answer)
    (topic,) = [t for t in doc["topics"] if t["topic_name"] == TOPIC]
    return {"stored": topic["stored_bytes"], "logical": topic["logical_bytes"]}


def one_run(
    setting: str, bodies: list[bytes], base: Path, durable: bool
) -> tuple[float, float, float]:
    """(stored bytes per logged message, logical bytes per logged message, daemon CPU µs per
    message) of one fresh daemon."""
    with tempfile.TemporaryDirectory(dir=base) as tmp:
        key = Path(tmp) / "key"
        key.write_bytes(os.urandom(32))
        key.chmod(0o600)
        flags = flags_for(setting, key) + (["--durable"] if durable else [])
        daemon = start_lmqd(Path(tmp) / "data", flags)
        try:
            host, _, port = daemon.tcp_address.rpartition(":")
            address = (host, int(port))
            # Create the channel first so that the writer's messages are kept for it.
            trio.run(_create, daemon)
            cpu0 = daemon.cpu_seconds()
            trio.run(write_phase, address, bodies)
            sizes = topic_stats(daemon)
            trio.run(read_phase, address, len(bodies))
            cpu = daemon.cpu_seconds() - cpu0
        finally:
            daemon.terminate(BENCH_SHUTDOWN_TIMEOUT_S)
    # Every message is in the log: past the memory tail directly, and the full tail too (the
    # overflow rule, lmqd/engine/stream.py), so the log's bytes are over all of them.
    return sizes["stored"] / len(bodies), sizes["logical"] / len(bodies), cpu / len(bodies) * 1e6


async def _create(daemon: LmqdProcess) -> None:
    import urllib.request

    def post(path: str) -> None:
        request = urllib.request.Request(f"http://{daemon.http_address}{path}", method="POST")
        urllib.request.urlopen(request, timeout=30).close()

    await trio.to_thread.run_sync(post, f"/topic/create?topic={TOPIC}")
    await trio.to_thread.run_sync(post, f"/channel/create?topic={TOPIC}&channel=ch")


def codec_only(bodies: list[bytes], settings: list[str], batch: int, runs: int) -> None:
    """Time ``Sealer.seal`` and ``Opener.open`` per message for each setting (see above)."""
    import time

    from lmqd.message import Message
    from lmqd.storage.atrest.compression import Compression
    from lmqd.storage.atrest.keys import AES_256_GCM, CHACHA20_POLY1305, Keyring
    from lmqd.storage.atrest.seal import Opener, Sealer
    from lmqd.storage.encoder import encode_entries, frame_batches

    stamp = 1_764_300_000_000_000_000
    messages = [Message(b"%016x" % i, b, stamp, 0) for i, b in enumerate(bodies)]
    records = []
    for k in range(0, len(messages), batch):
        entries, chunk = encode_entries(messages[k : k + batch], lambda t: 0)
        size = sum(38 + len(b) for b in chunk)
        records.append(bytes(frame_batches(entries, chunk, [(0, len(chunk), size)], k)))
    plain = sum(map(len, records))
    print(f"{len(bodies)} JSON bodies in {len(records)} batches of {batch}; best of {runs}")
    print(f"{'setting':>10} | {'B/msg':>6} | {'seal µs/msg':>11} | {'open µs/msg':>11}")
    for setting in settings:
        compression, keyring = Compression(), None
        for part in setting.split("+"):
            if part in ("aes", "chacha"):
                cipher = AES_256_GCM if part == "aes" else CHACHA20_POLY1305
                keyring = Keyring([os.urandom(32)], cipher)
            elif part != "none":
                compression = Compression.parse(part)
        if not compression.enabled and keyring is None:
            print(f"{setting:>10} | {plain / len(bodies):6.1f} | {'-':>11} | {'-':>11}")
            continue
        sealer, opener = Sealer(compression, keyring), Opener(keyring)
        seal_best = open_best = float("inf")
        for _ in range(runs):
            started = time.perf_counter()
            sealed = [sealer.seal(r) for r in records]
            seal_best = min(seal_best, time.perf_counter() - started)
            started = time.perf_counter()
            for r in sealed:
                opener.open(r, 0, len(r))
            open_best = min(open_best, time.perf_counter() - started)
        stored = sum(map(len, sealed)) / len(bodies)
        print(f"{setting:>10} | {stored:6.1f} | {seal_best / len(bodies) * 1e6:11.3f} | "
              f"{open_best / len(bodies) * 1e6:11.3f}")  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--durable", action="store_true")
    parser.add_argument("--settings", default="none,zstd,lz4,snappy,gzip,aes,zstd+aes,chacha")
    parser.add_argument("--dir", default=tempfile.gettempdir())
    parser.add_argument("--codec-only", action="store_true")
    parser.add_argument("--batch", type=int, default=BATCH)
    args = parser.parse_args(argv)
    bodies = json_bodies(args.messages)
    if args.codec_only:
        codec_only(bodies, args.settings.split(","), args.batch, args.runs)
        return
    mean = sum(map(len, bodies)) / len(bodies)
    mode = "--durable" if args.durable else f"default mode, --mem-queue-size={MEM_QUEUE}"
    print(f"{args.messages} JSON bodies of {mean:.0f} bytes on average; {mode}; "
          f"{args.runs} run(s) per setting, interleaved")  # fmt: skip
    settings = args.settings.split(",")
    results: dict[str, list[tuple[float, float, float]]] = {s: [] for s in settings}
    for run in range(args.runs):
        for setting in settings:  # interleaved: a neighbour's load spreads over all settings
            stored, logical, cpu = one_run(setting, bodies, Path(args.dir), args.durable)
            results[setting].append((stored, logical, cpu))
            print(f"  run {run + 1} {setting:>10}: {stored:7.1f} B/msg stored "
                  f"({logical:.1f} plain), {cpu:6.2f} µs CPU/msg", flush=True)  # fmt: skip
    print(f"\n{'setting':>10} | {'B/msg stored':>12} | {'x none':>6} | {'µs CPU/msg':>10} | "
          f"{'vs none':>8}")  # fmt: skip
    base_bytes = statistics.median(r[0] for r in results.get("none", results[settings[0]]))
    base_cpu = statistics.median(r[2] for r in results.get("none", results[settings[0]]))
    for setting in settings:
        stored = statistics.median(r[0] for r in results[setting])
        cpu = statistics.median(r[2] for r in results[setting])
        print(f"{setting:>10} | {stored:12.1f} | {stored / base_bytes:6.2f} | {cpu:10.2f} | "
              f"{cpu - base_cpu:+8.2f}")  # fmt: skip


if __name__ == "__main__":
    main()

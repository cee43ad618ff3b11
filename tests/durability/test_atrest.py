"""At rest (issue 27) on a real ``lmqd`` subprocess: compression per topic, encryption per
daemon, restarts, replay, key rotation, refusals that touch nothing, damage counted.

Rules for this module (STYLE.md):
- The daemon is ``python -m lmqd`` (``tests.support.process``) on 127.0.0.1 port 0 with its data
  in ``tmp_path``; clients speak V2 (``tests.support.wire.Wire``) and HTTP
  (``tests.support.http``) from trio tasks.
- Key files are made by the tests (``os.urandom``, mode 0600 unless a test says otherwise).
- Bodies are ~200-byte JSON documents that carry a marker the data-directory search looks for.
- Bounded: each test well under 30 s; every wait has a ``fail_after``/``move_on_after``.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest
import trio

from lmqd.message import decode_read_frames
from lmqd.protocol import Error, MessageFrame
from tests.support.http import http
from tests.support.process import LmqdProcess, lmqd_command, stop_lmqd
from tests.support.wire import ConnectionClosed, Wire

from .test_crash import OK, connect, kill9, start

SECRET = "Ada-Lovelace-4111"
"""In every body: no file of the data directory may hold it while encryption is on."""


def bodies(count: int, start: int = 0) -> list[bytes]:
    docs = [
        {"id": i, "user": f"user-{i % 97}", "name": SECRET, "event": "page_view",
         "path": f"/items/{i % 13}", "ts": 1700000000 + i, "ok": True}
        for i in range(start, start + count)
    ]  # fmt: skip
    return [json.dumps(doc).encode() for doc in docs]


def key_file(path: Path, mode: int = 0o600) -> Path:
    path.write_bytes(os.urandom(32))
    path.chmod(mode)
    return path


def snapshot(directory: Path) -> dict[str, str]:
    """Every file under ``directory`` -> the hash of its bytes and its mode."""
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        + oct(p.stat().st_mode)
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def segment_files(directory: Path, topic: str) -> list[Path]:
    return sorted(directory.glob(f"{topic}.lmq.*.dat"))


def holds(directory: Path, needle: bytes) -> list[str]:
    return [p.name for p in directory.iterdir() if p.is_file() and needle in p.read_bytes()]


def address(server: LmqdProcess) -> tuple[str, int]:
    assert server.http_address is not None
    host, _, port = server.http_address.rpartition(":")
    return host, int(port)


async def get_json(server: LmqdProcess, target: str) -> dict[str, object]:
    result = await http(address(server), "GET", target)
    assert result.status == 200, result.body
    doc: dict[str, object] = json.loads(result.body)
    return doc


async def topic_stats(server: LmqdProcess, topic: str) -> dict[str, object]:
    doc = await get_json(server, f"/stats?format=json&topic={topic}")
    (found,) = [t for t in doc["topics"] if t["topic_name"] == topic]  # type: ignore[attr-defined]
    return found  # type: ignore[no-any-return]


async def publish(server: LmqdProcess, topic: str, items: list[bytes]) -> None:
    wire = await connect(server)
    try:
        for k in range(0, len(items), 100):
            assert await wire.mpub(topic, items[k : k + 100]) == OK
    finally:
        await wire.aclose()


async def consume_all(server: LmqdProcess, topic: str, channel: str, want: list[bytes]) -> None:
    """Consume (and FIN) ``topic/channel`` until every body of ``want`` was delivered."""
    missing = set(want)
    wire = await connect(server)
    try:
        await wire.sub(topic, channel, rdy=500)
        with trio.move_on_after(15):
            while missing:
                event = await wire.frame()
                assert not isinstance(event, Error), event
                if isinstance(event, MessageFrame):
                    missing.discard(event.body)
                    await wire.fin(event.id)
    finally:
        await wire.aclose()
    assert not missing, f"{len(missing)} of {len(set(want))} missing, e.g. {min(missing)!r}"


def run_refused(data: Path, flags: list[str]) -> subprocess.CompletedProcess[str]:
    """``lmqd`` with ``flags`` on ``data``: it must refuse to start."""
    done = subprocess.run(
        lmqd_command(data, flags), capture_output=True, text=True, timeout=30, check=False
    )
    assert done.returncode == 1, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr + done.stdout
    return done


# -- compression per topic ----------------------------------------------------------------------


@pytest.mark.parametrize("codec", ["zstd", "zstd:9", "lz4", "snappy", "gzip"])
async def test_topic_compression_policy_round_trip_with_restart(tmp_path: Path, codec: str) -> None:
    flags = ["--mem-queue-size=0"]
    items = bodies(2000)
    with trio.fail_after(30):
        server = await start(tmp_path, flags)
        try:
            target = "/topic/policy?topic=zipped"
            created = await http(address(server), "POST", "/topic/create?topic=zipped")
            assert created.status == 200
            policy_doc = json.dumps({"compression": codec}).encode()
            got = await http(address(server), "POST", target, policy_doc)
            assert got.status == 200, got.body
            await publish(server, "zipped", items[:1000])
            stats = await topic_stats(server, "zipped")
            assert stats["stored_bytes"] < 0.6 * stats["logical_bytes"], stats  # type: ignore[operator]
            metrics = (await http(address(server), "GET", "/metrics")).body.decode()
            assert 'lmqd_queue_logical_bytes{channel="",topic="zipped"}' in metrics
            stop_lmqd(server)
            server = await start(tmp_path, flags)
            policy = await get_json(server, target)
            assert policy["compression"] == codec.replace(":3", "")
            await publish(server, "zipped", items[1000:])
            # Tools read what was published (decode_read_frames: the offset-framed bodies).
            read = await http(address(server), "GET", "/topic/read?topic=zipped&offset=0&count=3")
            assert [m.body for _, m in decode_read_frames(read.body)] == items[:3]
            await consume_all(server, "zipped", "c", items)
            stop_lmqd(server)
        finally:
            server.terminate()
    # The restart opened the log sealing as its policy says: it went on in its segment.
    assert len(segment_files(tmp_path, "zipped")) == 1


async def test_a_topic_switched_none_zstd_none_reads_every_segment(tmp_path: Path) -> None:
    flags = ["--mem-queue-size=0", "--max-bytes-per-file=20000"]
    items = bodies(900)
    with trio.fail_after(30):
        server = await start(tmp_path, flags)
        try:
            target = "/topic/policy?topic=mixed"
            await http(address(server), "POST", "/topic/create?topic=mixed")
            await publish(server, "mixed", items[:300])
            await http(address(server), "POST", target, b'{"compression": "zstd"}')
            await publish(server, "mixed", items[300:600])
            await http(address(server), "POST", target, b'{"compression": "none"}')
            await publish(server, "mixed", items[600:])
            stop_lmqd(server)
            server = await start(tmp_path, flags)
            # Replay from earliest on a new channel: every segment, plain and compressed.
            create = "/channel/create?topic=mixed&channel=replay&from=earliest"
            assert (await http(address(server), "POST", create)).status == 200
            await consume_all(server, "mixed", "replay", items)
            stop_lmqd(server)
        finally:
            server.terminate()


# -- encryption ---------------------------------------------------------------------------------


async def test_encrypted_daemon_round_trip_replay_and_nothing_readable(tmp_path: Path) -> None:
    data = tmp_path / "data"
    key = key_file(tmp_path / "key")
    flags = ["--mem-queue-size=10", f"--encryption-key-file={key}", "--compression=zstd"]
    items = bodies(500)
    with trio.fail_after(30):
        server = await start(data, flags)
        try:
            await publish(server, "secret", items)
            # A channel's deferred store: a DPUB an hour out, written there at shutdown.
            wire = await connect(server)
            await wire.sub("secret", "c")
            deferred = b'{"deferred":"' + SECRET.encode() + b'"}'
            assert await wire.dpub("secret", 3_600_000, deferred) == OK
            await wire.aclose()
            stop_lmqd(server)
            assert holds(data, SECRET.encode()) == []
            assert holds(data, b"page_view") == []
            server = await start(data, flags)
            await consume_all(server, "secret", "c", items)
            create = "/channel/create?topic=secret&channel=again&from=earliest"
            assert (await http(address(server), "POST", create)).status == 200
            await consume_all(server, "secret", "again", items)
            stop_lmqd(server)
            assert holds(data, SECRET.encode()) == []
        finally:
            server.terminate()


async def test_key_rotation_and_rewrite(tmp_path: Path) -> None:
    data = tmp_path / "data"
    old, new = key_file(tmp_path / "old"), key_file(tmp_path / "new")
    items = bodies(400)
    with trio.fail_after(40):
        server = await start(data, ["--mem-queue-size=0", f"--encryption-key-file={old}"])
        try:
            await publish(server, "rot", items[:200])
            stop_lmqd(server)
            # The new key first: it seals from now on, the old one still opens.
            both = [f"--encryption-key-file={new}", f"--encryption-key-file={old}"]
            server = await start(data, ["--mem-queue-size=0", *both])
            await publish(server, "rot", items[200:])
            stop_lmqd(server)
            # Without the old key the old segments cannot be read: refused, untouched.
            before = snapshot(data)
            done = run_refused(data, [f"--encryption-key-file={new}"])
            assert "no key file given has" in done.stderr and "rot.lmq.0" in done.stderr
            assert snapshot(data) == before
            # Rewrite under the new key, then the old key is no longer needed.
            server = await start(data, ["--mem-queue-size=0", "--rewrite-at-rest", *both])
            assert "AT-REST: rewrote" in server.output()
            stop_lmqd(server)
            server = await start(data, ["--mem-queue-size=0", f"--encryption-key-file={new}"])
            await consume_all(server, "rot", "c", items)
            stats = await topic_stats(server, "rot")
            assert stats["storage_damage"]["regions"] == 0  # type: ignore[index]
            stop_lmqd(server)
        finally:
            server.terminate()


async def test_turning_encryption_on_and_rewriting_leaves_nothing_in_clear(tmp_path: Path) -> None:
    data = tmp_path / "data"
    key = key_file(tmp_path / "key")
    items = bodies(300)
    with trio.fail_after(30):
        server = await start(data, ["--mem-queue-size=0"])
        try:
            await publish(server, "late", items)
            stop_lmqd(server)
            assert holds(data, SECRET.encode())
            server = await start(data, ["--rewrite-at-rest", f"--encryption-key-file={key}"])
            stop_lmqd(server)
            assert holds(data, SECRET.encode()) == []
            server = await start(data, [f"--encryption-key-file={key}"])
            await consume_all(server, "late", "c", items)
            stop_lmqd(server)
        finally:
            server.terminate()


# -- refusals -------------------------------------------------------------------------------------


async def test_wrong_or_missing_key_refuses_and_changes_nothing(tmp_path: Path) -> None:
    data = tmp_path / "data"
    key = key_file(tmp_path / "key")
    with trio.fail_after(30):
        server = await start(data, [f"--encryption-key-file={key}"])
        try:
            await publish(server, "t", bodies(50))
            stop_lmqd(server)
        finally:
            server.terminate()
    before = snapshot(data)
    wrong = key_file(tmp_path / "wrong")
    for flags in ([f"--encryption-key-file={wrong}"], []):
        done = run_refused(data, flags)
        lines = [line for line in done.stderr.splitlines() if "failed to start" in line]
        assert len(lines) == 1 and "t.lmq.000000.dat" in lines[0], done.stderr
        assert snapshot(data) == before
    with trio.fail_after(30):
        server = await start(data, [f"--encryption-key-file={key}"])  # the right key: all there
        try:
            await consume_all(server, "t", "c", bodies(50))
            stop_lmqd(server)
        finally:
            server.terminate()


@pytest.mark.parametrize(
    ("content", "mode", "says"),
    [
        (os.urandom(32), 0o644, "lets group or others read"),
        (os.urandom(32), 0o604, "lets group or others read"),
        (os.urandom(16), 0o600, "not a 256-bit key"),
        (None, 0o600, "No such file"),
    ],
    ids=["mode-0644", "mode-0604", "16-bytes", "missing"],
)
def test_bad_key_file_refuses_naming_it_and_changes_nothing(
    tmp_path: Path, content: bytes | None, mode: int, says: str
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "keep.txt").write_text("untouched")
    key = tmp_path / "key"
    if content is not None:
        key.write_bytes(content)
        key.chmod(mode)
    before = snapshot(data)
    done = run_refused(data, [f"--encryption-key-file={key}"])
    out = [line for line in done.stderr.splitlines() if "INFO" not in line and line.strip()]
    assert len(out) == 1 and str(key) in out[0] and says in out[0], done.stderr
    assert snapshot(data) == before


# -- kill -9 and damage ---------------------------------------------------------------------------


async def test_kill9_durable_compressed_and_encrypted_loses_no_acknowledged_message(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    key = key_file(tmp_path / "key")
    flags = [
        "--durable", "--mem-queue-size=0", "--sync-timeout=300ms", "--compression=zstd",
        f"--encryption-key-file={key}",
    ]  # fmt: skip
    acked: list[bytes] = []
    with trio.fail_after(40):
        for round_number in range(3):
            server = await start(data, flags)
            try:
                wire = await connect(server)
                stop = trio.Event()

                async def pump(
                    wire: Wire = wire, rnd: int = round_number, stop: trio.Event = stop
                ) -> None:
                    k = 0
                    while not stop.is_set():
                        batch = bodies(20, start=rnd * 100_000 + k)
                        try:
                            if await wire.mpub("crash", batch) != OK:
                                return
                        except ConnectionClosed:
                            return  # the kill: this batch was not acknowledged
                        acked.extend(batch)
                        k += 20

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(pump)
                    await trio.sleep(0.3 + 0.3 * round_number)
                    await kill9(server)
                    stop.set()
                    nursery.cancel_scope.cancel()
                await wire.aclose()
            finally:
                server.terminate()
        assert len(acked) > 100
        server = await start(data, flags)
        try:
            await consume_all(server, "crash", "c", acked)
            stop_lmqd(server)
        finally:
            server.terminate()
    assert holds(data, SECRET.encode()) == []


async def test_flipped_bit_in_an_encrypted_batch_is_counted_damage(tmp_path: Path) -> None:
    from crc32c import crc32c

    from lmqd.storage.record import SEGMENT_HEADER_SIZE, U32

    data = tmp_path / "data"
    key = key_file(tmp_path / "key")
    flags = ["--mem-queue-size=0", f"--encryption-key-file={key}"]
    items = bodies(300)
    with trio.fail_after(30):
        server = await start(data, flags)
        try:
            for k in range(3):
                await publish(server, "rot", items[k * 100 : (k + 1) * 100])
            stop_lmqd(server)
            segment = data / "rot.lmq.000000.dat"
            raw = bytearray(segment.read_bytes())
            pos = SEGMENT_HEADER_SIZE
            end = pos + 4 + U32.unpack_from(raw, pos)[0]
            raw[end - 30] ^= 0x01  # in the ciphertext; the CRC made to match again
            U32.pack_into(raw, end - 4, crc32c(bytes(raw[pos + 4 : end - 4])))
            segment.write_bytes(bytes(raw))
            server = await start(data, flags)
            damage = (await topic_stats(server, "rot"))["storage_damage"]
            assert damage["regions"] == 1 and damage["lost_messages"] == 100, damage  # type: ignore[index]
            await consume_all(server, "rot", "c", items[100:])
            metrics = (await http(address(server), "GET", "/metrics")).body.decode()
            assert 'lmqd_storage_damaged_regions_total{channel="",topic="rot"} 1.0' in metrics
            stop_lmqd(server)
        finally:
            server.terminate()


async def test_lmqadmin_rewrites_a_stopped_daemons_data_after_a_rotation(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from lmq_client.admin.cli import cli

    data = tmp_path / "data"
    old, new = key_file(tmp_path / "old"), key_file(tmp_path / "new")
    items = bodies(200)
    with trio.fail_after(30):
        server = await start(data, ["--mem-queue-size=0", f"--encryption-key-file={old}"])
        try:
            await publish(server, "rot", items)
            # Running: the data directory is held, lmqadmin refuses.
            args = ["rewrite-at-rest", str(data), "--encryption-key-file", str(new),
                    "--encryption-key-file", str(old)]  # fmt: skip
            held = CliRunner().invoke(cli, args)
            assert held.exit_code == 1 and "stop it first" in held.output, held.output
            stop_lmqd(server)
            missing_key = CliRunner().invoke(cli, args[:4])
            assert missing_key.exit_code == 1 and "no key file given has" in missing_key.output
            done = CliRunner().invoke(cli, [*args, "--json"])
            assert done.exit_code == 0, done.output
            assert json.loads(done.output)["rewritten"] >= 1
            server = await start(data, ["--mem-queue-size=0", f"--encryption-key-file={new}"])
            await consume_all(server, "rot", "c", items)
            stop_lmqd(server)
        finally:
            server.terminate()


@pytest.mark.parametrize(
    ("flag", "says"),
    [
        ("--compression=brotli", "--compression: unknown compression 'brotli'"),
        ("--compression=zstd:40", "--compression: zstd level must be 1..22"),
        ("--encryption-cipher=des", "--encryption-cipher: unknown cipher 'des'"),
    ],
)
def test_bad_at_rest_settings_refuse_in_one_line(tmp_path: Path, flag: str, says: str) -> None:
    done = run_refused(tmp_path / "data", [flag])
    out = [line for line in done.stderr.splitlines() if "INFO" not in line and line.strip()]
    assert len(out) == 1 and says in out[0], done.stderr
    assert not (tmp_path / "data").exists() or not any((tmp_path / "data").iterdir())

"""At rest (issue 27): sealed batches in topic logs and disk queues, read back, mixed, damaged.

Rules for this module: plain storage objects on ``tmp_path`` (no daemon, no trio); keys are
made by the tests (``os.urandom``); damage is made by flipping bytes in the files and checked
through the public counters (``damage``) and what readers return.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from lmqd.message import Message
from lmqd.storage.atrest.compression import Compression, decompress
from lmqd.storage.atrest.keys import (
    CHACHA20_POLY1305,
    KeyFileError,
    Keyring,
    key_id,
    load_key_file,
)
from lmqd.storage.atrest.seal import AtRest, Opener, Sealer, SealError, UnknownSeal
from lmqd.storage.record import (
    LOG_FORMAT_VERSION,
    LOG_READABLE_VERSIONS,
    SEALED_LOG_FORMAT_VERSION,
    SEGMENT_HEADER_SIZE,
    TYPE_OFFSET_BATCH,
    TYPE_SEALED_OFFSET_BATCH,
    U32,
    decode_segment_header,
)

from .log_helpers import entry_keys, expected, open_log, read_all, segment_files
from .storage_helpers import WALL_EPOCH_NS, drain, keys, open_queue, segment_paths

CODECS = ["zstd", "zstd:19", "lz4", "snappy", "gzip", "gzip:1"]


def json_messages(count: int, start: int = 0) -> list[Message]:
    """200-byte-ish JSON bodies, as the issue's measurements use."""
    out = []
    for i in range(start, start + count):
        body = json.dumps(
            {"id": i, "user": f"user-{i % 97}", "event": "page_view", "path": f"/items/{i % 13}",
             "ts": 1700000000 + i, "ok": True, "tags": ["a", "b"]}
        ).encode()  # fmt: skip
        out.append(Message(b"%016x" % i, body, WALL_EPOCH_NS + i * 1000, 0))
    return out


def keyring(n: int = 1, cipher: int = 1) -> Keyring:
    return Keyring([os.urandom(32) for _ in range(n)], cipher)


def versions(path: Path) -> list[int]:
    return [
        decode_segment_header(f.read_bytes()[:SEGMENT_HEADER_SIZE], LOG_READABLE_VERSIONS).version
        for f in segment_files(path)
    ]


# -- the codec step alone ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spelling", ["none", "zstd", "zstd:1", "zstd-22", "lz4", "snappy", "gzip:9"]
)
def test_compression_spellings_round_trip(spelling: str) -> None:
    parsed = Compression.parse(spelling)
    assert Compression.parse(str(parsed)) == parsed


@pytest.mark.parametrize("bad", ["brotli", "zstd:0", "zstd:23", "lz4:3", "gzip:x", ""])
def test_bad_compression_spellings_are_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        Compression.parse(bad)


def test_decompression_must_give_the_stated_length() -> None:
    packed = Compression.parse("zstd").compressor()(b"x" * 1000)
    assert decompress(1, packed, 1000) == b"x" * 1000
    with pytest.raises(ValueError):
        decompress(1, packed, 999)


def test_a_sealed_record_authenticates_its_clear_header() -> None:
    ring = keyring()
    log_messages = json_messages(5)
    from lmqd.storage.encoder import encode_entries, frame_batches

    entries, bodies = encode_entries(log_messages, lambda t: 0)
    total = sum(38 + len(b) for b in bodies)
    plain = frame_batches(entries, bodies, [(0, 5, total)], first_offset=7)
    sealed = bytearray(Sealer(Compression.parse("zstd"), ring).seal(plain))
    assert sealed[4] == TYPE_SEALED_OFFSET_BATCH
    opener = Opener(ring)
    opened = opener.open(sealed, 0, len(sealed))
    assert opened[4:-4] == bytes(plain[4:-4]) and opened[4] == TYPE_OFFSET_BATCH
    # The first offset is in clear but authenticated: changing it fails authentication.
    sealed[17] ^= 1
    with pytest.raises(SealError, match="authentication"):
        opener.open(sealed, 0, len(sealed))
    # A key id no key has is a wrong setting, not damage.
    with pytest.raises(UnknownSeal):
        Opener(keyring()).open(bytes(sealed), 0, len(sealed))
    with pytest.raises(UnknownSeal):
        Opener(None).check(bytes(sealed), 0)


def test_nonces_never_repeat_within_a_keyring() -> None:
    ring = keyring()
    nonces = {ring.next_nonce() for _ in range(10000)}
    assert len(nonces) == 10000
    assert len({keyring().next_nonce() for _ in range(100)}) == 100  # other prefixes


# -- key files -----------------------------------------------------------------------------------


def test_key_files_raw_hex_base64(tmp_path: Path) -> None:
    import base64

    key = os.urandom(32)
    for name, data in [
        ("raw", key),
        ("hex", key.hex().encode() + b"\n"),
        ("b64", base64.b64encode(key) + b"\n"),
    ]:
        path = tmp_path / name
        path.write_bytes(data)
        path.chmod(0o600)
        assert load_key_file(str(path)) == key
    assert key_id(key) == key_id(key) and key_id(key) != key_id(os.urandom(32))


@pytest.mark.parametrize(
    ("data", "mode", "why"),
    [
        (os.urandom(32), 0o644, "mode 0644"),
        (os.urandom(32), 0o640, "mode 0640"),
        (os.urandom(31), 0o600, "not a 256-bit key"),
        (b"not a key at all", 0o600, "not a 256-bit key"),
    ],
)
def test_bad_key_files_are_refused_naming_the_file(
    tmp_path: Path, data: bytes, mode: int, why: str
) -> None:
    path = tmp_path / "key"
    path.write_bytes(data)
    path.chmod(mode)
    with pytest.raises(KeyFileError, match=why) as info:
        load_key_file(str(path))
    assert str(path) in str(info.value)
    with pytest.raises(KeyFileError, match="No such file"):
        load_key_file(str(tmp_path / "missing"))


# -- topic logs ----------------------------------------------------------------------------------


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("encrypt", [False, True])
def test_log_round_trip_every_codec_with_restart(tmp_path: Path, codec: str, encrypt: bool) -> None:
    at_rest = AtRest(keyring() if encrypt else None)
    msgs = json_messages(3000)
    log = open_log(tmp_path, at_rest=at_rest, compression=Compression.parse(codec))
    log.create_cursor("c", "earliest")
    log.append_many(msgs[:1000])
    log.append_many(msgs[1000:2000], cache=False)
    for m in msgs[2000:]:
        log.append_many([m])
    assert log.bytes_on_disk < log.logical_bytes
    assert log.read_range(1500, 3) == [(1500 + i, m) for i, m in enumerate(msgs[1500:1503])] or (
        entry_keys(log.read_range(1500, 3)) == expected(1500, msgs[1500:1503])
    )
    log.close()
    assert set(versions(tmp_path)) == {SEALED_LOG_FORMAT_VERSION}
    log = open_log(tmp_path, at_rest=at_rest, compression=Compression.parse(codec))
    cursor = log.cursor("c")
    assert cursor is not None
    assert entry_keys(read_all(cursor)) == expected(0, msgs)
    assert log.offset_for_time(WALL_EPOCH_NS + 1234 * 1000) == 1234
    assert entry_keys(log.read_range(2500, 2)) == expected(2500, msgs[2500:2502])
    assert log.damage.corrupt_count == 0
    log.close()


def test_pushed_offsets_and_extensions_are_found_in_sealed_batches(tmp_path: Path) -> None:
    """What start-up reads without making messages (deferred times, priorities, dedup ids)
    comes out of sealed batches too."""
    from lmqd.message_ext import MessageExt

    msgs = json_messages(100)
    for i in (3, 50):
        msgs[i].deliver_at = 5000.0
    msgs[70].ext = MessageExt(priority=7, dedup_id=b"dedup-70")
    at_rest = AtRest(keyring(), Compression.parse("zstd"))
    log = open_log(tmp_path, at_rest=at_rest, recover_ids=10)
    log.append_many(msgs)
    assert log.pushed_offsets(0, 100) == [3, 50, 70]
    log.close()
    log = open_log(tmp_path, at_rest=at_rest, recover_ids=10)
    assert log.pushed_offsets(0, 100) == [3, 50, 70]
    assert [dedup for _, dedup in log.take_recovered_ids()] == [b"dedup-70"]
    got = dict(log.read_range(0, 100))
    assert got[70].ext is not None and got[70].ext.priority == 7
    log.close()


def test_log_mixes_plain_and_sealed_segments(tmp_path: Path) -> None:
    """A topic switched from none to zstd and back: every segment stays readable."""
    msgs = json_messages(300)
    log = open_log(tmp_path)
    log.create_cursor("c", "earliest")
    log.append_many(msgs[:100])
    log.compression = Compression.parse("zstd")
    log.append_many(msgs[100:200])
    log.compression = Compression.parse("none")
    log.append_many(msgs[200:])
    assert entry_keys(log.read_range(0, end_offset=300)) == expected(0, msgs)
    log.close()
    # none -> zstd started a sealed segment (an old build leaves it alone); back to none kept
    # appending plain records to it.
    assert versions(tmp_path) == [LOG_FORMAT_VERSION, SEALED_LOG_FORMAT_VERSION]
    for compression in (None, Compression.parse("lz4")):
        log = open_log(tmp_path, compression=compression)
        cursor = log.cursor("c")
        assert cursor is not None
        assert entry_keys(read_all(cursor)) == expected(0, msgs)
        log.close()


def test_log_key_rotation_old_segments_stay_readable(tmp_path: Path) -> None:
    old, new = os.urandom(32), os.urandom(32)
    msgs = json_messages(200)
    log = open_log(tmp_path, at_rest=AtRest(Keyring([old])))
    log.create_cursor("c", "earliest")
    log.append_many(msgs[:100])
    log.close()
    # The new key first (it seals), the old one after (it still opens).
    log = open_log(tmp_path, at_rest=AtRest(Keyring([new, old], CHACHA20_POLY1305)))
    log.append_many(msgs[100:])
    cursor = log.cursor("c")
    assert cursor is not None
    assert entry_keys(read_all(cursor)) == expected(0, msgs)
    log.close()


def _flip_in_payload(path: Path, record_type: int) -> None:
    """Flip one bit inside the first record of ``record_type`` and fix its CRC, so that only
    authentication or decompression can find it."""
    from crc32c import crc32c

    data = bytearray(path.read_bytes())
    pos = SEGMENT_HEADER_SIZE
    while data[pos + 4] != record_type:
        pos += 4 + U32.unpack_from(data, pos)[0]
    end = pos + 4 + U32.unpack_from(data, pos)[0]
    data[end - 20] ^= 0x10
    U32.pack_into(data, end - 4, crc32c(bytes(data[pos + 4 : end - 4])))
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("encrypt", [False, True])
def test_flipped_bits_in_a_sealed_batch_are_damage(tmp_path: Path, encrypt: bool) -> None:
    at_rest = AtRest(keyring() if encrypt else None)
    msgs = json_messages(400)
    log = open_log(tmp_path, at_rest=at_rest, compression=Compression.parse("zstd"))
    log.create_cursor("c", "earliest")
    for k in range(4):
        log.append_many(msgs[k * 100 : (k + 1) * 100])
    log.close()
    (first,) = segment_files(tmp_path)
    _flip_in_payload(first, TYPE_SEALED_OFFSET_BATCH)
    log = open_log(tmp_path, at_rest=at_rest, compression=Compression.parse("zstd"))
    assert log.damage.corrupt_count == 1 and log.damage.lost_messages == 100
    cursor = log.cursor("c")
    assert cursor is not None
    assert entry_keys(read_all(cursor)) == expected(100, msgs[100:])
    assert len(list(tmp_path.glob("*.bad-*"))) == 1
    log.close()


def test_a_flip_found_while_reading_is_set_aside(tmp_path: Path) -> None:
    at_rest = AtRest(keyring())
    msgs = json_messages(300)
    log = open_log(tmp_path, at_rest=at_rest, cache_bytes=0)
    log.create_cursor("c", "earliest")
    for k in range(3):
        log.append_many(msgs[k * 100 : (k + 1) * 100])
    (first,) = segment_files(tmp_path)
    _flip_in_payload(first, TYPE_SEALED_OFFSET_BATCH)
    cursor = log.cursor("c")
    assert cursor is not None
    assert entry_keys(read_all(cursor)) == expected(100, msgs[100:])
    assert log.damage.corrupt_count == 1
    log.close()


def test_nothing_readable_is_left_when_encrypted(tmp_path: Path) -> None:
    at_rest = AtRest(keyring())
    secret = b'{"card":"4111-1111-1111-1111","name":"Ada Lovelace"}'
    log = open_log(tmp_path, at_rest=at_rest)
    log.append_many([Message(b"%016x" % i, secret, WALL_EPOCH_NS, 0) for i in range(50)])
    log.close()
    q = open_queue(tmp_path, at_rest=at_rest)
    q.put_many([Message(b"%016x" % i, secret, WALL_EPOCH_NS, 0) for i in range(50)])
    q.close()
    for path in tmp_path.iterdir():
        data = path.read_bytes()
        assert b"4111" not in data and b"Lovelace" not in data, path


def test_the_start_up_check_refuses_what_it_cannot_open_and_reads_only(tmp_path: Path) -> None:
    """A key not given, no key, a codec this build does not know: refused, naming the file; a
    damaged batch is left to recovery (not refused)."""
    from crc32c import crc32c

    from lmqd.storage.atrest.check import AtRestRefused, check_data_dir

    key = os.urandom(32)
    log = open_log(tmp_path, at_rest=AtRest(Keyring([key])))
    log.append_many(json_messages(50))
    log.close()
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert check_data_dir(str(tmp_path), Opener(Keyring([key]))) == 1
    for opener in (Opener(keyring()), Opener(None)):
        with pytest.raises(AtRestRefused, match=r"t\.lmq\.000000\.dat: batch at offset 32"):
            check_data_dir(str(tmp_path), opener)
    # A codec byte this build does not know (the CRC made to match): refused too.
    (segment,) = segment_files(tmp_path)
    data = bytearray(segment.read_bytes())
    end = SEGMENT_HEADER_SIZE + 4 + U32.unpack_from(data, SEGMENT_HEADER_SIZE)[0]
    data[SEGMENT_HEADER_SIZE + 5] = 0x07 | (data[SEGMENT_HEADER_SIZE + 5] & 0x30)
    U32.pack_into(data, end - 4, crc32c(bytes(data[SEGMENT_HEADER_SIZE + 4 : end - 4])))
    segment.write_bytes(bytes(data))
    with pytest.raises(AtRestRefused, match="unknown at-rest codec byte"):
        check_data_dir(str(tmp_path), Opener(Keyring([key])))
    # A bad CRC is damage, not a wrong setting: recovery's business.
    data[end - 1] ^= 0xFF
    segment.write_bytes(bytes(data))
    check_data_dir(str(tmp_path), Opener(None))
    before[segment.name] = bytes(data)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


# -- disk queues ---------------------------------------------------------------------------------


@pytest.mark.parametrize("codec", ["none", "zstd", "lz4"])
@pytest.mark.parametrize("ack_mode", [False, True])
def test_queue_round_trip_sealed_with_restart(tmp_path: Path, codec: str, ack_mode: bool) -> None:
    at_rest = AtRest(keyring(), Compression.parse(codec))
    msgs = json_messages(500)
    q = open_queue(tmp_path, at_rest=at_rest, ack_mode=ack_mode, max_bytes_per_file=16 * 1024)
    for k in range(5):
        q.put_many(msgs[k * 100 : (k + 1) * 100])
    first = q.read_many(50)
    assert keys(first) == keys(msgs[:50])
    if ack_mode:
        q.ack_many([m.token for m in first])  # type: ignore[attr-defined]
    assert [m.body for m in q.peek(3)] == [m.body for m in msgs[50:53]]
    q.close()
    q = open_queue(tmp_path, at_rest=at_rest, ack_mode=ack_mode, max_bytes_per_file=16 * 1024)
    assert keys(drain(q)) == keys(msgs[50:])
    assert (q.logical_bytes > q.bytes_on_disk) == (codec != "none")  # encryption alone adds
    q.close()
    assert all(b"page_view" not in p.read_bytes() for p in segment_paths(tmp_path))


def test_rewrite_seals_a_queue_and_maps_its_positions(tmp_path: Path) -> None:
    """A disk queue written in clear and partly read, rewritten under a key: it resumes exactly
    where it was (its positions file mapped to the new file), nothing in clear is left, and a
    second rewrite finds nothing to do."""
    from lmqd.storage.atrest.rewrite import rewrite_data_dir

    msgs = json_messages(300)
    q = open_queue(tmp_path, max_bytes_per_file=16 * 1024)
    for k in range(3):
        q.put_many(msgs[k * 100 : (k + 1) * 100])
    assert keys(q.read_many(130)) == keys(msgs[:130])
    q.close()
    at_rest = AtRest(keyring(), Compression.parse("lz4"))
    report = rewrite_data_dir(str(tmp_path), at_rest)
    assert report.rewritten == report.checked > 0 and report.skipped == 0
    assert all(b"page_view" not in p.read_bytes() for p in segment_paths(tmp_path))
    q = open_queue(tmp_path, at_rest=at_rest, max_bytes_per_file=16 * 1024)
    assert q.damage.corrupt_count == 0 and not q.damage.rebuilt_positions
    assert keys(drain(q)) == keys(msgs[130:])
    q.close()
    assert rewrite_data_dir(str(tmp_path), at_rest).rewritten == 0


def test_rewrite_maps_an_acknowledging_queues_delivered_position(tmp_path: Path) -> None:
    """A channel's own store (acknowledgement mode) read past what it acknowledged persists how
    far it had delivered; rewritten under a key, the messages delivered before still count one
    more attempt on reopening, and the ones never delivered do not."""
    from lmqd.storage.atrest.rewrite import rewrite_data_dir

    msgs = json_messages(300)
    q = open_queue(tmp_path, ack_mode=True, max_bytes_per_file=16 * 1024)
    for k in range(30):
        q.put_many(msgs[k * 10 : (k + 1) * 10])
    read = q.read_many(135)
    q.ack_many([m.token for m in read[:50]])  # type: ignore[attr-defined]
    q.close()
    at_rest = AtRest(keyring(), Compression.parse("zstd"))
    report = rewrite_data_dir(str(tmp_path), at_rest)
    assert report.rewritten == report.checked > 0
    q = open_queue(tmp_path, at_rest=at_rest, ack_mode=True, max_bytes_per_file=16 * 1024)
    assert q.damage.corrupt_count == 0 and not q.damage.rebuilt_positions
    again = drain(q)
    assert [m.id for m in again] == [m.id for m in msgs[50:]]
    assert [m.attempts for m in again[:85]] == [1] * 85
    assert [m.attempts for m in again[85:]] == [0] * 165
    q.close()


def test_rewrite_leaves_a_damaged_segment_for_recovery(tmp_path: Path) -> None:
    from lmqd.storage.atrest.rewrite import rewrite_data_dir

    log = open_log(tmp_path)
    log.create_cursor("c", "earliest")
    log.append_many(json_messages(100))
    log.close()
    (segment,) = segment_files(tmp_path)
    data = bytearray(segment.read_bytes())
    data[SEGMENT_HEADER_SIZE + 100] ^= 0xFF
    segment.write_bytes(bytes(data))
    report = rewrite_data_dir(str(tmp_path), AtRest(keyring()))
    assert (report.rewritten, report.skipped) == (0, 1)
    assert segment.read_bytes() == bytes(data)

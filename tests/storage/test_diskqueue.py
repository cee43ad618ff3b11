"""DiskQueue behaviour through its public interface: FIFO, rolling, sync jobs, ack mode.

Real files under ``tmp_path``; no trio (the storage layer is synchronous). Where a test checks
*which* files were fsynced it wraps ``os.fsync`` in a recording spy that still calls the real one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lmqd.engine.backend import BackendError
from lmqd.message import Message
from lmqd.message_ext import MessageExt
from lmqd.storage import (
    AnchoredTimeBase,
    DiskQueue,
    StoredMessage,
    run_sync_jobs,
    token_position,
)
from lmqd.storage.files import name_from_stem, queue_stem
from lmqd.storage.record import (
    BATCH_ENTRY_SIZE,
    BATCH_OF_ONE_OVERHEAD,
    BATCH_OVERHEAD,
    SEGMENT_HEADER_SIZE,
)

from .storage_helpers import (
    FakeTimeBase,
    crash_copy,
    delivered_once,
    drain,
    key,
    keys,
    make_messages,
    open_queue,
    segment_paths,
)


def test_importing_storage_does_not_import_trio() -> None:
    code = "import sys, lmqd.storage; sys.exit('trio' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_fifo_with_all_fields_kept(tmp_path: Path) -> None:
    q = open_queue(tmp_path)
    msgs = make_messages(10)
    q.put_many(msgs[:3])
    q.put_many(msgs[3:])
    assert q.depth == 10
    first = q.read_many(4)
    assert keys(first) == keys(msgs[:4])
    assert q.depth == 6
    assert keys(q.read_many(100)) == keys(msgs[4:])
    assert q.depth == 0
    assert q.read_many(10) == []
    q.close()


def test_read_many_respects_max_count(tmp_path: Path) -> None:
    q = open_queue(tmp_path)
    q.put_many(make_messages(5))
    assert q.read_many(0) == []
    assert len(q.read_many(2)) == 2
    assert q.depth == 3
    q.close()


def test_messages_survive_close_and_reopen(tmp_path: Path) -> None:
    q = open_queue(tmp_path)
    msgs = make_messages(20, body_size=50)
    q.put_many(msgs)
    q.read_many(5)
    q.close()
    q = open_queue(tmp_path)
    assert q.depth == 15
    assert keys(drain(q)) == keys(msgs[5:])
    q.close()


@pytest.mark.parametrize("ack_mode", [False, True])
def test_topic_offsets_are_stored_and_listed_not_given_back(
    tmp_path: Path, ack_mode: bool
) -> None:
    # A channel's copy of a message of its topic's log carries the offset (FLAG_OFFSET), for
    # a primary's mirrors; what read_many gives back has none (for the engine, an offset means
    # "still in the log"), extension and fields intact, from the files and from the cache.
    q = open_queue(tmp_path, ack_mode=ack_mode)
    msgs = make_messages(8, body_size=20)
    ext = MessageExt(priority=3, headers=(("k", "v"),))
    for i, m in enumerate(msgs):
        if i % 2 == 0:
            m.offset = 100 + i
        if i % 3 == 0:
            m.ext = ext
    q.put_many(msgs[:4])
    q.put_many(msgs[4:])
    assert q.stored_offsets() == ({m.id: 100 + i for i, m in enumerate(msgs) if i % 2 == 0}, 4)
    first = q.read_many(3)
    assert keys(first) == keys(msgs[:3])
    assert q.stored_offsets() == ({msgs[4].id: 104, msgs[6].id: 106}, 3)
    assert q.stored_offsets(read_too=True)[0] == q.stored_offsets(read_too=False)[0] | {
        msgs[0].id: 100,
        msgs[2].id: 102,
    }
    q.close()
    q = open_queue(tmp_path, ack_mode=ack_mode)
    # After a reopen: ack mode reads again from the oldest unacknowledged (all of them).
    again = msgs if ack_mode else msgs[3:]
    with_offsets = {m.id: m.offset for m in again if m.offset >= 0}
    assert q.stored_offsets() == (with_offsets, len(again) - len(with_offsets))
    got = drain(q)
    assert [m.id for m in got] == [m.id for m in again]
    assert all(m.offset == -1 for m in got)
    assert [m.ext for m in got] == [m.ext for m in again]
    assert q.stored_offsets() == ({}, 0)
    q.close()


def test_noted_offsets_are_written_for_messages_without_one(tmp_path: Path) -> None:
    # A message read back from a store has no offset; written again, its channel's note does.
    q = open_queue(tmp_path)
    q.noted_offsets = {b"%016x" % 1: 41}
    q.put_many(make_messages(3))
    assert q.stored_offsets() == ({b"%016x" % 1: 41}, 2)
    q.close()


def test_a_batch_of_offsets_only_reads_back_through_the_fast_path(tmp_path: Path) -> None:
    # Every message with an offset and no extension: the blocks are checked in C at once.
    q = open_queue(tmp_path)
    msgs = make_messages(50, body_size=10)
    for k, m in enumerate(msgs):
        m.offset = 1000 + k
    q.put_many(msgs)
    q.close()
    q = open_queue(tmp_path)
    assert q.stored_offsets() == ({m.id: m.offset for m in msgs}, 0)
    got = drain(q)
    assert keys(got) == keys(msgs) and all(m.offset == -1 and m.ext is None for m in got)
    q.close()


def test_closed_queue_refuses_writes(tmp_path: Path) -> None:
    q = open_queue(tmp_path)
    q.close()
    q.close()  # idempotent
    with pytest.raises(BackendError):
        q.put_many(make_messages(1))
    assert q.read_many(5) == []
    assert q.prepare_sync() is None


def test_segments_roll_at_max_bytes_per_file(tmp_path: Path) -> None:
    record = BATCH_OF_ONE_OVERHEAD + 100
    per_file = 4
    q = open_queue(tmp_path, max_bytes_per_file=SEGMENT_HEADER_SIZE + per_file * record)
    msgs = make_messages(10, body_size=100)
    for m in msgs:
        q.put_many([m])
    sizes = [p.stat().st_size for p in segment_paths(tmp_path)]
    assert sizes == [SEGMENT_HEADER_SIZE + 4 * record] * 2 + [SEGMENT_HEADER_SIZE + 2 * record]
    assert keys(drain(q)) == keys(msgs)
    q.close()


def test_one_batch_spanning_several_segments(tmp_path: Path) -> None:
    record = BATCH_OF_ONE_OVERHEAD + 100
    q = open_queue(tmp_path, max_bytes_per_file=SEGMENT_HEADER_SIZE + 3 * record)
    msgs = make_messages(10, body_size=100)
    q.put_many(msgs[:1])
    q.put_many(msgs[1:])
    assert len(segment_paths(tmp_path)) == 4
    q.close()
    q = open_queue(tmp_path, max_bytes_per_file=SEGMENT_HEADER_SIZE + 3 * record)
    assert keys(drain(q)) == keys(msgs)
    q.close()


def test_a_record_larger_than_a_segment_gets_a_segment_of_its_own(tmp_path: Path) -> None:
    q = open_queue(tmp_path, max_bytes_per_file=200)
    small, big, small2 = make_messages(3)
    big.body = b"B" * 1000
    q.put_many([small, big, small2])
    assert len(segment_paths(tmp_path)) == 3
    assert keys(drain(q)) == keys([small, big, small2])
    q.close()


def test_consumed_segments_are_deleted_by_the_next_sync(tmp_path: Path) -> None:
    record = BATCH_OF_ONE_OVERHEAD + 100
    q = open_queue(tmp_path, max_bytes_per_file=SEGMENT_HEADER_SIZE + 2 * record)
    q.put_many(make_messages(6, body_size=100))
    q.sync()
    assert len(segment_paths(tmp_path)) == 3
    q.read_many(3)
    # Read, but no positions file says so yet: a crash now must not find the segment gone.
    assert len(segment_paths(tmp_path)) == 3
    q.sync()
    assert len(segment_paths(tmp_path)) == 2
    q.read_many(3)
    q.sync()
    assert len(segment_paths(tmp_path)) == 1  # the write segment stays
    q.close()


def test_read_ahead_reads_many_records_per_syscall(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    q = open_queue(tmp_path, write_cache=0)
    q.put_many(make_messages(2000, body_size=100))
    calls = []
    real_pread = os.pread

    def counting_pread(fd: int, n: int, offset: int) -> bytes:
        calls.append(n)
        return real_pread(fd, n, offset)

    monkeypatch.setattr(os, "pread", counting_pread)
    assert len(drain(q, batch=100)) == 2000
    # 2000 * 138 bytes = 276,000 bytes: two batch records, one read each.
    assert len(calls) == 2
    q.close()


def test_deferred_deadline_survives_a_restart(tmp_path: Path) -> None:
    # Process 1: trio time 0 = wall W. A message deferred until trio time 500 (W + 500 s).
    q = open_queue(tmp_path, timebase=FakeTimeBase(10**18))
    m = make_messages(1)[0]
    m.deliver_at = 500.0
    plain = make_messages(1, start=1)[0]
    q.put_many([m, plain])
    q.close()
    # Process 2 started 100 s of wall time later: its trio time 0 = W + 100 s.
    q = open_queue(tmp_path, timebase=FakeTimeBase(10**18 + 100 * 10**9))
    got, got_plain = q.read_many(2)
    assert got.deliver_at == pytest.approx(400.0, abs=1e-9)
    assert got_plain.deliver_at == 0.0  # not deferred stays not deferred
    assert got.attempts == m.attempts
    q.close()


def test_anchored_time_base_round_trips() -> None:
    tb = AnchoredTimeBase(12345.5, 1_700_000_000_000_000_000)
    assert tb.to_wall_ns(12345.5) == 1_700_000_000_000_000_000
    assert tb.to_wall_ns(12347.0) == 1_700_000_001_500_000_000
    assert tb.from_wall_ns(1_700_000_001_500_000_000) == pytest.approx(12347.0)
    now = AnchoredTimeBase.now(5.0)
    assert now.trio_time == 5.0


@given(st.from_regex(r"[.a-zA-Z0-9_-]{1,64}(:[.a-zA-Z0-9_-]{1,64})?", fullmatch=True))
def test_file_stems_are_portable_and_reversible(name: str) -> None:
    stem = queue_stem(name)
    assert name_from_stem(stem) == name
    assert ":" not in stem and not stem.startswith(".")
    assert stem == stem.lower() or "%" in stem
    # Distinct names stay distinct even on a case-insensitive file system.
    assert queue_stem(name.swapcase()).lower() != stem.lower() or name.swapcase() == name


def test_queues_named_by_case_and_dots_do_not_share_files(tmp_path: Path) -> None:
    names = ["Orders", "orders", ".hidden", "..", "a:b", "a.b"]
    queues = [open_queue(tmp_path, name) for name in names]
    for i, q in enumerate(queues):
        q.put_many(make_messages(1, start=i))
    for i, q in enumerate(queues):
        assert keys(q.read_many(5)) == keys(make_messages(1, start=i))
        q.close()
    assert not any(p.name.startswith(".") for p in tmp_path.iterdir())


def test_prepare_sync_counts_operations_and_skips_when_clean(tmp_path: Path) -> None:
    q = open_queue(tmp_path)
    assert q.prepare_sync() is None
    q.put_many(make_messages(5))
    q.read_many(2)
    assert q.dirty_count == 7
    assert q.needs_sync(7) and not q.needs_sync(8)
    job = q.prepare_sync()
    assert job is not None and job.operations == 7 and job.name == "t:c"
    assert q.dirty_count == 0
    job.run()
    assert q.prepare_sync() is None
    q.close()


def _positions(path: Path, name: str = "t%3Ac") -> dict[str, object]:
    doc: dict[str, object] = json.loads((path / f"{name}.lmq.pos.json").read_bytes())
    return doc


def test_positions_file_is_written_by_sync(tmp_path: Path) -> None:
    q = open_queue(tmp_path)
    q.put_many(make_messages(3))
    q.read_many(1)
    before = _positions(tmp_path)
    assert before["read"] == [0, SEGMENT_HEADER_SIZE, 0] and before["depth"] == 0
    q.sync()
    after = _positions(tmp_path)
    batch = BATCH_OVERHEAD + 3 * (BATCH_ENTRY_SIZE + len(b"m0."))
    assert after == {
        "version": 2,
        "name": "t:c",
        "depth": 2,
        "read": [0, SEGMENT_HEADER_SIZE, 1],  # the batch at 32, its message 1 next
        "write": [0, SEGMENT_HEADER_SIZE + batch],
    }
    q.close()


@pytest.fixture
def fsync_log(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, object]]]:
    """Records ("fsync", inode) and ("replace", target name) events, calling the real functions."""
    events: list[tuple[str, object]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append(("fsync", os.fstat(fd).st_ino))
        real_fsync(fd)

    def replace(src: str, dst: str) -> None:
        events.append(("replace", os.path.basename(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    yield events


def test_sync_job_fsyncs_data_before_positions_then_the_directory(
    tmp_path: Path, fsync_log: list[tuple[str, object]]
) -> None:
    q = open_queue(tmp_path)
    q.put_many(make_messages(3))
    job = q.prepare_sync()
    assert job is not None
    fsync_log.clear()
    job.run()
    segment_inode = segment_paths(tmp_path)[0].stat().st_ino
    dir_inode = tmp_path.stat().st_ino
    assert fsync_log[0] == ("fsync", segment_inode)
    assert ("replace", "t%3Ac.lmq.pos.json") in fsync_log
    assert fsync_log.index(("replace", "t%3Ac.lmq.pos.json")) < fsync_log.index(
        ("fsync", dir_inode)
    )
    q.close()


def test_group_commit_fsyncs_a_shared_directory_once(
    tmp_path: Path, fsync_log: list[tuple[str, object]]
) -> None:
    queues = [open_queue(tmp_path, f"t{i}") for i in range(3)]
    for q in queues:
        q.put_many(make_messages(2))
    jobs = [q.prepare_sync() for q in queues]
    assert all(j is not None for j in jobs)
    fsync_log.clear()
    assert run_sync_jobs([j for j in jobs if j is not None]) == [None, None, None]
    dir_inode = tmp_path.stat().st_ino
    assert fsync_log.count(("fsync", dir_inode)) == 1
    data_inodes = {p.stat().st_ino for p in tmp_path.glob("t?.lmq.*.dat")}
    assert data_inodes <= {ino for kind, ino in fsync_log if kind == "fsync"}
    for q in queues:
        q.close()


def test_durable_put_then_sync_survives_a_crash(tmp_path: Path) -> None:
    q = open_queue(tmp_path / "live")
    msgs = make_messages(5)
    q.put_many(msgs)
    job = q.prepare_sync()
    assert job is not None
    job.run()
    # Crash right after answering OK: no close, no further sync.
    crashed = crash_copy(tmp_path / "live", tmp_path / "crashed")
    q.close()
    q2 = open_queue(crashed)
    assert keys(drain(q2)) == keys(msgs)
    q2.close()


def test_an_older_job_never_overwrites_newer_positions(tmp_path: Path) -> None:
    q = open_queue(tmp_path)
    q.put_many(make_messages(4))
    old = q.prepare_sync()
    q.read_many(3)
    new = q.prepare_sync()
    assert old is not None and new is not None
    new.run()
    old.run()
    assert _positions(tmp_path)["depth"] == 1
    q.close()


def test_a_job_can_run_after_the_queue_moved_on(tmp_path: Path) -> None:
    q = open_queue(tmp_path, max_bytes_per_file=300)
    q.put_many(make_messages(3, body_size=100))
    job = q.prepare_sync()
    q.put_many(make_messages(3, start=3, body_size=100))  # rolls: the job's fd is a duplicate
    q.close()
    assert job is not None
    job.run()
    q = open_queue(tmp_path, max_bytes_per_file=300)
    assert keys(drain(q)) == keys(make_messages(6, body_size=100))
    q.close()


def test_cancelled_job_releases_its_descriptors(tmp_path: Path) -> None:
    q = open_queue(tmp_path)
    q.put_many(make_messages(1))
    before = len(os.listdir("/proc/self/fd"))
    job = q.prepare_sync()
    assert job is not None
    assert len(os.listdir("/proc/self/fd")) == before + 1
    job.cancel()
    assert len(os.listdir("/proc/self/fd")) == before
    with pytest.raises(OSError):
        job.run()  # a job runs at most once
    q.close()


def test_empty_drops_everything_durably(tmp_path: Path) -> None:
    q = open_queue(tmp_path, max_bytes_per_file=300)
    q.put_many(make_messages(10, body_size=50))
    q.read_many(2)
    q.empty()
    assert q.depth == 0
    assert q.read_many(10) == []
    assert len(segment_paths(tmp_path)) == 1
    q.put_many(make_messages(2, start=50))
    crashed = crash_copy(tmp_path, tmp_path.parent / "crashed")
    q.close()
    q = open_queue(crashed, max_bytes_per_file=300)
    assert keys(drain(q)) == keys(make_messages(2, start=50))
    q.close()


def test_delete_removes_the_files_and_outruns_pending_jobs(tmp_path: Path) -> None:
    other = open_queue(tmp_path, "other")
    q = open_queue(tmp_path)
    q.put_many(make_messages(3))
    job = q.prepare_sync()
    q.delete()
    assert job is not None
    job.run()  # must not recreate the positions file
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["other.lmq.000000.dat", "other.lmq.pos.json"]
    )
    with pytest.raises(BackendError):
        q.put_many(make_messages(1))
    other.close()
    q = open_queue(tmp_path)
    assert q.depth == 0
    q.close()


def test_ack_mode_returns_tokens_and_rereads_unacked_after_reopen(tmp_path: Path) -> None:
    q = open_queue(tmp_path, ack_mode=True)
    msgs = make_messages(6)
    q.put_many(msgs)
    got = q.read_many(4)
    assert all(isinstance(m, StoredMessage) for m in got)
    tokens = [m.token for m in got if isinstance(m, StoredMessage)]
    assert token_position(tokens[0]) == (0, SEGMENT_HEADER_SIZE)
    assert q.ack(tokens[0]) and q.ack(tokens[2])
    assert not q.ack(tokens[0])  # twice
    assert not q.ack(12345)
    assert q.unacked_count == 2
    q.close()
    q = open_queue(tmp_path, ack_mode=True)
    # Everything from the oldest unacknowledged record on: 1 (unacked), 2 (acked after it), 3..
    # (1 to 3 were handed out: one more attempt each).
    assert keys(drain(q)) == keys(delivered_once(msgs[1:4]) + msgs[4:])
    q.close()


def test_ack_mode_persisted_position_follows_the_oldest_unacked(tmp_path: Path) -> None:
    q = open_queue(tmp_path / "live", ack_mode=True)
    msgs = make_messages(5)
    q.put_many(msgs)
    got = [m for m in q.read_many(5) if isinstance(m, StoredMessage)]
    q.ack_many([got[0].token, got[1].token, got[3].token])
    q.sync()
    crashed = crash_copy(tmp_path / "live", tmp_path / "crashed")
    q.close()
    q = open_queue(crashed, ack_mode=True)
    assert keys(drain(q)) == keys(delivered_once(msgs[2:]))
    q.close()


def test_ack_mode_keeps_a_segment_until_all_its_records_are_acked(tmp_path: Path) -> None:
    record = BATCH_OF_ONE_OVERHEAD + 100
    q = open_queue(tmp_path, ack_mode=True, max_bytes_per_file=SEGMENT_HEADER_SIZE + 2 * record)
    q.put_many(make_messages(6, body_size=100))
    got = [m for m in q.read_many(4) if isinstance(m, StoredMessage)]
    q.ack_many(m.token for m in got[1:])
    q.sync()
    assert len(segment_paths(tmp_path)) == 3
    q.ack(got[0].token)
    q.sync()
    assert len(segment_paths(tmp_path)) == 1
    q.close()


def test_plain_mode_returns_plain_messages(tmp_path: Path) -> None:
    q = open_queue(tmp_path)
    q.put_many(make_messages(1))
    (m,) = q.read_many(1)
    assert type(m) is Message
    q.close()


def test_open_requires_a_sane_segment_size(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        DiskQueue("t", tmp_path, timebase=FakeTimeBase(), max_bytes_per_file=10)


def test_stored_message_copy_is_a_plain_message(tmp_path: Path) -> None:
    q = open_queue(tmp_path, ack_mode=True)
    q.put_many(make_messages(1))
    (m,) = q.read_many(1)
    assert key(m.copy()) == key(m)
    q.close()

"""``LmqDaemon(freeze_gc=True)`` (the CLI's daemon): what the restore built is frozen out of the
cyclic collector's reach, and thawed at the first deletion of a restored topic or channel.

Rules for this module (STYLE.md):
- Real ``LmqDaemon``\\ s in the test's nursery on 127.0.0.1 port 0, ``data_path`` in
  ``tmp_path``; topics made and deleted through the broker (what HTTP and TCP call).
- ``gc.freeze`` is process-wide: every test unfreezes in ``finally``, so no other test runs
  with a frozen heap.
- Every test has a ``fail_after`` guard.
"""

from __future__ import annotations

import gc
from pathlib import Path

import trio

from lmqd.options import Options
from lmqd.service import LmqDaemon

TIMEOUT = 20


def options(data_path: Path) -> Options:
    return Options(tcp_address="127.0.0.1:0", http_address="", data_path=str(data_path))


async def run_until_started(nursery: trio.Nursery, daemon: LmqDaemon) -> None:
    await nursery.start(daemon.run)


async def make_stored_topics(data_path: Path) -> None:
    """A first daemon leaves topics ``kept`` and ``gone``, each with channel ``c``."""
    daemon = LmqDaemon(options(data_path))
    async with trio.open_nursery() as nursery:
        await run_until_started(nursery, daemon)
        for name in ("kept", "gone"):
            daemon.broker.get_topic(name).get_channel("c")
        daemon.shutdown()


async def test_restored_objects_are_frozen_until_a_restored_topic_is_deleted(
    tmp_path: Path,
) -> None:
    with trio.fail_after(TIMEOUT):
        await make_stored_topics(tmp_path / "data")
        daemon = LmqDaemon(options(tmp_path / "data"), freeze_gc=True)
        try:
            async with trio.open_nursery() as nursery:
                await run_until_started(nursery, daemon)
                broker = daemon.broker
                assert sorted(broker.topics) == ["gone", "kept"]
                frozen = gc.get_freeze_count()
                assert frozen > 0
                # Created and deleted after the restore: nothing of it was frozen.
                broker.get_topic("new").get_channel("c")
                broker.get_topic("new").delete_channel("c")
                broker.delete_topic("new")
                assert gc.get_freeze_count() == frozen
                # A restored channel deleted: its cycles must become collectable again.
                broker.get_topic("kept").delete_channel("c")
                assert gc.get_freeze_count() == 0
                daemon.shutdown()
        finally:
            gc.unfreeze()


async def test_deleting_a_restored_topic_thaws(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        await make_stored_topics(tmp_path / "data")
        daemon = LmqDaemon(options(tmp_path / "data"), freeze_gc=True)
        try:
            async with trio.open_nursery() as nursery:
                await run_until_started(nursery, daemon)
                assert gc.get_freeze_count() > 0
                daemon.broker.delete_topic("gone")
                assert gc.get_freeze_count() == 0
                daemon.shutdown()
        finally:
            gc.unfreeze()


async def test_in_process_daemons_do_not_freeze(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        await make_stored_topics(tmp_path / "data")
        daemon = LmqDaemon(options(tmp_path / "data"))
        try:
            async with trio.open_nursery() as nursery:
                await run_until_started(nursery, daemon)
                assert sorted(daemon.broker.topics) == ["gone", "kept"]
                assert gc.get_freeze_count() == 0
                daemon.shutdown()
        finally:
            gc.unfreeze()

"""Publishes held for the mirrors (``--min-insync-mirrors``, ``lmqd.engine.insync``): the
engine's side, without a network.

Rules for this module:
- ``Topic`` with a real ``TopicLog`` in ``tmp_path``; a mirror's fetch is what
  ``/mirror/fetch`` does with its hold (``MirrorHold.answered``, ``fetched``, then
  ``InSyncAcks.acknowledged``); time is trio's, on the autojump clock, with exact virtual times.
"""

from __future__ import annotations

from pathlib import Path

import trio

from lmqd.engine.holds import MirrorHold
from lmqd.engine.insync import InSyncAcks, NotEnoughMirrors
from tests.mirror.test_holds import make_topic

TIMEOUT = 5.0


def fetch(insync: InSyncAcks, hold: MirrorHold, offset: int, acked: int | None = None) -> None:
    """One fetch of the mirror of ``hold``: it stored up to ``offset`` (durably up to
    ``acked``), then is answered."""
    now = trio.current_time()
    hold.fetched(offset, offset if acked is None else acked, now, TIMEOUT)
    insync.acknowledged(hold.stream, now)
    hold.answered()


async def test_a_publish_is_refused_without_a_mirror_in_sync(tmp_path: Path) -> None:
    topic = make_topic(tmp_path)
    insync = InSyncAcks(1, TIMEOUT)
    refusal = insync.refusal(topic.stream, trio.current_time(), insync.needed)
    assert isinstance(refusal, NotEnoughMirrors)
    assert str(refusal) == (
        "NOT_ENOUGH_MIRRORS: 0 of --min-insync-mirrors=1 in sync (nothing stored; retry)"
    )
    hold = MirrorHold(topic.stream, "m1")
    # Never fetched:
    assert insync.refusal(topic.stream, trio.current_time(), insync.needed) is not None
    fetch(insync, hold, 0)
    assert insync.refusal(topic.stream, trio.current_time(), insync.needed) is None
    # Two needed, one in sync.
    assert "1 of --min-insync-mirrors=2" in str(InSyncAcks(2, TIMEOUT).refusal(topic.stream, 0, 2))


async def test_the_ok_waits_for_the_mirror_to_store_it(tmp_path: Path) -> None:
    topic = make_topic(tmp_path)
    insync = InSyncAcks(1, TIMEOUT)
    hold = MirrorHold(topic.stream, "m1")
    fetch(insync, hold, 0)
    answers: list[tuple[int, OSError | None]] = []
    for n in (1, 2):
        topic.publish([b"x%d" % n] * n, trio.current_time())
        insync.wait(topic.stream, trio.current_time(),
                    lambda e, n=n: answers.append((n, e)), insync.needed)  # fmt: skip
    assert topic.stream.next_offset == 3 and answers == [] and insync.waiting("t")
    fetch(insync, hold, 1)  # has the first publish only
    assert answers == [(1, None)]
    fetch(insync, hold, 3, acked=2)  # a durable mirror stored both, fsynced one
    assert answers == [(1, None)]
    fetch(insync, hold, 3)
    assert answers == [(1, None), (2, None)] and not insync.waiting("t")
    # Everything stored already: answered at once.
    insync.wait(topic.stream, trio.current_time(), lambda e: answers.append((3, e)), insync.needed)
    assert answers[-1] == (3, None)


async def test_two_mirrors_needed(tmp_path: Path) -> None:
    topic = make_topic(tmp_path)
    insync = InSyncAcks(2, TIMEOUT)
    holds = [MirrorHold(topic.stream, "m1"), MirrorHold(topic.stream, "m2")]
    for hold in holds:
        fetch(insync, hold, 0)
    answers: list[OSError | None] = []
    topic.publish([b"a"], trio.current_time())
    insync.wait(topic.stream, trio.current_time(), answers.append, insync.needed)
    fetch(insync, holds[0], 1)
    assert answers == []
    fetch(insync, holds[1], 1)
    assert answers == [None]


async def test_a_held_ok_fails_after_the_timeout(tmp_path: Path, autojump_clock: object) -> None:
    topic = make_topic(tmp_path)
    insync = InSyncAcks(1, TIMEOUT)
    hold = MirrorHold(topic.stream, "m1")
    fetch(insync, hold, 0)
    answers: list[tuple[float, OSError | None]] = []
    await trio.sleep(1)
    topic.publish([b"a"], trio.current_time())
    insync.wait(topic.stream, 1.0, lambda e: answers.append((trio.current_time(), e)), 1)
    assert insync.next_deadline == 1 + TIMEOUT
    await trio.sleep_until(insync.next_deadline - 0.001)
    assert insync.expire(trio.current_time()) == 0
    await trio.sleep_until(insync.next_deadline)
    assert insync.expire(trio.current_time()) == 1
    [(at, error)] = answers
    assert at == 1 + TIMEOUT
    assert str(error) == ("NOT_ENOUGH_MIRRORS: not stored by 1 mirror(s) within 5s "
                          "(stored here: a retry may duplicate it)")  # fmt: skip
    assert insync.next_deadline == float("inf") and not insync.waiting("t")
    assert (insync.held, insync.refused, insync.timed_out, insync.waiting_count) == (1, 0, 1, 0)


async def test_a_mirror_that_falls_behind_drops_out_of_sync(
    tmp_path: Path, autojump_clock: object
) -> None:
    topic = make_topic(tmp_path)
    insync = InSyncAcks(1, TIMEOUT)
    hold = MirrorHold(topic.stream, "m1")
    assert hold.in_sync_since == float("-inf")
    fetch(insync, hold, 0)
    assert hold.in_sync_since == 0 and hold.in_sync(0, TIMEOUT)
    topic.publish([b"a"] * 100, trio.current_time())
    # It keeps fetching, but never catches up with the end it was last told of (its fetch at
    # t=1 caught up with the end of t=0's answer, the last time).
    for step in range(1, 9):
        await trio.sleep(1)
        fetch(insync, hold, step)
        topic.publish([b"b"] * 10, trio.current_time())
        in_sync = insync.refusal(topic.stream, trio.current_time(), insync.needed) is None
        assert in_sync == (step <= 1 + TIMEOUT), step
        assert hold.in_sync(trio.current_time(), TIMEOUT) == in_sync
    assert insync.refused == 2  # at t=7 and t=8
    assert hold.in_sync_since == 0  # (its last time in sync began at t=0)
    # A fetch that caught up brings it back: in sync since now.
    fetch(insync, hold, topic.stream.next_offset)
    assert insync.refusal(topic.stream, trio.current_time(), insync.needed) is None
    assert hold.in_sync_since == 8
    # A mirror that stops fetching drops out after the timeout.
    await trio.sleep(TIMEOUT)
    assert insync.refusal(topic.stream, trio.current_time(), insync.needed) is None
    topic.publish([b"c"], trio.current_time())
    await trio.sleep(0.5)
    assert insync.refusal(topic.stream, trio.current_time(), insync.needed) is not None


async def test_a_released_hold_does_not_count_as_copied(tmp_path: Path) -> None:
    """``--mirror-max-lag`` moves a lagging hold on; that is no acknowledgement."""
    topic = make_topic(tmp_path)
    insync = InSyncAcks(1, TIMEOUT)
    hold = MirrorHold(topic.stream, "m1")
    fetch(insync, hold, 0)
    answers: list[OSError | None] = []
    topic.publish([b"a"] * 10, trio.current_time())
    insync.wait(topic.stream, trio.current_time(), answers.append, insync.needed)
    assert hold.release(2) == 8
    insync.acknowledged(topic.stream, trio.current_time())
    assert answers == [] and hold.copied == 0


async def test_deleting_the_topic_fails_its_held_publishes(tmp_path: Path) -> None:
    topic = make_topic(tmp_path)
    insync = InSyncAcks(1, TIMEOUT)
    fetch(insync, MirrorHold(topic.stream, "m1"), 0)
    answers: list[OSError | None] = []
    topic.publish([b"a"], trio.current_time())
    insync.wait(topic.stream, trio.current_time(), answers.append, insync.needed)
    insync.drop("t", "topic deleted")
    assert [str(e) for e in answers] == ["NOT_ENOUGH_MIRRORS: topic deleted"]

"""The mirror's bookkeeping (``lmqd.mirror.planner``): missing offsets, gaps, state, lag, backoff.

Rules for this module: pure objects fed plain numbers (``now`` on a virtual clock, wall times
in ns); every rule is a row or a short story with exact values.
"""

from __future__ import annotations

import pytest

from lmqd.mirror.planner import (
    BACKOFF_MAX_S,
    GAP_STATE_S,
    Backoff,
    TopicLink,
    missing_offsets,
)
from lmqd.mirror.wire import Section

WALL0 = 1_750_000_000 * 10**9


def section(next_offset: int, end: int, *, since: int = 0, new_hold: bool = False,
            next_ts: int = 0) -> Section:  # fmt: skip
    return Section("t", next_offset, end, 0, since, next_ts, new_hold, b"")


def entries(*offsets: int) -> list[tuple[int, int]]:
    """The spans an answer with messages at ``offsets`` brought."""
    return [(o, o + 1) for o in offsets]


@pytest.mark.parametrize(
    ("asked", "next_offset", "offsets", "holes"),
    [
        (0, 3, [0, 1, 2], []),
        (0, 5, [1, 2], [(0, 1), (3, 5)]),
        (10, 10, [], []),
        (4, 9, [], [(4, 9)]),
        (0, 6, [0, 3, 5], [(1, 3), (4, 5)]),
    ],
)
def test_missing_offsets(asked: int, next_offset: int, offsets: list[int],
                         holes: list[tuple[int, int]]) -> None:  # fmt: skip
    assert missing_offsets(asked, next_offset, entries(*offsets)) == holes


def test_what_was_finished_before_the_mirror_came_is_not_a_gap() -> None:
    link = TopicLink("t")
    # A first fetch from 0 of a topic whose memory already forgot 0..3 (before the hold).
    missing = link.answered(section(10, 10, since=4, new_hold=True), 0, entries(*range(4, 10)),
                            copy_was_empty=True, now=0.0)  # fmt: skip
    assert (missing.skipped, missing.gap) == (4, 0)
    assert link.state(connected=True, now=1.0) == "following"
    assert link.copied == 6


def test_offsets_gone_after_the_hold_was_made_are_a_gap_for_a_while() -> None:
    link = TopicLink("t")
    link.answered(section(10, 10), 0, entries(*range(10)), copy_was_empty=True, now=0.0)
    # Released past the limit: the primary sends from 25 on when asked from 10.
    missing = link.answered(section(30, 40, since=4), 10, entries(*range(25, 30)),
                            copy_was_empty=False, now=100.0)  # fmt: skip
    assert (missing.skipped, missing.gap, missing.first_gap) == (0, 15, 10)
    assert link.gap == 15
    assert link.state(connected=True, now=100.0 + GAP_STATE_S - 1) == "gap"
    assert link.state(connected=True, now=100.0 + GAP_STATE_S) == "catching_up"
    assert link.state(connected=False, now=101.0) == "disconnected"


def test_a_made_again_hold_on_a_copy_that_had_something_is_a_gap() -> None:
    link = TopicLink("t")
    missing = link.answered(section(20, 20, since=15, new_hold=True), 10,
                            entries(*range(15, 20)), copy_was_empty=False, now=0.0)  # fmt: skip
    assert (missing.skipped, missing.gap) == (0, 5)


def test_lag_in_messages_and_seconds() -> None:
    link = TopicLink("t")
    link.answered(section(100, 400, next_ts=WALL0), 0, entries(*range(100)),
                  copy_was_empty=True, now=0.0)  # fmt: skip
    stats = link.statistics(100, connected=True, now=0.0, wall_ns=WALL0 + 2 * 10**9,
                            last_contact_ns=WALL0 + 2 * 10**9)  # fmt: skip
    assert (stats.state, stats.lag_messages, stats.lag_seconds) == ("catching_up", 300, 2.0)
    link.answered(section(400, 400), 100, entries(*range(100, 400)), copy_was_empty=False,
                  now=1.0)  # fmt: skip
    stats = link.statistics(400, connected=True, now=1.0, wall_ns=WALL0 + 3 * 10**9,
                            last_contact_ns=WALL0 + 3 * 10**9)  # fmt: skip
    assert (stats.state, stats.lag_messages, stats.lag_seconds) == ("following", 0, 0.0)
    # The primary stops answering: at least the time since it last did.
    stats = link.statistics(400, connected=False, now=9.0, wall_ns=WALL0 + 11 * 10**9,
                            last_contact_ns=WALL0 + 3 * 10**9)  # fmt: skip
    assert (stats.state, stats.lag_seconds) == ("disconnected", 8.0)


def test_backoff_doubles_to_its_cap_and_resets() -> None:
    backoff = Backoff()
    delays = [backoff.failed("down") for _ in range(9)]
    assert delays == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, BACKOFF_MAX_S, BACKOFF_MAX_S, BACKOFF_MAX_S]
    assert (backoff.failures, backoff.last_error) == (9, "down")
    backoff.succeeded()
    assert backoff.failed("again") == 0.5

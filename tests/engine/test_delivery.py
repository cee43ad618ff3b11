"""``split_batch`` and ``fit_bytes``: how one delivery round spreads messages over the ready
consumers, in counts and in bytes.

Rules for this module: pure function, seeded ``random.Random``; no trio.
"""

from __future__ import annotations

import random
from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from lmqd.engine.delivery import fit_bytes, split_batch
from lmqd.message import Message


def test_one_consumer_takes_everything() -> None:
    assert split_batch([("a", 10)], 7, 10, random.Random(1)) == [("a", 7)]


def test_enough_messages_fill_every_window() -> None:
    ready = [("a", 3), ("b", 5), ("c", 1)]
    shares = split_batch(list(ready), 9, 9, random.Random(1))
    assert sorted(shares) == sorted(ready)


def test_water_filling_gives_small_windows_all_and_splits_the_rest_evenly() -> None:
    # 10 messages over free rooms 1, 8, 8: the small window fills, the two big ones get 4 and 5.
    shares = dict(split_batch([("a", 1), ("b", 8), ("c", 8)], 10, 17, random.Random(3)))
    assert shares["a"] == 1
    assert sorted((shares["b"], shares["c"])) == [4, 5]


def test_a_single_message_goes_to_a_uniformly_random_consumer() -> None:
    rng = random.Random(7)
    picks: Counter[str] = Counter()
    for _ in range(3000):
        ((who, count),) = split_batch([("a", 5), ("b", 5), ("c", 5)], 1, 15, rng)
        assert count == 1
        picks[who] += 1
    assert set(picks) == {"a", "b", "c"}
    assert all(800 < n < 1200 for n in picks.values()), picks


@given(
    frees=st.lists(st.integers(min_value=1, max_value=50), min_size=1, max_size=12),
    data=st.data(),
    seed=st.integers(0, 2**32),
)
def test_shares_respect_windows_and_sum_to_the_batch(
    frees: list[int], data: st.DataObject, seed: int
) -> None:
    room = sum(frees)
    n = data.draw(st.integers(min_value=1, max_value=room))
    ready = [(i, free) for i, free in enumerate(frees)]
    shares = split_batch(list(ready), n, room, random.Random(seed))
    assert sum(take for _, take in shares) == n
    assert all(take > 0 for _, take in shares)
    assert len({who for who, _ in shares}) == len(shares)
    for who, take in shares:
        assert take <= frees[who]
    # Even: no consumer gets two more than another that still had room for more.
    taken = dict(shares)
    for i, free in enumerate(frees):
        for j in range(len(frees)):
            if taken.get(i, 0) < free:
                assert taken.get(j, 0) <= taken.get(i, 0) + 1


def _sized(*sizes: int) -> list[Message]:
    return [Message(b"%016d" % i, b"x" * size, 0) for i, size in enumerate(sizes)]


def test_fit_bytes_takes_messages_while_the_bytes_before_them_are_below_the_room() -> None:
    # 4 x 100 bytes in a room of 250: the third starts at 200 < 250 (it may pass the room),
    # the fourth would start at 300.
    assert fit_bytes(_sized(100, 100, 100, 100), 250) == (3, 300)
    assert fit_bytes(_sized(100, 100, 100, 100), 200) == (2, 200)
    assert fit_bytes(_sized(100, 100), 10_000) == (2, 200)


def test_fit_bytes_always_gives_one_message() -> None:
    # A message bigger than the whole room still goes (alone): the consumer would never get it.
    assert fit_bytes(_sized(5000, 1), 1) == (1, 5000)

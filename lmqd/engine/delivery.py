"""How one delivery round splits a batch of messages over the ready consumers (a pure function).

A round takes as many messages as the ready consumers have free room in their RDY windows, then
spreads them in random order (nsqd's racing goroutines pick a random ready client per message):
with enough messages every consumer fills its window; otherwise *water-filling*: find the highest
level ``b`` with ``sum(min(free, b)) <= n``, give each consumer ``min(free, b)`` and the few left
over (fewer than the consumers above the level) one each to consumers picked at random among
those with room above ``b``. A single message thus goes to a uniformly random ready consumer, and
a batch is spread evenly. O(k log k) for k ready consumers, independent of the batch size.

Rounds are bounded in bytes too: each consumer has a *byte room* (what its output buffer may
still take, ``Consumer.byte_room``) and gets messages only while the bodies given so far are
below it, so it holds at most its room plus one message. ``fit_bytes`` cuts a consumer's share
to its room; it runs only when a round is *tight* (its bodies add up to more than the smallest
room). Whether it is needs the round's bytes: the channel sums the bodies (``body_bytes``) only
when the bound its topic stream gives for the messages read from the cursor (``bytemarks.py``)
does not already show the round below every room.
"""

from __future__ import annotations

import random
from bisect import bisect_left
from collections.abc import Sequence
from itertools import accumulate
from typing import TypeVar

from lmqd.message import Message

T = TypeVar("T")


def body_bytes(messages: Sequence[Message]) -> int:
    """The bodies' total size: one ``len`` and one addition per message, in a comprehension
    (measured ~20 ns a message, cheaper than ``map`` over an ``attrgetter``)."""
    return sum([len(m.body) for m in messages])


def split_batch(
    ready: list[tuple[T, int]], n: int, room: int, rng: random.Random
) -> list[tuple[T, int]]:
    """Split ``n`` messages over ``ready`` ``(consumer, free room)`` pairs (``room`` is the sum of
    the free rooms, ``0 < n <= room``): ``(consumer, count)`` pairs, counts > 0 summing to ``n``,
    in random order. Shuffles ``ready`` in place."""
    if len(ready) == 1:
        return [(ready[0][0], n)]
    rng.shuffle(ready)
    if n >= room:
        return ready
    frees = sorted(free for _, free in ready)
    k = len(frees)
    prefix = 0
    level = 0
    for i, free in enumerate(frees):
        rest = k - i
        if prefix + free * rest > n:
            level = (n - prefix) // rest
            break
        prefix += free
    shares = [(consumer, min(free, level)) for consumer, free in ready]
    left = n - sum(take for _, take in shares)
    if left:
        above = [i for i, (_, free) in enumerate(ready) if free > level]
        for i in rng.sample(above, left):
            consumer, take = shares[i]
            shares[i] = (consumer, take + 1)
    return [(consumer, take) for consumer, take in shares if take]


def fit_bytes(messages: Sequence[Message], room: int) -> tuple[int, int]:
    """How many of ``messages`` (a prefix, at least one) a consumer with ``room`` bytes takes:
    each while the bodies before it add up to less than ``room``; and their bytes. O(n)."""
    sizes = list(accumulate([len(m.body) for m in messages]))
    k = min(len(sizes), 1 + bisect_left(sizes, room))
    return k, sizes[k - 1]

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

A round's plan is pure too (``round_size``, ``round_bytes``, ``plan_shares``: ready consumers,
RDY windows, byte rooms and the rng in; who gets which messages out), with table tests beside
``split_batch``'s; ``Channel.deliver`` takes the messages, applies the plan and sends.
"""

from __future__ import annotations

import random
from bisect import bisect_left
from collections.abc import Mapping, Sequence
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


# -- a delivery round, planned ----------------------------------------------------------------


def round_size(ready: int, room: int, budget: int, estimate: int) -> int:
    """How many messages a round asks for: all the count ``room`` of its ``ready`` consumers'
    RDY windows, but no more than their byte rooms (``budget`` bytes in all) hold at the last
    round's mean body size ``estimate`` (one each at least): big messages are not read only to
    be put back."""
    return min(room, max(ready, budget // estimate))


def round_bytes(
    messages: Sequence[Message],
    taken: Sequence[Message],
    unsummed: int,
    bound: int | None,
    least: int,
    estimate: int,
) -> tuple[bool, int, int | None, int]:
    """Whether a round's ``messages`` (of ``taken``, the policy may have given some up) are
    *tight*, more bytes than the smallest byte room ``least``; returns ``(tight, total, exact,
    estimate)``: the bytes the round counts (exact, or an upper bound), the exact sum if it was
    made (None: the bound sufficed), and the next rounds' mean body size estimate.

    The last ``unsummed`` messages taken were read from the cursor and have at most ``bound``
    bytes (the stream's byte marks); the others (requeued, stored, pushed: few, unless the
    channel has no cursor) are summed. Below every room the round is not tight and its bodies
    need no sum; otherwise they are summed once."""
    n = len(messages)
    upper = None
    if bound is not None and unsummed:  # else one exact sum below, not two
        others = len(taken) - unsummed
        upper = bound + body_bytes(taken[:others]) if others else bound
    if upper is not None and upper < least:
        # The mean is no bigger than the bound's.
        return False, upper, None, max(upper // n, 1) if upper // n < estimate else estimate
    exact = body_bytes(messages)
    return exact > least, exact, exact, max(exact // n, 1)


Share = tuple[T, list[Message], int | None, int, list[Message]]
"""One consumer's part of a round: (consumer, messages to deliver, their bytes for the in-flight
heap (None: unknown), the bytes its byte room lost (0 unless the round is tight), the messages
sampling left out)."""


def plan_shares(
    ready: list[tuple[T, int]],
    messages: list[Message],
    room: int,
    total: int,
    tight: bool,
    byte_rooms: Mapping[T, int],
    sample_rates: Mapping[T, int],
    rng: random.Random,
) -> tuple[list[Share[T]], list[Message]]:
    """Split a round's ``messages`` over ``ready`` ``(consumer, free RDY room)`` pairs (``room``
    their sum): ``split_batch``, then, when the round is ``tight``, each share cut to what its
    consumer's byte room takes (``fit_bytes``), then nsqd's sampling (a consumer with a
    ``sample_rate`` skips a message when ``randrange(100) > rate``). Returns the shares in
    delivery order and the messages no consumer had byte room for. ``total``: the round's bytes
    (exact or an upper bound), spread over the shares for the in-flight heap's compaction rule.
    Pure: the rng is the only state it touches."""
    n = len(messages)
    shares: list[Share[T]] = []
    leftovers: list[Message] = []
    start = 0
    for consumer, take in split_batch(ready, n, room, rng):
        chunk = messages if take == n else messages[start : start + take]
        start += take
        # The chunk's bytes for the in-flight heap: the round's when it is the whole round (or
        # cut to fit below), else its share of the round (a heuristic's input: no second pass
        # over the bodies).
        size: int | None = total if take == n else total * take // n
        used = 0
        if tight:
            # This consumer's share may be more than its byte room: it keeps a prefix that fits
            # (one message at least); the rest goes back to the queue.
            fit, used = fit_bytes(chunk, byte_rooms[consumer])
            size = used
            if fit < len(chunk):
                leftovers += chunk[fit:]
                chunk = chunk[:fit]
        sampled_out: list[Message] = []
        rate = sample_rates[consumer]
        if rate > 0:
            randrange = rng.randrange
            kept = [m for m in chunk if randrange(100) <= rate]
            if len(kept) < len(chunk):
                keep = set(map(id, kept))
                sampled_out = [m for m in chunk if id(m) not in keep]
                size = None
                chunk = kept
        shares.append((consumer, chunk, size, used, sampled_out))
    return shares, leftovers

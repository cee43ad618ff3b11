"""How a Consumer spreads ``max_in_flight`` over its connections (pure functions, no event loop).

RDY is a window per connection (nsqd sends while ``in_flight < rdy``), so the consumer only has
to choose one number per connection and send it when it changes. With at least as many slots as
connections every connection gets an even share (the remainder goes to the first ones, so the
shares add up to exactly ``max_in_flight``, unlike go-nsq which drops the remainder). With fewer
slots than connections only ``max_in_flight`` connections can have ``RDY 1`` at a time; the
consumer periodically moves the slots away from connections that received nothing (go-nsq's
"RDY redistribution"), so a daemon with messages is never starved by idle ones.
"""

from __future__ import annotations

import random
from collections.abc import Collection, Hashable, Mapping, Sequence
from typing import TypeVar

K = TypeVar("K", bound=Hashable)


def even_split(max_in_flight: int, caps: Sequence[int]) -> list[int]:
    """Shares of ``max_in_flight`` for connections whose max RDY are ``caps``, in order."""
    n = len(caps)
    if n == 0:
        return []
    base, extra = divmod(max_in_flight, n)
    return [min(cap, base + (1 if i < extra else 0)) for i, cap in enumerate(caps)]


def rdy_targets(
    max_in_flight: int,
    conns: Sequence[K],
    caps: Mapping[K, int],
    active: Collection[K],
) -> dict[K, int]:
    """The RDY each connection should have in normal (not backing off) operation.

    ``active`` matters only when there are more connections than slots: those connections get
    ``RDY 1`` and every other one ``RDY 0``.
    """
    if max_in_flight >= len(conns):
        return dict(zip(conns, even_split(max_in_flight, [caps[c] for c in conns]), strict=True))
    return {c: (1 if c in active else 0) for c in conns}


def choose_active(
    conns: Sequence[K],
    active: Collection[K],
    idle: Collection[K],
    slots: int,
    rng: random.Random,
) -> set[K]:
    """The next set of ``slots`` connections that may receive while slots < connections.

    Active connections that received something keep their slot; slots of ``idle`` ones go to
    connections that had none, chosen at random, and back to idle ones only if nothing else is
    left.
    """
    live = set(conns)
    keep = [c for c in conns if c in active and c not in idle]
    waiting = [c for c in conns if c not in active]
    stale = [c for c in conns if c in active and c in idle]
    chosen = set(keep[:slots])
    need = slots - len(chosen)
    for pool in (waiting, stale):
        if need <= 0:
            break
        picked = rng.sample(pool, min(need, len(pool)))
        chosen.update(picked)
        need -= len(picked)
    return chosen & live

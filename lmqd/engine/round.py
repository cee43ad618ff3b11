"""A channel's delivery round: take the ready messages, apply the plan, send.

Theory of operation
-------------------
A round hands messages to the consumers with room in their RDY window (``in_flight_count <
ready_count``; RDY is a window, never decremented) and in their output (``Consumer.byte_room``):

1. it asks for as many messages as the free room holds, but no more than the byte rooms hold at
   the last round's mean body size (``delivery.round_size``);
2. takes them (``ReadySources.take_measured``) and, under a policy, screens them
   (``Retry.screen``: expired ones and those out of attempts are given up);
3. plans who gets what (``delivery.round_bytes``, ``delivery.plan_shares``: pure -- random
   order, evenly, cut to each consumer's byte room when the round is tight, nsqd's sampling);
4. starts each share in flight (one heap entry per share) and, once the loop is done, calls each
   consumer's ``write_messages`` once, so its writer wakes once.

What no consumer had byte room for goes back to the own store, not in flight, and the round goes
on for the consumers still with room; it also goes on when the size estimate kept the take
short, or sampling or the policy left room unused, until nothing more fits or
``SCREEN_BUDGET`` messages were screened (then it asks for another round after the other tasks
ran, so an expired backlog never holds delivery back for long).
"""

from __future__ import annotations

import math
from typing import Protocol

from lmqd.engine.delivery import body_bytes, plan_shares, round_bytes, round_size
from lmqd.engine.keeping import Keeping
from lmqd.engine.retry import SCREEN_BUDGET, SCREEN_CHUNK, Retry
from lmqd.engine.sources import ChannelBasics, ReadySources
from lmqd.engine.subscription import Subscription
from lmqd.message import Message

__all__ = ["RoundChannel", "deliver"]


class RoundChannel(ChannelBasics, Protocol):
    """The channel, as its delivery round sees it."""

    body_estimate: int

    @property
    def sources(self) -> ReadySources: ...

    @property
    def keeping(self) -> Keeping: ...

    @property
    def retry(self) -> Retry: ...

    @property
    def clients(self) -> dict[int, Subscription]: ...

    def deliver_again(self) -> None: ...


def deliver(channel: RoundChannel, now: float) -> float:
    """One delivery round of ``channel`` at ``now`` (see the module docstring); returns the
    earliest deadline of what it put in flight (``math.inf``: nothing)."""
    sources = channel.sources
    if not sources.has_ready():
        return math.inf
    retry = channel.retry
    keeping = channel.keeping
    in_flight = channel.in_flight
    clients = channel.clients
    rng = channel.ctx.rng
    batches: dict[int, list[Message]] = {}
    byte_rooms: dict[Subscription, int] = {}
    earliest = math.inf
    screened = 0
    giving_up = False
    while True:
        ready: list[tuple[Subscription, int]] = []
        for s in clients.values():
            free = s.free
            if free > 0:
                byte_room = byte_rooms.get(s)
                if byte_room is None:
                    byte_room = byte_rooms[s] = s.consumer.byte_room()
                if byte_room > 0:
                    ready.append((s, free))
        if not ready:
            break
        room = sum(r for _, r in ready)
        budget = sum(byte_rooms[s] for s, _ in ready)
        asked = round_size(len(ready), room, budget, channel.body_estimate)
        # Once a take had messages to give up, take at least SCREEN_CHUNK: an expired backlog is
        # given up in batches however small the consumers' room (what is left over goes back in
        # front); until then, exactly what is asked (no cost without one).
        want = max(asked, SCREEN_CHUNK) if giving_up else asked
        taken, unsummed, bound = sources.take_measured(want, now)
        msgs = taken
        if not msgs:
            break
        dropped = False
        if retry.screening:
            screened += len(taken)
            msgs = retry.screen(taken, now)
            giving_up = giving_up or len(msgs) < len(taken)
            if len(msgs) > asked:
                sources.requeue_front(msgs[asked:])
                msgs = msgs[:asked]
            dropped = len(msgs) < asked
            if not msgs:
                if len(taken) < want:
                    break  # nothing else is ready
                if screened >= SCREEN_BUDGET:
                    channel.deliver_again()
                    break
                continue
        n = len(msgs)
        least = min(byte_rooms[s] for s, _ in ready)
        tight, total, nbytes, channel.body_estimate = round_bytes(
            msgs, taken, unsummed, bound, least, channel.body_estimate
        )
        rates = {s: s.consumer.sample_rate for s, _ in ready}
        shares, leftovers = plan_shares(ready, msgs, room, total, tight, byte_rooms, rates, rng)
        for sub, chunk, size, used, sampled_out in shares:
            if used:
                byte_rooms[sub] -= used
            if sampled_out:
                dropped = True
                keeping.done(sampled_out)  # sampled out = done, for this channel
            if not chunk:
                continue
            deadline = now + sub.consumer.msg_timeout
            cid = sub.id
            in_flight.start_many(chunk, cid, now, deadline, size)
            k = len(chunk)
            sub.in_flight_count += k
            sub.message_count += k
            if deadline < earliest:
                earliest = deadline
            batch = batches.get(cid)
            if batch is None:
                batches[cid] = chunk
            else:
                batch.extend(chunk)
        if leftovers:
            # Messages not sent are not in flight: they go back to the own store, for the
            # consumers still with room (those cut short have none left) or a later round.
            sources.put_back(leftovers)
            continue
        # Another round if the size estimate kept the take short (the rooms may hold more), or
        # if sampling (or the policy) left room unused and messages may remain.
        if not (n == asked < room and len(taken) == want):
            if not dropped or len(taken) < want:
                break
            if screened >= SCREEN_BUDGET:
                channel.deliver_again()
                break
        if not tight:
            # None gets more than the whole round: its bytes, exact, come off every room before
            # the next one (summed now if the bound let this round skip it).
            if nbytes is None:
                nbytes = body_bytes(msgs)
                channel.body_estimate = max(nbytes // n, 1)
            for s, _ in ready:
                byte_rooms[s] -= nbytes
    for cid, batch in batches.items():
        clients[cid].consumer.write_messages(batch)
    return earliest

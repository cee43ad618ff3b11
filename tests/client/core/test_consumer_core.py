"""``ConsumerCore`` alone: decoded frames and times in, bytes, actions and deadlines out.

Rules for this module: no sockets, no event loop (``tests/protocol``'s way): the test plays the
driver, feeding the core the events of each read with an exact ``now``, and asserts the exact
commands each link queued, the actions asked for and the deadlines; randomness comes from a
seeded ``random.Random``; backoffs have no jitter. These are the rules both front ends share,
including those on which the old async and blocking consumers disagreed (go-nsq's behaviour
chosen): RDY is redistributed every ``rdy_redistribute_interval`` in both, silent daemons are
dropped in both, messages of a lost connection are not handed out, and close requeues what was
not handed out.
"""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

from lmq_client.core import Connect, ConsumerCore, ConsumerLink, ConsumerOptions, Disconnect
from lmq_client.core.backoff import Backoff
from lmq_client.core.schedule import QueryLookupds
from lmq_client.errors import ConnectionFailed

from .helpers import (
    CLOSE_WAIT,
    HEARTBEAT,
    OK,
    Clock,
    error,
    identify_answer,
    message,
    msg_id,
    sent,
)

EXACT = Backoff(base=1.0, max_delay=8.0, jitter=0.0)


def make_core(addresses: list[str], clock: Clock, *, lookupds: bool = False,
              **options: Any) -> ConsumerCore:  # fmt: skip
    settings: dict[str, Any] = {"backoff": EXACT, "reconnect_backoff": EXACT, **options}
    return ConsumerCore("t", "c", addresses, lookupds=lookupds, options=ConsumerOptions(**settings),
                        rng=random.Random(7), clock=clock, now=clock.now)  # fmt: skip


def subscribe(core: ConsumerCore, address: str, now: float, **answer: Any) -> ConsumerLink:
    link = core.connected(address, identify_answer(**answer), now)
    assert sent(link) == [b"SUB t c"]
    core.receive(link, [OK], now)
    return link


def test_start_dials_subscribes_and_opens_the_window_once_every_daemon_was_tried() -> None:
    clock = Clock(100.0)
    core = make_core(["a:1", "b:1", "c:1"], clock, max_in_flight=7)
    core.start(100.0)
    assert core.take_actions() == [Connect("a:1"), Connect("b:1"), Connect("c:1")]
    a = subscribe(core, "a:1", 100.0)
    assert sent(a) == [] and not core.started  # b and c not tried yet: no RDY
    b = subscribe(core, "b:1", 100.5)
    core.connect_failed("c:1", 100.5)
    assert core.started
    assert (sent(a), sent(b)) == ([b"RDY 4"], [b"RDY 3"])  # 7 over the two that came up
    assert core.deadline == 101.5  # c's redial, 1 s after its failure
    core.timers(101.5)
    assert core.take_actions() == [Connect("c:1")]
    c = subscribe(core, "c:1", 101.6)
    assert (sent(a), sent(b), sent(c)) == ([b"RDY 3"], [b"RDY 2"], [b"RDY 2"])
    assert core.statistics().connections == 3


def test_rdy_never_exceeds_the_daemons_max_rdy_count() -> None:
    core = make_core(["a:1"], Clock(), max_in_flight=5000)
    core.start(0.0)
    core.take_actions()
    link = subscribe(core, "a:1", 0.0, max_rdy_count=300)
    assert sent(link) == [b"RDY 300"]


def test_backoff_pauses_probes_and_steps_down_at_exact_times() -> None:
    """go-nsq's backoff: RDY 0 before the failed message's REQ, a pause of 2**(level-1) s, a
    probe with RDY 1, successes step the level down; answers during a pause do not count."""
    clock = Clock(10.0)
    core = make_core(["a:1"], clock, max_in_flight=4)
    core.start(10.0)
    core.take_actions()
    link = subscribe(core, "a:1", 10.0)
    assert sent(link) == [b"RDY 4"]
    core.receive(link, [message(1), message(2)], 10.0)
    first, _ = core.next_message() or pytest.fail()
    second, _ = core.next_message() or pytest.fail()
    first.requeue(2.5)
    assert sent(link) == [b"RDY 0", b"REQ " + msg_id(1) + b" 2500"]
    assert core.deadline == 11.0 and core.statistics().backoff_level == 1
    clock.now = 10.5
    second.finish()  # in flight when the pause began: not counted
    assert sent(link) == [b"FIN " + msg_id(2)] and core.statistics().backoff_level == 1
    core.timers(11.0)
    assert sent(link) == [b"RDY 1"]  # the probe
    core.receive(link, [message(3)], 11.2)
    clock.now = 11.2
    probe, _ = core.next_message() or pytest.fail()
    probe.requeue(0)  # the probe failed: level 2, 2 s
    assert sent(link) == [b"RDY 0", b"REQ " + msg_id(3) + b" 0"]
    assert core.deadline == 13.2
    core.timers(13.2)
    assert sent(link) == [b"RDY 1"]
    core.receive(link, [message(4)], 13.3)
    clock.now = 13.3
    (core.next_message() or pytest.fail())[0].finish()  # a success: level 1, another 1 s
    assert sent(link) == [b"FIN " + msg_id(4), b"RDY 0"]
    assert core.deadline == 14.3
    core.timers(14.3)
    assert sent(link) == [b"RDY 1"]
    core.receive(link, [message(5)], 14.4)
    clock.now = 14.4
    (core.next_message() or pytest.fail())[0].finish()  # level 0: the whole window again
    assert sent(link) == [b"FIN " + msg_id(5), b"RDY 4"]
    assert core.deadline == 14.4 + 65.0  # only the silence deadline is left
    stats = core.statistics()
    assert (stats.received, stats.finished, stats.requeued, stats.backoff_level) == (5, 3, 2, 0)


def test_requeue_without_backoff_changes_no_rdy() -> None:
    clock = Clock()
    core = make_core(["a:1"], clock, max_in_flight=2)
    core.start(0.0)
    core.take_actions()
    link = subscribe(core, "a:1", 0.0)
    sent(link)
    core.receive(link, [message(1)], 0.0)
    (core.next_message() or pytest.fail())[0].requeue(1.0, backoff=False)
    assert sent(link) == [b"REQ " + msg_id(1) + b" 1000"]
    assert core.statistics().backoff_level == 0


def test_heartbeats_get_nop_and_a_silent_daemon_is_dropped_at_exactly_its_deadline() -> None:
    core = make_core(["a:1"], Clock(), heartbeat_interval=10.0)
    core.start(0.0)
    core.take_actions()
    link = subscribe(core, "a:1", 0.0)
    sent(link)
    core.receive(link, [HEARTBEAT], 10.0)
    assert sent(link) == [b"NOP"]
    assert link.deadline == 10.0 + 2 * 10.0 + 5.0  # two intervals and the grace
    core.timers(34.999)
    assert core.take_actions() == [] and link.open
    core.timers(35.0)
    assert core.take_actions() == [Disconnect("a:1")]
    assert not link.open and "heartbeats missed" in str(link.error)
    assert not core.links
    assert core.deadline == 36.0  # given addresses are dialled again after the backoff


def test_given_addresses_are_redialled_with_exponential_backoff() -> None:
    core = make_core(["a:1"], Clock())
    core.start(0.0)
    assert core.take_actions() == [Connect("a:1")]
    link = subscribe(core, "a:1", 0.0)
    core.ended(link, 5.0, ConnectionFailed("a:1", "connection closed by the daemon"))
    times = []
    for _ in range(4):
        times.append(core.deadline)
        core.timers(core.deadline)
        assert core.take_actions() == [Connect("a:1")]
        core.connect_failed("a:1", times[-1])
    assert times == [6.0, 8.0, 12.0, 20.0]  # 1, 2, 4, 8 s after each failure
    subscribe(core, "a:1", 30.0)  # a subscription resets the count
    core.ended(core.links["a:1"], 31.0)
    assert core.deadline == 32.0


def test_a_refused_subscription_closes_the_connection_and_is_retried() -> None:
    core = make_core(["a:1"], Clock())
    core.start(0.0)
    core.take_actions()
    link = core.connected("a:1", identify_answer(), 0.0)
    sent(link)
    core.receive(link, [error("E_SUB_FAILED", "SUB failed consumers for t:c exceeds limit")], 0.5)
    assert core.take_actions() == [Disconnect("a:1")]
    assert core.started and not core.links
    assert core.deadline == 1.5


def test_max_attempts_flags_the_message_to_give_up() -> None:
    core = make_core(["a:1"], Clock(), max_attempts=3, max_in_flight=5)
    core.start(0.0)
    core.take_actions()
    link = subscribe(core, "a:1", 0.0)
    core.receive(link, [message(1, attempts=3), message(2, attempts=4)], 0.0)
    one, give_up_one = core.next_message() or pytest.fail()
    two, give_up_two = core.next_message() or pytest.fail()
    assert (one.attempts, give_up_one, two.attempts, give_up_two) == (3, False, 4, True)
    assert core.statistics().given_up == 1
    sent(link)
    core.gave_up(two)  # the hook answered nothing: FIN
    assert sent(link) == [b"FIN " + msg_id(2)]
    one.requeue(0, backoff=False)
    core.gave_up(one)  # already answered: nothing more
    assert sent(link) == [b"REQ " + msg_id(1) + b" 0"]
    assert ConsumerOptions(requeue_delay=2.5).requeue_delay_for(3) == 7.5
    assert ConsumerOptions(requeue_delay=100, max_requeue_delay=250).requeue_delay_for(3) == 250


def test_messages_of_a_lost_connection_are_not_handed_out() -> None:
    core = make_core(["a:1", "b:1"], Clock(), max_in_flight=4)
    core.start(0.0)
    core.take_actions()
    a, b = subscribe(core, "a:1", 0.0), subscribe(core, "b:1", 0.0)
    core.receive(a, [message(1)], 0.1)
    core.receive(b, [message(2)], 0.1)
    core.ended(a, 0.2)
    got, _ = core.next_message() or pytest.fail()
    assert got.id == msg_id(2) and core.next_message() is None
    assert core.unanswered == 1
    assert sent(b) == [b"RDY 2", b"RDY 4"]  # a's share went to b


def test_fewer_slots_than_daemons_rotate_every_redistribute_interval() -> None:
    """max_in_flight=1 over three daemons: one RDY 1 at a time, moved off an idle holder at
    exactly 5 s; a daemon that delivered keeps its slot."""
    core = make_core(["a:1", "b:1", "c:1"], Clock(), max_in_flight=1)
    core.start(0.0)
    core.take_actions()
    links = {a: subscribe(core, a, 0.0) for a in ("a:1", "b:1", "c:1")}
    first = {a: sent(link) for a, link in links.items()}
    holder = next(a for a, commands in first.items() if commands == [b"RDY 1"])
    assert sorted(map(tuple, first.values())) == [(), (), (b"RDY 1",)]
    assert core.deadline == 5.0
    core.timers(5.0)
    moved = {a: sent(link) for a, link in links.items()}
    assert moved[holder] == [b"RDY 0"]
    second = next(a for a, commands in moved.items() if commands == [b"RDY 1"])
    core.receive(links[second], [message(1)], 6.0)  # it delivers: it keeps the slot
    assert core.deadline == 10.0
    core.timers(10.0)
    assert all(sent(link) == [] for link in links.values())
    core.timers(15.0)  # idle since: the slot moves again
    assert sent(links[second]) == [b"RDY 0"]


def test_close_sends_cls_requeues_what_was_not_handed_out_and_drains() -> None:
    clock = Clock()
    core = make_core(["a:1"], clock, max_in_flight=3, close_timeout=30.0)
    core.start(0.0)
    core.take_actions()
    link = subscribe(core, "a:1", 0.0)
    sent(link)
    core.receive(link, [message(1), message(2)], 1.0)
    held, _ = core.next_message() or pytest.fail()
    core.close(2.0)
    assert sent(link) == [b"CLS", b"REQ " + msg_id(2) + b" 0"]
    assert not core.drained and core.deadline == 32.0
    core.receive(link, [CLOSE_WAIT, message(3)], 2.1)  # delivered before the CLS arrived
    assert sent(link) == [b"REQ " + msg_id(3) + b" 0"]
    assert not core.drained  # one message handed out is not answered yet
    held.finish()
    assert core.drained and core.deadline == math.inf
    assert sent(link) == [b"FIN " + msg_id(1)]
    assert core.take_actions() == []


def test_close_gives_up_waiting_at_close_timeout() -> None:
    core = make_core(["a:1"], Clock(), close_timeout=3.0)
    core.start(0.0)
    core.take_actions()
    link = subscribe(core, "a:1", 0.0)
    core.receive(link, [message(1)], 0.0)
    core.next_message()
    core.close(1.0)
    core.receive(link, [CLOSE_WAIT], 1.0)
    core.timers(3.999)
    assert not core.drained
    core.timers(4.0)
    assert core.drained


def test_lookupd_discovery_connects_new_producers_and_drops_vanished_ones() -> None:
    core = make_core(["a:1"], Clock(), lookupds=True, max_in_flight=4, heartbeat_interval=0,
                     lookupd_poll_interval=60.0, lookupd_poll_jitter=0.0)  # fmt: skip
    core.start(0.0)
    assert core.take_actions() == [Connect("a:1"), QueryLookupds()]
    a = subscribe(core, "a:1", 0.0)
    assert not core.started  # the first lookupd answer is part of the first round
    core.answered(0.2, ["a:1", "b:1"])  # a is given: connected once
    assert core.take_actions() == [Connect("b:1")]
    b = subscribe(core, "b:1", 0.3)
    assert core.started and (sent(a), sent(b)) == ([b"RDY 2"], [b"RDY 2"])
    assert core.deadline == 60.0
    core.timers(60.0)
    assert core.take_actions() == [QueryLookupds()]
    core.answered(60.1, [])  # missed once: kept
    assert core.take_actions() == [] and core.deadline == 120.0
    core.timers(120.0)
    core.take_actions()
    core.answered(120.1, None)  # no lookupd answered: nothing changes
    core.timers(180.0)
    core.take_actions()
    core.answered(180.1, [])  # missed twice: dropped
    assert core.take_actions() == [Disconnect("b:1")]
    assert list(core.links) == ["a:1"] and sent(a) == [b"RDY 4"]


def test_a_discovered_producer_whose_connection_ended_is_asked_for_again() -> None:
    core = make_core([], Clock(), lookupds=True, lookupd_poll_jitter=0.0, heartbeat_interval=0)
    core.start(0.0)
    assert core.take_actions() == [QueryLookupds()]
    core.answered(0.0, ["b:1"])
    assert core.take_actions() == [Connect("b:1")]
    b = subscribe(core, "b:1", 0.0)
    core.ended(b, 10.0)
    assert core.deadline == 11.0  # the lookupds are asked again after b's backoff
    core.timers(11.0)
    assert core.take_actions() == [QueryLookupds()]
    core.answered(11.1, [])  # no longer listed: not dialled again
    assert core.take_actions() == []


def test_a_driver_without_writer_is_told_to_send_once_the_application_caught_up() -> None:
    """The blocking driver's ``send_now``: answers of a burst wait for each other, the last one
    (nothing received is left to hand out) and every TOUCH go out at once."""
    core = make_core(["a:1"], Clock(), max_in_flight=10)
    told: list[bytes] = []
    core.send_now = lambda link: told.append(link.take_output())
    core.start(0.0)
    core.take_actions()
    link = subscribe(core, "a:1", 0.0)
    sent(link)
    core.receive(link, [message(1), message(2), message(3)], 1.0)
    first, _ = core.next_message() or pytest.fail()
    first.finish()
    assert told == []  # two more are waiting to be handed out
    second, _ = core.next_message() or pytest.fail()
    second.touch()
    assert told == [b"FIN " + msg_id(1) + b"\nTOUCH " + msg_id(2) + b"\n"]
    second.finish()
    third, _ = core.next_message() or pytest.fail()
    third.requeue(0, backoff=False)
    assert told[1:] == [b"FIN " + msg_id(2) + b"\nREQ " + msg_id(3) + b" 0\n"]

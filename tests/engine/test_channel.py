"""Channel behaviour through its public interface, with fake subscribers.

Timer tests run the channel's own task on pytest-trio's ``autojump_clock`` and assert exact
virtual times (the clock starts at 0.0, so ``60.0`` means exactly the 60 s msg timeout).
Synchronous tests pass ``now`` explicitly: the queue logic never reads a clock itself.
"""

from __future__ import annotations

import random

import pytest
import trio

from lmqd.engine.backend import DummyBackend, MemoryBackend
from lmqd.engine.channel import Channel
from lmqd.engine.errors import TooManyConsumers, TopicExiting
from lmqd.engine.inflight import NotInFlight, NotOwner
from lmqd.names import is_ephemeral
from lmqd.options import Options

from .engine_fakes import FailingBackend, FakeClient, bodies, lone_channel, make_messages


class Unused:
    """A channel's owner that records the channels that asked to be deleted."""

    def __init__(self, asked: list[Channel]) -> None:
        self.asked = asked

    def entry_changed(self) -> None:
        pass

    def channel_unused(self, channel: Channel) -> None:
        self.asked.append(channel)


def make_channel(
    name: str = "c", *, backend: MemoryBackend | DummyBackend | None = None, **options: object
) -> Channel:
    return lone_channel(
        Options.from_mapping(options),
        name,
        backend=backend if backend is not None else MemoryBackend(),
        rng=random.Random(1234),
    )


# -- timers (autojump clock, exact times) -----------------------------------------------------


async def test_msg_timeout_redelivers_at_exactly_60s(autojump_clock: trio.abc.Clock) -> None:
    ch = make_channel()
    client = FakeClient(1, ready=5)
    client.subscribe(ch)
    async with trio.open_nursery() as nursery:
        await nursery.start(ch.run)
        assert trio.current_time() == 0.0
        ch.put_many(make_messages(1), 0.0)
        ch.deliver(0.0)
        [first] = client.writes[0]
        assert first.attempts == 1
        assert first.deadline == 60.0
        await client.wait_writes(2)
        assert trio.current_time() == 60.0
        [again] = client.writes[1]
        assert again is first
        assert again.attempts == 2
        assert again.deadline == 120.0
        assert ch.timeout_count == 1
        assert ch.requeue_count == 0
        assert client.in_flight_count == 1
        assert client.message_count == 2
        ch.close()
    assert client.write_times == [0.0, 60.0]


async def test_req_with_delay_redelivers_at_exactly_2s(autojump_clock: trio.abc.Clock) -> None:
    ch = make_channel()
    client = FakeClient(1, ready=1)
    client.subscribe(ch)
    async with trio.open_nursery() as nursery:
        await nursery.start(ch.run)
        ch.put_many(make_messages(1), 0.0)
        ch.deliver(0.0)
        [m] = client.writes[0]
        ch.requeue(client.sub, m.id, 2.0, 0.0)  # REQ <id> 2000
        assert ch.deferred_count == 1
        assert ch.in_flight_count == 0
        assert client.in_flight_count == 0
        ch.deliver(0.0)
        assert len(client.writes) == 1  # nothing to deliver before it is due
        await client.wait_writes(2)
        assert trio.current_time() == 2.0
        assert client.writes[1] == [m]
        assert m.attempts == 2
        assert ch.requeue_count == 1
        assert client.requeue_count == 1
        assert ch.timeout_count == 0
        ch.close()


async def test_earlier_deadline_wakes_a_sleeping_timer(autojump_clock: trio.abc.Clock) -> None:
    # The timer sleeps until 60 s (in-flight timeout); a REQ of 0.5 s pushed at t=1 must lower
    # that sleep's deadline directly.
    ch = make_channel()
    client = FakeClient(1, ready=2)
    client.subscribe(ch)
    async with trio.open_nursery() as nursery:
        await nursery.start(ch.run)
        ch.put_many(make_messages(2), 0.0)
        ch.deliver(0.0)
        a, _b = client.writes[0]
        await trio.sleep(1.0)
        ch.requeue(client.sub, a.id, 0.5, trio.current_time())
        await client.wait_writes(2)
        assert trio.current_time() == 1.5
        assert client.writes[1] == [a]
        ch.close()


async def test_dpub_message_delivered_at_exactly_its_time(autojump_clock: trio.abc.Clock) -> None:
    ch = make_channel()
    client = FakeClient(1, ready=10)
    client.subscribe(ch)
    async with trio.open_nursery() as nursery:
        await nursery.start(ch.run)
        [later] = make_messages(1, deliver_at=3.25)
        [now_msg] = make_messages(1, start=1)
        ch.put_many([later, now_msg], 0.0)
        assert ch.message_count == 2  # deferred messages count as put (nsqd)
        assert ch.deferred_count == 1
        assert ch.depth == 1
        ch.deliver(0.0)
        assert client.writes == [[now_msg]]
        await client.wait_writes(2)
        assert trio.current_time() == 3.25
        assert client.writes[1] == [later]
        assert later.attempts == 1
        ch.close()


async def test_touch_extends_the_deadline(autojump_clock: trio.abc.Clock) -> None:
    ch = make_channel()
    client = FakeClient(1, ready=1)
    client.subscribe(ch)
    async with trio.open_nursery() as nursery:
        await nursery.start(ch.run)
        ch.put_many(make_messages(1), 0.0)
        ch.deliver(0.0)
        [m] = client.writes[0]
        await trio.sleep(50.0)
        ch.touch(client.sub, m.id, trio.current_time())
        assert m.deadline == 110.0
        await client.wait_writes(2)
        assert trio.current_time() == 110.0
        assert ch.timeout_count == 1
        ch.close()


async def test_touch_is_capped_by_max_msg_timeout(autojump_clock: trio.abc.Clock) -> None:
    ch = make_channel(max_msg_timeout=100.0)
    client = FakeClient(1, ready=1)
    client.subscribe(ch)
    async with trio.open_nursery() as nursery:
        await nursery.start(ch.run)
        ch.put_many(make_messages(1), 0.0)
        ch.deliver(0.0)
        [m] = client.writes[0]
        await trio.sleep(50.0)
        ch.touch(client.sub, m.id, 50.0)  # would be 110, capped at delivery + 100
        assert m.deadline == 100.0
        await trio.sleep(40.0)
        ch.touch(client.sub, m.id, 90.0)
        assert m.deadline == 100.0
        await client.wait_writes(2)
        assert trio.current_time() == 100.0
        ch.close()


async def test_run_returns_when_deleted(autojump_clock: trio.abc.Clock) -> None:
    ch = make_channel()
    client = FakeClient(1, ready=1)
    client.subscribe(ch)
    async with trio.open_nursery() as nursery:
        await nursery.start(ch.run)
        ch.put_many(make_messages(1), 0.0)
        ch.deliver(0.0)
        ch.delete()
    # The nursery closed at once: no timeout fired and time did not move to 60 s.
    assert trio.current_time() == 0.0
    assert ch.timeout_count == 0


# -- FIN / REQ / TOUCH --------------------------------------------------------------------------


def test_fin_removes_from_flight_and_counts() -> None:
    ch = make_channel()
    client = FakeClient(1, ready=3)
    client.subscribe(ch)
    ch.put_many(make_messages(3), 0.0)
    ch.deliver(0.0)
    assert client.in_flight_count == 3
    for m in client.received:
        ch.finish(client.sub, m.id, 1.0)
    assert client.in_flight_count == 0
    assert client.finish_count == 3
    assert ch.in_flight_count == 0


def test_fin_errors_carry_nsqd_reasons() -> None:
    ch = make_channel()
    owner = FakeClient(1, ready=1)
    other = FakeClient(2, ready=0)
    owner.subscribe(ch)
    other.subscribe(ch)
    ch.put_many(make_messages(1), 0.0)
    ch.deliver(0.0)
    [m] = owner.received
    with pytest.raises(NotOwner) as not_owner:
        ch.finish(other.sub, m.id, 0.0)
    assert str(not_owner.value) == "client does not own message"
    with pytest.raises(NotInFlight) as not_in_flight:
        ch.finish(owner.sub, b"ffffffffffffffff", 0.0)
    assert str(not_in_flight.value) == "ID not in flight"
    with pytest.raises(NotOwner):
        ch.requeue(other.sub, m.id, 0.0, 0.0)
    with pytest.raises(NotOwner):
        ch.touch(other.sub, m.id, 0.0)
    # Nothing changed by the failures; a second FIN of a finished message fails.
    ch.finish(owner.sub, m.id, 0.0)
    with pytest.raises(NotInFlight):
        ch.finish(owner.sub, m.id, 0.0)
    with pytest.raises(NotInFlight):
        ch.requeue(owner.sub, m.id, 0.0, 0.0)
    with pytest.raises(NotInFlight):
        ch.touch(owner.sub, m.id, 0.0)
    assert owner.finish_count == 1


def test_req_0_goes_straight_back_to_the_queue() -> None:
    ch = make_channel()
    client = FakeClient(1, ready=1)
    client.subscribe(ch)
    ch.put_many(make_messages(2), 0.0)
    ch.deliver(0.0)
    [first] = client.writes[0]
    ch.requeue(client.sub, first.id, 0.0, 1.0)
    assert ch.depth == 2  # back at the tail, behind the second message
    assert ch.deferred_count == 0
    assert first.attempts == 1  # REQ leaves attempts; the next delivery increments
    ch.deliver(1.0)
    [second] = client.writes[1]
    assert second.body == b"m1"
    ch.finish(client.sub, second.id, 2.0)
    ch.deliver(2.0)
    assert client.writes[2] == [first]
    assert first.attempts == 2
    assert ch.requeue_count == 1
    assert client.requeue_count == 1


# -- delivery and RDY ---------------------------------------------------------------------------


def test_mutations_do_not_deliver_by_themselves() -> None:
    ch = make_channel()
    client = FakeClient(1, ready=10)
    client.subscribe(ch)
    ch.put_many(make_messages(5), 0.0)
    ch.consumer_ready()
    assert client.writes == []
    ch.deliver(0.0)
    assert len(client.writes) == 1  # one write call per client per round
    assert bodies(client.writes[0]) == [b"m0", b"m1", b"m2", b"m3", b"m4"]


def test_rdy_0_stops_delivery_and_raising_rdy_resumes() -> None:
    ch = make_channel()
    client = FakeClient(1, ready=0)
    client.subscribe(ch)
    ch.put_many(make_messages(5), 0.0)
    ch.deliver(0.0)
    assert client.writes == []
    client.ready_count = 2
    ch.consumer_ready()
    ch.deliver(0.0)
    assert bodies(client.received) == [b"m0", b"m1"]
    client.ready_count = 0  # backoff: in-flight messages stay in flight
    ch.consumer_ready()
    for m in client.received:
        ch.finish(client.sub, m.id, 1.0)
    ch.deliver(1.0)
    assert len(client.received) == 2
    assert ch.depth == 3
    client.ready_count = 5
    ch.consumer_ready()
    ch.deliver(2.0)
    assert bodies(client.received) == [b"m0", b"m1", b"m2", b"m3", b"m4"]


def test_rdy_is_a_window_not_a_countdown() -> None:
    ch = make_channel()
    client = FakeClient(1, ready=3)
    client.subscribe(ch)
    ch.put_many(make_messages(10), 0.0)
    delivered = 0
    for step in range(20):
        ch.deliver(float(step))
        assert client.in_flight_count <= 3
        assert ch.in_flight_count == client.in_flight_count
        if client.received[delivered:]:
            # Finish one: exactly one more may be sent (RDY stays 3, never decremented).
            m = client.received[delivered]
            delivered += 1
            ch.finish(client.sub, m.id, float(step))
    assert client.ready_count == 3
    assert bodies(client.received) == [b"m%d" % i for i in range(10)]


def test_random_selection_spreads_single_messages_over_ready_clients() -> None:
    ch = make_channel()
    clients = [FakeClient(i, ready=1000) for i in range(1, 5)]
    for c in clients:
        c.subscribe(ch)
    for i in range(1000):
        ch.put_many(make_messages(1, start=i), 0.0)
        ch.deliver(0.0)
    counts = [len(c.received) for c in clients]
    assert sum(counts) == 1000
    # Binomial(1000, 1/4): mean 250, sd ~13.7; 150..350 is > 7 sd, but one client taking all
    # or round-robin-by-accident to a single client fails it.
    assert all(150 <= n <= 350 for n in counts), counts


def test_a_batch_is_spread_not_given_to_one_client() -> None:
    ch = make_channel()
    clients = [FakeClient(i, ready=2500) for i in range(1, 5)]
    for c in clients:
        c.subscribe(ch)
    ch.put_many(make_messages(1000), 0.0)
    ch.deliver(0.0)
    assert [len(c.writes) for c in clients] == [1, 1, 1, 1]
    assert [len(c.received) for c in clients] == [250, 250, 250, 250]
    # Each client's part is in publish order.
    for c in clients:
        ids = [m.id for m in c.received]
        assert ids == sorted(ids)


def test_uneven_room_fills_small_windows_and_splits_the_rest() -> None:
    ch = make_channel()
    small = FakeClient(1, ready=2)
    big1 = FakeClient(2, ready=100)
    big2 = FakeClient(3, ready=100)
    for c in (small, big1, big2):
        c.subscribe(ch)
    ch.put_many(make_messages(50), 0.0)
    ch.deliver(0.0)
    assert len(small.received) == 2
    assert sorted([len(big1.received), len(big2.received)]) == [24, 24]
    assert ch.depth == 0


def test_more_messages_than_room_fills_every_window() -> None:
    ch = make_channel()
    a = FakeClient(1, ready=3)
    b = FakeClient(2, ready=5)
    a.subscribe(ch)
    b.subscribe(ch)
    ch.put_many(make_messages(20), 0.0)
    ch.deliver(0.0)
    assert (len(a.received), len(b.received)) == (3, 5)
    assert ch.depth == 12
    assert ch.in_flight_count == 8


def test_sample_rate_drops_unsampled_messages_for_the_channel() -> None:
    ch = make_channel()
    client = FakeClient(1, ready=10_000, sample_rate=10)
    client.subscribe(ch)
    ch.put_many(make_messages(2000), 0.0)
    ch.deliver(0.0)
    n = len(client.received)
    # nsqd keeps a message when randrange(100) <= rate: ~11% here (mean 220, sd ~14).
    assert 140 <= n <= 300, n
    assert ch.depth == 0  # the rest were consumed and dropped, not left queued
    assert client.message_count == n
    assert ch.in_flight_count == n


def test_sampling_round_repeats_to_fill_the_window() -> None:
    ch = make_channel()
    client = FakeClient(1, ready=10, sample_rate=50)
    client.subscribe(ch)
    ch.put_many(make_messages(1000), 0.0)
    ch.deliver(0.0)
    assert len(client.received) == 10
    assert len(client.writes) == 1


# -- clients ------------------------------------------------------------------------------------


def test_disconnect_requeues_in_flight_at_once() -> None:
    ch = make_channel()
    leaver = FakeClient(1, ready=3)
    stayer = FakeClient(2, ready=0)
    leaver.subscribe(ch)
    stayer.subscribe(ch)
    ch.put_many(make_messages(3), 0.0)
    ch.deliver(0.0)
    assert len(leaver.received) == 3
    ch.remove_consumer(leaver.sub, 0.0)
    assert ch.in_flight_count == 0
    assert leaver.in_flight_count == 0
    assert ch.depth == 3
    assert ch.requeue_count == 3  # documented: disconnect requeues count as requeues
    assert ch.timeout_count == 0
    stayer.ready_count = 10
    ch.deliver(5.0)
    assert bodies(stayer.received) == [b"m0", b"m1", b"m2"]
    assert [m.attempts for m in stayer.received] == [2, 2, 2]
    ch.remove_consumer(leaver.sub, 0.0)  # unknown client: nothing happens


def test_too_many_consumers() -> None:
    ch = make_channel(max_channel_consumers=2)
    ch.add_consumer(FakeClient(1))
    ch.add_consumer(FakeClient(2))
    ch.add_consumer(FakeClient(2))  # already subscribed: no error, no duplicate
    with pytest.raises(TooManyConsumers) as exc:
        ch.add_consumer(FakeClient(3))
    assert str(exc.value) == "consumers for t:c exceeds limit of 2"
    assert len(ch.clients) == 2


def test_subscribing_to_a_deleted_channel_raises_topic_exiting() -> None:
    ch = make_channel()
    ch.delete()
    with pytest.raises(TopicExiting):
        ch.add_consumer(FakeClient(1))


def test_deleting_a_channel_closes_its_clients() -> None:
    ch = make_channel()
    clients = [FakeClient(1, ready=1), FakeClient(2, ready=1)]
    for client in clients:
        client.subscribe(ch)
    ch.delete()
    assert [c.closed for c in clients] == [True, True]


def test_ephemeral_channel_asks_to_be_deleted_when_its_last_client_leaves() -> None:
    asked: list[Channel] = []
    ch = lone_channel(name="c#ephemeral", backend=DummyBackend(), owner=Unused(asked))
    a, b = FakeClient(1), FakeClient(2)
    a.subscribe(ch)
    b.subscribe(ch)
    ch.remove_consumer(a.sub, 0.0)
    assert asked == []
    ch.remove_consumer(b.sub, 0.0)
    assert asked == [ch]


def test_is_ephemeral() -> None:
    assert is_ephemeral("x#ephemeral")
    assert is_ephemeral("x#tmp")
    assert not is_ephemeral("x")
    assert not is_ephemeral("x#ephemeral2")


# -- memory queue and backend -------------------------------------------------------------------


def test_overflow_goes_to_backend_and_fifo_order_is_kept() -> None:
    ch = make_channel(mem_queue_size=3)
    ch.put_many(make_messages(5), 0.0)
    assert (ch.depth, ch.backend_depth) == (5, 2)
    client = FakeClient(1, ready=2)
    client.subscribe(ch)
    ch.deliver(0.0)
    # Memory has room again, but the backend is not empty: new messages must go behind it.
    ch.put_many(make_messages(3, start=5), 0.0)
    assert (ch.depth, ch.backend_depth) == (6, 5)
    client.ready_count = 100
    ch.deliver(1.0)
    assert bodies(client.received) == [b"m%d" % i for i in range(8)]
    assert (ch.depth, ch.backend_depth) == (0, 0)
    # Backend drained: memory is used again.
    ch.put_many(make_messages(1, start=8), 1.0)
    assert (ch.depth, ch.backend_depth) == (1, 0)


def test_requeue_keeps_fifo_behind_the_backend() -> None:
    ch = make_channel(mem_queue_size=1)
    client = FakeClient(1, ready=1)
    client.subscribe(ch)
    ch.put_many(make_messages(2), 0.0)
    ch.deliver(0.0)
    [m0] = client.received
    assert (ch.depth, ch.backend_depth) == (1, 1)
    ch.requeue(client.sub, m0.id, 0.0, 0.0)
    assert (ch.depth, ch.backend_depth) == (2, 2)  # memory has room, but FIFO: behind m1
    client.ready_count = 2
    ch.deliver(1.0)
    assert bodies(client.received) == [b"m0", b"m1", b"m0"]


def test_requeue_goes_to_backend_when_memory_is_full() -> None:
    ch = make_channel(mem_queue_size=2)
    client = FakeClient(1, ready=1)
    client.subscribe(ch)
    ch.put_many(make_messages(1), 0.0)
    ch.deliver(0.0)
    ch.put_many(make_messages(2, start=1), 0.0)
    assert (ch.depth, ch.backend_depth) == (2, 0)
    ch.requeue(client.sub, client.received[0].id, 0.0, 0.0)
    assert (ch.depth, ch.backend_depth) == (3, 1)


@pytest.mark.parametrize("size", [0, -1])  # nsqd v1.3.0 starts with -1: lmqd reads it as 0
def test_mem_queue_size_0_puts_everything_in_the_backend(size: int) -> None:
    ch = make_channel(mem_queue_size=size)
    ch.put_many(make_messages(4), 0.0)
    assert (ch.depth, ch.backend_depth) == (4, 4)
    client = FakeClient(1, ready=3)
    client.subscribe(ch)
    ch.deliver(0.0)
    assert bodies(client.received) == [b"m0", b"m1", b"m2"]
    assert (ch.depth, ch.backend_depth) == (1, 1)


def test_ephemeral_overflow_is_dropped() -> None:
    backend = DummyBackend()
    ch = make_channel("c#tmp", backend=backend, mem_queue_size=3)
    ch.put_many(make_messages(5), 0.0)
    assert (ch.depth, ch.backend_depth) == (3, 0)
    assert backend.dropped_count == 2
    assert ch.message_count == 5


@pytest.mark.parametrize("size", [0, -1])
def test_ephemeral_mem_0_accepts_only_what_ready_clients_can_take(size: int) -> None:
    # nsqd gives such a channel an unbuffered Go channel: a put succeeds only while a ready
    # consumer is waiting.
    backend = DummyBackend()
    ch = make_channel("c#ephemeral", backend=backend, mem_queue_size=size)
    ch.put_many(make_messages(2), 0.0)
    assert backend.dropped_count == 2
    client = FakeClient(1, ready=3)
    client.subscribe(ch)
    ch.put_many(make_messages(5, start=2), 0.0)
    assert backend.dropped_count == 4
    ch.deliver(0.0)
    assert bodies(client.received) == [b"m2", b"m3", b"m4"]


def test_backend_failure_keeps_messages_in_memory() -> None:
    backend = FailingBackend()
    ch = make_channel(backend=backend, mem_queue_size=1)
    ch.put_many(make_messages(3), 0.0)
    assert ch.depth == 3
    assert ch.last_backend_error is not None
    backend.failing = False
    client = FakeClient(1, ready=10)
    client.subscribe(ch)
    ch.deliver(0.0)
    assert bodies(client.received) == [b"m0", b"m1", b"m2"]


def test_deferred_messages_read_back_from_the_backend_stay_deferred() -> None:
    # Written at shutdown with their deliver_at, read back (restart) before they are due.
    backend = MemoryBackend()
    backend.put_many(make_messages(2, deliver_at=30.0) + make_messages(1, start=2))
    ch = make_channel(backend=backend)
    client = FakeClient(1, ready=10)
    client.subscribe(ch)
    ch.deliver(10.0)
    assert bodies(client.received) == [b"m2"]
    assert ch.deferred_count == 2
    assert ch.next_deadline() == 30.0


# -- pause, empty, close, statistics ------------------------------------------------------------


def test_pause_and_unpause() -> None:
    ch = make_channel()
    client = FakeClient(1, ready=10)
    client.subscribe(ch)
    ch.pause()
    ch.put_many(make_messages(3), 0.0)
    ch.deliver(0.0)
    assert client.writes == []
    assert ch.depth == 3
    assert ch.statistics(0.0).paused
    ch.unpause()
    assert client.writes == []  # unpause does not deliver by itself
    ch.deliver(1.0)
    assert len(client.received) == 3


def test_empty_drops_everything_and_zeroes_client_in_flight() -> None:
    ch = make_channel(mem_queue_size=2)
    client = FakeClient(1, ready=2)
    client.subscribe(ch)
    ch.put_many(make_messages(6), 0.0)
    ch.put_many(make_messages(1, start=6, deliver_at=9.0), 0.0)
    ch.deliver(0.0)
    assert (ch.depth, ch.backend_depth, ch.in_flight_count, ch.deferred_count) == (4, 4, 2, 1)
    ch.empty()
    assert (ch.depth, ch.backend_depth, ch.in_flight_count, ch.deferred_count) == (0, 0, 0, 0)
    assert client.in_flight_count == 0
    with pytest.raises(NotInFlight):
        ch.finish(client.sub, client.received[0].id, 1.0)


def test_close_flushes_memory_in_flight_and_deferred_to_the_backend() -> None:
    backend = MemoryBackend()
    ch = make_channel(backend=backend)
    client = FakeClient(1, ready=1)
    client.subscribe(ch)
    ch.put_many(make_messages(2), 0.0)
    ch.put_many(make_messages(1, start=2, deliver_at=50.0), 0.0)
    ch.deliver(0.0)
    ch.close()
    assert ch.exiting
    stored = backend.read_many(10)
    assert bodies(stored) == [b"m1", b"m0", b"m2"]  # memory, in flight, deferred
    assert stored[2].deliver_at == 50.0
    ch.remove_consumer(client.sub, 0.0)  # after close: no requeue into the closed backend
    assert backend.depth == 0
    ch.close()  # idempotent


def test_statistics_snapshot_counts() -> None:
    ch = make_channel(mem_queue_size=2)
    a = FakeClient(1, ready=2)
    b = FakeClient(2, ready=0)
    a.subscribe(ch)
    b.subscribe(ch)
    ch.put_many(make_messages(5), 0.0)
    ch.put_many(make_messages(1, start=5, deliver_at=10.0), 0.0)
    ch.deliver(0.0)
    x, y = a.received
    ch.finish(a.sub, x.id, 1.0)
    ch.requeue(a.sub, y.id, 5.0, 1.0)
    s = ch.statistics(0.0)
    assert s.channel_name == "c"
    assert (s.depth, s.backend_depth, s.in_flight_count, s.deferred_count) == (3, 3, 0, 2)
    assert (s.message_count, s.requeue_count, s.timeout_count) == (6, 1, 0)
    assert s.client_count == 2
    assert s.clients is not None
    assert [c.client_id for c in s.clients] == ["fake1", "fake2"]
    assert s.clients[0].finish_count == 1
    assert s.clients[0].requeue_count == 1
    assert s.e2e_processing_latency.count == 0
    assert s.e2e_processing_latency.percentiles is None
    brief = ch.statistics(0.0, include_clients=False)
    assert brief.clients is None
    assert brief.client_count == 2
    d = s.to_dict()
    assert list(d) == [
        "channel_name", "depth", "backend_depth", "in_flight_count", "deferred_count",
        "message_count", "requeue_count", "timeout_count", "client_count", "clients", "paused",
        "e2e_processing_latency",
        "dead_letter_count", "expired_count", "max_attempts_dropped_count",  # lmq's, after
        "storage_damage", "priority_depths",
    ]  # fmt: skip
    assert d["e2e_processing_latency"] == {"count": 0, "percentiles": None}
    assert d["priority_depths"] == {}
    assert "pub_counts" not in d["clients"][0]  # omitempty


async def test_fin_feeds_the_e2e_stream_when_percentiles_are_configured() -> None:
    # Inside trio: the stream's rolling window starts at the trio clock.
    ch = make_channel(e2e_processing_latency_percentiles=(0.99,))
    client = FakeClient(1, ready=5)
    client.subscribe(ch)
    ch.put_many(make_messages(3), 0.0)
    ch.deliver(0.0)
    for m in client.received[:2]:
        ch.finish(client.sub, m.id, 1.0)
    assert ch.statistics(0.0).e2e_processing_latency.count == 2


def test_shares_respect_windows_and_stay_even() -> None:
    rng = random.Random(5)
    for _ in range(300):
        ch = make_channel()
        clients = [FakeClient(i, ready=rng.randint(0, 12)) for i in range(rng.randint(1, 6))]
        for c in clients:
            c.subscribe(ch)
        room = sum(c.ready_count for c in clients)
        n = rng.randint(0, room + 5)
        ch.put_many(make_messages(n), 0.0)
        ch.deliver(0.0)
        got = [len(c.received) for c in clients]
        assert sum(got) == min(n, room)
        assert all(g <= c.ready_count for g, c in zip(got, clients, strict=True))
        assert all(len(c.writes) <= 1 for c in clients)
        # Water-filling: a client below its window got at least everyone else's share minus one.
        unfilled = [g for g, c in zip(got, clients, strict=True) if g < c.ready_count]
        if unfilled:
            assert max(got) - min(unfilled) <= 1, (got, [c.ready_count for c in clients])
        assert ch.depth == max(0, n - room)


async def test_finish_many_matches_finish_and_reports_failures_in_order() -> None:
    ch = make_channel(e2e_processing_latency_percentiles=(0.5,))
    a = FakeClient(1, ready=3)
    b = FakeClient(2, ready=1)
    a.subscribe(ch)
    ch.put_many(make_messages(3), 0.0)
    ch.deliver(0.0)
    b.subscribe(ch)
    ch.put_many(make_messages(1, start=3), 0.0)
    ch.deliver(0.0)
    x, y, z = a.received
    [theirs] = b.received
    failed = ch.finish_many(a.sub, [x.id, theirs.id, y.id, b"0000000000000000", x.id], 1.0)
    assert [(mid, str(err)) for mid, err in failed] == [
        (theirs.id, "client does not own message"),
        (b"0000000000000000", "ID not in flight"),
        (x.id, "ID not in flight"),
    ]
    assert (a.in_flight_count, a.finish_count) == (1, 2)
    assert ch.in_flight_count == 2
    assert ch.statistics(0.0).e2e_processing_latency.count == 2
    assert z.id in ch.in_flight

"""Consumer behaviour against scripted fake daemons: RDY, backoff, give-up, reconnect, close.

Rules for this module: no sockets (``FakeNetwork`` hands out memory streams); every test runs on
the ``autojump_clock`` and asserts exact virtual times (backoff and reconnect delays use
``jitter=0``); each test is bounded by ``trio.fail_after`` on that clock.
"""

from __future__ import annotations

import random

import pytest
import trio
import trio.lowlevel

from lmq_client.backoff import Backoff
from lmq_client.consumer import Consumer
from lmq_client.message import Message
from lmqd.protocol import Cls, Fin, Rdy, Req, Sub

from .fakes import FakeDaemon, FakeNetwork

NO_JITTER = Backoff(base=1.0, max_delay=60.0, jitter=0.0)


def msg_id(i: int) -> bytes:
    return b"%016x" % i


async def test_subscribe_rdy_handler_finish(autojump_clock: trio.abc.Clock) -> None:
    net = FakeNetwork()
    done = trio.Event()
    handled: list[bytes] = []

    async def handler(message: Message) -> None:
        handled.append(message.body)

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:

            async def daemon() -> None:
                fake = await net.accept()
                sub = await fake.subscribe()
                assert (sub.topic, sub.channel) == ("t", "c")
                assert (await fake.expect(Rdy)).count == 10
                await fake.deliver(msg_id(1), b"one")
                await fake.deliver(msg_id(2), b"two")
                assert (await fake.expect(Fin)).id == msg_id(1)
                assert (await fake.expect(Fin)).id == msg_id(2)
                done.set()
                await fake.expect(Cls)
                await fake.respond(b"CLOSE_WAIT")

            nursery.start_soon(daemon)
            consumer = Consumer(
                "t", "c", "fake:1", handler=handler, max_in_flight=10, open_stream=net.open_stream
            )
            async with consumer:
                await done.wait()
    assert handled == [b"one", b"two"]
    assert consumer.statistics().finished == 2


async def test_backoff_timing_exact(autojump_clock: trio.abc.Clock) -> None:
    """go-nsq's backoff: RDY 0, wait 2**(level-1) s, probe with RDY 1, success steps down."""
    net = FakeNetwork()
    done = trio.Event()
    outcomes = iter([False, False, False, True, True, True])

    async def handler(message: Message) -> None:
        if not next(outcomes):
            raise RuntimeError("handler failure")

    commands: list[tuple[float, str]] = []
    with trio.fail_after(100):
        async with trio.open_nursery() as nursery:
            consumer = Consumer(
                "t", "c", "fake:1", handler=handler, max_in_flight=4, requeue_delay=0,
                backoff=NO_JITTER, open_stream=net.open_stream,
            )

            async def daemon() -> None:
                fake = await net.accept()
                await fake.subscribe()
                start = trio.current_time()

                async def command() -> None:
                    event = await fake.next_command()
                    name = type(event).__name__.upper()
                    if isinstance(event, Rdy):
                        name += f" {event.count}"
                    commands.append((trio.current_time() - start, name))

                await command()  # RDY 4
                for i in range(6):
                    await fake.deliver(msg_id(i), b"x")
                    await command()  # FIN, or (a failure) the backoff's RDY 0
                    await command()  # the RDY change after a FIN, or the REQ
                    if i < 5:
                        await command()  # the probe's RDY 1 after the backoff timer
                done.set()
                await fake.answer_cls()

            nursery.start_soon(daemon)
            async with consumer:
                await done.wait()
    assert commands == [
        (0.0, "RDY 4"),
        # A failure's RDY 0 goes before its REQ (go-nsq's order): the daemon cannot hand the
        # message straight back during the pause.
        (0.0, "RDY 0"), (0.0, "REQ"), (1.0, "RDY 1"),  # level 1: 1 s
        (1.0, "RDY 0"), (1.0, "REQ"), (3.0, "RDY 1"),  # level 2: 2 s
        (3.0, "RDY 0"), (3.0, "REQ"), (7.0, "RDY 1"),  # level 3: 4 s
        (7.0, "FIN"), (7.0, "RDY 0"), (9.0, "RDY 1"),  # success: level 2, 2 s
        (9.0, "FIN"), (9.0, "RDY 0"), (10.0, "RDY 1"),  # success: level 1, 1 s
        (10.0, "FIN"), (10.0, "RDY 4"),  # success: level 0, full RDY again
    ]


async def test_give_up_after_max_attempts(autojump_clock: trio.abc.Clock) -> None:
    net = FakeNetwork()
    done = trio.Event()
    handled: list[int] = []
    given_up: list[tuple[bytes, int]] = []

    async def handler(message: Message) -> None:
        handled.append(message.attempts)

    async def give_up(message: Message) -> None:
        await trio.lowlevel.checkpoint()
        given_up.append((message.id, message.attempts))

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            finished: list[bytes] = []

            async def daemon() -> None:
                fake = await net.accept()
                await fake.subscribe()
                await fake.expect(Rdy)
                await fake.deliver(msg_id(1), b"x", attempts=3)
                await fake.deliver(msg_id(2), b"y", attempts=4)
                for _ in range(2):
                    finished.append((await fake.expect(Fin)).id)
                done.set()
                await fake.answer_cls()

            nursery.start_soon(daemon)
            async with Consumer(
                "t", "c", "fake:1", handler=handler, max_attempts=3, on_give_up=give_up,
                open_stream=net.open_stream,
            ):
                await done.wait()
    assert handled == [3]
    assert given_up == [(msg_id(2), 4)]
    assert finished == [msg_id(1), msg_id(2)]


async def test_handler_failure_requeues_with_delay_times_attempts(
    autojump_clock: trio.abc.Clock,
) -> None:
    net = FakeNetwork()
    done = trio.Event()

    async def handler(message: Message) -> None:
        raise ValueError("nope")

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            reqs: list[Req] = []

            async def daemon() -> None:
                fake = await net.accept()
                await fake.subscribe()
                await fake.expect(Rdy)
                await fake.deliver(msg_id(1), b"x", attempts=3)
                assert (await fake.expect(Rdy)).count == 0  # the backoff's, before the REQ
                reqs.append(await fake.expect(Req))
                done.set()
                await fake.answer_cls()

            nursery.start_soon(daemon)
            async with Consumer(
                "t", "c", "fake:1", handler=handler, requeue_delay=2.5, backoff=NO_JITTER,
                open_stream=net.open_stream,
            ):
                await done.wait()
    assert reqs == [Req(id=msg_id(1), timeout_ms=7500)]


async def test_rdy_split_across_daemons() -> None:
    net = FakeNetwork()
    done = trio.Event()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            rdys: dict[str, int] = {}

            async def daemon() -> None:
                fake = await net.accept()
                await fake.subscribe()
                rdys[fake.address] = (await fake.expect(Rdy)).count
                if len(rdys) == 3:
                    done.set()
                await fake.answer_cls()

            for _ in range(3):
                nursery.start_soon(daemon)
            async with Consumer(
                "t", "c", ["a:1", "b:1", "c:1"], max_in_flight=7, open_stream=net.open_stream
            ) as consumer:
                await done.wait()
                assert sorted(consumer.rdy_counts().values()) == [2, 2, 3]
    assert sorted(rdys.values()) == [2, 2, 3]


async def test_rdy_redistribution_with_fewer_slots_than_daemons(
    autojump_clock: trio.abc.Clock,
) -> None:
    """max_in_flight=1 over 3 daemons: one RDY 1 at a time, moved from an idle daemon every 5 s."""
    net = FakeNetwork()
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            fakes: dict[str, FakeDaemon] = {}

            async def daemon() -> None:
                fake = await net.accept()
                await fake.subscribe()
                fakes[fake.address] = fake
                while True:
                    await fake.next_command()

            for _ in range(3):
                nursery.start_soon(daemon)
            consumer = Consumer(
                "t", "c", ["a:1", "b:1", "c:1"], max_in_flight=1, open_stream=net.open_stream,
                rng=random.Random(7),
            )
            async with consumer:
                await trio.sleep(0.001)
                first = consumer.rdy_counts()
                assert sorted(first.values()) == [0, 0, 1]
                holder = next(a for a, n in first.items() if n == 1)
                await trio.sleep(4.9)
                assert consumer.rdy_counts() == first
                await trio.sleep(0.2)  # t = 5.1: redistributed away from the idle holder
                second = consumer.rdy_counts()
                assert sorted(second.values()) == [0, 0, 1]
                assert second[holder] == 0
                nursery.cancel_scope.cancel()
    # the RDY commands themselves: the first holder got RDY 1 at ~0 and RDY 0 at exactly 5 s
    times = [(t, e.count) for t, e in fakes[holder].log if isinstance(e, Rdy)]
    assert times[0][1] == 1
    assert times[1][1] == 0
    assert times[1][0] == pytest.approx(times[0][0] + 5.0)


async def test_reconnect_with_exponential_backoff(autojump_clock: trio.abc.Clock) -> None:
    net = FakeNetwork()
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            consumer = Consumer(
                "t", "c", "a:1", open_stream=net.open_stream, reconnect_backoff=NO_JITTER
            )

            async def daemon() -> None:
                fake = await net.accept()
                await fake.subscribe()
                await fake.expect(Rdy)
                net.refuse.add("a:1")
                await fake.close()  # the daemon goes away at t=0
                await trio.sleep(6.5)
                net.refuse.clear()  # back at t=6.5: the attempt at t=7 succeeds
                fake = await net.accept()
                await fake.subscribe()
                await fake.expect(Rdy)
                await fake.deliver(msg_id(9), b"again")
                await fake.answer_cls()

            nursery.start_soon(daemon)
            async with consumer:
                start = trio.current_time()
                async for message in consumer:
                    assert message.body == b"again"
                    message.finish()
                    break
    times = [round(t - start, 6) for t, _ in net.attempts[1:]]
    # retries 1 s, 2 s, 4 s after each failure: t = 1, 3, 7
    assert times == [1.0, 3.0, 7.0]


async def test_close_lets_running_handler_finish_and_requeues_queued(
    autojump_clock: trio.abc.Clock,
) -> None:
    net = FakeNetwork()
    started = trio.Event()

    async def handler(message: Message) -> None:
        started.set()
        await trio.sleep(3)

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            answers: list[object] = []

            async def daemon() -> None:
                fake = await net.accept()
                await fake.subscribe()
                await fake.expect(Rdy)
                await fake.deliver(msg_id(1), b"slow")
                await fake.deliver(msg_id(2), b"queued")
                await fake.expect(Cls)
                await fake.respond(b"CLOSE_WAIT")
                for _ in range(2):
                    event = await fake.next_command()
                    answers.append((trio.current_time(), event))

            nursery.start_soon(daemon)
            consumer = Consumer(
                "t", "c", "a:1", handler=handler, max_in_flight=2, concurrency=1,
                open_stream=net.open_stream,
            )
            async with consumer:
                await started.wait()
                t0 = trio.current_time()
            closed_at = trio.current_time()
    assert answers == [(t0, Req(id=msg_id(2), timeout_ms=0)), (t0 + 3, Fin(id=msg_id(1)))]
    assert closed_at == t0 + 3


async def test_async_for_and_touch(autojump_clock: trio.abc.Clock) -> None:
    net = FakeNetwork()
    done = trio.Event()
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            seen: list[object] = []

            async def daemon() -> None:
                fake = await net.accept()
                identify = (await fake.subscribe())
                assert identify is not None
                await fake.expect(Rdy)
                await fake.deliver(msg_id(5), b"body", attempts=2, timestamp=123)
                seen.append(await fake.next_command())
                seen.append(await fake.next_command())
                done.set()
                await fake.answer_cls()

            nursery.start_soon(daemon)
            async with Consumer(
                "t", "c", "a:1", msg_timeout=10.0, open_stream=net.open_stream
            ) as consumer:
                async for message in consumer:
                    assert (message.id, message.body, message.attempts, message.timestamp) == (
                        msg_id(5), b"body", 2, 123
                    )
                    message.touch()
                    message.requeue(1.25, backoff=False)
                    with pytest.raises(RuntimeError):
                        message.finish()
                    break
                await done.wait()
    assert [type(e).__name__ for e in seen] == ["Touch", "Req"]
    assert seen[1] == Req(id=msg_id(5), timeout_ms=1250)


async def test_sub_error_is_retried(autojump_clock: trio.abc.Clock) -> None:
    net = FakeNetwork()
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:

            async def daemon() -> None:
                fake = await net.accept()
                await fake.handshake()
                await fake.expect(Sub)
                await fake.error(b"E_SUB_FAILED SUB failed consumers for t:c exceeds limit of 1")
                await fake.close()
                fake = await net.accept()
                await fake.subscribe()
                await fake.answer_cls()

            nursery.start_soon(daemon)
            consumer = Consumer(
                "t", "c", "a:1", open_stream=net.open_stream, reconnect_backoff=NO_JITTER
            )
            async with consumer:
                assert consumer.connected_addresses == []
                await trio.sleep(1.001)
                assert consumer.connected_addresses == ["a:1"]


async def test_run_in_a_nursery_until_close(autojump_clock: trio.abc.Clock) -> None:
    """``await nursery.start(consumer.run)`` (started once the daemon was tried), then
    ``close()``: CLS, the handler's FIN, and ``run`` returns without an exception."""
    net = FakeNetwork()
    handled = trio.Event()

    async def handler(message: Message) -> None:
        handled.set()

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            commands: list[object] = []

            async def daemon() -> None:
                fake = await net.accept()
                await fake.subscribe()
                await fake.expect(Rdy)
                await fake.deliver(msg_id(1), b"one")
                commands.append(await fake.next_command())
                await fake.expect(Cls)
                await fake.respond(b"CLOSE_WAIT")

            nursery.start_soon(daemon)
            consumer = Consumer("t", "c", "a:1", handler=handler, open_stream=net.open_stream)
            await nursery.start(consumer.run)
            assert consumer.connected_addresses == ["a:1"]
            await handled.wait()
            await consumer.close()
    assert commands == [Fin(id=msg_id(1))]
    assert consumer.statistics().finished == 1

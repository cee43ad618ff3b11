"""A channel's cursor across a restart and a crash: topic empty's skipped range, and a seek's
messages in flight (``--durable``).

Rules for this module: no trio run loop (the engine's plain-def entry points with ``now`` passed
in); real files on tmpfs through the daemon's own restore path (``lmqd.engine.stores``), as
``test_model``; a crash is a copy of the data directory taken after a sync (what the OS holds at
a kill -9), the engine then goes on in the copy; a graceful restart closes the topic and opens
it again in place.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ..storage.storage_helpers import memory_dir
from .engine_restart import NOW, Engine


@pytest.fixture(params=[False, True], ids=["default", "durable"])
def engine(request: pytest.FixtureRequest) -> Iterator[Engine]:
    with memory_dir() as base:
        e = Engine(base, durable=request.param)
        try:
            yield e
        finally:
            e.close()


def publish(engine: Engine, *bodies: bytes) -> None:
    engine.topic.publish(list(bodies), NOW)


@pytest.mark.parametrize("how", ["restart", "crash"])
def test_topic_empty_with_a_lagging_channel_is_stepped_over_after_a_restart(
    engine: Engine, how: str
) -> None:
    topic = engine.topic
    engine.subscribe(topic, "a")
    publish(engine, b"kept1", b"kept2")
    engine.pump()  # handed to "a", which has not read them (RDY 0)
    topic.pause()
    publish(engine, b"gone1", b"gone2", b"gone3")
    topic.empty()  # drops the three the topic had not handed on
    topic.unpause()
    publish(engine, b"after")
    engine.pump()
    engine.sync()
    engine.restart() if how == "restart" else engine.crash()
    engine.pump()
    assert [m.body for m in engine.drain("a")] == [b"kept1", b"kept2", b"after"]


def test_a_skipped_range_is_forgotten_once_the_channel_passed_it(engine: Engine) -> None:
    topic = engine.topic
    engine.subscribe(topic, "a")
    publish(engine, b"kept")
    engine.pump()
    topic.pause()
    publish(engine, b"gone")
    topic.empty()
    topic.unpause()
    engine.pump()
    assert [m.body for m in engine.drain("a")] == [b"kept"]
    engine.sync()
    log = topic.stream.log
    assert log is not None
    cursor = log.cursor("a")
    assert cursor is not None and cursor.skips == []
    state = (next(engine.root.glob("**/t.lmq.log.json"))).read_text()
    assert '"skips"' not in state


def test_seek_in_durable_keeps_the_messages_in_flight_across_a_crash() -> None:
    with memory_dir() as base:
        engine = Engine(base, durable=True)
        try:
            client = engine.subscribe(engine.topic, "a", ready=10)
            publish(engine, b"m1", b"m2", b"m3")
            engine.pump()
            channel = engine.topic.channels["a"]
            channel.deliver(NOW)
            assert [m.body for m in client.received] == [b"m1", b"m2", b"m3"]
            assert client.sub is not None
            channel.finish(client.sub, client.received[0].id, NOW)  # m1 done; m2, m3 in flight
            channel.seek(engine.topic.stream.next_offset)  # jump to the end
            publish(engine, b"m4")
            engine.pump()
            engine.sync()
            engine.crash()
            engine.pump()
            got = engine.drain("a")
            assert sorted(m.body for m in got) == [b"m2", b"m3", b"m4"]
            # m2 and m3 were delivered before the crash: that delivery counts.
            assert {m.body: m.attempts for m in got if m.body != b"m4"} == {b"m2": 2, b"m3": 2}
        finally:
            engine.close()


def test_messages_in_flight_across_a_seek_still_settle_and_free_the_log() -> None:
    with memory_dir() as base:
        engine = Engine(base, durable=True)
        try:
            client = engine.subscribe(engine.topic, "a", ready=10)
            publish(engine, b"m1", b"m2")
            engine.pump()
            channel = engine.topic.channels["a"]
            channel.deliver(NOW)
            assert client.sub is not None
            channel.seek(0)  # a replay while m1, m2 are in flight: they come again
            channel.finish_many(client.sub, [m.id for m in client.received], NOW)
            replayed = engine.drain("a")
            assert [m.body for m in replayed] == [b"m1", b"m2"]
            log = engine.topic.stream.log
            assert log is not None
            cursor = log.cursor("a")
            assert cursor is not None
            assert (cursor.unsettled_count, cursor.low) == (0, engine.topic.stream.next_offset)
            engine.sync()
            engine.crash()
            engine.pump()
            assert engine.drain("a") == []  # everything was FIN'd: nothing comes back
        finally:
            engine.close()

"""``lmqd.engine.e2e``: nsqd's rolling-window end-to-end latency percentiles.

Rules for this module (STYLE.md):
- Pure queue logic: time is passed in as ``now`` (trio-clock seconds), so windows are exact.
- Every window boundary is asserted at its exact time (stale strictly after ``window / 2``).
- The last test runs a real daemon on 127.0.0.1 port 0 (``start_daemon``) under a fail_after.
- Random sampling uses a seeded ``random.Random``; estimates are checked against exact answers.
"""

from __future__ import annotations

import random

import pytest
import trio

from lmqd.engine.e2e import E2eLatencyStream, new_stream
from lmqd.options import Options
from lmqd.stats import NO_E2E_LATENCY, E2eLatency, Percentile
from tests.support.daemon import StartDaemon, eventually
from tests.support.http import http
from tests.support.wire import OK, Wire


def values(result: E2eLatency) -> list[float]:
    assert result.percentiles is not None
    return [p.value for p in result.percentiles]


def test_exact_nearest_rank_under_the_sample_size() -> None:
    stream = E2eLatencyStream((0.5, 0.9, 0.99, 1.0), 600.0, now=0.0)
    for v in random.Random(1).sample(range(1, 101), 100):  # 1..100 in random order
        stream.record(1.0, v)
    result = stream.result(1.0)
    assert result.count == 100
    assert result.percentiles == (
        Percentile(quantile=0.5, value=50.0),
        Percentile(quantile=0.9, value=90.0),
        Percentile(quantile=0.99, value=99.0),
        Percentile(quantile=1.0, value=100.0),
    )


def test_empty_window_reports_zero_values_as_perks_does() -> None:
    stream = E2eLatencyStream((0.99,), 10.0, now=0.0)
    assert stream.result(0.0) == E2eLatency(
        count=0, percentiles=(Percentile(quantile=0.99, value=0.0),)
    )


def test_window_rolls_in_halves_at_exact_times() -> None:
    # window 10 s: halves of 5 s; a half is stale strictly after last_move + 5.
    stream = E2eLatencyStream((1.0,), 10.0, now=0.0)
    stream.record(0.0, 1000)
    stream.record(5.0, 2000)  # exactly at the boundary: still the first half
    assert stream.count(5.0) == 2
    stream.record(5.5, 3000)  # first move at 5.5: the old half stays as "previous"
    assert stream.count(5.5) == 3
    assert values(stream.result(10.0)) == [3000.0]
    # At 10.0 (= last_move 5 + 5) nothing is stale yet; just after, the first half is dropped.
    assert stream.count(10.0) == 3
    assert stream.count(10.000001) == 1
    assert values(stream.result(10.000001)) == [3000.0]
    # Idle for a long time: both halves gone.
    assert stream.result(1000.0) == E2eLatency(
        count=0, percentiles=(Percentile(quantile=1.0, value=0.0),)
    )
    stream.record(1000.0, 7)
    assert stream.result(1000.0).count == 1


def test_estimate_beyond_the_sample_size_is_close() -> None:
    rng = random.Random(42)
    stream = E2eLatencyStream((0.5, 0.99), 600.0, now=0.0, sample_size=512, rng=random.Random(7))
    data = [rng.randrange(1_000_000) for _ in range(50_000)]
    for v in data:
        stream.record(1.0, v)
    result = stream.result(1.0)
    assert result.count == 50_000
    ordered = sorted(data)
    p50, p99 = values(result)
    # ~3 standard deviations of the rank error for 512 samples.
    assert abs(p50 - ordered[25_000 - 1]) < 0.07 * 1_000_000
    assert abs(p99 - ordered[49_500 - 1]) < 0.015 * 1_000_000


def test_merge_and_combined_equal_the_union_of_the_samples() -> None:
    a = E2eLatencyStream((0.5, 1.0), 60.0, now=0.0)
    b = E2eLatencyStream((0.5, 1.0), 60.0, now=0.0)
    for v in (1, 2, 3, 4):
        a.record(1.0, v)
    for v in (5, 6, 7, 8):
        b.record(40.0, v)  # b has moved to its second half by now
    union = E2eLatency(
        count=8,
        percentiles=(Percentile(quantile=0.5, value=4.0), Percentile(quantile=1.0, value=8.0)),
    )
    assert E2eLatencyStream.combined([a, None, b], 40.0) == union
    merged = E2eLatencyStream((0.5, 1.0), 60.0, now=0.0)
    merged.merge(a, 40.0)
    merged.merge(b, 40.0)
    assert merged.result(40.0) == union
    # merge leaves its source alone
    assert a.result(40.0).count == 4
    # a's samples (first half) are older: they leave the merged window first, as nsqd's do.
    assert merged.result(61.0).count == 4
    assert E2eLatencyStream.combined([None, None], 1.0) is NO_E2E_LATENCY


def test_new_stream_follows_the_options() -> None:
    assert new_stream(Options(), 0.0) is None
    stream = new_stream(
        Options(
            e2e_processing_latency_percentiles=(0.95,), e2e_processing_latency_window_time=120.0
        ),
        0.0,
    )
    assert stream is not None
    assert stream.percentiles == (0.95,)
    assert stream.window == 120.0


def test_invalid_construction() -> None:
    with pytest.raises(ValueError):
        E2eLatencyStream((), 10.0, now=0.0)
    with pytest.raises(ValueError):
        E2eLatencyStream((0.5,), 0.0, now=0.0)


async def test_window_on_the_trio_clock(autojump_clock: trio.testing.MockClock) -> None:
    # The engine passes trio.current_time(): virtual time rolls the window exactly.
    start = trio.current_time()
    stream = E2eLatencyStream((1.0,), 60.0, now=start)
    stream.record(trio.current_time(), 5)
    await trio.sleep(30)
    assert trio.current_time() - start == 30
    assert stream.result(trio.current_time()).count == 1  # not stale at exactly 30 s
    await trio.sleep(0.5)
    stream.record(trio.current_time(), 9)  # 30.5 s: the first half is now the older one
    assert stream.result(trio.current_time()).count == 2
    await trio.sleep(30)  # 60.5 s: the older half (holding the first sample) is reset
    assert trio.current_time() - start == 60.5
    assert values(stream.result(trio.current_time())) == [9.0]


async def test_stats_report_percentiles_of_finished_messages(start_daemon: StartDaemon) -> None:
    """Through the real daemon: FINs over TCP feed the channel's stream; /stats shows the
    configured percentiles for the channel and, merged, for its topic."""
    with trio.fail_after(10):
        running = await start_daemon(http=True, e2e_processing_latency_percentiles=(0.5, 0.99))
        consumer = await Wire.connect(running.tcp)
        await consumer.sub("lat", "c", rdy=10)
        producer = await Wire.connect(running.tcp)
        for i in range(5):
            assert await producer.pub("lat", b"m%d" % i) == OK
        for _ in range(5):
            message = await consumer.message()
            await consumer.send(b"FIN " + message.id + b"\n")
        channel = running.broker.topics["lat"].channels["c"]
        await eventually(lambda: channel.in_flight_count == 0)
        stats = (await http(running.http, "GET", "/stats?format=json")).json()
        await consumer.aclose()
        await producer.aclose()
    topic = stats["topics"][0]
    for latency in (
        topic["channels"][0]["e2e_processing_latency"],
        topic["e2e_processing_latency"],
    ):
        assert latency["count"] == 5
        assert [p["quantile"] for p in latency["percentiles"]] == [0.5, 0.99]
        assert all(p["value"] > 0 for p in latency["percentiles"])

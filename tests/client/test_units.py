"""Pure pieces of the clients: backoff delays, RDY arithmetic, bench histogram and FIN batches.

Rules for this module: no I/O, no trio; randomness comes from seeded ``random.Random``.
"""

from __future__ import annotations

import random

import pytest

from lmq_client.admin.bench import LatencyHistogram
from lmq_client.core.backoff import Backoff, BackoffState
from lmq_client.core.rdy import choose_active, even_split, rdy_targets
from lmq_client.errors import NSQError, SubFailedError, error_from_frame
from lmqd.net import split_address


def test_backoff_exponential_capped_and_jittered() -> None:
    exact = Backoff(base=1.0, max_delay=10.0, jitter=0.0)
    assert [exact.delay(level) for level in range(6)] == [0.0, 1.0, 2.0, 4.0, 8.0, 10.0]
    assert exact.delay(10_000) == 10.0  # no overflow far past the cap
    assert exact.max_level == 5
    jittered = Backoff(base=1.0, max_delay=10.0, jitter=0.5, rng=random.Random(1))
    delays = [jittered.delay(3) for _ in range(200)]
    assert all(2.0 <= d <= 4.0 for d in delays)
    assert len(set(delays)) > 100  # actually random
    with pytest.raises(ValueError):
        Backoff(jitter=1.5)


def test_backoff_state_pauses_probes_and_steps_down() -> None:
    """go-nsq's consumer backoff, with ``now`` passed in: exact pause deadlines."""
    flow = BackoffState(Backoff(base=1.0, max_delay=4.0, jitter=0.0))
    assert not flow.outcome(0.0, failure=False)  # a success at level 0 changes nothing
    assert flow.outcome(10.0, failure=True)
    assert (flow.level, flow.paused_until, flow.probing) == (1, 11.0, False)
    assert not flow.outcome(10.5, failure=True)  # in flight before the pause: not counted
    assert not flow.pause_over(10.999) and flow.pause_over(11.0)
    assert (flow.paused_until, flow.probing) == (None, True)
    assert flow.outcome(12.0, failure=True)  # the probe failed: level 2, 2 s
    assert (flow.level, flow.paused_until) == (2, 14.0)
    assert flow.pause_over(14.0)
    assert flow.backoff.max_level == 3  # 4 s, the cap, is reached at level 3
    for now in (15.0, 23.0, 31.0):  # the level stops at 3, the pause at max_delay
        assert flow.outcome(now, failure=True)
        assert (flow.level, flow.paused_until) == (3, now + 4.0)
        assert flow.pause_over(now + 4.0)
    assert flow.outcome(40.0, failure=False)  # a success steps down and pauses less long
    assert (flow.level, flow.paused_until) == (2, 42.0)
    while flow.level:
        assert flow.pause_over(flow.paused_until or 0.0)
        assert flow.outcome(100.0, failure=False)
    assert (flow.paused_until, flow.probing) == (None, False)


def test_even_split_adds_up_and_respects_caps() -> None:
    assert even_split(7, [2500, 2500, 2500]) == [3, 2, 2]
    assert sum(even_split(2500, [2500] * 7)) == 2500
    assert even_split(100, [10, 2500]) == [10, 50]
    assert even_split(5, []) == []


def test_rdy_targets_with_fewer_slots_than_connections() -> None:
    conns = ["a", "b", "c"]
    caps = dict.fromkeys(conns, 2500)
    assert rdy_targets(6, conns, caps, set()) == {"a": 2, "b": 2, "c": 2}
    assert rdy_targets(2, conns, caps, {"a", "c"}) == {"a": 1, "b": 0, "c": 1}


def test_choose_active_moves_slots_from_idle_connections() -> None:
    rng = random.Random(3)
    conns = ["a", "b", "c", "d"]
    # a got messages (keeps its slot); b was idle: its slot goes to c or d
    chosen = choose_active(conns, {"a", "b"}, idle={"b"}, slots=2, rng=rng)
    assert "a" in chosen and "b" not in chosen and len(chosen) == 2
    # nothing else to give the slot to: the idle one keeps it
    assert choose_active(["a", "b"], {"a", "b"}, idle={"a", "b"}, slots=2, rng=rng) == {"a", "b"}
    # a connection that went away is never chosen
    assert choose_active(["a"], {"a", "gone"}, idle=set(), slots=2, rng=rng) == {"a"}


def test_latency_histogram_percentiles_within_one_percent() -> None:
    hist = LatencyHistogram()
    values = list(range(1, 100_001))  # 1 µs .. 100 ms
    random.Random(5).shuffle(values)
    for v in values:
        hist.record(v)
    assert hist.count == 100_000
    for q in (0.5, 0.99, 0.999):
        got = hist.percentile(q)
        assert got is not None
        assert got == pytest.approx(q * 100_000, rel=0.01)
    assert LatencyHistogram().percentile(0.5) is None
    small = LatencyHistogram()
    small.record(3, times=2)
    small.record(7)
    assert (small.percentile(0.5), small.percentile(1.0)) == (3.0, 7.0)
    # a few thousand buckets at most, however many samples
    assert len(hist.buckets) < 2000


def test_error_from_frame_and_addresses() -> None:
    error = error_from_frame("E_SUB_FAILED", "SUB failed exiting", address="h:1")
    assert isinstance(error, SubFailedError) and error.fatal
    unknown = error_from_frame("E_SOMETHING_NEW", "text")
    assert type(unknown) is NSQError and unknown.code == "E_SOMETHING_NEW"
    assert not error_from_frame("E_FIN_FAILED", "x").fatal
    assert split_address("[::1]:4150") == ("::1", 4150)
    for bad in ("nohost", ":4150", "h:0", "h:port", "h:70000"):
        with pytest.raises(ValueError):
            split_address(bad)

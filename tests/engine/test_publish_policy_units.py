"""The publish policies' parts on their own: the typed validator, the token bucket, the dedup
window (``lmqd.engine.policy``, ``ratelimit``, ``dedup``).

Rules for this module: plain functions on explicit ``now`` values (no trio, no clock); the
bucket's long-run rate and the window's bound are checked with hypothesis over many schedules.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lmqd.engine.dedup import DEDUP_MAX_ENTRIES, DedupWindow, body_digest
from lmqd.engine.policy import MAX_POLICY_VALUE, PolicyError, TopicPolicy, parse_update
from lmqd.engine.ratelimit import TokenBucket
from lmqd.options import Options

# -- the validator ----------------------------------------------------------------------------


def test_publish_keys_are_typed() -> None:
    assert parse_update(
        {"max_depth": 10, "overflow": "drop_oldest", "publish_rate": 5, "publish_burst": 0,
         "dedup_window_ms": 300_000}
    ) == {"max_depth": 10, "overflow": "drop_oldest", "publish_rate": 5, "publish_burst": 0,
          "dedup_window_ms": 300_000}  # fmt: skip
    assert parse_update({"overflow": "reject"}) == {"overflow": "reject"}
    assert parse_update({"max_depth": MAX_POLICY_VALUE}) == {"max_depth": MAX_POLICY_VALUE}


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"overflow": "drop_newest"}, 'overflow must be one of "reject", "drop_oldest"'),
        ({"overflow": 1}, 'overflow must be one of "reject", "drop_oldest"'),
        ({"overflow": None}, 'overflow must be one of "reject", "drop_oldest"'),
        ({"overflow": "REJECT"}, 'overflow must be one of "reject", "drop_oldest"'),
        ({"max_depth": "10"}, "max_depth must be an integer from 0 to"),
        ({"max_depth": -1}, "max_depth must be an integer from 0 to"),
        ({"max_depth": True}, "max_depth must be an integer from 0 to"),
        ({"publish_rate": 1.5}, "publish_rate must be an integer from 0 to"),
        ({"publish_burst": 2**63}, "publish_burst must be an integer from 0 to"),
        ({"dedup_window_ms": [1]}, "dedup_window_ms must be an integer from 0 to"),
        ({"max_depth": 5, "rate": 1}, "unknown key 'rate'"),
    ],
)
def test_bad_publish_keys_are_refused_whole(doc: dict[str, object], message: str) -> None:
    with pytest.raises(PolicyError, match=message):
        parse_update(doc)


def test_effective_policy_and_when_it_gates_publishing() -> None:
    options = Options(max_depth=100, overflow="drop_oldest", publish_rate=0)
    policy = TopicPolicy.effective(options, {"publish_rate": 7, "overflow": "reject"})
    assert (policy.max_depth, policy.overflow, policy.publish_rate) == (100, "reject", 7)
    assert policy.gates_publishing
    assert not TopicPolicy.effective(Options(), {}).gates_publishing
    assert not TopicPolicy.effective(Options(), {"overflow": "drop_oldest"}).gates_publishing
    assert TopicPolicy.effective(Options(), {"dedup_window_ms": 1}).gates_publishing
    with pytest.raises(ValueError, match="overflow"):
        Options(overflow="drop_newest")


# -- the token bucket -------------------------------------------------------------------------


def test_bucket_burst_then_rate_exact_waits() -> None:
    bucket = TokenBucket(rate=4, burst=2, now=0.0)
    assert bucket.reserve([1, 1], 0.0, max_wait=1.0) == (2, 0.0)  # the burst
    assert bucket.reserve([1], 0.0, max_wait=1.0) == (1, 0.25)  # one token: 1/4 s
    assert bucket.reserve([1], 0.0, max_wait=1.0) == (1, 0.5)  # queued behind it
    assert bucket.tokens(0.0) == -2
    assert bucket.tokens(0.5) == 0
    assert bucket.tokens(10.0) == 2  # never more than the burst


def test_bucket_refuses_what_cannot_be_paid_within_the_bound_and_takes_nothing() -> None:
    bucket = TokenBucket(rate=4, burst=2, now=0.0)
    # An MPUB of 7: 5 missing = 1.25 s > 1 s: refused, the bucket untouched.
    assert bucket.reserve([7], 0.0, max_wait=1.0) == (0, 0.0)
    assert bucket.tokens(0.0) == 2
    assert bucket.retry_after(7, 0.0) == 1.25
    # A run: the prefix paid within the bound is taken, the rest is not.
    assert bucket.reserve([2, 4, 1], 0.0, max_wait=1.0) == (2, 1.0)
    assert bucket.tokens(0.0) == -4
    assert bucket.reserve([1], 0.0, max_wait=1.0) == (0, 0.0)
    assert bucket.reserve([1], 0.25, max_wait=1.0) == (1, 1.0)


@settings(max_examples=200, deadline=None)
@given(
    rate=st.integers(1, 50),
    burst=st.integers(1, 50),
    gaps=st.lists(st.integers(0, 2000), min_size=1, max_size=200),
    sizes=st.lists(st.integers(1, 20), min_size=1, max_size=200),
)
def test_bucket_never_admits_more_than_burst_plus_rate_times_time(
    rate: int, burst: int, gaps: list[int], sizes: list[int]
) -> None:
    """Whatever the schedule, what was admitted by the time its wait ends is at most the burst
    plus ``rate`` per elapsed second; and a publisher that always waits gets the full rate."""
    bucket = TokenBucket(rate, burst, 0.0)
    now = 0.0
    admitted = 0
    for gap_ms, size in zip(gaps, sizes, strict=False):
        now += gap_ms / 1000
        count, wait = bucket.reserve([size], now, max_wait=1.0)
        if count:
            admitted += size
            now += wait  # this publisher waits for its tokens before it sends again
            assert admitted <= burst + rate * now + 1e-6
    # Saturated: one message at a time, always waiting, is served at exactly the rate.
    bucket = TokenBucket(rate, burst, 0.0)
    now = 0.0
    for _ in range(burst + 10 * rate):
        count, wait = bucket.reserve([1], now, max_wait=1.0)
        assert count == 1
        now += wait
    assert now == pytest.approx(10.0)


# -- the dedup window -------------------------------------------------------------------------


def test_window_expires_exactly_at_its_length_and_is_not_renewed_by_duplicates() -> None:
    window = DedupWindow(5.0)
    pending: set[bytes] = set()
    kept, digests = window.unseen([b"a", b"b", b"a"], pending)
    assert kept == [b"a", b"b"]  # duplicates within one batch count too
    assert digests == [body_digest(b"a"), body_digest(b"b")]
    window.remember(digests, 0.0)
    window.expire(4.999)
    assert window.unseen([b"a"], set()) == ([], [])  # a duplicate: not renewed
    window.expire(5.0)
    assert len(window) == 0
    assert window.unseen([b"a"], set())[0] == [b"a"]


def test_unseen_remembers_nothing_until_told() -> None:
    window = DedupWindow(5.0)
    window.unseen([b"x"], set())
    assert len(window) == 0
    assert window.unseen([b"x"], set())[0] == [b"x"]


def test_window_is_bounded_oldest_evicted_first() -> None:
    window = DedupWindow(60.0, max_entries=3)
    for i, body in enumerate([b"1", b"2", b"3", b"4"]):
        window.remember([body_digest(body)], float(i))
    assert (len(window), window.evicted) == (3, 1)
    assert window.unseen([b"1", b"2", b"4"], set())[0] == [b"1"]  # only the oldest forgotten
    assert DEDUP_MAX_ENTRIES == 100_000


@settings(max_examples=200, deadline=None)
@given(
    batches=st.lists(st.lists(st.sampled_from([b"%d" % k for k in range(12)]), max_size=8),
                     max_size=12),
    max_entries=st.integers(1, 10),
)  # fmt: skip
def test_a_batch_remembered_at_once_is_remembered_as_one_at_a_time(
    batches: list[list[bytes]], max_entries: int
) -> None:
    """``remember`` of a list (all new and distinct: C loops; otherwise one at a time) leaves
    the window as remembering its digests one by one does: the same entries in the same
    order, the same evictions -- whatever the bound, repeats within and across batches."""
    at_once = DedupWindow(60.0, max_entries=max_entries)
    one_by_one = DedupWindow(60.0, max_entries=max_entries)
    for t, batch in enumerate(batches):
        digests = [body_digest(b) for b in batch]
        at_once.remember(digests, float(t))
        for digest in digests:
            one_by_one.remember(iter([digest]), float(t))
        assert list(at_once._order) == list(one_by_one._order)
        assert at_once._seen == one_by_one._seen == {d for _, d in one_by_one._order}
        assert at_once.evicted == one_by_one.evicted


def test_restored_entries_expire_at_their_own_times_kept_in_order() -> None:
    """An earlier run's entries (``Topic.recover_dedup``): each expires at its own time; one
    out of order (a wall-clock step back) is taken at the time before it, so expiry, which pops
    from the oldest end, never stops early."""
    window = DedupWindow(10.0, max_entries=3)
    restored = [(-8.0, body_digest(b"a")), (-2.0, body_digest(b"b")), (-5.0, body_digest(b"c")),
                (-2.0, body_digest(b"a"))]  # fmt: skip
    assert window.restore(restored) == 3  # "a" twice: once
    window.expire(1.999)
    assert window.unseen([b"a"], set())[0] == []
    window.expire(2.0)  # "a" was accepted at -8
    assert window.unseen([b"a", b"b", b"c"], set())[0] == [b"a"]
    window.expire(8.0)  # "b" and "c" (taken at -2) go together
    assert len(window) == 0
    window.restore([(float(i), body_digest(b"%d" % i)) for i in range(4)])
    assert (len(window), window.evicted) == (3, 1)


@settings(max_examples=100, deadline=None)
@given(
    events=st.lists(
        st.tuples(st.integers(0, 24), st.sampled_from([b"a", b"b", b"c", b"d"])),
        min_size=1,
        max_size=100,
    )
)
def test_window_matches_a_model(events: list[tuple[int, bytes]]) -> None:
    """A body is new iff no accepted equal body is less than the window old (model: a dict of
    acceptance times). Times are multiples of 1/8 s, exact in binary floating point."""
    window = DedupWindow(2.0)
    accepted_at: dict[bytes, float] = {}
    now = 0.0
    for eighths, body in events:
        now += eighths / 8
        window.expire(now)
        kept, digests = window.unseen([body], set())
        expected_new = body not in accepted_at or now - accepted_at[body] >= 2.0
        assert (kept == [body]) == expected_new
        if kept:
            window.remember(digests, now)
            accepted_at[body] = now

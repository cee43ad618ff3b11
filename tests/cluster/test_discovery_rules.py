"""``lmq_client.lookupd``'s pure parts: lookupd URLs, the poll schedule and ``Discovery``.

Rules for this module: no trio, no sockets; times are passed in; randomness comes from a
``random.Random`` whose ``random()`` is fixed, so every expected time is exact.
"""

from __future__ import annotations

import itertools
import random

import pytest

from lmq_client.backoff import Backoff
from lmq_client.lookupd import DROP_AFTER_MISSES, Discovery, lookupd_url, poll_times

EXACT = Backoff(base=1.0, max_delay=8.0, jitter=0.0)


class Fixed(random.Random):
    """``random()`` always returns ``value``."""

    def __init__(self, value: float) -> None:
        super().__init__(0)
        self.value = value

    def random(self) -> float:
        return self.value


@pytest.mark.parametrize(
    ("address", "path", "params", "url"),
    [
        ("127.0.0.1:4161", "/lookup", {"topic": "t"}, "http://127.0.0.1:4161/lookup?topic=t"),
        ("[::1]:4161", "/nodes", None, "http://[::1]:4161/nodes"),
        ("http://lookupd:4161", "/lookup", {"topic": "a#ephemeral"},
         "http://lookupd:4161/lookup?topic=a%23ephemeral"),
        ("http://lookupd:4161/", "/lookup", None, "http://lookupd:4161/lookup"),
        # a URL's own path replaces /lookup (pynsq, go-nsq), and only /lookup
        ("https://proxy/nsq/lookup", "/lookup", {"topic": "t"},
         "https://proxy/nsq/lookup?topic=t"),
        ("https://proxy/nsq/lookup", "/nodes", None, "https://proxy/nodes"),
    ],
)  # fmt: skip
def test_lookupd_urls(address: str, path: str, params: dict[str, str] | None, url: str) -> None:
    assert lookupd_url(address, path, params) == url


@pytest.mark.parametrize("address", ["lookupd", "ftp://lookupd:21", "::1:4161", "http://"])
def test_bad_lookupd_addresses(address: str) -> None:
    with pytest.raises(ValueError, match="invalid"):
        lookupd_url(address)


def test_poll_times_are_go_nsqs() -> None:
    # at once; then after jitter * interval * random() plus one interval; then every interval
    times = list(itertools.islice(poll_times(100.0, 60.0, 0.3, Fixed(0.5)), 4))
    assert times == [100.0, 169.0, 229.0, 289.0]
    assert list(itertools.islice(poll_times(0.0, 10.0, 0.0, Fixed(0.9)), 3)) == [0, 10, 20]


def test_new_producers_are_connected_once() -> None:
    discovery = Discovery(interval=60, jitter=0.3, rng=Fixed(0.0), start=5.0)
    assert discovery.next_poll_at == 5.0
    discovery.polled(5.0)
    assert discovery.next_poll_at == 65.0
    assert discovery.answered(5.0, ["a:1", "b:1"]) == (["a:1", "b:1"], [])
    discovery.connected("a:1")
    discovery.connected("b:1")
    discovery.polled(65.0)
    assert discovery.answered(65.0, ["a:1", "b:1", "c:1"]) == (["c:1"], [])
    assert discovery.next_poll_at == 125.0


def test_a_producer_is_dropped_after_missing_from_consecutive_answers() -> None:
    assert DROP_AFTER_MISSES == 2
    discovery = Discovery(rng=Fixed(0.0))
    discovery.answered(0.0, ["a:1", "b:1"])
    assert discovery.answered(60.0, ["b:1"]) == ([], [])  # one miss: maybe a fresh lookupd
    assert discovery.answered(120.0, ["a:1", "b:1"]) == ([], [])  # back: the count restarts
    assert discovery.answered(180.0, ["b:1"]) == ([], [])
    assert discovery.answered(240.0, []) == ([], ["a:1"])
    discovery.connection_ended("a:1", 240.0, dropped=True)
    assert discovery.next_poll_at == 0.0  # no early poll for a dropped one
    assert discovery.answered(300.0, []) == ([], ["b:1"])


def test_no_answer_changes_nothing() -> None:
    discovery = Discovery(rng=Fixed(0.0))
    discovery.answered(0.0, ["a:1"])
    for now in (60.0, 120.0, 180.0):
        assert discovery.answered(now, None) == ([], [])
    assert discovery.producers == {"a:1"}
    assert discovery.active == {"a:1"}


def test_an_ended_connection_is_requeried_after_its_backoff_and_redialled_only_if_listed() -> None:
    discovery = Discovery(interval=60, jitter=0, reconnect_backoff=EXACT, rng=Fixed(0.0))
    discovery.polled(0.0)
    discovery.answered(0.0, ["a:1", "b:1"])
    discovery.connected("a:1")
    discovery.connection_ended("a:1", 10.0)
    assert discovery.next_poll_at == 11.0  # an early query, 1 s (the first backoff) later
    discovery.polled(11.0)
    assert discovery.next_poll_at == 60.0
    assert discovery.answered(11.0, ["a:1", "b:1"]) == (["a:1"], [])  # still listed: redial
    discovery.connection_ended("a:1", 11.5)  # it failed again: 2 s this time
    assert discovery.next_poll_at == 13.5
    discovery.polled(13.5)
    assert discovery.answered(13.5, ["b:1"]) == ([], [])  # no longer listed: not redialled
    assert discovery.active == {"b:1"}


def test_a_producer_in_backoff_waits_for_it_even_if_a_regular_poll_comes_first() -> None:
    discovery = Discovery(interval=60, jitter=0, reconnect_backoff=EXACT, rng=Fixed(0.0))
    discovery.polled(0.0)
    discovery.answered(0.0, ["a:1"])
    for failures in range(1, 5):  # four failures in a row, each redialled after 1, 2, 4, 8 s
        discovery.connection_ended("a:1", 59.0)
        redial_at = 59.0 + 2.0 ** (failures - 1)
        assert discovery.answered(redial_at - 0.5, ["a:1"]) == ([], [])
        assert discovery.answered(redial_at, ["a:1"]) == (["a:1"], [])
    assert discovery.next_poll_at == 60.0  # the earliest early poll was never taken
    discovery.polled(60.0)
    discovery.connection_ended("a:1", 60.0)  # the fifth: 8 s, the cap
    assert discovery.answered(60.0, ["a:1"]) == ([], [])  # a poll in the meantime: no redial
    assert discovery.next_poll_at == 68.0
    assert discovery.answered(68.0, ["a:1"]) == (["a:1"], [])


@pytest.mark.parametrize(("interval", "jitter"), [(0.0, 0.3), (60.0, 1.5), (60.0, -0.1)])
def test_bad_schedule_settings(interval: float, jitter: float) -> None:
    with pytest.raises(ValueError, match="lookupd poll"):
        Discovery(interval=interval, jitter=jitter)

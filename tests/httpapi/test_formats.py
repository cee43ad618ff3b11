"""The HTTP layer's pure pieces: Go-compatible encodings and nsqd's text formats.

Rules for this module (STYLE.md):
- No sockets and no daemon: functions are called with values; the expected strings are what Go
  and nsqd produce (``time.Duration.String``, ``encoding/json``, ``url.ParseQuery``,
  ``stringy.NanoSecondToHuman``, ``printStats``), written out by hand.
"""

from __future__ import annotations

import datetime

import pytest

from lmqd.gohttp import QueryError, parse_query
from lmqd.httpapi.asgi import go_json
from lmqd.httpapi.config_api import get_option
from lmqd.httpapi.stats_text import format_stats, go_duration, nanoseconds_to_human, rfc3339
from lmqd.memory import MEMORY_KEYS, _percentile, memory_stats, track_gc_pauses
from lmqd.options import Options
from lmqd.stats import ChannelStats, E2eLatency, Percentile, TopicStats


@pytest.mark.parametrize(
    ("ns", "text"),
    [
        (0, "0s"),
        (1, "1ns"),
        (999, "999ns"),
        (1_500, "1.5µs"),
        (250_000_000, "250ms"),
        (1_000_000_000, "1s"),
        (1_500_000_000, "1.5s"),
        (60_000_000_000, "1m0s"),
        (3_723_500_000_000, "1h2m3.5s"),
        (3_600_000_000_000, "1h0m0s"),
        (-2_000_000_000, "-2s"),
        (90 * 60 * 1_000_000_000 + 1, "1h30m0.000000001s"),
    ],
)
def test_go_duration(ns: int, text: str) -> None:
    assert go_duration(ns) == text


@pytest.mark.parametrize(
    ("ns", "text"),
    [(0.0, "0.0ns"), (1000.0, "1000.0ns"), (1500.0, "1.5us"), (2_345_678.0, "2.3ms"),
     (1_000_000_000.0, "1000.0ms"), (12_340_000_000.0, "12.3s")],
)
def test_nanoseconds_to_human(ns: float, text: str) -> None:
    assert nanoseconds_to_human(ns) == text


def test_rfc3339_is_local_time_with_z_for_utc() -> None:
    text = rfc3339(1_700_000_000)
    local = datetime.datetime.fromtimestamp(1_700_000_000).astimezone()
    if local.utcoffset() == datetime.timedelta(0):
        assert text == "2023-11-14T22:13:20Z"
    else:
        assert datetime.datetime.fromisoformat(text).timestamp() == 1_700_000_000


def test_go_json() -> None:
    doc = {"value": 1_234_567.0, "quantile": 0.99, "one": 1.0, "n": [2.0, 2.5], "s": "<é>",
           "none": None, "big": 1e21}
    assert go_json(doc) == (
        '{"value":1234567,"quantile":0.99,"one":1,"n":[2,2.5],"s":"<é>","none":null,'
        '"big":1e+21}'
    ).encode()


def test_parse_query_as_go() -> None:
    assert parse_query(b"topic=a&channel=b+c&topic=z&flag&=v&&x=%41") == {
        "topic": ["a", "z"], "channel": ["b c"], "flag": [""], "": ["v"], "x": ["A"],
    }
    assert parse_query(b"") == {}
    for bad in (b"topic=%zz", b"topic=a;b", b"a=1&b=%", b"%4=1"):
        with pytest.raises(QueryError):
            parse_query(bad)


def test_config_values_are_go_json_values() -> None:
    options = Options(log_level="warn", tls_required="tcp-https", tls_min_version="tls1.2",
                      max_req_timeout=1.5, nsqlookupd_tcp_addresses=("a:1",))
    assert get_option(options, "log_level") == 3
    assert get_option(options, "tls_required") == 1
    assert get_option(options, "tls_min_version") == 0x0303
    assert get_option(options, "max_req_timeout") == 1_500_000_000
    assert get_option(options, "nsqlookupd_tcp_addresses") == ["a:1"]
    assert get_option(options, "durable") is False


def test_memory_block_keys_and_pause_percentiles() -> None:
    # nsqd's percentile(): index floor(p/100 * n + 0.5), clamped.
    ordered = list(range(10, 110, 10))  # 10 values
    assert [_percentile(p, ordered) for p in (100.0, 99.0, 95.0, 50.0)] == [100, 100, 100, 60]
    assert _percentile(99.0, []) == 0
    with track_gc_pauses():
        import gc

        gc.collect()
        stats = memory_stats()
    assert list(stats) == list(MEMORY_KEYS)
    assert stats["gc_pause_usec_100"] >= stats["gc_pause_usec_99"] >= stats["gc_pause_usec_95"]
    assert stats["gc_total_runs"] >= 1
    assert stats["heap_in_use_bytes"] > 0


def test_text_stats_with_e2e_percentiles() -> None:
    e2e = E2eLatency(count=3, percentiles=(Percentile(quantile=0.5, value=1_500.0),
                                           Percentile(quantile=0.99, value=2_345_678.0)))
    channel = ChannelStats(
        channel_name="c", depth=1, backend_depth=0, in_flight_count=0, deferred_count=0,
        message_count=4, requeue_count=2, timeout_count=1, client_count=0, clients=(),
        paused=False, e2e_processing_latency=e2e,
    )
    topic = TopicStats(
        topic_name="a-rather-long-topic-name", channels=(channel,), depth=12345678,
        backend_depth=7, message_count=4, message_bytes=40, paused=False,
        e2e_processing_latency=e2e,
    )
    text = format_stats(topics=[topic], producers=[], memory=None, health="OK",
                        start_time=1_700_000_000, now=1_700_003_723.5)
    lines = text.split("\n")
    assert lines[2] == "uptime 1h2m3.5s"
    assert lines[3:] == [
        "", "Health: OK", "", "Topics:",
        # %-15s and %-5d only pad: longer values push the columns right, as in Go
        "   [a-rather-long-topic-name] depth: 12345678 be-depth: 7     msgs: 4        "
        "e2e%: 1.5us, 2.3ms",
        "      [c                        ] depth: 1     be-depth: 0     inflt: 0    def: 0    "
        "re-q: 2     timeout: 1     msgs: 4        e2e%: 1.5us, 2.3ms",
        "", "Producers: None", "",
    ]

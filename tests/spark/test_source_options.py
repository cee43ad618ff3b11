"""The source's options, offsets and batch planning, without Spark: ``SourceOptions.parse``,
``SourceOffsets``, ``NodeSpellings`` and ``planner.plan_batch`` / ``split_ranges`` as tables.

Rules for this module: no SparkSession and no daemon; only pure functions and value classes.
"""

from __future__ import annotations

import pickle
from typing import Any

import pytest

from lmq_client.spark import SourceOptions
from lmq_client.spark.nodes import NodeSpellings, same_host
from lmq_client.spark.offsets import EARLIEST, LATEST, SourceOffsets
from lmq_client.spark.planner import Known, Loss, Range, plan_batch, split_ranges, spread
from lmq_client.spark.source_options import (
    DEFAULT_MAX_TRIGGER_DELAY_S,
    EARLIEST_BOUND,
    LATEST_BOUND,
    Bound,
    parse_duration,
)

A = "127.0.0.1:4151"
B = "127.0.0.1:4161"


def parse(**given: str) -> SourceOptions:
    return SourceOptions.parse(given)


def test_defaults_are_kafkas() -> None:
    options = parse(address="127.0.0.1:4150", subscribe="orders")
    assert options == SourceOptions(addresses=("127.0.0.1:4150",), topics=("orders",))
    assert (options.fail_on_data_loss, options.include_headers) == (True, False)
    assert options.max_trigger_delay_s == DEFAULT_MAX_TRIGGER_DELAY_S == 900
    assert (options.starting, options.ending, options.time_strategy) == (None, None, "error")
    assert pickle.loads(pickle.dumps(options)) == options  # it travels to the executors


def test_addresses_of_three_kinds_in_any_combination() -> None:
    options = parse(ADDRESS="h:4150, g:4150", httpAddress="h:4151", lookupdHttpAddress="l:4161",
                    topic="t")  # fmt: skip
    assert options.addresses == ("h:4150", "g:4150")
    assert (options.http_addresses, options.lookupd_addresses) == (("h:4151",), ("l:4161",))


def test_topics_one_of_three_ways() -> None:
    assert parse(address="h:1", subscribe="a, b,a").topics == ("a", "b")
    assert parse(address="h:1", topic="a").topics == ("a",)
    pattern = parse(address="h:1", subscribePattern="orders-.*")
    assert (pattern.topics, pattern.pattern) == ((), "orders-.*")
    assert pattern.reads("orders-eu") and not pattern.reads("x-orders-eu")
    assert pattern.described == "topics matching 'orders-.*'"
    assert parse(address="h:1", subscribe="a,b").described == "topics 'a', 'b'"


def test_read_limits_and_synonyms() -> None:
    options = parse(address="h:1", topic="t", maxOffsetsPerTrigger="30",
                    minOffsetsPerTrigger="10", maxTriggerDelay="30s", minPartitions="4",
                    maxRecordsPerPartition="500")  # fmt: skip
    assert (options.max_per_trigger, options.min_per_trigger) == (30, 10)
    assert (options.max_trigger_delay_s, options.min_partitions, options.partition_size) == (
        30.0, 4, 500,
    )
    assert parse(address="h:1", topic="t", maxMessagesPerTrigger="7").max_per_trigger == 7
    assert parse(address="h:1", topic="t", partitionSize="9").partition_size == 9


@pytest.mark.parametrize(
    ("raw", "seconds"),
    [("15m", 900.0), ("30s", 30.0), ("500ms", 0.5), ("250", 0.25), ("1h", 3600.0),
     ("2 min", 120.0), ("1d", 86400.0)],
)  # fmt: skip
def test_durations_as_spark_writes_them(raw: str, seconds: float) -> None:
    assert parse_duration(raw, "maxTriggerDelay") == seconds


def test_positions_by_offset_time_and_kafkas_precedence() -> None:
    offsets = parse(address="h:1", subscribe="a,b",
                    startingOffsets='{"a": {"h:4151": 5, "g:4151": -2}, "b": {"h:4151": -1}}',
                    endingOffsets='{"a": {"h:4151": 9}}')  # fmt: skip
    assert offsets.starting == Bound("offsets", {"a": {"h:4151": 5, "g:4151": EARLIEST},
                                                 "b": {"h:4151": LATEST}})  # fmt: skip
    assert offsets.ending == Bound("offsets", {"a": {"h:4151": 9}})
    # One topic: the older {"node": offset} shape is still taken.
    assert parse(address="h:1", topic="t", startingOffsets='{"h:4151": 3}').starting == Bound(
        "offsets", {"t": {"h:4151": 3}}
    )
    assert parse(address="h:1", topic="t", startingOffsets="earliest").starting is EARLIEST_BOUND
    assert parse(address="h:1", topic="t", endingOffsets=" latest ").ending is LATEST_BOUND
    times = parse(address="h:1", topic="t", startingOffsetsByTimestamp='{"t": {"h:1": 1000}}',
                  endingTimestamp="2000", startingOffsetsByTimestampStrategy="LATEST")
    assert times.starting == Bound("times", {"t": {"h:1": 1000}})
    assert times.ending == Bound("time", time_ms=2000)
    assert times.time_strategy == "latest"
    # Kafka: startingTimestamp before startingOffsetsByTimestamp before startingOffsets.
    both = parse(address="h:1", topic="t", startingTimestamp="5", startingOffsets="earliest",
                 startingOffsetsByTimestamp='{"t": {"h:1": 1}}')  # fmt: skip
    assert both.starting == Bound("time", time_ms=5)


def test_a_pattern_takes_offsets_of_any_topic_it_may_match() -> None:
    options = parse(address="h:1", subscribePattern="o.*", startingOffsets='{"x": {"h:1": 2}}')
    assert options.starting == Bound("offsets", {"x": {"h:1": 2}})


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"topic": "t"}, "option 'address' is required"),
        ({"address": "x", "topic": "t"}, "option 'address': invalid address 'x'"),
        ({"httpAddress": "x:1,y", "topic": "t"}, "option 'httpAddress': invalid address 'y'"),
        ({"lookupdHttpAddress": "ftp://l:1", "topic": "t"}, "option 'lookupdHttpAddress'"),
        ({"address": "x:1"}, "give one of 'subscribe'"),
        ({"address": "x:1", "topic": "a", "subscribe": "b"},
         "give one of .* not 'topic' and 'subscribe'"),
        ({"address": "x:1", "subscribe": "ok,bad name"}, "option 'subscribe': invalid topic"),
        ({"address": "x:1", "subscribePattern": "(["}, "not a regular expression"),
        ({"address": "x:1", "topic": "t", "bodyColumn": "v"}, "unknown option 'bodyColumn'"),
        ({"address": "x:1", "topic": "t", "kafka.bootstrap.servers": "k:9092"},
         "option 'kafka.bootstrap.servers' is Kafka's: use 'address'"),
        ({"address": "x:1", "topic": "t", "kafka.security.protocol": "SSL"},
         "is Kafka's: Kafka client settings have no lmq meaning"),
        ({"address": "x:1", "assign": '{"t": [0]}'}, "option 'assign' is Kafka's"),
        ({"address": "x:1", "topic": "t", "startingOffsets": "soon"}, "earliest, latest or"),
        ({"address": "x:1", "topic": "t", "startingOffsets": '{"t": {"nope": 1}}'},
         "option 'startingOffsets': invalid address 'nope'"),
        ({"address": "x:1", "topic": "t", "startingOffsets": '{"u": {"h:1": 1}}'},
         "names topic 'u', which the query does not read"),
        ({"address": "x:1", "subscribe": "a,b", "startingOffsets": '{"h:1": 1}'},
         "must name topics"),
        ({"address": "x:1", "topic": "t", "startingOffsets": '{"t": {"h:1": -3}}'},
         "is not an integer of at least -2"),
        ({"address": "x:1", "topic": "t", "endingOffsets": '{"t": {"h:1": -2}}'},
         "-2 \\(earliest\\) cannot be an end"),
        ({"address": "x:1", "topic": "t", "startingTimestamp": "yesterday"},
         "'startingTimestamp' must be an integer"),
        ({"address": "x:1", "topic": "t", "startingOffsetsByTimestamp": '{"t": {"h:1": -1}}'},
         "is not an integer of at least 0"),
        ({"address": "x:1", "topic": "t", "startingOffsetsByTimestampStrategy": "skip"},
         "must be error or latest"),
        ({"address": "x:1", "topic": "t", "maxOffsetsPerTrigger": "0"}, "at least 1"),
        ({"address": "x:1", "topic": "t", "maxOffsetsPerTrigger": "1",
          "maxMessagesPerTrigger": "1"}, "not both"),
        ({"address": "x:1", "topic": "t", "maxTriggerDelay": "soon"}, "a duration such as"),
        ({"address": "x:1", "topic": "t", "failOnDataLoss": "yes"}, "must be true or false"),
        ({"address": "x:1", "topic": "t", "lookupdPollIntervalMs": "-5"}, "at least 0"),
        ({"address": "x:1", "topic": "t", "timeout": "0"}, "must be positive"),
    ],
)
def test_a_bad_option_is_one_line_naming_it(given: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message) as info:
        SourceOptions.parse(given)
    text = str(info.value)
    assert text.startswith("lmq source: ") and "\n" not in text


# -- offsets --------------------------------------------------------------------------------


def test_offsets_round_trip_and_read_an_older_checkpoint() -> None:
    offsets = SourceOffsets({"b": {B: 2, A: 1}, "a": {A: 0}}, {"a": {A: 470}})
    doc = offsets.to_json()
    assert list(doc) == ["a", "b", "#lost"] and list(doc["b"]) == [A, B]
    assert SourceOffsets.from_json(doc, ["a", "b"]) == offsets
    assert SourceOffsets({"a": {A: 1}}).to_json() == {"a": {A: 1}}  # no #lost without losses
    # Written by the source before subscribe existed: {node: offset} of the one topic.
    assert SourceOffsets.from_json({A: 7}, ["t"]) == SourceOffsets({"t": {A: 7}})
    with pytest.raises(ValueError, match="older lmq source"):
        SourceOffsets.from_json({A: 7}, ["t", "u"])


def test_spellings_of_one_node() -> None:
    assert same_host("localhost", "127.0.0.1") and same_host("LOCALHOST", "localhost")
    assert not same_host("127.0.0.1", "127.0.0.2")
    spellings = NodeSpellings([A], also={"127.0.0.1:4150": A})
    for key in (A, "localhost:4151", "127.0.0.1:4150", "localhost:4150"):
        assert spellings.node_of(key) == A, key
    for key in ("127.0.0.1:4152", "10.9.9.9:4151", "not-an-address"):
        assert spellings.node_of(key) is None, key
    offsets = SourceOffsets(
        {"t": {"localhost:4151": 5, "10.9.9.9:1": 3}}, {"t": {"localhost:4150": 2}}
    )
    assert offsets.respelled(spellings) == SourceOffsets(
        {"t": {A: 5, "10.9.9.9:1": 3}}, {"t": {A: 2}}
    )


# -- planning ---------------------------------------------------------------------------------


def earliest(topic: str, node: str, known: Known) -> int:
    return known.earliest


def plan(start: dict[str, Any], known: dict[tuple[str, str], Known | None], **kw: Any) -> Any:
    return plan_batch(SourceOffsets(start), known, new_start=earliest, **kw)


def test_a_batch_reads_to_every_end() -> None:
    p = plan({"t": {A: 3, B: 0}}, {("t", A): Known(0, 10), ("t", B): Known(0, 4)})
    assert p.end == SourceOffsets({"t": {A: 10, B: 4}})
    assert (p.begins, p.losses, p.latest) == ({("t", A): 3, ("t", B): 0}, [],
                                              {"t": {A: 10, B: 4}})  # fmt: skip


def test_a_node_not_asked_or_not_answering_keeps_its_offset() -> None:
    p = plan({"t": {A: 3, B: 7}}, {("t", A): None})
    assert p.end == SourceOffsets({"t": {A: 3, B: 7}}) and p.begins == {}


def test_a_new_pair_joins_at_its_start_and_is_read_from_the_next_batch() -> None:
    p = plan({"t": {A: 3}}, {("t", A): Known(0, 5), ("t", B): Known(2, 9), ("u", A): Known(0, 1)})
    assert p.end == SourceOffsets({"t": {A: 5, B: 2}, "u": {A: 0}})
    assert ("t", B) not in p.begins
    # startingOffsets naming a new pair wins over its earliest
    named = plan_batch(SourceOffsets({}), {("t", B): Known(2, 9)},
                       new_start=lambda t, n, k: 6)  # fmt: skip
    assert named.end == SourceOffsets({"t": {B: 6}})


def test_offsets_below_the_earliest_are_a_loss_counted_when_asked() -> None:
    start = {"t": {A: 50}}
    p = plan(start, {("t", A): Known(520, 550)})
    assert p.losses == [Loss("t", A, 50, 520)]
    assert p.begins == {("t", A): 520} and p.end == SourceOffsets({"t": {A: 550}})
    assert p.losses[0].count == 470
    assert p.losses[0].describe() == (
        f"topic 't' on {A}: offsets 50..519 (470 messages) are no longer stored (retention, an "
        "emptied topic, or never written) and were not read"
    )
    counted = plan_batch(SourceOffsets(start, {"t": {A: 5}}), {("t", A): Known(520, 550)},
                         new_start=earliest, count_losses=True)  # fmt: skip
    assert counted.end == SourceOffsets({"t": {A: 550}}, {"t": {A: 475}})


def test_offsets_that_went_back_are_a_loss_of_unknown_size() -> None:
    p = plan({"t": {A: 500}}, {("t", A): Known(0, 30)})
    assert p.losses == [Loss("t", A, 500, None)] and p.losses[0].count == 0
    assert "went back below 500" in p.losses[0].describe()
    assert p.begins == {("t", A): 0} and p.end == SourceOffsets({"t": {A: 30}})


def test_max_rows_are_spread_by_backlog_without_starving_a_pair() -> None:
    p = plan({"t": {A: 0, B: 0}}, {("t", A): Known(0, 90), ("t", B): Known(0, 10)}, max_rows=30)
    assert p.end == SourceOffsets({"t": {A: 27, B: 3}})
    # Past a loss the limit counts from the earliest offset, not from the lost start.
    lost = plan({"t": {A: 50}}, {("t", A): Known(520, 600)}, max_rows=30)
    assert lost.end == SourceOffsets({"t": {A: 550}})
    assert spread({("t", A): 1000, ("t", B): 1}, 10) == {("t", A): 9, ("t", B): 1}
    assert spread({("t", A): 5}, 10) == {("t", A): 5}


def test_min_rows_hold_a_batch_until_enough_wait_or_the_delay_passed() -> None:
    start = {"t": {A: 0}}
    known = {("t", A): Known(0, 5)}
    held = plan(start, known, min_rows=10, delay_passed=False)
    assert held.held and held.end == SourceOffsets(start)
    assert not plan(start, known, min_rows=10, delay_passed=True).held
    assert not plan(start, known, min_rows=5, delay_passed=False).held
    # A loss is never held back.
    lossy = plan({"t": {A: 0}}, {("t", A): Known(2, 5)}, min_rows=10, delay_passed=False)
    assert not lossy.held and lossy.losses


def test_available_now_reads_to_its_target_then_plans_the_start() -> None:
    target = {("t", A): 10}
    known = {("t", A): Known(0, 25), ("t", B): Known(0, 5)}  # B appeared after the target
    first = plan({"t": {A: 0}}, known, target=target, max_rows=4)
    assert first.end == SourceOffsets({"t": {A: 4}})
    last = plan({"t": {A: 8}}, known, target=target, max_rows=4)
    assert last.end == SourceOffsets({"t": {A: 10}})
    done = plan({"t": {A: 10}}, known, target=target, max_rows=4)
    assert done.end == SourceOffsets({"t": {A: 10}})


def test_ranges_are_cut_by_size_and_minimum_count() -> None:
    ranges = {("t", A): (0, 5), ("t", B): (3, 3), ("u", A): (10, 12)}
    assert split_ranges(ranges, 2) == [
        Range("t", A, 0, 2), Range("t", A, 2, 4), Range("t", A, 4, 5), Range("u", A, 10, 12),
    ]
    assert len(split_ranges(ranges, 100, min_partitions=7)) == 7  # 7 offsets, 1 each
    assert split_ranges({}, 10, min_partitions=3) == []

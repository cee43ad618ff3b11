"""SinkOptions: parsing ``.option(...)`` strings and resolving columns (no Spark session needed)."""

from __future__ import annotations

import pickle

import pytest
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    DoubleType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
)

from lmq_client.spark import SinkOptions
from lmq_client.spark.options import (
    DEFAULT_BATCH_BYTES,
    DEFAULT_BATCH_SIZE,
    DEFAULT_RETRY_TIMEOUT_MS,
)

SCHEMA = StructType([
    StructField("id", LongType()),
    StructField("Body", StringType()),
    StructField("raw", BinaryType()),
    StructField("delay", IntegerType()),
    StructField("score", DoubleType()),
])


def test_minimum_options_and_defaults() -> None:
    options = SinkOptions.parse({"address": "127.0.0.1:4150", "topic": "events"})
    assert options == SinkOptions(addresses=("127.0.0.1:4150",), topic="events")
    assert options.body_column is None
    assert options.batch_size == DEFAULT_BATCH_SIZE == 1000
    assert options.batch_bytes == DEFAULT_BATCH_BYTES == 5 * 1024 * 1024
    assert options.defer_ms == 0
    assert options.timeout_s == 10.0
    assert options.retry_timeout_s == DEFAULT_RETRY_TIMEOUT_MS / 1000 == 30.0


def test_every_option_any_case() -> None:
    options = SinkOptions.parse({
        "ADDRESS": " 127.0.0.1:4150, 127.0.0.1:4250 ,",
        "Topic": "events#ephemeral",
        "bodycolumn": "Body",
        "BatchSize": "50",
        "batchbytes": "4096",
        "DEFERMS": "2500",
        "deferColumn": "delay",
        "timeout": "2.5",
        "RETRYTIMEOUTMS": "1500",
        "checkpointLocation": "/tmp/ck",  # Spark's own option, passed to every sink
        "path": "ignored",
    })
    assert options == SinkOptions(
        addresses=("127.0.0.1:4150", "127.0.0.1:4250"),
        topic="events#ephemeral",
        body_column="Body",
        batch_size=50,
        batch_bytes=4096,
        defer_ms=2500,
        defer_column="delay",
        timeout_s=2.5,
        retry_timeout_s=1.5,
    )


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"topic": "t"}, "option 'address' is required"),
        ({"address": " ", "topic": "t"}, "option 'address' is required"),
        ({"address": "localhost", "topic": "t"}, "option 'address': invalid address 'localhost'"),
        ({"address": "h:99999", "topic": "t"}, "invalid address 'h:99999'"),
        ({"address": ",", "topic": "t"}, "option 'address': no daemon address given"),
        ({"address": "h:1", "topic": "bad topic"}, "option 'topic': invalid topic name"),
        ({"address": "h:1", "topic": "t" * 65}, "option 'topic': invalid topic name"),
        ({"address": "h:1", "topic": "t", "batchSize": "0"},
         "option 'batchSize' must be at least 1, not 0"),
        ({"address": "h:1", "topic": "t", "batchSize": "ten"},
         "option 'batchSize' must be an integer, not 'ten'"),
        ({"address": "h:1", "topic": "t", "deferMs": "-1"},
         "option 'deferMs' must be at least 0, not -1"),
        ({"address": "h:1", "topic": "t", "timeout": "0"}, "option 'timeout' must be positive"),
        ({"address": "h:1", "topic": "t", "timeout": "soon"},
         "option 'timeout' must be a number, not 'soon'"),
        ({"address": "h:1", "topic": "t", "bodyColumn": "x", "deferColumn": "x"},
         "bodyColumn and deferColumn must be different columns"),
        ({"address": "h:1", "topic": "t", "adress": "h:2"}, "unknown option 'adress' (known: "),
        ({"address": "h:1", "topic": "t", "retryTimeoutMs": "-1"},
         "option 'retryTimeoutMs' must be at least 0, not -1"),
    ],
)
def test_bad_options_are_refused_with_the_option_named(
    given: dict[str, str], message: str
) -> None:
    with pytest.raises(ValueError) as info:
        SinkOptions.parse(given)
    assert str(info.value).startswith("lmq sink: ")
    assert message in str(info.value)


def test_unknown_option_lists_the_known_ones_but_not_sparks() -> None:
    with pytest.raises(ValueError) as info:
        SinkOptions.parse({"address": "h:1", "topic": "t", "bodycol": "x"})
    assert str(info.value) == (
        "lmq sink: unknown option 'bodycol' (known: address, authSecret, batchBytes, batchSize, "
        "bodyColumn, dedupIds, deferColumn, deferMs, deflate, deflateLevel, headersColumn, "
        "lookupdHttpAddress, priorityColumn, retryTimeoutMs, snappy, timeout, tls, tlsCert, "
        "tlsInsecureSkipVerify, tlsKey, tlsRootCaFile, topic, ttlColumn)"
    )


def test_columns_resolve_to_the_schemas_spelling() -> None:
    options = SinkOptions.parse(
        {"address": "h:1", "topic": "t", "bodyColumn": "body", "deferColumn": "DELAY"}
    )
    resolved = options.resolve_columns(SCHEMA)
    assert (resolved.body_column, resolved.defer_column) == ("Body", "delay")
    binary = SinkOptions(addresses=("h:1",), topic="t", body_column="raw")
    assert binary.resolve_columns(SCHEMA).body_column == "raw"
    no_columns = SinkOptions(addresses=("h:1",), topic="t")
    assert no_columns.resolve_columns(SCHEMA) == no_columns


def test_a_string_or_binary_value_column_is_the_body_unless_body_column_says_otherwise() -> None:
    # Kafka's sink's habit: ``value`` is the body; JSON rows only when there is no body column.
    options = SinkOptions(addresses=("h:1",), topic="t")
    for kind in (StringType(), BinaryType()):
        schema = StructType([StructField("key", StringType()), StructField("Value", kind)])
        assert options.resolve_columns(schema).body_column == "Value"
    chosen = SinkOptions(addresses=("h:1",), topic="t", body_column="key")
    schema = StructType([StructField("key", StringType()), StructField("value", StringType())])
    assert chosen.resolve_columns(schema).body_column == "key"
    # a number called value (a metric) is data: the row goes as JSON
    metric = StructType([StructField("name", StringType()), StructField("value", DoubleType())])
    assert options.resolve_columns(metric).body_column is None


def test_without_a_topic_option_a_string_topic_column_routes_rows() -> None:
    options = SinkOptions.parse({"address": "h:1"})
    assert (options.topic, options.topic_column) == ("", None)
    schema = StructType([StructField("Topic", StringType()), StructField("value", BinaryType())])
    resolved = options.resolve_columns(schema)
    assert (resolved.topic_column, resolved.body_column) == ("Topic", "value")
    assert resolved.described_topic == "topics from column 'Topic'"
    # the option wins: the column is then just data
    fixed = SinkOptions.parse({"address": "h:1", "topic": "t"}).resolve_columns(schema)
    assert (fixed.topic_column, fixed.described_topic) == (None, "topic 't'")
    with pytest.raises(ValueError) as info:
        options.resolve_columns(SCHEMA)
    assert str(info.value) == (
        "lmq sink: option 'topic' is required, or a string column 'topic' that names each row's "
        "topic (columns: id, Body, raw, delay, score)"
    )
    numbered = StructType([StructField("topic", LongType())])
    with pytest.raises(ValueError, match="column 'topic' routes rows without a 'topic' option "
                       "and must be a string column, not bigint"):  # fmt: skip
        options.resolve_columns(numbered)
    both = SinkOptions(addresses=("h:1",), body_column="topic")
    with pytest.raises(ValueError, match="cannot be both the topic and the body"):
        both.resolve_columns(StructType([StructField("topic", StringType())]))


def test_an_exact_match_wins_over_case_folding() -> None:
    schema = StructType([StructField("v", StringType()), StructField("V", BinaryType())])
    options = SinkOptions(addresses=("h:1",), topic="t", body_column="V")
    assert options.resolve_columns(schema).body_column == "V"
    with pytest.raises(ValueError, match="bodyColumn 'v2' is not a column"):
        SinkOptions(addresses=("h:1",), topic="t", body_column="v2").resolve_columns(schema)
    folded = StructType([StructField("v", StringType()), StructField("V", StringType())])
    with pytest.raises(ValueError, match=r"bodyColumn 'x' is not a column \(columns: v, V\)"):
        SinkOptions(addresses=("h:1",), topic="t", body_column="x").resolve_columns(folded)
    upper = StructType([StructField("aB", StringType()), StructField("Ab", StringType())])
    with pytest.raises(ValueError, match="bodyColumn 'ab' is ambiguous"):
        SinkOptions(addresses=("h:1",), topic="t", body_column="ab").resolve_columns(upper)


@pytest.mark.parametrize(
    ("body", "defer", "message"),
    [
        ("missing", None, "lmq sink: bodyColumn 'missing' is not a column (columns: id, Body,"),
        ("score", None, "bodyColumn 'score' must be a string or binary column, not double"),
        (None, "score", "deferColumn 'score' must be an integer column (milliseconds), not double"),
        (None, "Body", "deferColumn 'Body' must be an integer column (milliseconds), not string"),
        (None, "nope", "deferColumn 'nope' is not a column"),
    ],
)
def test_unusable_columns_are_refused(body: str | None, defer: str | None, message: str) -> None:
    options = SinkOptions(addresses=("h:1",), topic="t", body_column=body, defer_column=defer)
    with pytest.raises(ValueError) as info:
        options.resolve_columns(SCHEMA)
    assert message in str(info.value)


def test_options_survive_pickling() -> None:
    # The writer holding them is pickled from the driver to every executor.
    options = SinkOptions.parse({"address": "h:1,h:2", "topic": "t", "deferMs": "5"})
    assert pickle.loads(pickle.dumps(options)) == options


HEADERS = MapType(StringType(), StringType())
KAFKA_HEADERS = ArrayType(StructType([StructField("key", StringType()),
                                      StructField("value", BinaryType())]))  # fmt: skip


@pytest.mark.parametrize("kind", [HEADERS, KAFKA_HEADERS])
def test_a_headers_column_of_a_headers_type_is_found_by_name(kind: DataType) -> None:
    schema = StructType([StructField("value", StringType()), StructField("Headers", kind)])
    resolved = SinkOptions(addresses=("h:1",), topic="t").resolve_columns(schema)
    assert resolved.headers_column == "Headers"
    assert resolved.has_extension and resolved.metadata_columns == {"Headers"}


def test_a_headers_column_of_another_type_is_data_unless_named() -> None:
    schema = StructType([StructField("headers", StringType()), StructField("n", LongType())])
    options = SinkOptions(addresses=("h:1",), topic="t")
    assert options.resolve_columns(schema).headers_column is None
    named = SinkOptions(addresses=("h:1",), topic="t", headers_column="headers")
    with pytest.raises(ValueError, match=r"headersColumn 'headers' must be a map<string,string> "
                       r"column \(or Kafka's array<struct<key:string,value:binary>>\), not string"):
        named.resolve_columns(schema)


def test_extension_options_are_parsed_and_checked() -> None:
    parsed = SinkOptions.parse({"address": "h:1", "topic": "t", "headersColumn": "h",
                                "priorityColumn": "p", "ttlColumn": "ttl", "dedupIds": "false"})
    assert (parsed.headers_column, parsed.priority_column, parsed.ttl_column,
            parsed.dedup_ids) == ("h", "p", "ttl", False)  # fmt: skip
    assert SinkOptions.parse({"address": "h:1", "topic": "t"}).dedup_ids is None
    with pytest.raises(ValueError, match="option 'dedupIds' must be true or false, not 'yes'"):
        SinkOptions.parse({"address": "h:1", "topic": "t", "dedupIds": "yes"})
    with pytest.raises(ValueError, match="priorityColumn and ttlColumn must be different"):
        SinkOptions.parse({"address": "h:1", "topic": "t", "priorityColumn": "x",
                           "ttlColumn": "X"})  # fmt: skip
    schema = StructType([StructField("value", StringType()), StructField("p", DoubleType())])
    with pytest.raises(ValueError, match=r"priorityColumn 'p' must be an integer column \(0-9\)"):
        SinkOptions(addresses=("h:1",), topic="t", priority_column="p").resolve_columns(schema)

"""The source's options (``spark.read.format("lmq")``, ``spark.readStream.format("lmq")``):
parsed and checked once on the driver, shipped to executors as one object.

Kafka's names. A Spark user's Kafka job ports to lmq by changing the format and the address
options, so the source takes Kafka's source options under Kafka's names, with Kafka's meaning
and defaults where lmq has the concept: ``subscribe``, ``subscribePattern``, ``startingOffsets``
/ ``endingOffsets`` (``earliest``, ``latest`` or JSON by topic, with ``-2``/``-1``),
``startingTimestamp`` / ``endingTimestamp`` / ``startingOffsetsByTimestamp`` /
``endingOffsetsByTimestamp`` (and ``startingOffsetsByTimestampStrategy``), ``maxOffsetsPerTrigger``,
``minOffsetsPerTrigger`` + ``maxTriggerDelay``, ``failOnDataLoss``, ``includeHeaders``,
``minPartitions``, ``maxRecordsPerPartition``. Where Kafka has a partition, lmq has a node (a
daemon holding the topic): offsets JSON is ``{"topic": {"host:port": offset}}``. Kafka's client
settings (``kafka.*``), ``assign`` and consumer-group options have no lmq meaning and are refused
with the lmq option to use instead.

The daemons: ``address`` (what the sink takes: TCP addresses; the source finds each one's HTTP
API through IDENTIFY, ``nodes.py``), ``httpAddress`` (HTTP addresses, read as given) and
``lookupdHttpAddress`` (the nodes the lookupds list), in any combination.

As for the sink (``options.py``), an unknown option fails the query before any task runs, with
one line naming it.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Literal

from lmq_client._util import address_list, check_name
from lmq_client.lookupd import lookupd_addresses
from lmq_client.spark.offsets import EARLIEST, ByNode, parse_by_node
from lmq_client.spark.option_values import SPARK_OWN, bool_option, canonical_options, split_list

__all__ = [
    "DEFAULT_LOOKUPD_POLL_INTERVAL_MS",
    "DEFAULT_MAX_TRIGGER_DELAY_S",
    "DEFAULT_PARTITION_SIZE",
    "DEFAULT_READ_COUNT",
    "DEFAULT_SOURCE_TIMEOUT_S",
    "EARLIEST_BOUND",
    "LATEST_BOUND",
    "Bound",
    "SourceOptions",
    "parse_duration",
]

DEFAULT_PARTITION_SIZE = 100_000
"""Offsets per Spark partition: a range of a million messages is read by ten tasks in
parallel; each task's reads are ~10 requests of ``DEFAULT_READ_COUNT`` messages, long enough
that a task's start-up cost (a Python worker, a connection) is small beside them."""

DEFAULT_READ_COUNT = 10_000
"""Messages per ``/topic/read`` request: the daemon's maximum (``lmqd.httpapi.replay``)."""

DEFAULT_SOURCE_TIMEOUT_S = 30.0
"""Seconds an HTTP request to a daemon may take before the task fails (a read of 10,000
messages takes milliseconds; the bound only catches a daemon that stopped answering)."""

DEFAULT_LOOKUPD_POLL_INTERVAL_MS = 10_000
"""How often a stream looks again for nodes (asking its lookupds) and, with
``subscribePattern``, for topics. Spark plans micro-batches back to back, and an idle stream
asks for new offsets every 10 ms (``spark.sql.streaming.pollingDelay``): discovering each time
would be a hundred queries a second for news that comes rarely. A node or topic found up to
10 s late loses nothing (it is read from its earliest offset); NSQ's consumers poll every 60 s,
which would leave a new node unread for a minute."""

DEFAULT_MAX_TRIGGER_DELAY_S = 15 * 60.0
"""``maxTriggerDelay``: Kafka's default, 15 minutes."""

_KNOWN = {
    name.lower(): name
    for name in (
        "address",
        "httpAddress",
        "lookupdHttpAddress",
        "lookupdPollIntervalMs",
        "topic",
        "subscribe",
        "subscribePattern",
        "startingOffsets",
        "endingOffsets",
        "startingTimestamp",
        "endingTimestamp",
        "startingOffsetsByTimestamp",
        "endingOffsetsByTimestamp",
        "startingOffsetsByTimestampStrategy",
        "maxOffsetsPerTrigger",
        "maxMessagesPerTrigger",  # lmq's first name for maxOffsetsPerTrigger
        "minOffsetsPerTrigger",
        "maxTriggerDelay",
        "failOnDataLoss",
        "includeHeaders",
        "partitionSize",
        "maxRecordsPerPartition",  # Kafka's name for partitionSize
        "minPartitions",
        "timeout",
        *SPARK_OWN,
    )
}

# Kafka's source options with no lmq meaning, and what to give instead.
_KAFKA_ONLY = {
    "assign": "lmq has no partitions to assign: use 'subscribe' (a node is read whole)",
    "kafka.bootstrap.servers": "use 'address' (the daemons' TCP addresses, as the sink takes)",
    "groupidprefix": "the source reads by offset and has no consumer group",
    "kafka.group.id": "the source reads by offset and has no consumer group",
}


@dataclasses.dataclass(frozen=True)
class Bound:
    """Where a read starts or ends: ``earliest``, ``latest``, offsets by topic and node
    (``offsets``: ``EARLIEST``/``LATEST`` allowed), times by topic and node (``times``, ms),
    or one time for every node (``time_ms``). Topics and nodes a map leaves out start at
    earliest (a start) or end at latest (an end)."""

    kind: Literal["earliest", "latest", "offsets", "times", "time"]
    by_node: ByNode = dataclasses.field(default_factory=dict)
    time_ms: int | None = None


EARLIEST_BOUND = Bound("earliest")
LATEST_BOUND = Bound("latest")


@dataclasses.dataclass(frozen=True, kw_only=True)
class SourceOptions:
    """Everything a read needs (picklable: it travels to the executors).

    ``addresses``: daemons by the address the sink takes (TCP; an HTTP address works too);
    ``http_addresses``: daemons' HTTP addresses, read as given; ``lookupd_addresses``: lookupds
    whose nodes are read as well; ``topics`` (``topic``, ``subscribe``) or ``pattern``
    (``subscribePattern``, a regex the whole topic name must match); ``starting`` / ``ending``
    (None: the default, ``latest`` for a stream's start, ``earliest`` for a batch's, ``latest``
    for an end); ``time_strategy``: a start by time that finds no message (``error`` fails,
    ``latest`` starts at the end); ``max_per_trigger`` / ``min_per_trigger`` and
    ``max_trigger_delay_s``: read limits per micro-batch; ``fail_on_data_loss``; ``include_headers``
    (Kafka's ``headers`` column); ``partition_size`` (offsets per Spark task) and
    ``min_partitions``; ``timeout_s`` per request; ``lookupd_poll_interval_s``.
    """

    addresses: tuple[str, ...] = ()
    http_addresses: tuple[str, ...] = ()
    lookupd_addresses: tuple[str, ...] = ()
    topics: tuple[str, ...] = ()
    pattern: str | None = None
    starting: Bound | None = None
    ending: Bound | None = None
    time_strategy: Literal["error", "latest"] = "error"
    max_per_trigger: int | None = None
    min_per_trigger: int | None = None
    max_trigger_delay_s: float = DEFAULT_MAX_TRIGGER_DELAY_S
    fail_on_data_loss: bool = True
    include_headers: bool = False
    partition_size: int = DEFAULT_PARTITION_SIZE
    min_partitions: int | None = None
    timeout_s: float = DEFAULT_SOURCE_TIMEOUT_S
    lookupd_poll_interval_s: float = DEFAULT_LOOKUPD_POLL_INTERVAL_MS / 1000

    @property
    def described(self) -> str:
        """The topics as errors name them: ``topic 'a'``, ``topics 'a', 'b'``, ``topics
        matching 'x.*'``."""
        if self.pattern is not None:
            return f"topics matching {self.pattern!r}"
        if len(self.topics) == 1:
            return f"topic {self.topics[0]!r}"
        return "topics " + ", ".join(repr(t) for t in self.topics)

    def reads(self, topic: str) -> bool:
        """Whether ``topic`` is one this query reads."""
        if self.pattern is not None:
            return re.fullmatch(self.pattern, topic) is not None
        return topic in self.topics

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        """Options as given to ``.option(...)``; ``ValueError`` naming the bad one otherwise."""
        for key in options:
            hint = _KAFKA_ONLY.get(key.lower())
            if hint is None and key.lower().startswith("kafka."):
                hint = "Kafka client settings have no lmq meaning"
            if hint is not None:
                raise ValueError(f"lmq source: option {key!r} is Kafka's: {hint}")
        given = canonical_options(options, _KNOWN, "source")
        addresses = _addresses(given, "address")
        http_addresses = _addresses(given, "httpAddress")
        lookupds = tuple(split_list(given.get("lookupdHttpAddress", "")))
        try:
            lookupd_addresses(list(lookupds))
        except ValueError as exc:
            raise ValueError(f"lmq source: option 'lookupdHttpAddress': {exc}") from None
        if not (addresses or http_addresses or lookupds):
            raise ValueError(
                "lmq source: option 'address' is required (the daemons' addresses, as the sink "
                "takes them), or 'httpAddress' or 'lookupdHttpAddress'"
            )
        topics, pattern = _subscription(given)
        limit = _synonym(given, "maxOffsetsPerTrigger", "maxMessagesPerTrigger")
        size = _synonym(given, "partitionSize", "maxRecordsPerPartition")
        return cls(
            addresses=addresses,
            http_addresses=http_addresses,
            lookupd_addresses=lookupds,
            topics=topics,
            pattern=pattern,
            starting=_bound(given, "starting", topics if pattern is None else None),
            ending=_bound(given, "ending", topics if pattern is None else None),
            time_strategy=_strategy(given.get("startingOffsetsByTimestampStrategy")),
            max_per_trigger=None if limit is None else _integer(limit, "maxOffsetsPerTrigger", 1),
            min_per_trigger=_optional(given, "minOffsetsPerTrigger", 1),
            max_trigger_delay_s=(
                DEFAULT_MAX_TRIGGER_DELAY_S if "maxTriggerDelay" not in given
                else parse_duration(given["maxTriggerDelay"], "maxTriggerDelay")
            ),
            fail_on_data_loss=bool_option(given, "failOnDataLoss", default=True, who="source"),
            include_headers=bool_option(given, "includeHeaders", who="source"),
            partition_size=(
                DEFAULT_PARTITION_SIZE if size is None else _integer(size, "partitionSize", 1)
            ),
            min_partitions=_optional(given, "minPartitions", 1),
            timeout_s=_seconds(given.get("timeout"), DEFAULT_SOURCE_TIMEOUT_S),
            lookupd_poll_interval_s=_integer(
                given.get("lookupdPollIntervalMs", str(DEFAULT_LOOKUPD_POLL_INTERVAL_MS)),
                "lookupdPollIntervalMs", 0,
            ) / 1000,
        )  # fmt: skip


def _addresses(given: Mapping[str, str], name: str) -> tuple[str, ...]:
    addresses = tuple(split_list(given.get(name, "")))
    if addresses:
        try:
            address_list(list(addresses))
        except ValueError as exc:
            raise ValueError(f"lmq source: option {name!r}: {exc}") from None
    return addresses


def _subscription(given: Mapping[str, str]) -> tuple[tuple[str, ...], str | None]:
    """The topics (``topic``, ``subscribe``) or the pattern (``subscribePattern``): one of
    the three, as Kafka wants exactly one of ``assign``, ``subscribe``, ``subscribePattern``."""
    named = [n for n in ("topic", "subscribe", "subscribePattern") if given.get(n, "").strip()]
    if len(named) != 1:
        raise ValueError(
            "lmq source: give one of 'subscribe' (topics, comma-separated), "
            "'subscribePattern' (a regular expression) or 'topic'"
            + (f", not {' and '.join(repr(n) for n in named)}" if named else "")
        )
    which = named[0]
    if which == "subscribePattern":
        pattern = given[which].strip()
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ValueError(
                f"lmq source: option 'subscribePattern': {pattern!r} is not a regular "
                f"expression ({exc})"
            ) from None
        return (), pattern
    topics = tuple(dict.fromkeys(split_list(given[which])))
    for topic in topics:
        try:
            check_name("topic", topic)
        except ValueError as exc:
            raise ValueError(f"lmq source: option {which!r}: {exc}") from None
    return topics, None


def _bound(
    given: Mapping[str, str], side: Literal["starting", "ending"], topics: tuple[str, ...] | None
) -> Bound | None:
    """``startingOffsets`` & co. (or ``ending...``), Kafka's order of precedence: the one
    time for all, then times by node, then offsets."""
    if f"{side}Timestamp" in given:
        return Bound("time", time_ms=_integer(given[f"{side}Timestamp"], f"{side}Timestamp", 0))
    name = f"{side}OffsetsByTimestamp"
    if name in given:
        return Bound("times", parse_by_node(name, given[name], topics, minimum=0))
    name = f"{side}Offsets"
    raw = given.get(name)
    if raw is None:
        return None
    value = raw.strip()
    if value in ("earliest", "latest"):
        return EARLIEST_BOUND if value == "earliest" else LATEST_BOUND
    if not value.startswith("{"):
        raise ValueError(
            f"lmq source: option {name!r} must be earliest, latest or a JSON object of "
            f'offsets by topic and node ({{"topic": {{"host:port": 1200}}}}), not {raw!r}'
        )
    by_node = parse_by_node(name, value, topics, minimum=EARLIEST)
    values = [v for nodes in by_node.values() for v in nodes.values()]
    if side == "ending" and EARLIEST in values:
        raise ValueError(f"lmq source: option {name!r}: -2 (earliest) cannot be an end")
    return Bound("offsets", by_node)


def _strategy(raw: str | None) -> Literal["error", "latest"]:
    value = (raw or "error").strip().lower()
    if value not in ("error", "latest"):
        raise ValueError(
            "lmq source: option 'startingOffsetsByTimestampStrategy' must be error or latest, "
            f"not {raw!r}"
        )
    return "error" if value == "error" else "latest"


def _synonym(given: Mapping[str, str], name: str, other: str) -> str | None:
    if name in given and other in given:
        raise ValueError(f"lmq source: give {name!r} or its synonym {other!r}, not both")
    return given.get(name, given.get(other))


def _integer(raw: str, name: str, minimum: int) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"lmq source: option {name!r} must be an integer, not {raw!r}") from None
    if value < minimum:
        raise ValueError(f"lmq source: option {name!r} must be at least {minimum}, not {value}")
    return value


def _optional(given: Mapping[str, str], name: str, minimum: int) -> int | None:
    raw = given.get(name)
    return None if raw is None else _integer(raw, name, minimum)


def _seconds(raw: str | None, default: float) -> float:
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"lmq source: option 'timeout' must be a number, not {raw!r}") from None
    if not value > 0:
        raise ValueError(f"lmq source: option 'timeout' must be positive, not {value}")
    return value


_DURATION = re.compile(r"\s*([0-9]+)\s*(us|ms|s|sec|m|min|h|d)?\s*", re.IGNORECASE)
_UNIT_S = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0,
           "d": 86400.0}  # fmt: skip


def parse_duration(raw: str, name: str) -> float:
    """A Spark time string (``15m``, ``30s``, ``500ms``; a bare number is milliseconds, as
    Spark's ``timeStringAsMs``) in seconds."""
    match = _DURATION.fullmatch(raw)
    if match is None:
        raise ValueError(
            f"lmq source: option {name!r} must be a duration such as 15m, 30s or 500ms, "
            f"not {raw!r}"
        )
    return int(match.group(1)) * _UNIT_S[(match.group(2) or "ms").lower()]


"""The sink's options: parsed and checked once on the driver, shipped to executors as one object.

Spark hands a data source its ``.option(...)`` values as a case-insensitive mapping of strings.
``SinkOptions.parse`` turns them into typed fields and rejects anything it does not know, so a
misspelt option fails the query at start instead of being silently ignored; ``resolve_columns``
checks the named columns against the DataFrame's schema, also on the driver, before any task runs.

Columns as Kafka's sink reads them, since that is what Spark users know: a string or binary
column named ``value`` is the body unless ``bodyColumn`` names another (rows become JSON objects
only when there is neither), and without a ``topic`` option a string column named ``topic``
routes each row.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    ByteType,
    DataType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructField,
    StructType,
)

from lmq_client._util import address_list, check_name
from lmq_client.lookupd import lookupd_addresses
from lmq_client.spark.option_values import SPARK_OWN, bool_option, canonical_options, split_list
from lmq_client.transport import PLAIN, TransportOptions

__all__ = [
    "DEFAULT_BATCH_BYTES",
    "DEFAULT_BATCH_SIZE",
    "DEFAULT_RETRY_TIMEOUT_MS",
    "HEADERS_COLUMN",
    "TOPIC_COLUMN",
    "VALUE_COLUMN",
    "SinkOptions",
]

DEFAULT_BATCH_SIZE = 1000
"""Messages per MPUB. One MPUB costs a round trip (~0.6 ms on the development machine), under a
microsecond a row at 1000 rows, small against the ~5 µs a row of the whole Spark path; 5000
measured no faster (docs/benchmarks.md), and a bigger batch only makes a retried batch bigger."""

DEFAULT_BATCH_BYTES = 5 * 1024 * 1024
"""Largest MPUB body: nsqd's (and lmqd's) default ``--max-body-size``; a bigger body is refused."""

DEFAULT_TIMEOUT_S = 10.0
"""Connect and answer timeout of the executors' producer (the blocking client's default)."""

DEFAULT_RETRY_TIMEOUT_MS = 30_000
"""How long a task keeps retrying a publish that failed for want of a daemon (connection
refused or lost, ``E_*PUB_FAILED``) before it fails: a restarted lmqd listens again within a
few seconds (start-up is ~1 s, a SIGTERM flush of a full memory queue a few more), and 30 s
rides that out while a daemon that is really gone still fails the task in well under a minute
(Kafka's producer waits 2 minutes, ``delivery.timeout.ms``; a Spark task failure is cheaper)."""

VALUE_COLUMN = "value"
"""The body column when ``bodyColumn`` is not given (Kafka's sink's name)."""

TOPIC_COLUMN = "topic"
"""The column that routes each row when no ``topic`` option is given (Kafka's sink's name)."""

HEADERS_COLUMN = "headers"
"""The column of each row's message headers when ``headersColumn`` is not given (Kafka's name)."""

_INTEGER_TYPES = (ByteType, ShortType, IntegerType, LongType)

# Spark's option mapping is case-insensitive, but iterating over it yields the user's spelling:
# the canonical spellings, keyed by their lower case.
_KNOWN = {
    name.lower(): name
    for name in (
        "address",
        "lookupdHttpAddress",
        "topic",
        "bodyColumn",
        "batchSize",
        "batchBytes",
        "deferMs",
        "deferColumn",
        "headersColumn",
        "priorityColumn",
        "ttlColumn",
        "dedupIds",
        "timeout",
        "retryTimeoutMs",
        # TLS, compression and AUTH: go-nsq's names in camelCase
        "tls",
        "tlsRootCaFile",
        "tlsCert",
        "tlsKey",
        "tlsInsecureSkipVerify",
        "snappy",
        "deflate",
        "deflateLevel",
        "authSecret",
        *SPARK_OWN,  # Spark passes these through to every sink; they are Spark's, not ours.
    )
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class SinkOptions:
    """Everything a write task needs to know (picklable: it travels to the executors).

    ``addresses``: the daemons' TCP addresses; ``lookupd_addresses``: lookupds whose nodes
    (``GET /nodes``) are published to as well, looked up by each task; ``topic``: every row's
    topic, or "" to route each row by ``topic_column`` (set by ``resolve_columns``);
    ``body_column``: the string/binary column sent as each message's body, or None to send each
    row as a JSON object; ``batch_size``/``batch_bytes``: limits of one MPUB; ``defer_ms``:
    DPUB delay for every row (0: publish at once); ``defer_column``: an integer column of
    per-row delays in ms (null: use ``defer_ms``); ``headers_column``: a map<string,string>
    column (or Kafka's array<struct<key,value>>) of each message's headers; ``priority_column``
    and ``ttl_column``: integer columns of each message's priority (0-9) and TTL in ms (null:
    none); ``dedup_ids``: give every row a dedup id derived from its query, batch, partition and
    index (None: the writer's default, on for streams and off for batch writes; see
    ``publish.dedup_scope``); ``timeout_s``: the producer's connect and
    answer timeout; ``retry_timeout_s``: how long a publish that failed for want of a daemon
    is retried (0: not at all); ``transport``: TLS (``tls``, ``tlsRootCaFile``, ``tlsCert``,
    ``tlsKey``, ``tlsInsecureSkipVerify``), compression (``snappy``, or ``deflate`` with
    ``deflateLevel``) and ``authSecret`` (Spark redacts option values whose key contains
    "secret" in its UI and logs).
    """

    addresses: tuple[str, ...] = ()
    topic: str = ""
    lookupd_addresses: tuple[str, ...] = ()
    body_column: str | None = None
    topic_column: str | None = None
    batch_size: int = DEFAULT_BATCH_SIZE
    batch_bytes: int = DEFAULT_BATCH_BYTES
    defer_ms: int = 0
    defer_column: str | None = None
    headers_column: str | None = None
    priority_column: str | None = None
    ttl_column: str | None = None
    dedup_ids: bool | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S
    retry_timeout_s: float = DEFAULT_RETRY_TIMEOUT_MS / 1000
    transport: TransportOptions = PLAIN

    @property
    def described_topic(self) -> str:
        """The topic for messages and logs: ``topic 'events'`` or ``topics from column 'topic'``."""
        if self.topic:
            return f"topic {self.topic!r}"
        return f"topics from column {self.topic_column or TOPIC_COLUMN!r}"

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SinkOptions:
        """Options as given to ``.option(...)``; ``ValueError`` naming the bad one otherwise.

        Without ``topic``, the rows' ``topic`` column must route them: ``resolve_columns``
        checks that it exists."""
        given = canonical_options(options, _KNOWN, "sink")
        lookupds = tuple(split_list(given.get("lookupdHttpAddress", "")))
        try:
            lookupd_addresses(list(lookupds))
        except ValueError as exc:
            raise ValueError(f"lmq sink: option 'lookupdHttpAddress': {exc}") from None
        address_text = given.get("address", "").strip()
        if not address_text and not lookupds:
            raise ValueError(
                "lmq sink: option 'address' is required (or give 'lookupdHttpAddress')"
            )
        addresses = tuple(split_list(address_text))
        if address_text:  # without it, every node the lookupds list
            try:
                address_list(list(addresses))
            except ValueError as exc:
                raise ValueError(f"lmq sink: option 'address': {exc}") from None
        topic = given.get("topic", "").strip()
        if topic:
            try:
                check_name("topic", topic)
            except ValueError as exc:
                raise ValueError(f"lmq sink: option 'topic': {exc}") from None
        result = cls(
            addresses=addresses,
            lookupd_addresses=lookupds,
            topic=topic,
            body_column=given.get("bodyColumn") or None,
            batch_size=_int_option(given, "batchSize", DEFAULT_BATCH_SIZE, minimum=1),
            batch_bytes=_int_option(given, "batchBytes", DEFAULT_BATCH_BYTES, minimum=1),
            defer_ms=_int_option(given, "deferMs", 0, minimum=0),
            defer_column=given.get("deferColumn") or None,
            headers_column=given.get("headersColumn") or None,
            priority_column=given.get("priorityColumn") or None,
            ttl_column=given.get("ttlColumn") or None,
            dedup_ids=bool_option(given, "dedupIds") if "dedupIds" in given else None,
            timeout_s=_float_option(given, "timeout", DEFAULT_TIMEOUT_S),
            retry_timeout_s=_int_option(
                given, "retryTimeoutMs", DEFAULT_RETRY_TIMEOUT_MS, minimum=0
            ) / 1000,
            transport=_transport(given),
        )
        named = [
            (option, column)
            for option, column in (
                ("bodyColumn", result.body_column),
                ("deferColumn", result.defer_column),
                ("headersColumn", result.headers_column),
                ("priorityColumn", result.priority_column),
                ("ttlColumn", result.ttl_column),
            )
            if column is not None
        ]
        for i, (option, column) in enumerate(named):
            for other, other_column in named[i + 1 :]:
                if column.lower() == other_column.lower():
                    raise ValueError(
                        f"lmq sink: {option} and {other} must be different columns"
                    )
        return result

    def resolve_columns(self, schema: StructType) -> SinkOptions:
        """These options with column names spelt as in ``schema``; ``ValueError`` if unusable.

        Spark resolves column names case-insensitively by default, so ``bodyColumn=Body`` finds
        ``body``; the executors look columns up in Arrow batches, which is case-sensitive.
        Without ``bodyColumn``, a string or binary ``value`` column is the body (a ``value`` of
        another type, a metric's number say, is just data: the row goes as JSON). Without
        ``headersColumn``, a ``headers`` column of a headers type (map<string,string>, or
        Kafka's array<struct<key:string,value:string|binary>>) is the headers (of another type,
        it is data). Without a ``topic`` option, a string ``topic`` column is required.
        """
        body = defer = topic_column = headers = priority = ttl = None
        if self.body_column is not None:
            field = _find_field(schema, self.body_column, "bodyColumn")
            if not isinstance(field.dataType, StringType | BinaryType):
                raise ValueError(
                    f"lmq sink: bodyColumn {field.name!r} must be a string or binary column, "
                    f"not {field.dataType.simpleString()} (cast it, or use to_json for a struct)"
                )
            body = field.name
        else:
            value = _maybe_field(schema, VALUE_COLUMN)
            if value is not None and isinstance(value.dataType, StringType | BinaryType):
                body = value.name
        if self.defer_column is not None:
            defer = _integer_column(schema, self.defer_column, "deferColumn", "milliseconds")
        if self.priority_column is not None:
            priority = _integer_column(schema, self.priority_column, "priorityColumn", "0-9")
        if self.ttl_column is not None:
            ttl = _integer_column(schema, self.ttl_column, "ttlColumn", "milliseconds")
        if self.headers_column is not None:
            field = _find_field(schema, self.headers_column, "headersColumn")
            if not is_headers_type(field.dataType):
                raise ValueError(
                    f"lmq sink: headersColumn {field.name!r} must be a map<string,string> "
                    "column (or Kafka's array<struct<key:string,value:binary>>), not "
                    f"{field.dataType.simpleString()}"
                )
            headers = field.name
        else:
            found = _maybe_field(schema, HEADERS_COLUMN)
            if found is not None and is_headers_type(found.dataType):
                headers = found.name
        if not self.topic:
            field_or_none = _maybe_field(schema, TOPIC_COLUMN)
            if field_or_none is None:
                columns = ", ".join(schema.fieldNames()) or "none"
                raise ValueError(
                    "lmq sink: option 'topic' is required, or a string column 'topic' that "
                    f"names each row's topic (columns: {columns})"
                )
            if not isinstance(field_or_none.dataType, StringType):
                raise ValueError(
                    f"lmq sink: column {field_or_none.name!r} routes rows without a 'topic' "
                    f"option and must be a string column, not "
                    f"{field_or_none.dataType.simpleString()}"
                )
            topic_column = field_or_none.name
            if topic_column in (body, defer, headers, priority, ttl):
                raise ValueError(
                    f"lmq sink: column {topic_column!r} cannot be both the topic and the "
                    "body, delay, headers, priority or TTL"
                )
        if headers is not None and headers == body:
            raise ValueError(f"lmq sink: column {headers!r} cannot be both body and headers")
        return dataclasses.replace(
            self,
            body_column=body,
            defer_column=defer,
            topic_column=topic_column,
            headers_column=headers,
            priority_column=priority,
            ttl_column=ttl,
        )

    @property
    def metadata_columns(self) -> frozenset[str]:
        """Columns that say how a row is published rather than what it says: left out of
        JSON bodies."""
        columns = (self.defer_column, self.topic_column, self.headers_column,
                   self.priority_column, self.ttl_column)  # fmt: skip
        return frozenset(c for c in columns if c is not None)

    @property
    def has_extension(self) -> bool:
        """Whether rows carry lmq's per-message fields from columns (then XPUB, lmqd only)."""
        return any(
            c is not None for c in (self.headers_column, self.priority_column, self.ttl_column)
        )


def is_headers_type(kind: DataType) -> bool:
    """map<string,string>, or Kafka's headers type array<struct<key:string,value:string or
    binary>> (values must be UTF-8 text here)."""
    if isinstance(kind, MapType):
        return isinstance(kind.keyType, StringType) and isinstance(kind.valueType, StringType)
    if isinstance(kind, ArrayType) and isinstance(kind.elementType, StructType):
        fields = {f.name: f.dataType for f in kind.elementType.fields}
        return (
            len(fields) == 2
            and isinstance(fields.get("key"), StringType)
            and isinstance(fields.get("value"), StringType | BinaryType)
        )
    return False


def _integer_column(schema: StructType, name: str, option: str, unit: str) -> str:
    field = _find_field(schema, name, option)
    if not isinstance(field.dataType, _INTEGER_TYPES):
        raise ValueError(
            f"lmq sink: {option} {field.name!r} must be an integer column ({unit}), "
            f"not {field.dataType.simpleString()}"
        )
    return field.name


def _transport(given: Mapping[str, str]) -> TransportOptions:
    tls_files = {
        "tls_root_ca_file": given.get("tlsRootCaFile") or None,
        "tls_cert": given.get("tlsCert") or None,
        "tls_key": given.get("tlsKey") or None,
    }
    skip_verify = bool_option(given, "tlsInsecureSkipVerify")
    try:
        transport = TransportOptions(
            # a CA file, a certificate or skipping verification only make sense with TLS
            tls=bool_option(given, "tls") or skip_verify or any(tls_files.values()),
            tls_insecure_skip_verify=skip_verify,
            snappy=bool_option(given, "snappy"),
            deflate=bool_option(given, "deflate"),
            deflate_level=_int_option(given, "deflateLevel", 6, minimum=1),
            auth_secret=given.get("authSecret") or None,
            **tls_files,
        )
        if transport.tls:
            transport.ssl_context()  # unreadable files fail the query now, on the driver
    except ValueError as exc:
        raise ValueError(f"lmq sink: {exc}") from None
    return transport


def _maybe_field(schema: StructType, name: str) -> StructField | None:
    """The column ``name`` resolves to (an exact match first, then one case-insensitive
    match), or None when there is none or it is ambiguous."""
    exact = [f for f in schema.fields if f.name == name]
    if exact:
        return exact[0]
    folded = [f for f in schema.fields if f.name.lower() == name.lower()]
    return folded[0] if len(folded) == 1 else None


def _find_field(schema: StructType, name: str, option: str) -> StructField:
    exact = [f for f in schema.fields if f.name == name]
    if exact:
        return exact[0]
    folded = [f for f in schema.fields if f.name.lower() == name.lower()]
    if len(folded) == 1:
        return folded[0]
    columns = ", ".join(schema.fieldNames()) or "none"
    if folded:
        raise ValueError(f"lmq sink: {option} {name!r} is ambiguous (columns: {columns})")
    raise ValueError(f"lmq sink: {option} {name!r} is not a column (columns: {columns})")


def _int_option(given: Mapping[str, str], name: str, default: int, *, minimum: int) -> int:
    raw = given.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"lmq sink: option {name!r} must be an integer, not {raw!r}") from None
    if value < minimum:
        raise ValueError(f"lmq sink: option {name!r} must be at least {minimum}, not {value}")
    return value


def _float_option(given: Mapping[str, str], name: str, default: float) -> float:
    raw = given.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"lmq sink: option {name!r} must be a number, not {raw!r}") from None
    if not value > 0:
        raise ValueError(f"lmq sink: option {name!r} must be positive, not {value}")
    return value

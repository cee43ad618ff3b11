"""The source's options (``spark.read.format("lmq")``, ``spark.readStream.format("lmq")``):
parsed and checked once on the driver, shipped to executors as one object.

As for the sink (``options.py``), an unknown option fails the query before any task runs.

The daemons are given by their **HTTP** addresses (the source reads with ``GET /topic/read``),
found through lookupds (``lookupdHttpAddress``: the nodes ``/lookup?topic=`` lists, at their
``broadcast_address:http_port``), or both. The option is ``httpAddress``: the sink's ``address``
takes TCP addresses, and one name meaning two kinds of address in one data source surprised
users. The source's ``address`` (its first name, documented before ``httpAddress`` existed)
still works as a synonym; giving both is refused.

Offsets are per daemon, keyed by that HTTP address: a start or end is ``earliest``, ``latest``,
or a JSON object mapping a daemon's HTTP address to an offset, ``{"10.0.0.1:4151": 1200}`` (a
daemon it leaves out starts at ``earliest``; for an end, at ``latest``).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping

from lmq_client._util import address_list, check_name
from lmq_client.lookupd import lookupd_addresses
from lmq_client.spark.options import canonical_options
from lmqd.net import split_address

__all__ = [
    "DEFAULT_LOOKUPD_POLL_INTERVAL_MS",
    "DEFAULT_PARTITION_SIZE",
    "DEFAULT_READ_COUNT",
    "DEFAULT_SOURCE_TIMEOUT_S",
    "Bound",
    "SourceOptions",
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
"""How often a stream asks its lookupds for the topic's nodes. Spark plans micro-batches back to
back, and an idle stream asks for new offsets every 10 ms (``spark.sql.streaming.pollingDelay``):
asking the lookupds each time would be a hundred queries a second for news that comes rarely. A
node found up to 10 s late loses nothing (it is read from its earliest offset); NSQ's consumers
poll every 60 s, which would leave a new node unread for a minute."""

Bound = str | Mapping[str, int]
"""``"earliest"``, ``"latest"``, or offsets by daemon address."""

_KNOWN = {
    name.lower(): name
    for name in (
        "httpAddress",
        "address",  # the source's first name for httpAddress; still accepted
        "lookupdHttpAddress",
        "lookupdPollIntervalMs",
        "topic",
        "startingOffsets",
        "endingOffsets",
        "maxMessagesPerTrigger",
        "partitionSize",
        "timeout",
        # Spark's own
        "checkpointLocation",
        "path",
    )
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class SourceOptions:
    """Everything a read needs (picklable: it travels to the executors).

    ``addresses``: the daemons' **HTTP** addresses as given (the source reads with ``GET
    /topic/read``); ``lookupd_addresses``: lookupds whose nodes for the topic are read as well,
    asked on the driver whenever a read is planned (every micro-batch); ``topic``;
    ``starting``/``ending``: the start (streaming: of the first micro-batch) and, for batch
    reads, the end; ``max_per_trigger``: at most this many messages per micro-batch over all
    daemons (None: everything available); ``partition_size``: offsets per Spark partition;
    ``timeout_s``: per HTTP request; ``lookupd_poll_interval_s``: how often a stream asks the
    lookupds again.
    """

    addresses: tuple[str, ...] = ()
    topic: str
    lookupd_addresses: tuple[str, ...] = ()
    lookupd_poll_interval_s: float = DEFAULT_LOOKUPD_POLL_INTERVAL_MS / 1000
    starting: Bound | None = None
    ending: Bound = "latest"
    max_per_trigger: int | None = None
    partition_size: int = DEFAULT_PARTITION_SIZE
    timeout_s: float = DEFAULT_SOURCE_TIMEOUT_S

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        """Options as given to ``.option(...)``; ``ValueError`` naming the bad one otherwise."""
        given = canonical_options(options, _KNOWN, "source")
        if "address" in given and "httpAddress" in given:
            raise ValueError(
                "lmq source: give 'httpAddress' or its older name 'address', not both"
            )
        name = "address" if "address" in given else "httpAddress"
        address_text = given.get(name, "").strip()
        lookupds = tuple(_split(given.get("lookupdHttpAddress", "")))
        try:
            lookupd_addresses(list(lookupds))
        except ValueError as exc:
            raise ValueError(f"lmq source: option 'lookupdHttpAddress': {exc}") from None
        if not address_text and not lookupds:
            raise ValueError(
                "lmq source: option 'httpAddress' is required (the daemons' HTTP addresses), "
                "or 'lookupdHttpAddress'"
            )
        if not given.get("topic", "").strip():
            raise ValueError("lmq source: option 'topic' is required")
        addresses = tuple(_split(address_text))
        if address_text:
            try:
                address_list(list(addresses))
            except ValueError as exc:
                raise ValueError(f"lmq source: option {name!r}: {exc}") from None
        topic = given["topic"].strip()
        try:
            check_name("topic", topic)
        except ValueError as exc:
            raise ValueError(f"lmq source: option 'topic': {exc}") from None
        maximum = given.get("maxMessagesPerTrigger")
        per_trigger = None if maximum is None else _positive(maximum, "maxMessagesPerTrigger")
        # With lookupds, the daemons are not known before the read: any HTTP address may be named.
        named = None if lookupds else addresses
        return cls(
            addresses=addresses,
            lookupd_addresses=lookupds,
            topic=topic,
            starting=_bound(given, "startingOffsets", named),
            ending=_bound(given, "endingOffsets", named) or "latest",
            max_per_trigger=per_trigger,
            partition_size=_positive(
                given.get("partitionSize", str(DEFAULT_PARTITION_SIZE)), "partitionSize"
            ),
            timeout_s=_seconds(given.get("timeout"), DEFAULT_SOURCE_TIMEOUT_S),
            lookupd_poll_interval_s=_milliseconds(
                given.get("lookupdPollIntervalMs"), "lookupdPollIntervalMs",
                DEFAULT_LOOKUPD_POLL_INTERVAL_MS,
            ) / 1000,
        )


def _split(value: str) -> list[str]:
    return [a.strip() for a in value.split(",") if a.strip()]


def _bound(
    given: Mapping[str, str], name: str, addresses: tuple[str, ...] | None
) -> Bound | None:
    """``name``'s value; offsets by daemon must name ``addresses`` (None: any HTTP address)."""
    raw = given.get(name)
    if raw is None:
        return None
    value = raw.strip()
    if value in ("earliest", "latest"):
        return value
    try:
        doc = json.loads(value)
    except ValueError:
        doc = None
    if not isinstance(doc, dict) or not all(
        isinstance(k, str) and type(v) is int and v >= 0 for k, v in doc.items()
    ):
        raise ValueError(
            f"lmq source: option {name!r} must be earliest, latest or a JSON object of "
            f"offsets by daemon address, not {raw!r}"
        )
    if addresses is None:
        for key in doc:
            try:
                split_address(key)
            except ValueError as exc:
                raise ValueError(f"lmq source: option {name!r}: {exc}") from None
    else:
        unknown = sorted(set(doc) - set(addresses))
        if unknown:
            raise ValueError(
                f"lmq source: option {name!r} names daemons not in 'httpAddress': {unknown}"
            )
    return dict(doc)


def _integer(raw: str, name: str, minimum: int) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"lmq source: option {name!r} must be an integer, not {raw!r}") from None
    if value < minimum:
        raise ValueError(f"lmq source: option {name!r} must be at least {minimum}, not {value}")
    return value


def _positive(raw: str, name: str) -> int:
    return _integer(raw, name, 1)


def _milliseconds(raw: str | None, name: str, default: int) -> int:
    return default if raw is None else _integer(raw, name, 0)


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

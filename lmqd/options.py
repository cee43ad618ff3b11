"""Every lmqd setting in one frozen class, with nsqd's defaults where nsqd has the option.

Field names are nsqd's config-file keys (the flag name with ``_`` for ``-``), so
``--mem-queue-size``, ``mem_queue_size = 10000`` in a TOML file and ``GET /config/mem_queue_size``
all name one field.
Durations are stored as float **seconds** (nsqd's flags take Go durations such as ``1m0s``;
``lmqd.cli`` parses those); sizes are bytes; counts are plain ints.
"""

from __future__ import annotations

import os
import socket
import zlib
from collections.abc import Mapping
from typing import Any

import attrs

from lmqd.units import KiB, MiB


def _default_node_id() -> int:
    # nsqd: crc32(md5(hostname)) % 1024. The exact hash only matters for id uniqueness across
    # nodes, so crc32 of the hostname serves the same purpose.
    return zlib.crc32(socket.gethostname().encode()) % 1024


def _positive(instance: Any, attribute: attrs.Attribute[Any], value: float) -> None:
    if value <= 0:
        raise ValueError(f"--{attribute.name.replace('_', '-')} must be > 0")


def _non_negative(instance: Any, attribute: attrs.Attribute[Any], value: float) -> None:
    if value < 0:
        raise ValueError(f"--{attribute.name.replace('_', '-')} must be >= 0")


def _port(instance: Any, attribute: attrs.Attribute[Any], value: int) -> None:
    if not 0 <= value <= 65535:  # TCP's port range (lmqd.net checks addresses the same way)
        raise ValueError(f"--{attribute.name.replace('_', '-')} must be [0,65535]")


MAX_ATTEMPTS = 65535
"""The largest ``max_attempts`` (channel policy, ``--max-attempts``): the wire carries a
message's attempts as a uint16 (nsqd's frame), so a larger limit could never be seen reached."""

MAX_BACKOFF_MS = 3_600_000
"""The largest ``backoff_ms``/``backoff_max_ms``, and the cap when ``backoff_max_ms`` is 0: one
hour, nsqd's default ``--max-req-timeout`` (the longest delay a client may give a ``REQ``)."""
OVERFLOW_MODES = ("reject", "drop_oldest")
"""What a topic at its ``max_depth`` does with a publish (``lmqd.engine.policy``)."""

LOG_LEVELS = ("debug", "info", "warn", "error", "fatal")
"""``--log-level`` names, nsqd's (``internal/lg``), in order: DEBUG = 1 ... FATAL = 5."""


@attrs.frozen(kw_only=True)
class Options:
    """The daemon's configuration; see docs/operations.md for every flag."""

    # -- logging and identity
    log_level: str = attrs.field(
        default="info",
        validator=attrs.validators.in_(LOG_LEVELS),
    )
    log_prefix: str = "[lmqd] "
    node_id: int = attrs.field(factory=_default_node_id)

    # -- listeners
    tcp_address: str = "0.0.0.0:4150"
    http_address: str = "0.0.0.0:4151"
    https_address: str = "0.0.0.0:4152"
    broadcast_address: str = attrs.field(factory=socket.gethostname)
    broadcast_tcp_port: int = attrs.field(default=0, validator=_port)
    """Registered with lookupd instead of the listening port (0: that port), e.g. behind NAT."""
    broadcast_http_port: int = attrs.field(default=0, validator=_port)

    # -- storage
    data_path: str = attrs.field(factory=os.getcwd)
    mem_queue_size: int = 10000
    """As given, negative values included (``mem_queue_limit`` is what the queues use)."""
    max_bytes_per_file: int = attrs.field(default=100 * MiB, validator=_positive)
    sync_every: int = attrs.field(default=2500, validator=_positive)
    sync_timeout: float = attrs.field(default=2.0, validator=_positive)
    durable: bool = False
    """lmq extension: answer PUB/MPUB/DPUB only after the records are fsynced."""
    retention_ms: int = attrs.field(default=0, validator=_non_negative)
    """lmq extension: keep a topic's log segments every channel has passed while their newest
    message is younger than this (0: delete them once passed, nsqd's behaviour). A topic's own
    policy (``/topic/policy``) overrides it."""
    retention_bytes: int = attrs.field(default=0, validator=_non_negative)
    """lmq extension: keep such segments while they and the newer ones take at most this many
    bytes (0: no size retention)."""
    compression: str = "none"
    """lmq extension: how stored batches are compressed where a topic's ``compression`` policy
    says nothing (``none``, ``zstd[:LEVEL]``, ``lz4``, ``snappy``, ``gzip[:LEVEL]``;
    ``lmqd.storage.atrest.compression``); ``lmqd.config`` checks the spelling."""
    encryption_key_files: tuple[str, ...] = ()
    """lmq extension: files holding 256-bit keys; every stored batch is encrypted with the
    first, batches sealed with any of them are read (``lmqd.storage.atrest.keys``)."""
    encryption_cipher: str = "aes-256-gcm"
    """lmq extension: ``aes-256-gcm`` or ``chacha20-poly1305``."""
    rewrite_at_rest: bool = False
    """lmq extension: at start-up, before restoring, rewrite every segment not sealed as the
    settings say now (``lmqd.storage.atrest.rewrite``): after a key rotation, or once
    encryption is turned on, nothing stays under an old key or in clear."""
    # -- replication (lmq; ``lmqd.mirror``, docs/mirrors.md)
    mirror_of: str = ""
    """The primary's HTTP address (``[https://]host:port``) this node mirrors ("": none)."""
    mirror_force: bool = False
    """Follow ``mirror_of`` even if that means dropping local data (own topics, a copy of
    another node or of an older epoch)."""
    mirror_max_lag: int = attrs.field(default=10_000_000, validator=_non_negative)
    """A primary keeps at most this many messages per topic for a mirror that has not copied
    them (0: no bound). 10 M messages: ~1 GB of 100-byte messages on disk, a 100 s outage of a
    mirror at 100k messages a second."""
    min_insync_mirrors: int = attrs.field(default=0, validator=_non_negative)
    """On a primary: a publish is answered ``OK`` only once this many mirrors have stored it
    (fsynced, a ``--durable`` mirror); with fewer in sync it is refused (Kafka's ``acks=all``
    with ``min.insync.replicas``; ``lmqd.engine.insync``). 0: replication is asynchronous."""
    mirror_ack_timeout: float = attrs.field(default=5.0, validator=_positive)
    """With ``min_insync_mirrors``: the longest a publish's ``OK`` waits for the mirrors before
    it fails, and how long a mirror that stopped fetching or fell behind stays in sync."""
    mirror_tls_root_ca_file: str = ""
    mirror_tls_cert: str = ""
    mirror_tls_key: str = ""
    mirror_tls_insecure_skip_verify: bool = False
    ttl_ms: int = attrs.field(default=0, validator=_non_negative)
    """lmq extension: the default of a topic's ``ttl_ms`` policy: a message not delivered within
    this many ms of its publish is dropped or dead-lettered (0: no TTL)."""

    # -- channel policies (lmq; ``lmqd.engine.channel_policy``), the defaults of every channel
    max_attempts: int = attrs.field(default=0, validator=_non_negative)
    """Deliveries after which a message that comes back is dead-lettered or dropped (0: no
    limit, nsqd)."""
    dead_letter_topic: str = ""
    """Where such messages go ("": dropped and counted); ``lmqd.config`` checks the name."""
    backoff_ms: int = attrs.field(default=0, validator=_non_negative)
    """Server-side delay before a timed-out or ``REQ 0`` message is retried, doubling with each
    attempt (0: none, nsqd)."""
    backoff_max_ms: int = attrs.field(default=0, validator=_non_negative)
    """The cap of that delay (0: ``MAX_BACKOFF_MS``, an hour)."""
    backoff_jitter: float = attrs.field(default=0.0)
    """Fraction of the delay taken off at random, 0 to 1."""
    # lmq topic publish policies (lmqd.engine.policy): the defaults of every topic's own keys.
    max_depth: int = attrs.field(default=0, validator=_non_negative)
    """The deepest backlog a topic's channel may have (0: unbounded, nsqd)."""
    overflow: str = attrs.field(default="reject")
    """What a topic at its max_depth does with a publish: one of ``OVERFLOW_MODES``."""
    publish_rate: int = attrs.field(default=0, validator=_non_negative)
    """Messages per second a topic accepts (0: no limit)."""
    publish_burst: int = attrs.field(default=0, validator=_non_negative)
    """Messages a topic accepts at once above its rate (0: one second's worth)."""
    dedup_window_ms: int = attrs.field(default=0, validator=_non_negative)
    """A body equal to one published this recently is not enqueued again (0: off)."""

    # -- messages
    msg_timeout: float = attrs.field(default=60.0, validator=_positive)
    max_msg_timeout: float = attrs.field(default=15 * 60.0, validator=_positive)
    max_msg_size: int = attrs.field(default=1 * MiB, validator=_positive)
    max_body_size: int = attrs.field(default=5 * MiB, validator=_positive)
    max_req_timeout: float = attrs.field(default=60 * 60.0, validator=_non_negative)

    # -- clients
    max_rdy_count: int = attrs.field(default=2500, validator=_positive)
    max_heartbeat_interval: float = attrs.field(default=60.0, validator=_positive)
    max_output_buffer_size: int = attrs.field(default=64 * KiB, validator=_positive)
    max_output_buffer_timeout: float = attrs.field(default=30.0, validator=_positive)
    min_output_buffer_timeout: float = attrs.field(default=0.025, validator=_non_negative)
    output_buffer_timeout: float = attrs.field(default=0.25, validator=_non_negative)
    max_channel_consumers: int = attrs.field(default=0, validator=_non_negative)
    max_buffered_bytes: int = attrs.field(default=256 * MiB, validator=_positive)
    """lmq extension: bytes all TCP connections may hold in their buffers together (output not
    yet sent, partial commands received); past it publishes wait (backpressure) until they
    drain, other commands still apply (``lmqd.server.budget``). 256 MiB: some fifty
    connections each at its own bound (a consumer's ~5 MiB of output, a publisher's 5 MiB
    MPUB), far more than a healthy daemon holds (a consumer that keeps up holds one send's
    worth)."""
    client_timeout: float = 60.0
    """nsqd's ClientTimeout (no flag there): the default heartbeat interval is half of it."""

    # -- compression and TLS (negotiated in IDENTIFY; TLS also serves HTTPS)
    deflate: bool = True
    max_deflate_level: int = attrs.field(default=6)
    snappy: bool = True
    tls_cert: str = ""
    tls_key: str = ""
    tls_client_auth_policy: str = ""
    tls_root_ca_file: str = ""
    tls_required: str = "false"
    tls_min_version: str = "tls1.0"

    # -- statistics
    e2e_processing_latency_percentiles: tuple[float, ...] = attrs.field(default=())
    e2e_processing_latency_window_time: float = attrs.field(default=600.0, validator=_positive)
    statsd_address: str = ""
    statsd_prefix: str = "nsq.%s"
    statsd_interval: float = 60.0
    statsd_mem_stats: bool = True
    statsd_udp_packet_size: int = 508
    statsd_exclude_ephemeral: bool = False
    metrics_clients: bool = True
    """Per-client series in ``/metrics`` (one per connection: a busy daemon's many short-lived
    clients can swamp a Prometheus server with series, so operators may turn them off)."""

    # -- cluster and auth (auth: --auth-http-address and the HTTP client timeouts it uses)
    nsqlookupd_tcp_addresses: tuple[str, ...] = ()
    """Lookupds to register with (``lmqd.registration``); changeable at run time over HTTP."""
    auth_http_addresses: tuple[str, ...] = ()
    auth_http_request_method: str = "get"
    http_client_connect_timeout: float = 2.0
    http_client_request_timeout: float = 5.0
    queue_scan_worker_pool_max: int = 4
    queue_scan_selection_count: int = 20

    @max_attempts.validator
    def _check_max_attempts(self, attribute: attrs.Attribute[int], value: int) -> None:
        if not 0 <= value <= MAX_ATTEMPTS:
            raise ValueError(f"--max-attempts must be [0,{MAX_ATTEMPTS}]")

    @backoff_ms.validator
    @backoff_max_ms.validator
    def _check_backoff(self, attribute: attrs.Attribute[int], value: int) -> None:
        if not 0 <= value <= MAX_BACKOFF_MS:
            raise ValueError(f"--{attribute.name.replace('_', '-')} must be [0,{MAX_BACKOFF_MS}]")

    @backoff_jitter.validator
    def _check_backoff_jitter(self, attribute: attrs.Attribute[float], value: float) -> None:
        if not 0 <= value <= 1:
            raise ValueError("--backoff-jitter must be [0,1]")

    @max_deflate_level.validator
    def _check_deflate_level(self, attribute: attrs.Attribute[int], value: int) -> None:
        if not 1 <= value <= 9:
            raise ValueError("--max-deflate-level must be [1,9]")

    @overflow.validator
    def _check_overflow(self, attribute: attrs.Attribute[str], value: str) -> None:
        if value not in OVERFLOW_MODES:
            raise ValueError(f"--overflow must be {' or '.join(OVERFLOW_MODES)} (got {value!r})")

    @node_id.validator
    def _check_node_id(self, attribute: attrs.Attribute[int], value: int) -> None:
        if not 0 <= value < 1024:
            raise ValueError("--node-id must be [0,1024)")

    @msg_timeout.validator
    def _check_msg_timeout(self, attribute: attrs.Attribute[float], value: float) -> None:
        if value > self.max_msg_timeout:
            raise ValueError("--msg-timeout must be <= --max-msg-timeout")

    @e2e_processing_latency_percentiles.validator
    def _check_percentiles(
        self, attribute: attrs.Attribute[tuple[float, ...]], value: tuple[float, ...]
    ) -> None:
        for p in value:
            if not 0 < p <= 1:
                raise ValueError(f"invalid E2E processing latency percentile: {p}")

    @property
    def mem_queue_limit(self) -> int:
        """Messages a topic's or channel's memory queue holds: ``--mem-queue-size``, a negative
        value read as 0 (everything through the disk).

        nsqd v1.3.0 parses the flag as an int64 and starts with ``-1``, reports ``-1`` at
        ``/config/mem_queue_size``, and its channels keep a memory queue only for a size
        ``> 0``; but its topics make a Go channel of that capacity, which panics ("makechan:
        size out of range") at the first topic, so every publish then fails (HTTP 500
        ``INTERNAL_ERROR``) and the daemon hangs. lmqd starts and reports the value as nsqd does
        and gives it the meaning of nsqd's ``> 0`` test, with a warning at start-up
        (``lmqd.config.Resolved.warnings``)."""
        return max(self.mem_queue_size, 0)

    @property
    def default_heartbeat_interval(self) -> float:
        return self.client_timeout / 2

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> Options:
        """Build from config keys; an unknown key is an error, not silently ignored."""
        known = {a.name for a in attrs.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown option(s): {', '.join(unknown)}")
        return cls(**values)

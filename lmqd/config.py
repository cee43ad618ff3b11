"""Settings: nsqd's flags and config-file keys, their value syntaxes, and the mapping onto Options.

``SETTINGS`` is the one table of every setting ``lmqd`` accepts (nsqd v1.3.0's flags, the master
ones, and lmq's ``--durable``, ``--retention-ms``, ``--retention-bytes``, ``--ttl-ms``, the
channel-policy defaults ``--max-attempts`` ... ``--backoff-jitter`` and the topic publish-policy
defaults ``--max-depth`` ... ``--dedup-window-ms``): the flag name, the
config-file key(s), the value kind, the ``Options`` field it sets, and -- for the settings lmqd
accepts only so that nsqd command lines and config files keep working -- why it has no effect.
``lmqd.cli`` builds its flags from this table and ``docs/operations.md`` documents it;
``tests/test_config.py`` checks both stay in step.

Value syntaxes are nsqd's (Go's ``flag`` package and ``mreiferson/go-options``):

- durations: Go's ``time.ParseDuration`` (``1m30s``, ``250ms``, ``1.5h``, ``300us``/``µs``,
  ``ns``); a bare number is rejected except ``0``, as ``flag.Duration`` does. In a config file a
  duration is such a string, or an integer number of **milliseconds** (go-options' rule).
- integers: Go's ``strconv.ParseInt(s, 0, 64)``: decimal, ``0x``/``0o``/``0b`` prefixes, ``_``
  between digits, and (as in Go) a leading ``0`` means octal.
- booleans: Go's ``strconv.ParseBool``: ``1 t T TRUE true True 0 f F FALSE false False``.

Fail closed: ``inert`` is only for harmless settings (deprecated no-ops, queue-scan
tuning, experiments). Nothing that protects a connection -- TLS, client certificates,
``--tls-required``, auth servers -- may be accepted and ignored; those either work or stop lmqd
(``tests/security`` holds both rules).

Resolution is nsqd's: a flag given on the command line wins over the config file, which wins over
the default; an unknown config key is an error (nsqd silently ignores it; a typo that silently
keeps a default is worse).
"""

from __future__ import annotations

import enum
import os
import re
import tomllib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from lmqd.names import is_ephemeral, valid_name
from lmqd.net import split_address
from lmqd.options import LOG_LEVELS, Options

__all__ = [
    "BOOL_KINDS",
    "BOOL_WORDS",
    "SETTINGS",
    "ConfigError",
    "Kind",
    "Resolved",
    "Setting",
    "default_value",
    "format_duration",
    "load_toml",
    "parse_bool",
    "parse_duration",
    "parse_duration_ns",
    "parse_int",
    "resolve",
]


class ConfigError(ValueError):
    """A setting could not be parsed or is invalid; ``str(error)`` is a one-line message."""


class Kind(enum.Enum):
    """How a setting's value is written and what Python type it becomes."""

    STRING = "string"
    INT = "int"
    FLOAT = "number"
    DURATION = "duration"  # -> float seconds
    BOOL = "bool"
    STRING_LIST = "string list"  # repeatable flag; list (or comma string) in a config file
    FLOAT_LIST = "float list"  # repeatable flag and/or comma list
    LOG_LEVEL = "log level"  # debug|info|warn|error|fatal, any case
    TLS_REQUIRED = "tls-required"  # a bool flag that also takes "tcp-https"
    TLS_MIN_VERSION = "tls version"  # tls1.0 .. tls1.3


# Kinds whose flag may be given bare (``-snappy``), meaning true: Go's ``IsBoolFlag``.
BOOL_KINDS = frozenset({Kind.BOOL, Kind.TLS_REQUIRED})


@attrs.frozen
class Setting:
    """One nsqd flag (and config key) as lmqd understands it."""

    flag: str
    """The flag name without dashes, nsqd's spelling: ``"msg-timeout"``."""
    kind: Kind
    field: str | None
    """The ``Options`` field it sets; None for nsqd flags that lmqd has no setting for."""
    help: str
    keys: tuple[str, ...] = ()
    """Config-file keys; empty means the flag name with ``_`` for ``-`` (nsqd's default)."""
    inert: str | None = None
    """Why lmqd accepts this setting but does not act on it; None when it takes effect."""
    default: Any = None
    """Default for settings without an ``Options`` field (those with one use Options')."""

    @property
    def config_keys(self) -> tuple[str, ...]:
        """The keys this setting answers to in a config file."""
        return self.keys or (self.flag.replace("-", "_"),)

    @property
    def param(self) -> str:
        """A Python identifier for the setting (click's parameter name)."""
        return self.flag.replace("-", "_")


_NO_SCAN = "lmqd has no queue-scan workers: each channel wakes exactly at its next deadline"
_EXPERIMENT = "nsqd master's topology-aware-consumption experiment is not implemented"

SETTINGS: tuple[Setting, ...] = (
    # -- logging and identity
    Setting("log-level", Kind.LOG_LEVEL, "log_level",
            "log verbosity: debug, info, warn, error or fatal"),
    Setting("log-prefix", Kind.STRING, "log_prefix", "prefix of every log line"),
    Setting("verbose", Kind.BOOL, None, "[deprecated in nsqd] has no effect, use --log-level",
            inert="deprecated no-op in nsqd too", default=False),
    Setting("node-id", Kind.INT, "node_id",
            "unique part of message IDs, in [0,1024)",
            keys=("id", "node_id")),
    Setting("worker-id", Kind.BOOL, None, "[deprecated in nsqd] use --node-id",
            inert="deprecated no-op in nsqd too", default=False),
    # -- listeners
    Setting("tcp-address", Kind.STRING, "tcp_address",
            "<addr>:<port> to listen on for TCP clients"),
    Setting("http-address", Kind.STRING, "http_address",
            "<addr>:<port> to listen on for HTTP clients (empty: no HTTP listener)"),
    Setting("https-address", Kind.STRING, "https_address",
            "<addr>:<port> to listen on for HTTPS clients (with --tls-cert and --tls-key)"),
    Setting("broadcast-address", Kind.STRING, "broadcast_address",
            "address this node is registered with lookupd as, and reported by /info"),
    Setting("broadcast-tcp-port", Kind.INT, "broadcast_tcp_port",
            "TCP port registered with lookupd (0: the listening port)"),
    Setting("broadcast-http-port", Kind.INT, "broadcast_http_port",
            "HTTP port registered with lookupd (0: the listening port)"),
    Setting("lookupd-tcp-address", Kind.STRING_LIST, "nsqlookupd_tcp_addresses",
            "lookupd TCP address to register with (may be given multiple times)",
            keys=("nsqlookupd_tcp_addresses",)),
    Setting("auth-http-address", Kind.STRING_LIST, "auth_http_addresses",
            "<addr>:<port> or URL of an auth server (may be given multiple times)",
            keys=("auth_http_addresses",)),
    Setting("auth-http-request-method", Kind.STRING, "auth_http_request_method",
            "HTTP method for auth requests: get or post"),
    Setting("http-client-connect-timeout", Kind.DURATION, "http_client_connect_timeout",
            "timeout for HTTP connect (auth requests)"),
    Setting("http-client-request-timeout", Kind.DURATION, "http_client_request_timeout",
            "timeout for HTTP requests (auth requests)"),
    Setting("topology-region", Kind.STRING, None, "[nsqd master] this node's region",
            inert=_EXPERIMENT, default=""),
    Setting("topology-zone", Kind.STRING, None, "[nsqd master] this node's zone",
            inert=_EXPERIMENT, default=""),
    Setting("enable-experiment", Kind.STRING_LIST, None,
            "[nsqd master] enable an experiment (may be given multiple times)",
            keys=("enable_experiment",), inert=_EXPERIMENT, default=()),
    # -- storage
    Setting("data-path", Kind.STRING, "data_path",
            "directory for disk-backed messages and metadata"),
    Setting("mem-queue-size", Kind.INT, "mem_queue_size",
            "messages kept in memory per topic before they go to its log on disk"),
    Setting("max-bytes-per-file", Kind.INT, "max_bytes_per_file",
            "bytes per log or disk queue segment file before rolling"),
    Setting("sync-every", Kind.INT, "sync_every", "messages per disk queue fsync"),
    Setting("sync-timeout", Kind.DURATION, "sync_timeout",
            "longest time between disk queue fsyncs while there is activity"),
    Setting("durable", Kind.BOOL, "durable",
            "[lmq] answer PUB/MPUB/DPUB only once the message is fsynced"),
    Setting("retention-ms", Kind.INT, "retention_ms",
            "[lmq] keep a topic's log this many ms after every channel passed it (0: no)"),
    Setting("retention-bytes", Kind.INT, "retention_bytes",
            "[lmq] keep up to this many bytes of a topic's log every channel passed (0: no)"),
    Setting("compression", Kind.STRING, "compression",
            "[lmq] default compression of stored batches where a topic's policy sets none: "
            "none, zstd[:LEVEL], lz4, snappy, gzip[:LEVEL]"),
    Setting("encryption-key-file", Kind.STRING_LIST, "encryption_key_files",
            "[lmq] file with a 256-bit key encrypting stored messages (may be given multiple "
            "times: the first encrypts, all decrypt)",
            keys=("encryption_key_files",)),
    Setting("encryption-cipher", Kind.STRING, "encryption_cipher",
            "[lmq] aes-256-gcm or chacha20-poly1305"),
    Setting("rewrite-at-rest", Kind.BOOL, "rewrite_at_rest",
            "[lmq] at start-up, rewrite stored segments under the first key and the current "
            "compression (after a key rotation, or once encryption is turned on)"),
    # -- replication (lmq: docs/mirrors.md)
    Setting("mirror-of", Kind.STRING, "mirror_of",
            "[lmq] follow the primary lmqd at this HTTP address ([https://]host:port) as its "
            "mirror: reads served, writes refused, until POST /mirror/promote"),
    Setting("mirror-force", Kind.BOOL, "mirror_force",
            "[lmq] with --mirror-of: drop this node's own topics, or a copy of another primary "
            "or of an older epoch, and copy the primary afresh"),
    Setting("mirror-max-lag", Kind.INT, "mirror_max_lag",
            "[lmq] on a primary: messages of a topic kept for a mirror that has not copied "
            "them; past it they are released and the mirror reports a gap (0: no bound)"),
    Setting("min-insync-mirrors", Kind.INT, "min_insync_mirrors",
            "[lmq] on a primary: answer a publish OK only once this many mirrors stored it "
            "(fsynced, a --durable mirror); refuse it with fewer in sync (0: asynchronous); "
            "the default of the topic policy min_insync_mirrors"),
    Setting("mirror-ack-timeout", Kind.DURATION, "mirror_ack_timeout",
            "[lmq] with --min-insync-mirrors: the longest a publish waits for its mirrors "
            "before E_PUB_FAILED, and how long a mirror behind stays in sync"),
    Setting("mirror-tls-root-ca-file", Kind.STRING, "mirror_tls_root_ca_file",
            "[lmq] CA certificates that sign an https:// primary's (default: the system's)"),
    Setting("mirror-tls-cert", Kind.STRING, "mirror_tls_cert",
            "[lmq] client certificate for an https:// primary with a client-auth policy"),
    Setting("mirror-tls-key", Kind.STRING, "mirror_tls_key",
            "[lmq] private key of --mirror-tls-cert"),
    Setting("mirror-tls-insecure-skip-verify", Kind.BOOL, "mirror_tls_insecure_skip_verify",
            "[lmq] don't verify an https:// primary's certificate"),
    Setting("ttl-ms", Kind.INT, "ttl_ms",
            "[lmq] default topic TTL: drop or dead-letter messages not delivered within this "
            "many ms of their publish (0: no TTL)"),
    # -- channel policies (lmq): every channel's defaults; /channel/policy overrides them
    Setting("max-attempts", Kind.INT, "max_attempts",
            "[lmq] deliveries after which a message that comes back is dead-lettered or "
            "dropped (0: unlimited)"),
    Setting("dead-letter-topic", Kind.STRING, "dead_letter_topic",
            "[lmq] topic for messages out of attempts or expired (empty: drop and count)"),
    Setting("backoff-ms", Kind.INT, "backoff_ms",
            "[lmq] server-side delay before retrying a timed-out or REQ 0 message, doubling "
            "with each attempt (0: none)"),
    Setting("backoff-max-ms", Kind.INT, "backoff_max_ms",
            "[lmq] cap of that delay (0: one hour)"),
    Setting("backoff-jitter", Kind.FLOAT, "backoff_jitter",
            "[lmq] fraction of the delay taken off at random, 0 to 1"),
    Setting("max-depth", Kind.INT, "max_depth",
            "[lmq] default topic policy: most messages any channel of a topic may have waiting "
            "(0: unbounded)"),
    Setting("overflow", Kind.STRING, "overflow",
            "[lmq] default topic policy at max-depth: reject or drop_oldest"),
    Setting("publish-rate", Kind.INT, "publish_rate",
            "[lmq] default topic policy: messages per second a topic accepts (0: no limit)"),
    Setting("publish-burst", Kind.INT, "publish_burst",
            "[lmq] default topic policy: messages accepted at once above the rate "
            "(0: publish-rate)"),
    Setting("dedup-window-ms", Kind.INT, "dedup_window_ms",
            "[lmq] default topic policy: drop a body equal to one published this many ms "
            "before (0: off)"),
    Setting("queue-scan-worker-pool-max", Kind.INT, "queue_scan_worker_pool_max",
            "max concurrency for checking in-flight and deferred timeouts", inert=_NO_SCAN),
    Setting("queue-scan-selection-count", Kind.INT, "queue_scan_selection_count",
            "channels to check per cycle for in-flight and deferred timeouts", inert=_NO_SCAN),
    # -- messages
    Setting("msg-timeout", Kind.DURATION, "msg_timeout",
            "default time to wait before auto-requeueing an in-flight message"),
    Setting("max-msg-timeout", Kind.DURATION, "max_msg_timeout",
            "maximum msg_timeout a client may set (IDENTIFY) or extend to (TOUCH)"),
    Setting("max-msg-size", Kind.INT, "max_msg_size", "maximum size of a single message in bytes"),
    Setting("max-body-size", Kind.INT, "max_body_size", "maximum size of a command body in bytes"),
    Setting("max-req-timeout", Kind.DURATION, "max_req_timeout",
            "maximum requeue delay (REQ) and publish deferral (DPUB, /pub?defer=)"),
    # -- clients
    Setting("max-heartbeat-interval", Kind.DURATION, "max_heartbeat_interval",
            "maximum heartbeat interval a client may ask for"),
    Setting("max-rdy-count", Kind.INT, "max_rdy_count", "maximum RDY count for a client"),
    Setting("max-output-buffer-size", Kind.INT, "max_output_buffer_size",
            "maximum output buffer size (bytes) a client may ask for"),
    Setting("max-output-buffer-timeout", Kind.DURATION, "max_output_buffer_timeout",
            "maximum output buffer flush interval a client may ask for"),
    Setting("min-output-buffer-timeout", Kind.DURATION, "min_output_buffer_timeout",
            "minimum output buffer flush interval a client may ask for"),
    Setting("output-buffer-timeout", Kind.DURATION, "output_buffer_timeout",
            "default output buffer flush interval"),
    Setting("max-channel-consumers", Kind.INT, "max_channel_consumers",
            "maximum consumers per channel (0: unlimited)"),
    Setting("max-buffered-bytes", Kind.INT, "max_buffered_bytes",
            "[lmq] bytes all TCP connections' buffers may hold before publishes wait"),
    # -- statsd
    Setting("statsd-address", Kind.STRING, "statsd_address",
            "UDP <addr>:<port> of a statsd daemon"),
    Setting("statsd-prefix", Kind.STRING, "statsd_prefix",
            "prefix of statsd keys (%s for the host)"),
    Setting("statsd-interval", Kind.DURATION, "statsd_interval",
            "time between pushes to statsd"),
    Setting("statsd-mem-stats", Kind.BOOL, "statsd_mem_stats",
            "send memory and GC stats to statsd"),
    Setting("statsd-udp-packet-size", Kind.INT, "statsd_udp_packet_size",
            "size in bytes of statsd UDP packets"),
    Setting("statsd-exclude-ephemeral", Kind.BOOL, "statsd_exclude_ephemeral",
            "leave ephemeral topics and channels out of statsd"),
    Setting("metrics-clients", Kind.BOOL, "metrics_clients",
            "per-client series (lmqd_client_*, lmqd_producer_*) in /metrics"),
    # -- end-to-end latency
    Setting("e2e-processing-latency-percentile", Kind.FLOAT_LIST,
            "e2e_processing_latency_percentiles",
            "message processing time percentile to track, in (0,1] (repeatable or comma list)",
            keys=("e2e_processing_latency_percentiles",)),
    Setting("e2e-processing-latency-window-time", Kind.DURATION,
            "e2e_processing_latency_window_time",
            "time window of the end-to-end latency percentiles"),
    # -- TLS
    Setting("tls-cert", Kind.STRING, "tls_cert", "path to certificate file"),
    Setting("tls-key", Kind.STRING, "tls_key", "path to key file"),
    Setting("tls-client-auth-policy", Kind.STRING, "tls_client_auth_policy",
            "client certificate policy: require or require-verify"),
    Setting("tls-root-ca-file", Kind.STRING, "tls_root_ca_file",
            "path to certificate authority file"),
    Setting("tls-required", Kind.TLS_REQUIRED, "tls_required",
            "require TLS for client connections: true, false or tcp-https"),
    Setting("tls-min-version", Kind.TLS_MIN_VERSION, "tls_min_version",
            "minimum TLS version: tls1.0, tls1.1, tls1.2 or tls1.3"),
    # -- compression
    Setting("deflate", Kind.BOOL, "deflate", "allow deflate negotiation"),
    Setting("max-deflate-level", Kind.INT, "max_deflate_level",
            "max deflate level a client may negotiate, 1..9"),
    Setting("snappy", Kind.BOOL, "snappy", "allow snappy negotiation"),
)  # fmt: skip

_BY_FLAG: dict[str, Setting] = {s.flag: s for s in SETTINGS}
_BY_KEY: dict[str, Setting] = {key: s for s in SETTINGS for key in s.config_keys}


def default_value(setting: Setting, defaults: Options | None = None) -> Any:
    """The value a setting has when neither a flag nor the config file gives one.

    ``defaults`` is a default ``Options()`` to read from, to save building one per call.
    """
    if setting.field is None:
        return setting.default
    return getattr(defaults if defaults is not None else Options(), setting.field)


# -- value syntaxes ------------------------------------------------------------------------------

_NS_PER_UNIT = {
    "ns": 1,
    "us": 1_000,
    "µs": 1_000,  # U+00B5 micro sign
    "μs": 1_000,  # U+03BC greek small letter mu
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60 * 1_000_000_000,
    "h": 3600 * 1_000_000_000,
}
_NUMBER = re.compile(r"([0-9]*)(?:\.([0-9]*))?")
# Go's time.Duration is an int64 of nanoseconds: anything beyond it is an invalid duration.
_MAX_NS = 2**63 - 1


def parse_duration_ns(text: str) -> int:
    """Go's ``time.ParseDuration``: ``"1m30s"`` -> 90_000_000_000 (integer nanoseconds).

    Raises ValueError with Go's message (``time: missing unit in duration "60"``).
    """
    quoted = f'"{text}"'
    s = text
    negative = False
    if s[:1] in ("-", "+"):
        negative = s[0] == "-"
        s = s[1:]
    if s == "0":
        return 0
    if not s:
        raise ValueError(f"time: invalid duration {quoted}")
    total = 0
    pos = 0
    while pos < len(s):
        number = _NUMBER.match(s, pos)
        assert number is not None  # the pattern matches the empty string
        whole, fraction = number.group(1), number.group(2)
        if not whole and not fraction:
            raise ValueError(f"time: invalid duration {quoted}")
        pos = number.end()
        unit_end = pos
        while unit_end < len(s) and s[unit_end] not in "0123456789.":
            unit_end += 1
        if unit_end == pos:
            raise ValueError(f"time: missing unit in duration {quoted}")
        unit = s[pos:unit_end]
        if unit not in _NS_PER_UNIT:
            raise ValueError(f'time: unknown unit "{unit}" in duration {quoted}')
        scale = _NS_PER_UNIT[unit]
        total += int(whole or "0") * scale
        if fraction:
            total += int(fraction) * scale // 10 ** len(fraction)
        if total > _MAX_NS + negative:
            raise ValueError(f"time: invalid duration {quoted}")
        pos = unit_end
    return -total if negative else total


def parse_duration(text: str) -> float:
    """A Go duration string as float seconds: ``"1m30s"`` -> 90.0, ``"250ms"`` -> 0.25."""
    return parse_duration_ns(text) / 1e9


def _decimal(value: int, unit: int) -> str:
    whole, rest = divmod(value, unit)
    if not rest:
        return str(whole)
    digits = str(rest).rjust(len(str(unit)) - 1, "0").rstrip("0")
    return f"{whole}.{digits}"


def format_duration(seconds: float) -> str:
    """Float seconds as Go's ``Duration.String()``: 60.0 -> ``"1m0s"``, 0.25 -> ``"250ms"``."""
    ns = round(seconds * 1e9)
    sign = "-" if ns < 0 else ""
    ns = abs(ns)
    if ns == 0:
        return "0s"
    if ns < 1_000:
        return f"{sign}{ns}ns"
    if ns < 1_000_000:
        return f"{sign}{_decimal(ns, 1_000)}µs"
    if ns < 1_000_000_000:
        return f"{sign}{_decimal(ns, 1_000_000)}ms"
    minutes, rest = divmod(ns, 60 * 1_000_000_000)
    secs = _decimal(rest, 1_000_000_000) + "s"
    if not minutes:
        return f"{sign}{secs}"
    hours, minutes = divmod(minutes, 60)
    if not hours:
        return f"{sign}{minutes}m{secs}"
    return f"{sign}{hours}h{minutes}m{secs}"


def default_shown(value: object, *, duration: bool = False) -> str:
    """A default as both daemons' ``--help`` writes it, nsqd's way: ``1m0s`` (``duration``:
    float seconds), ``true``, ``none`` for an empty list, plain text, quoted only when empty or
    space-padded so that it shows (``"[lmqd] "``)."""
    if duration and isinstance(value, int | float) and not isinstance(value, bool):
        return format_duration(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value) or "none"
    if isinstance(value, str) and (value == "" or value != value.strip()):
        return f'"{value}"'
    return str(value)


_INT_SYNTAX = re.compile(r"[+-]?[0-9][0-9A-Za-z_]*")


def parse_int(text: str) -> int:
    """Go's ``strconv.ParseInt(text, 0, 64)`` (what ``flag.Int64`` uses): ``"0x10"`` -> 16.

    As in Go, a leading ``0`` means octal (``"017"`` -> 15); the result must fit an int64.
    """
    if not _INT_SYNTAX.fullmatch(text):
        raise ValueError("not an integer")
    sign, digits = ("", text) if text[0] not in "+-" else (text[0], text[1:])
    if len(digits) > 1 and digits[0] == "0" and digits[1] in "01234567_":
        digits = "0o" + digits[1:]  # Python's base-0 parsing has no bare-leading-zero octal
    try:
        value = int(sign + digits, 0)
    except ValueError:
        raise ValueError("not an integer") from None
    if not -(2**63) <= value < 2**63:
        raise ValueError("value out of range")
    return value


_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})
BOOL_WORDS = _TRUE | _FALSE
"""Every spelling Go's ``strconv.ParseBool`` accepts."""


def parse_bool(text: str) -> bool:
    """Go's ``strconv.ParseBool``: ``1 t T TRUE true True`` / ``0 f F FALSE false False``."""
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError("not a boolean (true, false, 1, 0, t, f)")


_TLS_VERSIONS = ("tls1.0", "tls1.1", "tls1.2", "tls1.3")


def _parse_log_level(text: str) -> str:
    level = text.lower()
    if level not in LOG_LEVELS:
        raise ValueError(f"invalid log level '{text}' ({', '.join(LOG_LEVELS)})")
    return level


def _parse_tls_required(text: str) -> str:
    # nsqd's tlsRequiredOption: "tcp-https" (TLS for TCP only) or any ParseBool spelling.
    lowered = text.lower()
    if lowered == "tcp-https":
        return lowered
    return "true" if parse_bool(lowered) else "false"


def _parse_tls_min_version(text: str) -> str:
    lowered = text.lower() or "tls1.0"  # nsqd: an empty value keeps the default
    if lowered not in _TLS_VERSIONS:
        raise ValueError(f'unknown tlsVersionOption "{text}"')
    return lowered


def _parse_float(text: str) -> float:
    # Go's strconv.ParseFloat spellings that matter here; nan and inf are no setting.
    try:
        value = float(text)
    except ValueError:
        raise ValueError("not a number") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError("not a finite number")
    return value


def _parse_floats(text: str) -> list[float]:
    try:
        return [float(part) for part in text.split(",")]
    except ValueError:
        raise ValueError("not a comma-separated list of numbers") from None


_SCALAR_PARSERS: dict[Kind, Callable[[str], Any]] = {
    Kind.STRING: str,
    Kind.INT: parse_int,
    Kind.FLOAT: _parse_float,
    Kind.DURATION: parse_duration,
    Kind.BOOL: parse_bool,
    Kind.LOG_LEVEL: _parse_log_level,
    Kind.TLS_REQUIRED: _parse_tls_required,
    Kind.TLS_MIN_VERSION: _parse_tls_min_version,
}


def _from_flag(setting: Setting, raw: str | Sequence[str]) -> Any:
    """A command-line value (each occurrence of a repeatable flag is one string) -> Python."""
    if setting.kind is Kind.STRING_LIST:
        return tuple([raw] if isinstance(raw, str) else raw)
    if setting.kind is Kind.FLOAT_LIST:
        # nsqd's FloatArray: every occurrence may be a comma list; kept sorted, highest first.
        parts = [raw] if isinstance(raw, str) else raw
        return tuple(sorted((f for part in parts for f in _parse_floats(part)), reverse=True))
    if not isinstance(raw, str):
        raise TypeError(f"--{setting.flag} takes one value")
    return _SCALAR_PARSERS[setting.kind](raw)


def _from_config(setting: Setting, raw: object) -> Any:
    """A TOML value -> Python, with go-options' coercions (strings parse as on the command line)."""
    kind = setting.kind
    if kind is Kind.STRING_LIST:
        if isinstance(raw, str):
            return tuple(raw.split(","))
        if isinstance(raw, list) and all(isinstance(v, str) for v in raw):
            return tuple(raw)
        raise ValueError("want a list of strings")
    if kind is Kind.FLOAT_LIST:
        if isinstance(raw, str):
            return tuple(sorted(_parse_floats(raw), reverse=True))
        if isinstance(raw, list) and all(
            isinstance(v, int | float) and not isinstance(v, bool) for v in raw
        ):
            return tuple(sorted((float(v) for v in raw), reverse=True))
        raise ValueError("want a list of numbers")
    if kind is Kind.DURATION and isinstance(raw, int) and not isinstance(raw, bool):
        return raw / 1000  # go-options: an integer duration in a config file is milliseconds
    if kind is Kind.DURATION and isinstance(raw, float):
        raise ValueError('want a duration string such as "1m30s", or integer milliseconds')
    if kind is Kind.INT and isinstance(raw, int) and not isinstance(raw, bool):
        return raw
    if kind is Kind.FLOAT and isinstance(raw, int | float) and not isinstance(raw, bool):
        return _parse_float(str(float(raw)))
    if kind in BOOL_KINDS and isinstance(raw, bool):
        return raw if kind is Kind.BOOL else ("true" if raw else "false")
    if isinstance(raw, str):
        return _SCALAR_PARSERS[kind](raw)
    raise ValueError(f"want a {kind.value}")


# -- resolution ----------------------------------------------------------------------------------


@attrs.frozen
class Resolved:
    """The outcome of ``resolve``: the Options, and what the operator set that lmqd ignores."""

    options: Options
    extras: Mapping[str, Any]
    """Values of settings with no ``Options`` field, by flag name (only those that were given)."""
    inert: tuple[Setting, ...]
    """Inert settings whose value is not the default, in ``SETTINGS`` order."""

    def warnings(self) -> list[str]:
        """One startup warning per inert setting given a non-default value, and one for a
        negative ``--mem-queue-size`` (``Options.mem_queue_limit``)."""
        out = [
            f"--{s.flag} is accepted for nsqd compatibility and has no effect" for s in self.inert
        ]
        if self.options.mem_queue_size < 0:
            out.append(
                f"--mem-queue-size={self.options.mem_queue_size} keeps no message in memory, "
                "as 0 does (nsqd v1.3.0 starts with it but cannot create a topic)"
            )
        return out


def load_toml(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a TOML config file; ConfigError (nsqd's wording) if it can't be read or parsed."""
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"failed to load config file {os.fspath(path)} - {exc}") from None


def _hint(setting: Setting, raw: object) -> str:
    # Go's flag.Duration takes no bare numbers but nsqd's old int flags did: say what to write.
    if setting.kind is Kind.DURATION and isinstance(raw, str) and raw.lstrip("+-").isdigit():
        return f" (a duration needs a unit, e.g. {raw.lstrip('+')}s or {raw.lstrip('+')}ms)"
    return ""


def _describe_flag_value(raw: str | Sequence[str]) -> str:
    return f'"{raw}"' if isinstance(raw, str) else ",".join(f'"{v}"' for v in raw)


def resolve(
    flags: Mapping[str, str | Sequence[str]],
    config: Mapping[str, Any] | None = None,
    *,
    source: str = "config file",
) -> Resolved:
    """Combine command-line values (by flag name) and config-file values (by key) into Options.

    ``flags`` holds only the flags actually given (a repeatable flag's value is the sequence of
    its occurrences); ``source`` names the config file in error messages. Raises ConfigError.
    """
    values: dict[str, Any] = {}
    given_key: dict[str, str] = {}
    config = config or {}
    unknown = sorted(k for k in config if k not in _BY_KEY)
    if unknown:
        raise ConfigError(f"unknown option(s) in {source}: {', '.join(unknown)}")
    for key, raw in config.items():
        setting = _BY_KEY[key]
        if setting.flag in given_key:
            raise ConfigError(
                f"{given_key[setting.flag]} and {key} in {source} set the same option"
            )
        given_key[setting.flag] = key
        try:
            values[setting.flag] = _from_config(setting, raw)
        except ValueError as exc:
            raise ConfigError(
                f"invalid value {raw!r} for {key} in {source}: {exc}{_hint(setting, raw)}"
            ) from None
    for flag, raw in flags.items():
        try:
            setting = _BY_FLAG[flag]
        except KeyError:
            raise ConfigError(f"flag provided but not defined: --{flag}") from None
        try:
            values[flag] = _from_flag(setting, raw)
        except (ValueError, TypeError) as exc:
            desc = _describe_flag_value(raw)
            raise ConfigError(
                f"invalid value {desc} for --{flag}: {exc}{_hint(setting, raw)}"
            ) from None

    fields: dict[str, Any] = {}
    extras: dict[str, Any] = {}
    for flag, value in values.items():
        field = _BY_FLAG[flag].field
        if field is None:
            extras[flag] = value
        else:
            fields[field] = value
    if fields.get("data_path") == "":
        fields["data_path"] = os.getcwd()  # nsqd: an empty --data-path means the cwd
    # nsqd.New: a client-auth policy implies --tls-required.
    if fields.get("tls_client_auth_policy") and fields.get("tls_required", "false") == "false":
        fields["tls_required"] = "true"
    try:
        options = Options(**fields)
    except (ValueError, TypeError) as exc:
        raise ConfigError(str(exc)) from None
    _check_nsqd_rules(options)

    def current(s: Setting) -> Any:
        return getattr(options, s.field) if s.field else extras.get(s.flag, s.default)

    defaults = Options()
    inert = tuple(s for s in SETTINGS if s.inert and current(s) != default_value(s, defaults))
    return Resolved(options=options, extras=extras, inert=inert)


def _check_nsqd_rules(options: Options) -> None:
    """nsqd.New's start-up checks that Options' own validators don't cover."""
    for flag, address in (
        ("tcp-address", options.tcp_address),
        ("http-address", options.http_address),
        ("https-address", options.https_address),
    ):
        if address or flag == "tcp-address":  # an empty HTTP(S) address: no such listener
            try:
                split_address(address, default_host="0.0.0.0")
            except ValueError as exc:
                raise ConfigError(f"--{flag}: {exc}") from None
    if options.tls_required != "false" and not (options.tls_cert and options.tls_key):
        raise ConfigError("cannot require TLS client connections without TLS key and cert")
    if options.dead_letter_topic and (
        not valid_name(options.dead_letter_topic) or is_ephemeral(options.dead_letter_topic)
    ):
        raise ConfigError("--dead-letter-topic must be a valid, non-ephemeral topic name")
    if options.auth_http_request_method not in ("get", "post"):
        raise ConfigError("--auth-http-request-method must be post or get")
    if options.mirror_of:
        rest = options.mirror_of.removeprefix("https://").removeprefix("http://")
        try:
            split_address(rest)
        except ValueError as exc:
            raise ConfigError(f"--mirror-of: {exc}") from None
    if options.mirror_tls_key and not options.mirror_tls_cert:
        raise ConfigError("--mirror-tls-key needs --mirror-tls-cert")
    tls_flags = (options.mirror_tls_root_ca_file or options.mirror_tls_cert
                 or options.mirror_tls_insecure_skip_verify)  # fmt: skip
    if tls_flags and not options.mirror_of.startswith("https://"):
        # A security flag must never be accepted and ignored.
        raise ConfigError("--mirror-tls-* flags need an https:// --mirror-of address")

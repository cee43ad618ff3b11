"""IDENTIFY: decoding the JSON body like nsqd's Go decoder, validating it, and the response.

nsqd decodes the body into a Go struct (``identifyDataV2``) with ``encoding/json``, then applies
the fields in this order, each failure a fatal ``E_BAD_BODY IDENTIFY <reason>``
(``nsqd/client_v2.go``): heartbeat interval, output buffer timeout, output buffer size, sample
rate, msg timeout. Decoding follows Go's rules that matter to a client: unknown keys are ignored,
``null`` leaves a field at its default, keys match case-insensitively, an integer field takes
only an integer literal (``1.5`` or ``1e3`` is a decode error), and a string field takes only a
string.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, NoReturn

import attrs

import lmqd
from lmqd.protocol import errors
from lmqd.protocol.extension import EXT_VERSION
from lmqd.protocol.extension import IDENTIFY_KEY as EXT_IDENTIFY_KEY
from lmqd.protocol.limits import (
    DEFAULT_DEFLATE_LEVEL,
    MAX_SAMPLE_RATE,
    MIN_HEARTBEAT_INTERVAL_MS,
    MIN_MSG_TIMEOUT_MS,
    MIN_OUTPUT_BUFFER_SIZE,
    Limits,
)

_INT64 = (-(1 << 63), (1 << 63) - 1)
_INT32 = (-(1 << 31), (1 << 31) - 1)

# identifyDataV2's fields and their Go types.
_STRING_FIELDS = ("client_id", "hostname", "user_agent")
_BOOL_FIELDS = ("feature_negotiation", "tls_v1", "deflate", "snappy")
_INT_FIELDS = {
    "heartbeat_interval": _INT64,
    "output_buffer_size": _INT64,
    "output_buffer_timeout": _INT64,
    "deflate_level": _INT64,
    "msg_timeout": _INT64,
    "sample_rate": _INT32,
}
_FIELDS = frozenset((*_STRING_FIELDS, *_BOOL_FIELDS, *_INT_FIELDS))
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")

HTTP_ADDRESS_KEY = "lmq_http_address"
"""lmq's IDENTIFY key asking where the HTTP API listens: ``true`` with ``feature_negotiation``,
answered under the same key with the bound ``host:port`` ("" without an HTTP listener). nsqd
ignores it; a client that does not ask gets nsqd's answer exactly (docs/protocol.md)."""


@attrs.frozen(kw_only=True, slots=True)
class IdentifySettings:
    """A client's effective settings after IDENTIFY (defaults filled in, all in wire units)."""

    client_id: str = ""
    """As sent; "" means the server keeps its default (the remote address)."""
    hostname: str = ""
    """As sent; "" means the server keeps its default (the remote address)."""
    user_agent: str = ""
    feature_negotiation: bool = False
    """The client wants the JSON response instead of ``OK``."""
    heartbeat_interval_ms: int
    """0 when the client disabled heartbeats (``-1``); SUB is then refused."""
    output_buffer_size: int
    output_buffer_timeout_ms: int
    """0 means unbuffered: flush every write."""
    sample_rate: int = 0
    msg_timeout_ms: int
    tls_v1: bool = False
    """Negotiated TLS upgrade (only with feature negotiation and a server that offers it)."""
    deflate: bool = False
    deflate_level: int = DEFAULT_DEFLATE_LEVEL
    snappy: bool = False
    lmq_ext: int | None = None
    """lmq's message extension (``lmqd.protocol.extension``): None when the client did not ask
    (its IDENTIFY answer is nsqd's exactly), else the version accepted (0: not accepted)."""
    lmq_http_address: bool = False
    """The client asked where the daemon's HTTP API listens (``HTTP_ADDRESS_KEY``): the Spark
    source, given the TCP address a sink takes, finds the node's ``/topic/read`` this way."""


def default_settings(limits: Limits) -> IdentifySettings:
    """The settings of a client that never sends IDENTIFY."""
    return IdentifySettings(
        heartbeat_interval_ms=limits.default_heartbeat_interval_ms,
        output_buffer_size=limits.default_output_buffer_size,
        output_buffer_timeout_ms=limits.output_buffer_timeout_ms,
        msg_timeout_ms=limits.msg_timeout_ms,
        deflate_level=min(DEFAULT_DEFLATE_LEVEL, limits.max_deflate_level),
    )


def _reject_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not JSON")


def decode_identify_body(body: bytes) -> dict[str, Any]:
    """Decode an IDENTIFY body as Go's ``json.Unmarshal`` into nsqd's struct would.

    Returns the decoded object ({} for ``null``); raises ``E_BAD_BODY IDENTIFY failed to decode
    JSON body`` for anything Go rejects: invalid JSON, NaN/Infinity, a top level that is not an
    object, or a known field of the wrong type.
    """
    # Go replaces invalid UTF-8 inside strings with U+FFFD and rejects it elsewhere; decoding
    # with "replace" then parsing gives both outcomes.
    # Go type-checks every occurrence of a duplicated key, so keep the key/value pairs of the
    # outermost object (the last one the parser completes) as well as the dict.
    last_pairs: list[tuple[str, Any]] = []

    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        nonlocal last_pairs
        last_pairs = pairs
        return dict(pairs)

    try:
        data = json.loads(
            body.decode("utf-8", "replace"),
            object_pairs_hook=hook,
            parse_constant=_reject_constant,
        )
    except (ValueError, RecursionError):
        raise errors.identify_bad_json() from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise errors.identify_bad_json()
    _check_fields(last_pairs)
    return data


def _check_fields(pairs: list[tuple[str, Any]]) -> None:
    for key, value in pairs:
        field = _field_name(key)
        if field is not None and value is not None:
            _check_type(field, value)


def _field_name(key: str) -> str | None:
    if key in _FIELDS:
        return key
    # Go's decoder falls back to a case-insensitive match of the struct tag.
    folded = key.lower()
    return folded if folded in _FIELDS else None


def _check_type(field: str, value: Any) -> None:
    if field in _STRING_FIELDS:
        ok = isinstance(value, str)
    elif field in _BOOL_FIELDS:
        ok = isinstance(value, bool)
    else:
        low, high = _INT_FIELDS[field]
        ok = type(value) is int and low <= value <= high
    if not ok:
        raise errors.identify_bad_json()


def _fields(data: Mapping[str, Any]) -> dict[str, Any]:
    """Known fields by canonical name, later keys winning (Go assigns in document order)."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        field = _field_name(key)
        if field is None or value is None:
            continue
        _check_type(field, value)
        if field in _STRING_FIELDS and not value.isascii():
            # Go has no lone surrogates: its decoder turns an unpaired \ud800 into U+FFFD.
            value = _LONE_SURROGATE.sub("\ufffd", value)
        out[field] = value
    return out


def negotiate(data: Mapping[str, Any], limits: Limits) -> IdentifySettings:
    """Validate a decoded IDENTIFY body against ``limits`` and return the effective settings.

    Raises ``ProtocolError`` with nsqd's exact text: ``E_BAD_BODY IDENTIFY heartbeat interval
    (N) is invalid`` (and likewise output buffer timeout/size, sample rate, msg timeout), or
    ``E_IDENTIFY_FAILED`` when both deflate and snappy would be enabled.
    """
    f = _fields(data)

    heartbeat = f.get("heartbeat_interval", 0)
    if heartbeat == -1:
        heartbeat_ms = 0
    elif heartbeat == 0:
        heartbeat_ms = limits.default_heartbeat_interval_ms
    elif MIN_HEARTBEAT_INTERVAL_MS <= heartbeat <= limits.max_heartbeat_interval_ms:
        heartbeat_ms = heartbeat
    else:
        raise errors.identify_invalid(f"heartbeat interval ({heartbeat}) is invalid")

    # nsqd's SetOutputBuffer checks the timeout before the size.
    timeout = f.get("output_buffer_timeout", 0)
    if timeout == -1:
        timeout_ms = 0
    elif timeout == 0:
        timeout_ms = limits.output_buffer_timeout_ms
    elif limits.min_output_buffer_timeout_ms <= timeout <= limits.max_output_buffer_timeout_ms:
        timeout_ms = timeout
    else:
        raise errors.identify_invalid(f"output buffer timeout ({timeout}) is invalid")

    size = f.get("output_buffer_size", 0)
    if size == -1:
        # Unbuffered: every write goes straight to the socket.
        buffer_size = 1
        timeout_ms = 0
    elif size == 0:
        buffer_size = limits.default_output_buffer_size
    elif MIN_OUTPUT_BUFFER_SIZE <= size <= limits.max_output_buffer_size:
        buffer_size = size
    else:
        raise errors.identify_invalid(f"output buffer size ({size}) is invalid")

    sample_rate = f.get("sample_rate", 0)
    if not 0 <= sample_rate <= MAX_SAMPLE_RATE:
        raise errors.identify_invalid(f"sample rate ({sample_rate}) is invalid")

    msg_timeout = f.get("msg_timeout", 0)
    if msg_timeout == 0:
        msg_timeout_ms = limits.msg_timeout_ms
    elif MIN_MSG_TIMEOUT_MS <= msg_timeout <= limits.max_msg_timeout_ms:
        msg_timeout_ms = msg_timeout
    else:
        raise errors.identify_invalid(f"msg timeout ({msg_timeout}) is invalid")

    # Upgrades are only negotiated with feature negotiation (nsqd returns "OK" before looking).
    negotiation = f.get("feature_negotiation", False)
    tls_v1 = negotiation and limits.tls_available and f.get("tls_v1", False)
    deflate = negotiation and limits.deflate_available and f.get("deflate", False)
    snappy = negotiation and limits.snappy_available and f.get("snappy", False)
    deflate_level = DEFAULT_DEFLATE_LEVEL
    requested_level = f.get("deflate_level", 0)
    if deflate and requested_level > 0:
        deflate_level = requested_level
    deflate_level = min(deflate_level, limits.max_deflate_level)
    if deflate and snappy:
        raise errors.identify_compression_conflict()
    # lmq's extension: a key nsqd ignores, answered only where the answer is JSON.
    lmq_ext: int | None = None
    if negotiation and EXT_IDENTIFY_KEY in data:
        asked = data[EXT_IDENTIFY_KEY]
        lmq_ext = EXT_VERSION if type(asked) is int and asked == EXT_VERSION else 0
    lmq_http_address = negotiation and data.get(HTTP_ADDRESS_KEY) is True

    return IdentifySettings(
        client_id=f.get("client_id", ""),
        hostname=f.get("hostname", ""),
        user_agent=f.get("user_agent", ""),
        feature_negotiation=negotiation,
        heartbeat_interval_ms=heartbeat_ms,
        output_buffer_size=buffer_size,
        output_buffer_timeout_ms=timeout_ms,
        sample_rate=sample_rate,
        msg_timeout_ms=msg_timeout_ms,
        tls_v1=tls_v1,
        deflate=deflate,
        deflate_level=deflate_level,
        snappy=snappy,
        lmq_ext=lmq_ext,
        lmq_http_address=lmq_http_address,
    )


def identify_response(
    settings: IdentifySettings, limits: Limits, *, http_address: str = ""
) -> bytes:
    """nsqd's JSON answer to IDENTIFY with ``feature_negotiation`` (v1.3.0's key order), then
    lmq's keys for a client that asked for them: the extension version, and ``http_address``
    (where the HTTP API listens, "" for nowhere)."""
    answer: dict[str, Any] = {
        "max_rdy_count": limits.max_rdy_count,
        "version": lmqd.NSQD_COMPAT_VERSION,
        "max_msg_timeout": limits.max_msg_timeout_ms,
        "msg_timeout": settings.msg_timeout_ms,
        "tls_v1": settings.tls_v1,
        "deflate": settings.deflate,
        "deflate_level": settings.deflate_level,
        "max_deflate_level": limits.max_deflate_level,
        "snappy": settings.snappy,
        "sample_rate": settings.sample_rate,
        "auth_required": limits.auth_required,
        "output_buffer_size": settings.output_buffer_size,
        "output_buffer_timeout": settings.output_buffer_timeout_ms,
    }
    if settings.lmq_ext is not None:
        answer[EXT_IDENTIFY_KEY] = settings.lmq_ext
    if settings.lmq_http_address:
        answer[HTTP_ADDRESS_KEY] = http_address
    return json.dumps(answer, separators=(",", ":")).encode()

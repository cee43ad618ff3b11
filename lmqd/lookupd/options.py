"""lmqlookupd's options: nsqlookupd v1.3.0's settings and defaults (``apps/nsqlookupd``)."""

from __future__ import annotations

import socket
from typing import Any

import attrs

from lmqd.logging_setup import LEVELS
from lmqd.net import split_address

__all__ = ["NSQLOOKUPD_COMPAT_VERSION", "LookupdOptions"]

NSQLOOKUPD_COMPAT_VERSION = "1.3.0"
"""The nsqlookupd release whose protocol and API lmqlookupd speaks: what IDENTIFY and /info
report (nsqadmin flags nodes below the highest version it sees as out of date)."""


def _address(instance: Any, attribute: attrs.Attribute[str], value: str) -> None:
    split_address(value, default_host="0.0.0.0")  # raises ValueError with the reason


def _non_negative(instance: Any, attribute: attrs.Attribute[float], value: float) -> None:
    if value < 0:
        raise ValueError(f"{attribute.name} must not be negative ({value})")


def _log_level(instance: Any, attribute: attrs.Attribute[str], value: str) -> None:
    if value not in LEVELS:
        raise ValueError(f"invalid log level '{value}' ({', '.join(LEVELS)})")


@attrs.frozen(kw_only=True)
class LookupdOptions:
    """Every setting of lmqlookupd with nsqlookupd's default; durations in seconds."""

    tcp_address: str = attrs.field(default="0.0.0.0:4160", validator=_address)
    """Where registering nodes connect (V1 protocol)."""
    http_address: str = attrs.field(default="0.0.0.0:4161", validator=_address)
    """Where consumers and admin tools query the HTTP API."""
    broadcast_address: str = attrs.field(factory=socket.gethostname)
    """The address sent in the IDENTIFY answer; nsqd queries ``/channels`` at it."""
    inactive_producer_timeout_s: float = attrs.field(default=300.0, validator=_non_negative)
    """A producer not heard from (IDENTIFY, PING) for longer is hidden from /lookup, /nodes."""
    tombstone_lifetime_s: float = attrs.field(default=45.0, validator=_non_negative)
    """How long ``/topic/tombstone`` hides a producer of a topic from /lookup."""
    log_level: str = attrs.field(default="info", validator=_log_level)
    """debug, info, warn, error or fatal (lower case)."""
    log_prefix: str = "[lmqlookupd] "
    """Prefix of every log line (nsqlookupd's is ``[nsqlookupd] ``)."""

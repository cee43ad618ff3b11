"""``GET/PUT /config/:opt``: settings by their config key, rendered as nsqd's Go JSON renders them.

nsqd answers ``GET /config/<cfg name>`` with ``json.Marshal`` of the option's Go value, so the
types on the wire are Go's: a ``time.Duration`` is an integer of **nanoseconds**
(``msg_timeout`` -> ``60000000000``), ``--log-level`` is the integer ``lg.LogLevel`` (debug 1,
info 2, warn 3, error 4, fatal 5), ``--tls-required`` the integer constant (false 0,
tcp-https 1, true 2), ``--tls-min-version`` the ``crypto/tls`` number (tls1.0 = 769 ... tls1.3 =
772), lists are arrays. The names are nsqd's config keys (the flag with ``_`` for ``-``, or the
renamed ones: ``id`` for ``--node-id``, ``nsqlookupd_tcp_addresses`` for
``--lookupd-tcp-address`` ...), taken from ``lmqd.config.SETTINGS``; settings lmqd accepts but
has no ``Options`` field for report their default.

``PUT`` changes only what nsqd lets it change at run time: ``nsqlookupd_tcp_addresses`` (a JSON
array of strings) and ``log_level`` (the bare level name, any case). The daemon's frozen
``Options`` is replaced with ``attrs.evolve`` through ``Broker.update_options``, so everything
that reads ``broker.options`` afterwards sees the new value and the broker's observers hear of
it (the lookupd registration connects to new addresses and drops removed ones at once); a log
level change also re-levels logging at once.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import attrs

from lmqd.config import SETTINGS, Kind, Setting, default_value
from lmqd.httpapi.asgi import HttpError
from lmqd.logging_setup import LEVELS, set_level
from lmqd.options import LOG_LEVELS, Options

if TYPE_CHECKING:
    from lmqd.broker import Broker

__all__ = ["MUTABLE_OPTIONS", "get_option", "put_option"]

_BY_KEY: dict[str, Setting] = {key: s for s in SETTINGS for key in s.config_keys}

# nsqd/options.go: TLSNotRequired = iota, TLSRequiredExceptHTTP, TLSRequired.
_TLS_REQUIRED_NUMBERS = {"false": 0, "tcp-https": 1, "true": 2}
# crypto/tls: VersionTLS10 = 0x0301 ... VersionTLS13 = 0x0304.
_TLS_VERSION_NUMBERS = {"tls1.0": 0x0301, "tls1.1": 0x0302, "tls1.2": 0x0303, "tls1.3": 0x0304}

MUTABLE_OPTIONS = ("nsqlookupd_tcp_addresses", "log_level")
"""What ``PUT /config/:opt`` may change (nsqd's ``doConfig``)."""


def _go_value(setting: Setting, value: Any) -> Any:
    kind = setting.kind
    if kind is Kind.DURATION:
        return round(value * 1_000_000_000)
    if kind is Kind.LOG_LEVEL:
        return LOG_LEVELS.index(value) + 1  # internal/lg: DEBUG = 1 ... FATAL = 5
    if kind is Kind.TLS_REQUIRED:
        return _TLS_REQUIRED_NUMBERS.get(value, value)
    if kind is Kind.TLS_MIN_VERSION:
        return _TLS_VERSION_NUMBERS.get(value, value)
    if kind in (Kind.STRING_LIST, Kind.FLOAT_LIST):
        return list(value)
    return value


def get_option(options: Options, key: str) -> Any:
    """The JSON value nsqd would answer for ``GET /config/<key>``; ``400 INVALID_OPTION``."""
    setting = _BY_KEY.get(key)
    if setting is None:
        raise HttpError(400, "INVALID_OPTION")
    if setting.field is None:
        value = default_value(setting, options)
    else:
        value = getattr(options, setting.field)
    return _go_value(setting, value)


def put_option(broker: Broker, key: str, body: bytes) -> Any:
    """Apply ``PUT /config/<key>`` with ``body`` (already size-checked); returns the new value.

    ``400 INVALID_VALUE`` for a body that does not parse, ``400 INVALID_OPTION`` for a key nsqd
    does not let you change.
    """
    if key == "nsqlookupd_tcp_addresses":
        try:
            value = json.loads(body)
        except (ValueError, RecursionError):  # nested past the stack is not a list either
            raise HttpError(400, "INVALID_VALUE") from None
        # Go unmarshals into []string: an array of strings, or null (which clears it).
        if value is None:
            value = []
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise HttpError(400, "INVALID_VALUE")
        # The registration connects to new lookupds and drops removed ones at once (nsqd).
        broker.update_options(attrs.evolve(broker.options, nsqlookupd_tcp_addresses=tuple(value)))
    elif key == "log_level":
        # nsqd: lg.ParseLogLevel(string(body)), case-insensitive, no JSON quoting.
        level = body.decode("utf-8", "replace").lower()
        if level not in LEVELS:
            raise HttpError(400, "INVALID_VALUE")
        broker.update_options(attrs.evolve(broker.options, log_level=level))
        set_level(level)
    else:
        raise HttpError(400, "INVALID_OPTION")
    return get_option(broker.options, key)

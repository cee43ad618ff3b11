"""The clients' options: one vocabulary for every front end (async and blocking).

``ConsumerOptions`` and ``ProducerOptions`` hold every setting with its default; the front ends
take them as keyword arguments (``Consumer(topic, channel, address, max_in_flight=100)``), typed
by the ``ConsumerSettings`` / ``ProducerSettings`` dicts, and build the options with
``from_settings``, which rejects unknown names and maps the **renamed** ones
(``RENAMED``) with a ``DeprecationWarning``. Renamed names keep working for one release
(docs/client.md lists them).

Durations are float seconds, as everywhere in lmq_client.
"""

from __future__ import annotations

import warnings
from typing import Any, TypedDict, TypeVar

import attrs

from lmq_client.core.backoff import Backoff
from lmq_client.core.discovery import (
    DEFAULT_POLL_INTERVAL,
    DEFAULT_POLL_JITTER,
    DEFAULT_TIMEOUT,
    check_schedule,
)
from lmq_client.transport import PLAIN, TransportOptions

__all__ = [
    "RENAMED",
    "ConsumerOptions",
    "ConsumerSettings",
    "ProducerOptions",
    "ProducerSettings",
    "dpub_delay_ms",
    "from_settings",
]


def _positive(instance: object, attribute: attrs.Attribute[Any], value: float) -> None:
    if not value > 0:
        raise ValueError(f"{attribute.name} must be > 0, not {value!r}")


def _not_negative(instance: object, attribute: attrs.Attribute[Any], value: float) -> None:
    if value < 0:
        raise ValueError(f"{attribute.name} must be >= 0, not {value!r}")


@attrs.frozen(kw_only=True)
class ConsumerOptions:
    """Every consumer setting (async and blocking consumers alike)."""

    max_in_flight: int = attrs.field(default=1, validator=_positive)
    """Messages in flight at once, spread over the daemons as RDY."""
    max_attempts: int = attrs.field(default=5, validator=_not_negative)
    """A message delivered more often is given up (0: no limit)."""
    requeue_delay: float = attrs.field(default=90.0, validator=_not_negative)
    """A failed handler's requeue delay, times the message's attempts (go-nsq's rule)..."""
    max_requeue_delay: float = attrs.field(default=900.0, validator=_not_negative)
    """... capped at this."""
    backoff: Backoff = attrs.field(factory=lambda: Backoff(base=1.0, max_delay=120.0))
    """The pause after failures (go-nsq's max_backoff_duration: 2 minutes)."""
    reconnect_backoff: Backoff = attrs.field(factory=lambda: Backoff(base=1.0, max_delay=60.0))
    """Between attempts to reach a daemon again."""
    heartbeat_interval: float = 30.0
    msg_timeout: float | None = None
    """Asked of the daemon in IDENTIFY (None: the daemon's ``--msg-timeout``)."""
    connect_timeout: float = attrs.field(default=5.0, validator=_positive)
    """Connecting, the handshake and the subscription, per daemon."""
    rdy_redistribute_interval: float = attrs.field(default=5.0, validator=_positive)
    """With fewer slots than daemons: how often slots move off daemons that sent nothing."""
    close_timeout: float = attrs.field(default=30.0, validator=_not_negative)
    """How long ``close()`` of an async consumer waits for handlers to answer."""
    lookupd_poll_interval: float = DEFAULT_POLL_INTERVAL
    lookupd_poll_jitter: float = DEFAULT_POLL_JITTER
    lookupd_timeout: float = attrs.field(default=DEFAULT_TIMEOUT, validator=_positive)
    """Seconds one lookupd query may take."""
    transport: TransportOptions = PLAIN
    """TLS, compression, AUTH (``lmq_client.transport``)."""

    def __attrs_post_init__(self) -> None:
        check_schedule(self.lookupd_poll_interval, self.lookupd_poll_jitter)

    def requeue_delay_for(self, attempts: int) -> float:
        """``requeue_delay * attempts``, capped at ``max_requeue_delay`` (go-nsq)."""
        return min(self.requeue_delay * attempts, self.max_requeue_delay)


@attrs.frozen(kw_only=True)
class ProducerOptions:
    """Every producer setting (async and blocking producers alike)."""

    heartbeat_interval: float = 30.0
    connect_timeout: float = attrs.field(default=5.0, validator=_positive)
    """Connecting and the handshake, per daemon."""
    response_timeout: float = attrs.field(default=10.0, validator=_positive)
    """The blocking producer's wait for an answer (an async caller bounds its own wait)."""
    transport: TransportOptions = PLAIN


class ConsumerSettings(TypedDict, total=False):
    """``ConsumerOptions``' fields as keyword arguments (and the renamed ``timeout``)."""

    max_in_flight: int
    max_attempts: int
    requeue_delay: float
    max_requeue_delay: float
    backoff: Backoff | None
    reconnect_backoff: Backoff | None
    heartbeat_interval: float
    msg_timeout: float | None
    connect_timeout: float
    rdy_redistribute_interval: float
    close_timeout: float
    lookupd_poll_interval: float
    lookupd_poll_jitter: float
    lookupd_timeout: float
    transport: TransportOptions
    timeout: float


class ProducerSettings(TypedDict, total=False):
    """``ProducerOptions``' fields as keyword arguments (and the renamed ``timeout``)."""

    heartbeat_interval: float
    connect_timeout: float
    response_timeout: float
    transport: TransportOptions
    timeout: float


RENAMED: dict[str, tuple[str, ...]] = {
    "timeout": ("connect_timeout", "response_timeout"),
}
"""Old name -> the names it sets now (the blocking clients' ``timeout`` bounded both the
connection and each wait for an answer)."""

OptionsT = TypeVar("OptionsT", ConsumerOptions, ProducerOptions)


def from_settings(
    cls: type[OptionsT], settings: dict[str, Any], *, stacklevel: int = 3
) -> OptionsT:
    """``cls`` from keyword arguments: ``TypeError`` for an unknown name, a
    ``DeprecationWarning`` for a renamed one (the new name wins when both are given); ``None``
    for a ``Backoff`` means its default."""
    fields = {f.name for f in attrs.fields(cls)}
    values: dict[str, Any] = {}
    for name, value in settings.items():
        if name in fields:
            if value is not None or name not in ("backoff", "reconnect_backoff"):
                values[name] = value
            continue
        if name not in RENAMED:
            raise TypeError(f"unknown {cls.__name__} setting {name!r}")
        targets = [t for t in RENAMED[name] if t in fields]
        warnings.warn(
            f"{name}= is deprecated: use {' and '.join(t + '=' for t in targets)}",
            DeprecationWarning,
            stacklevel=stacklevel,
        )
        for target in targets:
            if target not in settings:
                values[target] = value
    return cls(**values)


def dpub_delay_ms(
    delay: float | None, *, delay_ms: int | None = None, int_is_ms: bool = False,
    stacklevel: int = 3,
) -> int:
    """DPUB's delay on the wire (milliseconds) from ``delay`` in seconds, the unit of every
    producer. The blocking producer's old spelling, milliseconds, still works for one release
    with a ``DeprecationWarning``: ``delay_ms=``, and (``int_is_ms``) a non-zero ``int`` passed as
    ``delay``, which it cannot tell from seconds (pass seconds as a float: ``2.5``, ``30.0``)."""
    if delay_ms is not None:
        if delay is not None:
            raise TypeError("dpub() takes delay (seconds) or the deprecated delay_ms, not both")
        warnings.warn("dpub(delay_ms=) is deprecated: pass delay= in seconds",
                      DeprecationWarning, stacklevel=stacklevel)  # fmt: skip
        return delay_ms
    if delay is None:
        raise TypeError("dpub() needs a delay (seconds)")
    if int_is_ms and type(delay) is int and delay != 0:
        warnings.warn(
            f"dpub({delay}, ...): an int delay is read as milliseconds in this release, and as "
            f"seconds in the next: pass seconds as a float ({delay / 1000!r})",
            DeprecationWarning, stacklevel=stacklevel,
        )  # fmt: skip
        return delay
    return round(delay * 1000)

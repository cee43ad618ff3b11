"""The limits the protocol enforces, in wire units (bytes, milliseconds), built from Options."""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from lmqd.units import KiB, MiB

if TYPE_CHECKING:
    from lmqd.options import Options


MAX_LINE_LENGTH = 16 * KiB
"""Longest command line accepted, newline included.

nsqd reads each command with ``bufio.Reader.ReadSlice('\\n')`` on a reader of
``defaultBufferSize`` = 16 KiB; a line that does not fit fails with "buffer full" and the
connection is dropped. The longest legitimate line is ``DPUB <64-char topic> <ms>`` (under 100
bytes), so 16 KiB only bounds the buffer, it never limits a real client.
"""

DEFAULT_OUTPUT_BUFFER_SIZE = 16 * KiB
"""nsqd's ``defaultBufferSize``: a client's output buffer unless IDENTIFY asks otherwise."""

MIN_OUTPUT_BUFFER_SIZE = 64
"""The smallest ``output_buffer_size`` IDENTIFY accepts (besides -1 and 0)."""

MIN_HEARTBEAT_INTERVAL_MS = 1000
MIN_MSG_TIMEOUT_MS = 1000
MAX_SAMPLE_RATE = 99
DEFAULT_DEFLATE_LEVEL = 6


def _ms(seconds: float) -> int:
    return round(seconds * 1000)


@attrs.frozen(kw_only=True)
class Limits:
    """Everything the codec needs to know about the daemon's settings; defaults are nsqd's."""

    max_msg_size: int = 1 * MiB
    """Largest single message body (PUB, DPUB, each part of an MPUB)."""
    max_body_size: int = 5 * MiB
    """Largest command body (IDENTIFY, AUTH, a whole MPUB)."""
    max_rdy_count: int = 2500
    max_req_timeout_ms: int = 60 * 60 * 1000
    """Cap for REQ delays (clamped) and DPUB defer times (rejected above it)."""
    max_msg_timeout_ms: int = 15 * 60 * 1000
    msg_timeout_ms: int = 60 * 1000
    """The default message timeout when IDENTIFY does not set one."""
    max_heartbeat_interval_ms: int = 60 * 1000
    default_heartbeat_interval_ms: int = 30 * 1000
    """nsqd: half the (fixed) 60 s client timeout."""
    max_output_buffer_size: int = 64 * KiB
    max_output_buffer_timeout_ms: int = 30 * 1000
    min_output_buffer_timeout_ms: int = 25
    output_buffer_timeout_ms: int = 250
    """The default output buffer timeout when IDENTIFY does not set one."""
    default_output_buffer_size: int = DEFAULT_OUTPUT_BUFFER_SIZE
    max_deflate_level: int = 6
    max_line_length: int = MAX_LINE_LENGTH
    """Longest command line, newline included (see ``MAX_LINE_LENGTH`` for the number)."""
    tls_available: bool = False
    """Whether IDENTIFY may negotiate TLS (``--tls-cert`` and ``--tls-key`` are set)."""
    tls_required: bool = False
    """Every command but IDENTIFY needs TLS first (``--tls-required`` true or ``tcp-https``,
    or a ``--tls-client-auth-policy``)."""
    deflate_available: bool = True
    """Whether IDENTIFY may negotiate deflate (``--deflate``, default true)."""
    snappy_available: bool = True
    """Whether IDENTIFY may negotiate snappy (``--snappy``, default true)."""
    auth_required: bool = False
    """Reported to clients in the IDENTIFY response (``--auth-http-address`` is set); then
    SUB/PUB/MPUB/DPUB need a successful AUTH first."""

    @classmethod
    def from_options(cls, options: Options) -> Limits:
        """Convert the daemon's Options (float seconds) into wire units (int milliseconds)."""
        return cls(
            max_msg_size=options.max_msg_size,
            max_body_size=options.max_body_size,
            max_rdy_count=options.max_rdy_count,
            max_req_timeout_ms=_ms(options.max_req_timeout),
            max_msg_timeout_ms=_ms(options.max_msg_timeout),
            msg_timeout_ms=_ms(options.msg_timeout),
            max_heartbeat_interval_ms=_ms(options.max_heartbeat_interval),
            default_heartbeat_interval_ms=_ms(options.default_heartbeat_interval),
            max_output_buffer_size=options.max_output_buffer_size,
            max_output_buffer_timeout_ms=_ms(options.max_output_buffer_timeout),
            min_output_buffer_timeout_ms=_ms(options.min_output_buffer_timeout),
            output_buffer_timeout_ms=_ms(options.output_buffer_timeout),
            max_deflate_level=options.max_deflate_level,
            tls_available=bool(options.tls_cert and options.tls_key),
            tls_required=options.tls_required != "false" or bool(options.tls_client_auth_policy),
            deflate_available=options.deflate,
            snappy_available=options.snappy,
            auth_required=bool(options.auth_http_addresses),
        )

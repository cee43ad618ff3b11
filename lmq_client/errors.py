"""Exceptions raised by the lmq clients.

An error frame from the daemon becomes an ``NSQError`` subclass chosen by its code (so callers can
catch ``BadTopicError`` or test ``exc.code == "E_MPUB_FAILED"``); a network failure becomes
``ConnectionFailed``, which is also a builtin ``ConnectionError`` and names the daemon's address.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "AuthError",
    "AuthRequired",
    "BadBodyError",
    "BadChannelError",
    "BadMessageError",
    "BadTopicError",
    "ConnectionFailed",
    "DpubFailedError",
    "FinFailedError",
    "IdentifyFailedError",
    "InvalidError",
    "InvalidNameError",
    "LmqClientError",
    "MpubFailedError",
    "NSQError",
    "PubFailedError",
    "ReqFailedError",
    "SubFailedError",
    "TouchFailedError",
    "error_from_frame",
    "reason",
]

NON_FATAL_CODES = frozenset({"E_FIN_FAILED", "E_REQ_FAILED", "E_TOUCH_FAILED"})


class LmqClientError(Exception):
    """Base class of every exception the lmq clients raise on purpose."""


class NSQError(LmqClientError):
    """The daemon answered with an error frame: ``code`` (``E_...``) and its description.

    ``fatal`` is False only for E_FIN_FAILED, E_REQ_FAILED and E_TOUCH_FAILED; after any other
    error the daemon has closed the connection.
    """

    code: str = "E_UNKNOWN"

    def __init__(self, code: str | None = None, text: str = "", *, address: str = "") -> None:
        if code is not None:
            self.code = code
        self.text = text
        self.address = address
        self.fatal = self.code not in NON_FATAL_CODES
        message = f"{self.code} {text}" if text else self.code
        super().__init__(f"{message} (from {address})" if address else message)


class InvalidError(NSQError):
    """``E_INVALID``: a malformed command or one not allowed in the connection's state."""

    code = "E_INVALID"


class BadBodyError(NSQError):
    """``E_BAD_BODY``: an IDENTIFY/AUTH/MPUB body the daemon could not accept."""

    code = "E_BAD_BODY"


class BadTopicError(NSQError):
    """``E_BAD_TOPIC``: the topic name is not valid."""

    code = "E_BAD_TOPIC"


class BadChannelError(NSQError):
    """``E_BAD_CHANNEL``: the channel name is not valid."""

    code = "E_BAD_CHANNEL"


class BadMessageError(NSQError):
    """``E_BAD_MESSAGE``: an empty or too big message."""

    code = "E_BAD_MESSAGE"


class PubFailedError(NSQError):
    """``E_PUB_FAILED``: the daemon could not store the message."""

    code = "E_PUB_FAILED"


class MpubFailedError(NSQError):
    """``E_MPUB_FAILED``: the daemon could not store the batch (none of it was stored)."""

    code = "E_MPUB_FAILED"


class DpubFailedError(NSQError):
    """``E_DPUB_FAILED``: the daemon could not store the deferred message."""

    code = "E_DPUB_FAILED"


class SubFailedError(NSQError):
    """``E_SUB_FAILED``: e.g. too many consumers on the channel, or the daemon is exiting."""

    code = "E_SUB_FAILED"


class FinFailedError(NSQError):
    """``E_FIN_FAILED`` (not fatal): the message was not in flight for this connection."""

    code = "E_FIN_FAILED"


class ReqFailedError(NSQError):
    """``E_REQ_FAILED`` (not fatal)."""

    code = "E_REQ_FAILED"


class TouchFailedError(NSQError):
    """``E_TOUCH_FAILED`` (not fatal)."""

    code = "E_TOUCH_FAILED"


class IdentifyFailedError(NSQError):
    """``E_IDENTIFY_FAILED``."""

    code = "E_IDENTIFY_FAILED"


class AuthError(NSQError):
    """The ``E_AUTH_*`` and ``E_UNAUTHORIZED`` family: ``E_AUTH_FAILED`` (the daemon's auth
    server refused the secret or could not be asked), ``E_UNAUTHORIZED`` (the secret grants
    nothing, or not this topic/channel), ``E_AUTH_FIRST``, ``E_AUTH_DISABLED``."""

    code = "E_AUTH_FAILED"


class AuthRequired(AuthError):
    """The daemon requires AUTH and the client has no secret (raised before sending anything
    the daemon would refuse with ``E_AUTH_FIRST``)."""

    code = "E_AUTH_FIRST"


_BY_CODE: dict[str, type[NSQError]] = {
    cls.code: cls
    for cls in (
        InvalidError,
        BadBodyError,
        BadTopicError,
        BadChannelError,
        BadMessageError,
        PubFailedError,
        MpubFailedError,
        DpubFailedError,
        SubFailedError,
        FinFailedError,
        ReqFailedError,
        TouchFailedError,
        IdentifyFailedError,
    )
}
for _code in ("E_AUTH_FIRST", "E_AUTH_FAILED", "E_UNAUTHORIZED", "E_AUTH_DISABLED", "E_AUTH_ERROR"):
    _BY_CODE[_code] = AuthError


def error_from_frame(code: str, text: str, *, address: str = "") -> NSQError:
    """The exception for an error frame: the subclass for ``code``, or ``NSQError`` itself."""
    cls = _BY_CODE.get(code, NSQError)
    return cls(code, text, address=address)


class ConnectionFailed(LmqClientError, ConnectionError):
    """The daemon at ``address`` could not be reached, or the connection to it was lost.

    A publish that fails this way may or may not have been stored by the daemon (the answer was
    lost); publishing it again gives at-least-once delivery.
    """

    def __init__(self, address: str, reason: str) -> None:
        super().__init__(f"{address}: {reason}")
        self.address = address
        self.reason = reason


def all_addresses_failed(failures: Sequence[ConnectionFailed]) -> ConnectionFailed:
    """The error to raise once failing over through every address failed: the only failure
    itself, or one naming every address tried and why each failed."""
    if len(failures) == 1:
        return failures[0]
    return ConnectionFailed(
        ", ".join(f.address for f in failures), "; ".join(f.reason for f in failures)
    )


class InvalidNameError(LmqClientError, ValueError):
    """A topic or channel name that no daemon would accept (checked before sending)."""


def reason(exc: BaseException) -> str:
    """A short text for why an I/O operation failed, the same in every front end: an OS error's
    ``strerror``; for a wrapper raised ``from`` its cause (anyio's ``BrokenResourceError`` around
    a failed TLS handshake or a corrupt compressed stream), the cause's reason."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    if exc.__cause__ is not None:
        return reason(exc.__cause__)
    return str(exc) or type(exc).__name__

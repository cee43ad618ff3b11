"""nsqlookupd V1 protocol errors: the exception, and one constructor per error nsqlookupd sends.

Every V1 error is fatal: nsqlookupd sends ``[size]<CODE> <description>`` and closes the
connection (``nsqlookupd/lookup_protocol_v1.go``; there is no non-fatal error in V1). The
constructors give nsqlookupd v1.3.0's exact strings, so no other module formats one by hand.
Where nsqlookupd interpolates wire bytes with ``%s`` (a command name, a topic or channel name),
the description keeps those bytes unchanged.

Three errors are lmq's own, for input that nsqlookupd has no limit for (``line_too_long``,
``body_too_big``, ``invalid_body_size``: a negative IDENTIFY size crashes nsqlookupd itself);
their wording is nsqd's V2 wording for the same conditions.
"""

from __future__ import annotations

import struct

__all__ = [
    "LookupProtocolError",
    "bad_channel",
    "bad_protocol",
    "bad_topic",
    "body_too_big",
    "cannot_identify_again",
    "failed_to_decode_body",
    "failed_to_read_body",
    "failed_to_read_body_size",
    "insufficient_params",
    "invalid_body_size",
    "invalid_command",
    "line_too_long",
    "missing_fields",
    "must_identify",
]

_SIZE = struct.Struct(">i")


class LookupProtocolError(Exception):
    """A V1 error to send to the peer: ``code`` (``E_INVALID``), ``text`` its description.

    ``body`` is the exact payload (``CODE`` alone when there is no description, as for
    ``E_BAD_PROTOCOL``); ``frame()`` adds the 4-byte size.
    """

    code: str
    text: str
    body: bytes

    def __init__(self, code: str, description: str | bytes = "") -> None:
        if isinstance(description, bytes):
            raw = description
            text = description.decode("utf-8", "backslashreplace")
        else:
            raw = description.encode("utf-8")
            text = description
        super().__init__(f"{code} {text}" if text else code)
        self.code = code
        self.text = text
        self.body = code.encode("ascii") + b" " + raw if raw else code.encode("ascii")

    def frame(self) -> bytes:
        """The complete response to send (``[int32 size][body]``, no frame type in V1)."""
        return _SIZE.pack(len(self.body)) + self.body

    def __repr__(self) -> str:
        return f"LookupProtocolError({self.code!r}, {self.text!r})"


def bad_protocol() -> LookupProtocolError:
    """The first 4 bytes were not ``"  V1"``: nsqlookupd sends the bare code."""
    return LookupProtocolError("E_BAD_PROTOCOL")


def invalid_command(name: bytes) -> LookupProtocolError:
    """An unknown command (an empty line gives ``E_INVALID invalid command `` with a space)."""
    return LookupProtocolError("E_INVALID", b"invalid command " + name)


def line_too_long(limit: int) -> LookupProtocolError:
    """lmq: a command line did not end within ``limit`` bytes (nsqlookupd has no limit)."""
    return LookupProtocolError("E_INVALID", f"command line too long (limit {limit} bytes)")


def must_identify() -> LookupProtocolError:
    """REGISTER or UNREGISTER before IDENTIFY."""
    return LookupProtocolError("E_INVALID", "client must IDENTIFY")


def cannot_identify_again() -> LookupProtocolError:
    """A second IDENTIFY on one connection."""
    return LookupProtocolError("E_INVALID", "cannot IDENTIFY again")


def failed_to_read_body_size() -> LookupProtocolError:
    """The connection ended inside IDENTIFY's 4-byte size."""
    return LookupProtocolError("E_BAD_BODY", "IDENTIFY failed to read body size")


def failed_to_read_body() -> LookupProtocolError:
    """The connection ended inside IDENTIFY's body."""
    return LookupProtocolError("E_BAD_BODY", "IDENTIFY failed to read body")


def invalid_body_size(size: int) -> LookupProtocolError:
    """lmq: a negative IDENTIFY size (nsqlookupd crashes on it; the wording is nsqd's)."""
    return LookupProtocolError("E_BAD_BODY", f"IDENTIFY invalid body size {size}")


def body_too_big(size: int, limit: int) -> LookupProtocolError:
    """lmq: an IDENTIFY size above the limit (nsqlookupd has none; the wording is nsqd's)."""
    return LookupProtocolError("E_BAD_BODY", f"IDENTIFY body too big {size} > {limit}")


def failed_to_decode_body() -> LookupProtocolError:
    """The IDENTIFY body is not JSON, or a field has the wrong JSON type."""
    return LookupProtocolError("E_BAD_BODY", "IDENTIFY failed to decode JSON body")


def missing_fields() -> LookupProtocolError:
    """IDENTIFY lacks broadcast_address, tcp_port, http_port or version (or one is zero)."""
    return LookupProtocolError("E_BAD_BODY", "IDENTIFY missing fields")


def insufficient_params(command: str) -> LookupProtocolError:
    """REGISTER or UNREGISTER without a topic."""
    return LookupProtocolError("E_INVALID", f"{command} insufficient number of params")


def bad_topic(command: str, name: bytes) -> LookupProtocolError:
    """An invalid topic name, echoed as sent."""
    return LookupProtocolError(
        "E_BAD_TOPIC", command.encode() + b" topic name '" + name + b"' is not valid"
    )


def bad_channel(command: str, name: bytes) -> LookupProtocolError:
    """An invalid channel name, echoed as sent."""
    return LookupProtocolError(
        "E_BAD_CHANNEL", command.encode() + b" channel name '" + name + b"' is not valid"
    )

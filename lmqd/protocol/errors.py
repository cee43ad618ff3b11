"""NSQ protocol errors: the exception, and one constructor per error nsqd sends.

An error frame's body is ``b"<CODE> <description>"``. Only ``E_FIN_FAILED``, ``E_REQ_FAILED`` and
``E_TOUCH_FAILED`` leave the connection open; every other error is fatal (nsqd sends the frame,
then closes). The constructors below produce nsqd's exact strings (``nsqd/protocol_v2.go``,
``nsqd/client_v2.go``, ``nsqd/tcp.go``), so no other module formats an error by hand. Where nsqd
interpolates raw bytes from the wire with ``%s`` (command names, unparsable numbers), the body
keeps those bytes unchanged; names quoted with Go's ``%q`` are quoted the way Go does.
"""

from __future__ import annotations

import struct

NON_FATAL_CODES = frozenset({"E_FIN_FAILED", "E_REQ_FAILED", "E_TOUCH_FAILED"})

# Reasons nsqd's channel gives for a failed FIN/REQ/TOUCH (``nsqd/channel.go``); the daemon passes
# them to fin_failed()/req_failed()/touch_failed().
ID_NOT_IN_FLIGHT = "ID not in flight"
CLIENT_DOES_NOT_OWN_MESSAGE = "client does not own message"
EXITING = "exiting"

_FRAME_HEADER = struct.Struct(">ii")
_FRAME_TYPE_ERROR = 1


class ProtocolError(Exception):
    """An NSQ error to report to the client: ``code`` is the wire code, ``text`` its description.

    ``description`` may be bytes when nsqd echoes raw client bytes into it; ``text`` is then the
    readable form (undecodable bytes backslash-escaped) and ``body`` the exact bytes.
    """

    code: str
    text: str
    fatal: bool
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
        self.fatal = code not in NON_FATAL_CODES
        # E_BAD_PROTOCOL is the one error nsqd sends without a description.
        self.body = code.encode("ascii") + b" " + raw if raw else code.encode("ascii")

    def frame(self) -> bytes:
        """The complete error frame to send to the client."""
        body = self.body
        return _FRAME_HEADER.pack(len(body) + 4, _FRAME_TYPE_ERROR) + body

    def __repr__(self) -> str:
        return f"ProtocolError({self.code!r}, {self.text!r})"


# -- Go's %q ------------------------------------------------------------------------------------

_GO_ESCAPES = {
    "\a": "\\a",
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
    "\v": "\\v",
    '"': '\\"',
    "\\": "\\\\",
}


def go_quote(raw: bytes) -> str:
    """``raw`` quoted as Go's ``fmt.Sprintf("%q", string(raw))`` (``strconv.Quote``) does it."""
    out = ['"']
    # surrogateescape maps each byte that is not valid UTF-8 to U+DC80..U+DCFF, which Go writes
    # as \xNN, exactly like the invalid byte it stands for.
    for ch in raw.decode("utf-8", "surrogateescape"):
        cp = ord(ch)
        escape = _GO_ESCAPES.get(ch)
        if escape is not None:
            out.append(escape)
        elif 0xDC80 <= cp <= 0xDCFF:
            out.append(f"\\x{cp - 0xDC00:02x}")
        elif ch.isprintable():  # same classes as Go's unicode.IsPrint
            out.append(ch)
        elif cp < 0x20 or cp == 0x7F:
            out.append(f"\\x{cp:02x}")
        elif cp < 0x10000:
            out.append(f"\\u{cp:04x}")
        else:
            out.append(f"\\U{cp:08x}")
    out.append('"')
    return "".join(out)


# -- connection start and commands ----------------------------------------------------------------


def bad_protocol() -> ProtocolError:
    """The client's 4-byte magic was not ``"  V2"`` (body is just ``E_BAD_PROTOCOL``)."""
    return ProtocolError("E_BAD_PROTOCOL")


def invalid_command(name: bytes) -> ProtocolError:
    """Unknown command (an empty line gives ``E_INVALID invalid command `` with a space)."""
    return ProtocolError("E_INVALID", b"invalid command " + name)


def line_too_long(max_line_length: int) -> ProtocolError:
    """lmq: a command line did not end within ``max_line_length`` bytes.

    nsqd drops such a connection without a frame (its ``bufio.Reader.ReadSlice`` fails with
    ``buffer full``); lmq tells the client why first.
    """
    return ProtocolError("E_INVALID", f"command line too long (limit {max_line_length} bytes)")


def cannot_in_state(cmd: str) -> ProtocolError:
    """``cannot <CMD> in current state`` (IDENTIFY, AUTH, SUB, RDY, FIN, REQ, TOUCH, CLS)."""
    return ProtocolError("E_INVALID", f"cannot {cmd} in current state")


def tls_required(cmd: bytes) -> ProtocolError:
    """``--tls-required`` and the connection is not TLS (every command except IDENTIFY)."""
    return ProtocolError("E_INVALID", b"cannot " + cmd + b" in current state (TLS required)")


def sub_heartbeats_disabled() -> ProtocolError:
    """SUB after IDENTIFY disabled heartbeats (``heartbeat_interval: -1``)."""
    return ProtocolError("E_INVALID", "cannot SUB with heartbeats disabled")


def insufficient_params(cmd: str) -> ProtocolError:
    """Too few parameters; nsqd words it differently for FIN/REQ/TOUCH than for the others."""
    if cmd in ("FIN", "REQ", "TOUCH"):
        return ProtocolError("E_INVALID", f"{cmd} insufficient number of params")
    return ProtocolError("E_INVALID", f"{cmd} insufficient number of parameters")


def invalid_message_id() -> ProtocolError:
    """FIN/REQ/TOUCH with an ID that is not exactly 16 bytes."""
    return ProtocolError("E_INVALID", "invalid message ID")


def rdy_could_not_parse(raw: bytes) -> ProtocolError:
    """RDY count that is not an unsigned decimal number."""
    return ProtocolError("E_INVALID", b"RDY could not parse count " + raw)


def rdy_out_of_range(count: int, max_rdy_count: int) -> ProtocolError:
    """RDY count outside ``0..--max-rdy-count``."""
    return ProtocolError("E_INVALID", f"RDY count {count} out of range 0-{max_rdy_count}")


def req_could_not_parse(raw: bytes) -> ProtocolError:
    """REQ timeout that is not an unsigned decimal number (out of range is clamped, not this)."""
    return ProtocolError("E_INVALID", b"REQ could not parse timeout " + raw)


def dpub_could_not_parse(raw: bytes) -> ProtocolError:
    """DPUB defer time that is not an unsigned decimal number."""
    return ProtocolError("E_INVALID", b"DPUB could not parse timeout " + raw)


def dpub_out_of_range(defer_ms: int, max_req_timeout_ms: int) -> ProtocolError:
    """DPUB defer time above ``--max-req-timeout`` (DPUB rejects where REQ clamps)."""
    return ProtocolError(
        "E_INVALID", f"DPUB timeout {defer_ms} out of range 0-{max_req_timeout_ms}"
    )


def bad_topic(cmd: str, name: bytes) -> ProtocolError:
    """Invalid topic name; MPUB repeats the code inside the text, as nsqd does."""
    if cmd == "MPUB":
        return ProtocolError(
            "E_BAD_TOPIC", f"E_BAD_TOPIC MPUB topic name {go_quote(name)} is not valid"
        )
    return ProtocolError("E_BAD_TOPIC", f"{cmd} topic name {go_quote(name)} is not valid")


def bad_channel(cmd: str, name: bytes) -> ProtocolError:
    """Invalid channel name (SUB)."""
    return ProtocolError("E_BAD_CHANNEL", f"{cmd} channel name {go_quote(name)} is not valid")


# -- command bodies: IDENTIFY, AUTH and MPUB (E_BAD_BODY) ------------------------------------------


def failed_to_read_body_size(cmd: str) -> ProtocolError:
    """The 4-byte body size of IDENTIFY/AUTH/MPUB could not be read."""
    return ProtocolError("E_BAD_BODY", f"{cmd} failed to read body size")


def body_too_big(cmd: str, size: int, max_body_size: int) -> ProtocolError:
    """IDENTIFY/AUTH/MPUB body larger than ``--max-body-size``."""
    return ProtocolError("E_BAD_BODY", f"{cmd} body too big {size} > {max_body_size}")


def invalid_body_size(cmd: str, size: int) -> ProtocolError:
    """IDENTIFY/AUTH/MPUB body size ``<= 0``."""
    return ProtocolError("E_BAD_BODY", f"{cmd} invalid body size {size}")


def failed_to_read_body(cmd: str) -> ProtocolError:
    """The IDENTIFY/AUTH body could not be read."""
    return ProtocolError("E_BAD_BODY", f"{cmd} failed to read body")


def identify_bad_json() -> ProtocolError:
    """The IDENTIFY body is not JSON that decodes into nsqd's identify structure."""
    return ProtocolError("E_BAD_BODY", "IDENTIFY failed to decode JSON body")


def identify_invalid(reason: str) -> ProtocolError:
    """An IDENTIFY field out of range: ``identify_invalid("heartbeat interval (5) is invalid")``."""
    return ProtocolError("E_BAD_BODY", f"IDENTIFY {reason}")


def mpub_failed_to_read_count() -> ProtocolError:
    """The MPUB message count could not be read."""
    return ProtocolError("E_BAD_BODY", "MPUB failed to read message count")


def mpub_invalid_count(count: int) -> ProtocolError:
    """MPUB message count outside ``1..(max_body_size - 4) // 5``."""
    return ProtocolError("E_BAD_BODY", f"MPUB invalid message count {count}")


def mpub_size_mismatch(body_size: int) -> ProtocolError:
    """lmq: the MPUB messages do not exactly fill the declared body.

    nsqd reads the messages straight from the stream and never checks this, so a wrong body size
    makes it read into (or leave behind) bytes of the next command. lmq refuses the MPUB instead.
    """
    return ProtocolError("E_BAD_BODY", f"MPUB messages do not add up to body size {body_size}")


# -- messages: PUB, DPUB and MPUB's parts (E_BAD_MESSAGE) ------------------------------------------


def message_failed_to_read_size(cmd: str) -> ProtocolError:
    """PUB/DPUB: the 4-byte message size could not be read."""
    return ProtocolError("E_BAD_MESSAGE", f"{cmd} failed to read message body size")


def message_invalid_size(cmd: str, size: int) -> ProtocolError:
    """PUB/DPUB message size ``<= 0``."""
    return ProtocolError("E_BAD_MESSAGE", f"{cmd} invalid message body size {size}")


def message_too_big(cmd: str, size: int, max_msg_size: int) -> ProtocolError:
    """PUB/DPUB/MPUB message larger than ``--max-msg-size``."""
    return ProtocolError("E_BAD_MESSAGE", f"{cmd} message too big {size} > {max_msg_size}")


def message_failed_to_read_body(cmd: str) -> ProtocolError:
    """PUB/DPUB/MPUB: a message body could not be read."""
    return ProtocolError("E_BAD_MESSAGE", f"{cmd} failed to read message body")


def mpub_failed_to_read_message_size(index: int) -> ProtocolError:
    """MPUB: the size of message ``index`` (0-based) could not be read."""
    return ProtocolError("E_BAD_MESSAGE", f"MPUB failed to read message({index}) body size")


def mpub_invalid_message_size(index: int, size: int) -> ProtocolError:
    """MPUB: message ``index`` (0-based) has size ``<= 0``."""
    return ProtocolError("E_BAD_MESSAGE", f"MPUB invalid message({index}) body size {size}")


# -- failures the daemon reports -------------------------------------------------------------------


def publish_failed(cmd: str, err: str) -> ProtocolError:
    """PUB/MPUB/DPUB could not enqueue: ``E_PUB_FAILED PUB failed <err>`` (and MPUB, DPUB)."""
    return ProtocolError(f"E_{cmd}_FAILED", f"{cmd} failed {err}")


pub_failed = publish_failed


def fin_failed(msg_id: bytes, reason: str) -> ProtocolError:
    """Non-fatal: ``E_FIN_FAILED FIN <id> failed <reason>``."""
    return ProtocolError("E_FIN_FAILED", b"FIN " + msg_id + b" failed " + reason.encode())


def req_failed(msg_id: bytes, reason: str) -> ProtocolError:
    """Non-fatal: ``E_REQ_FAILED REQ <id> failed <reason>``."""
    return ProtocolError("E_REQ_FAILED", b"REQ " + msg_id + b" failed " + reason.encode())


def touch_failed(msg_id: bytes, reason: str) -> ProtocolError:
    """Non-fatal: ``E_TOUCH_FAILED TOUCH <id> failed <reason>``."""
    return ProtocolError("E_TOUCH_FAILED", b"TOUCH " + msg_id + b" failed " + reason.encode())


def sub_failed(reason: str) -> ProtocolError:
    """``E_SUB_FAILED SUB failed <reason>`` (e.g. ``exiting``)."""
    return ProtocolError("E_SUB_FAILED", f"SUB failed {reason}")


def sub_too_many_consumers(topic: str, channel: str, limit: int) -> ProtocolError:
    """``--max-channel-consumers`` reached."""
    return sub_failed(f"consumers for {topic}:{channel} exceeds limit of {limit}")


def sub_deleted() -> ProtocolError:
    """The ephemeral topic or channel was being deleted while subscribing (nsqd's wording)."""
    return ProtocolError("E_SUB_FAILED", "SUB failed to deleted topic/channel")


def identify_failed(err: str) -> ProtocolError:
    """A TLS/compression upgrade after IDENTIFY failed."""
    return ProtocolError("E_IDENTIFY_FAILED", f"IDENTIFY failed {err}")


def identify_compression_conflict() -> ProtocolError:
    """IDENTIFY asked for both deflate and snappy (and the server offers both)."""
    return ProtocolError("E_IDENTIFY_FAILED", "cannot enable both deflate and snappy compression")


# -- AUTH ------------------------------------------------------------------------------------------


def auth_invalid_params() -> ProtocolError:
    """AUTH takes no parameters on its line."""
    return ProtocolError("E_INVALID", "AUTH invalid number of parameters")


def auth_already_set() -> ProtocolError:
    """A second AUTH on a connection that is already authorised."""
    return ProtocolError("E_INVALID", "AUTH already set")


def auth_disabled() -> ProtocolError:
    """AUTH sent to a daemon without ``--auth-http-address``."""
    return ProtocolError("E_AUTH_DISABLED", "AUTH disabled")


def auth_failed() -> ProtocolError:
    """The auth server could not be queried or answered nonsense (details are only logged)."""
    return ProtocolError("E_AUTH_FAILED", "AUTH failed")


def auth_no_authorizations() -> ProtocolError:
    """The auth server granted nothing."""
    return ProtocolError("E_UNAUTHORIZED", "AUTH no authorizations found")


def auth_unauthorized(cmd: str, topic: str, channel: str) -> ProtocolError:
    """The authorisations do not cover ``cmd`` on topic/channel (channel is "" for publishes)."""
    return ProtocolError(
        "E_UNAUTHORIZED",
        f"AUTH failed for {cmd} on {go_quote(topic.encode())} {go_quote(channel.encode())}",
    )


def auth_first(cmd: str) -> ProtocolError:
    """Auth is enabled and SUB/PUB/MPUB/DPUB came before AUTH."""
    return ProtocolError("E_AUTH_FIRST", f"AUTH required before {cmd}")


def auth_error(err: str) -> ProtocolError:
    """The AUTH response could not be built or sent."""
    return ProtocolError("E_AUTH_ERROR", f"AUTH error {err}")


# -- lmq's message extension (XPUB) -------------------------------------------------------------


def extension_not_negotiated() -> ProtocolError:
    """XPUB from a client whose IDENTIFY did not negotiate lmq's extension."""
    return ProtocolError(
        "E_INVALID", "XPUB needs the lmq extension (IDENTIFY with feature_negotiation, lmq_ext 1)"
    )


def bad_extension(reason: str) -> ProtocolError:
    """A malformed XPUB body or extension block: ``E_BAD_MESSAGE XPUB <reason>``."""
    return ProtocolError("E_BAD_MESSAGE", f"XPUB {reason}")

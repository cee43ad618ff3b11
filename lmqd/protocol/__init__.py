"""The NSQ V2 protocol, sans I/O: command parsing, frame encoding, names, errors, client states.

Imports no trio and no sockets (h11's rule): the TCP server and lmq_client move bytes in and
out of ``ServerConnection`` / ``ClientConnection`` and act on the events they return.
"""

from lmqd.names import is_ephemeral, valid_name
from lmqd.protocol import errors
from lmqd.protocol.client import DEFAULT_MAX_FRAME_SIZE, ClientConnection, FrameEvent
from lmqd.protocol.connection import MAGIC_V2, ServerConnection, parse_uint
from lmqd.protocol.errors import ProtocolError
from lmqd.protocol.events import (
    Auth,
    Cls,
    Command,
    Dpub,
    Event,
    Fin,
    Fins,
    Identify,
    Mpub,
    Nop,
    Pub,
    Rdy,
    Req,
    Sub,
    Touch,
    Xpub,
    encode_fin,
    encode_identify,
    one_per_command,
)
from lmqd.protocol.frames import (
    CLOSE_WAIT_FRAME,
    FRAME_TYPE_ERROR,
    FRAME_TYPE_MESSAGE,
    FRAME_TYPE_RESPONSE,
    HEARTBEAT_FRAME,
    OK_FRAME,
    Error,
    MessageFrame,
    Response,
    encode_error,
    encode_message,
    encode_messages,
    encode_response,
    ext_message_frame_parts,
    message_frame_parts,
)
from lmqd.protocol.identify import (
    IdentifySettings,
    decode_identify_body,
    default_settings,
    identify_response,
    negotiate,
)
from lmqd.protocol.limits import MAX_LINE_LENGTH, Limits
from lmqd.protocol.state import LEGAL_STATES, ClientState

__all__ = [
    "CLOSE_WAIT_FRAME",
    "DEFAULT_MAX_FRAME_SIZE",
    "FRAME_TYPE_ERROR",
    "FRAME_TYPE_MESSAGE",
    "FRAME_TYPE_RESPONSE",
    "HEARTBEAT_FRAME",
    "LEGAL_STATES",
    "MAGIC_V2",
    "MAX_LINE_LENGTH",
    "OK_FRAME",
    "Auth",
    "ClientConnection",
    "ClientState",
    "Cls",
    "Command",
    "Dpub",
    "Error",
    "Event",
    "Fin",
    "Fins",
    "FrameEvent",
    "Identify",
    "IdentifySettings",
    "Limits",
    "MessageFrame",
    "Mpub",
    "Nop",
    "ProtocolError",
    "Pub",
    "Rdy",
    "Req",
    "Response",
    "ServerConnection",
    "Sub",
    "Touch",
    "Xpub",
    "decode_identify_body",
    "default_settings",
    "encode_error",
    "encode_fin",
    "encode_identify",
    "encode_message",
    "encode_messages",
    "encode_response",
    "errors",
    "ext_message_frame_parts",
    "identify_response",
    "is_ephemeral",
    "message_frame_parts",
    "negotiate",
    "one_per_command",
    "parse_uint",
    "valid_name",
]

"""nsqlookupd's V1 TCP protocol, sans I/O: shared by lmqlookupd and lmqd's registration.

Imports no trio and no sockets (h11's rule). ``LookupServerConnection`` turns a registering
node's bytes into command events (``Identify``, ``Register``, ``Unregister``, ``Ping``) and
responses into bytes; ``LookupClientConnection`` is the node's side: commands to bytes, the
lookupd's bytes to responses (``Ok``, ``IdentifyResponse``, ``Error``). The wire format and
every error string are nsqlookupd v1.3.0's (``nsqlookupd-reference.md`` §1).
"""

from lmqd.lookup import errors
from lmqd.lookup.client import MAX_RESPONSE_SIZE, LookupClientConnection
from lmqd.lookup.errors import LookupProtocolError
from lmqd.lookup.events import (
    Command,
    ConnectionClosed,
    Error,
    Identify,
    IdentifyResponse,
    Ok,
    Ping,
    Register,
    Response,
    Unregister,
    encode_response,
)
from lmqd.lookup.server import (
    MAGIC_V1,
    MAX_IDENTIFY_SIZE,
    MAX_LINE_LENGTH,
    LookupServerConnection,
)
from lmqd.lookup.state import PeerState

__all__ = [
    "MAGIC_V1",
    "MAX_IDENTIFY_SIZE",
    "MAX_LINE_LENGTH",
    "MAX_RESPONSE_SIZE",
    "Command",
    "ConnectionClosed",
    "Error",
    "Identify",
    "IdentifyResponse",
    "LookupClientConnection",
    "LookupProtocolError",
    "LookupServerConnection",
    "Ok",
    "PeerState",
    "Ping",
    "Register",
    "Response",
    "Unregister",
    "encode_response",
    "errors",
]

"""The V1 peer state machine: states, and which commands each state accepts.

This is the one place that says which command is legal when (after ``h11/_state.py``).
nsqlookupd keeps no explicit state; whether the connection has identified (``client.peerInfo``
is set) is the state, and the magic comes before any command::

    AWAITING_MAGIC --"  V1"--> ANONYMOUS --IDENTIFY--> IDENTIFIED

* PING is legal in both ANONYMOUS and IDENTIFIED (it refreshes liveness only once identified).
* IDENTIFY is legal once: in IDENTIFIED it is ``E_INVALID cannot IDENTIFY again``, checked
  before its body is read.
* REGISTER and UNREGISTER need IDENTIFIED: in ANONYMOUS they are ``E_INVALID client must
  IDENTIFY``, checked before their parameters.
* Any other command line is ``E_INVALID invalid command <NAME>``.

Every error is fatal (nsqlookupd sends it, then closes), so the parser applies IDENTIFY's
transition as soon as it has parsed the command.
"""

from __future__ import annotations

import enum
from collections.abc import Callable

from lmqd.lookup import errors
from lmqd.lookup.errors import LookupProtocolError

__all__ = ["COMMANDS", "TRANSITIONS", "PeerState"]


class PeerState(enum.Enum):
    """Where a V1 connection is in its life."""

    AWAITING_MAGIC = "awaiting magic"
    ANONYMOUS = "anonymous"
    IDENTIFIED = "identified"


_Refusal = Callable[[], LookupProtocolError]

COMMANDS: dict[bytes, dict[PeerState, _Refusal | None]] = {
    b"PING": {PeerState.ANONYMOUS: None, PeerState.IDENTIFIED: None},
    b"IDENTIFY": {
        PeerState.ANONYMOUS: None,
        PeerState.IDENTIFIED: errors.cannot_identify_again,
    },
    b"REGISTER": {PeerState.ANONYMOUS: errors.must_identify, PeerState.IDENTIFIED: None},
    b"UNREGISTER": {PeerState.ANONYMOUS: errors.must_identify, PeerState.IDENTIFIED: None},
}
"""Command name -> state -> None (legal) or the constructor of the error it gets there."""

TRANSITIONS: dict[bytes, PeerState] = {b"IDENTIFY": PeerState.IDENTIFIED}
"""Command name -> the state a successfully parsed command moves the connection to."""

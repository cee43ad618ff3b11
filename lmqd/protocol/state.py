"""The V2 client state machine: states, and which commands each state accepts.

This is the one place that says which command is legal when (after ``h11/_state.py``).

nsqd (``nsqd/client_v2.go``) numbers five states, and those numbers appear as ``"state"`` in
``/stats``; a V2 connection only ever uses three of them:

    INIT --SUB--> SUBSCRIBED --CLS--> CLOSING

* IDENTIFY and AUTH do not change the state. Both are allowed only in INIT, and lmqd takes each
  at most once: a second IDENTIFY gets ``E_INVALID cannot IDENTIFY in current state`` (nsqd
  accepts it but ignores the new settings) and a second AUTH ``E_INVALID AUTH already set``.
* SUB is allowed once, in INIT, and only while heartbeats are enabled.
* RDY needs SUBSCRIBED; in CLOSING it is dropped silently (nsqd ignores RDY after CLS).
* FIN, REQ and TOUCH need SUBSCRIBED or CLOSING: after CLS the client still settles the messages
  it holds.
* CLS needs SUBSCRIBED.
* PUB, MPUB, DPUB, lmq's XPUB and NOP are allowed in every state: a consumer connection may
  also publish.

Any command in a state that does not accept it is a fatal ``E_INVALID cannot <CMD> in current
state``. The parser applies SUB's and CLS's transitions when it parses them; that is safe because
every failure of those commands is fatal and ends the connection anyway.
"""

from __future__ import annotations

import enum


class ClientState(enum.IntEnum):
    """nsqd's client states; the values are what ``/stats`` reports."""

    INIT = 0
    DISCONNECTED = 1
    CONNECTED = 2
    SUBSCRIBED = 3
    CLOSING = 4


_ANY = frozenset(ClientState)

LEGAL_STATES: dict[str, frozenset[ClientState]] = {
    "IDENTIFY": frozenset({ClientState.INIT}),
    "AUTH": frozenset({ClientState.INIT}),
    "SUB": frozenset({ClientState.INIT}),
    "RDY": frozenset({ClientState.SUBSCRIBED}),
    "FIN": frozenset({ClientState.SUBSCRIBED, ClientState.CLOSING}),
    "REQ": frozenset({ClientState.SUBSCRIBED, ClientState.CLOSING}),
    "TOUCH": frozenset({ClientState.SUBSCRIBED, ClientState.CLOSING}),
    "CLS": frozenset({ClientState.SUBSCRIBED}),
    "PUB": _ANY,
    "MPUB": _ANY,
    "DPUB": _ANY,
    "XPUB": _ANY,
    "NOP": _ANY,
}
"""Command name -> the states in which it is accepted."""

IGNORED_STATES: dict[str, frozenset[ClientState]] = {
    "RDY": frozenset({ClientState.CLOSING}),
}
"""Command name -> states in which it is dropped without an event or an error."""

TRANSITIONS: dict[str, ClientState] = {
    "SUB": ClientState.SUBSCRIBED,
    "CLS": ClientState.CLOSING,
}
"""Command name -> the state a successfully parsed command moves the connection to."""

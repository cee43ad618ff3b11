"""lmqd's registration with nsqlookupd (or lmqlookupd): nsqd's V1 client side, on trio.

``peer.py`` is the sans-IO state machine of one lookupd (handshake, PING schedule, answers,
reconnect backoff; time passed in as ``now``); ``service.py`` is ``Registration``, the broker
observer that turns topic and channel events into commands and runs one I/O task per lookupd.
"""

from lmqd.registration.peer import LookupdPeer, PeerFailed, PeerStatus
from lmqd.registration.service import Registration

__all__ = ["LookupdPeer", "PeerFailed", "PeerStatus", "Registration"]

"""lmqlookupd: nsqlookupd v1.3.0's V1 TCP protocol and HTTP API, on trio.

Registering nodes (nsqd, lmqd) connect over TCP (``tcp.py``, with the sans-IO codec of
``lmqd.lookup``) and their topics and channels go into the registration DB (``db.py``);
consumers and admin tools query it over HTTP (``httpapi.py`` routes, ``views.py`` answers).
``service.LookupDaemon`` runs both; ``cli.main`` is the ``lmqlookupd`` command.
"""

from lmqd.lookupd.db import PeerInfo, Producer, Registration, RegistrationDB
from lmqd.lookupd.options import NSQLOOKUPD_COMPAT_VERSION, LookupdOptions
from lmqd.lookupd.service import Addresses, LookupDaemon

__all__ = [
    "NSQLOOKUPD_COMPAT_VERSION",
    "Addresses",
    "LookupDaemon",
    "LookupdOptions",
    "PeerInfo",
    "Producer",
    "Registration",
    "RegistrationDB",
]

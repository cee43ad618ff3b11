"""The TCP side of lmqd: listeners, and per connection a reader/writer pair of tasks
(``connection``) around a trio-free session that applies commands to the broker (``session``)
and an output buffer with durable holds (``output``); the daemon's TLS context and auth servers
(``security``) and the TLS/snappy/deflate upgrade after IDENTIFY (``upgrade``).

It only moves bytes: parsing and framing are ``lmqd.protocol``'s, queue logic the engine's.
"""

from lmqd.server.connection import TcpConnection
from lmqd.server.tcp import serve_tcp

__all__ = ["TcpConnection", "serve_tcp"]

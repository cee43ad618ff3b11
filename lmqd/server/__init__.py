"""The TCP side of lmqd: listeners and one reader/writer pair of tasks per connection.

It only moves bytes: parsing and framing are ``lmqd.protocol``'s, queue logic the engine's.
"""

from lmqd.server.tcp import serve_tcp

__all__ = ["serve_tcp"]

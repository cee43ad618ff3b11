"""Errors the storage layer raises to the layers above it.

Defined here, at the bottom of the import graph, so that storage never imports upward: the
engine (topics, channels, the in-memory backends of ``lmqd.engine.backend``) imports storage and
re-exports ``BackendError`` from here, never the reverse.
"""


class BackendError(Exception):
    """A backend could not store messages (disk full, I/O error): publishing gets E_PUB_FAILED."""

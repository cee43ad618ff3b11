"""Errors the storage layer raises to the engine."""


class BackendError(Exception):
    """A backend could not store messages (disk full, I/O error): publishing gets E_PUB_FAILED."""

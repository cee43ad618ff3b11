"""Fixtures for the transport tests: one PKI per test session (see ``certs.py``)."""

from __future__ import annotations

import pytest

from .certs import Certs, make_certs


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    """A CA, server and client certificates; the server's also names the host ``fake``."""
    return make_certs(tmp_path_factory.mktemp("certs"), hostnames=["fake"])

"""Fixtures for the client tests: the session's test PKI (``tests/transport/certs.py``)."""

from __future__ import annotations

import pytest

from tests.transport.certs import Certs, make_certs


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    """A CA, server and client certificates; the server's also names ``fake`` (FakeNetwork)."""
    return make_certs(tmp_path_factory.mktemp("client-certs"), hostnames=["fake"])

"""Fixtures for the durability tests: client connections that are closed after the test."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
import trio

from .wire import Wire

Connect = Callable[..., Awaitable[Wire]]


@pytest.fixture
async def connect() -> AsyncIterator[Connect]:
    """``await connect(address, **identify)`` -> a ``Wire``, closed at the end of the test."""
    opened: list[Wire] = []

    async def open_wire(address: tuple[str, int], **identify: object) -> Wire:
        wire = await Wire.connect(address, **identify)
        opened.append(wire)
        return wire

    yield open_wire
    with trio.CancelScope(shield=True):
        for wire in opened:
            await wire.aclose()

"""The parser around stream upgrades: it stops after an IDENTIFY that negotiates TLS, snappy
or deflate, hands back the bytes behind it untouched, and under ``--tls-required`` refuses every
command but IDENTIFY until told the connection is TLS.

Each case is fed whole and one byte at a time (``protocol_helpers.chunks``).
"""

from __future__ import annotations

import json

import pytest

from lmqd.protocol import Identify, Limits, Nop, ProtocolError, Pub, ServerConnection

from .feeding import MAGIC, sized

OFFERS_ALL = Limits(tls_available=True)
BEHIND = b"\x16\x03\x01\x02\x00 not a command\n PUB x\n"  # e.g. a TLS ClientHello


def identify(**fields: object) -> bytes:
    return b"IDENTIFY\n" + sized(json.dumps({"feature_negotiation": True, **fields}).encode())


def feed_all(conn: ServerConnection, data: bytes, bytewise: bool) -> list[object]:
    events: list[object] = []
    for chunk in [data[i : i + 1] for i in range(len(data))] if bytewise else [data]:
        conn.receive_data(chunk)
        events += conn.next_events()
    return events


@pytest.mark.parametrize("bytewise", [False, True], ids=["whole", "bytewise"])
@pytest.mark.parametrize("upgrade", [{"tls_v1": True}, {"snappy": True}, {"deflate": True}])
def test_parsing_stops_after_an_upgrading_identify(
    bytewise: bool, upgrade: dict[str, bool]
) -> None:
    conn = ServerConnection(OFFERS_ALL)
    events = feed_all(conn, MAGIC + b"NOP\n" + identify(**upgrade) + BEHIND, bytewise)
    assert [type(e) for e in events] == [Nop, Identify]
    assert conn.upgrading
    assert conn.take_unparsed() == BEHIND
    assert conn.take_unparsed() == b""
    conn.resume()
    assert not conn.upgrading
    conn.receive_data(b"NOP\n")  # what comes through the new layer is parsed again
    assert conn.next_events() == [Nop()]


def test_identify_without_upgrades_goes_on_parsing() -> None:
    conn = ServerConnection(Limits(snappy_available=False, deflate_available=False))
    conn.receive_data(MAGIC + identify(tls_v1=True, snappy=True) + b"NOP\n")
    assert [type(e) for e in conn.next_events()] == [Identify, Nop]
    assert not conn.upgrading


@pytest.mark.parametrize("bytewise", [False, True], ids=["whole", "bytewise"])
@pytest.mark.parametrize(
    ("line", "name"),
    [(b"PUB t\n" + sized(b"x"), b"PUB"), (b"NOP\n", b"NOP"), (b"FOO bar\n", b"FOO")],
)
def test_tls_required_refuses_all_but_identify(bytewise: bool, line: bytes, name: bytes) -> None:
    conn = ServerConnection(Limits(tls_available=True, tls_required=True))
    events = feed_all(conn, MAGIC + identify(), bytewise)
    assert [type(e) for e in events] == [Identify]
    conn.receive_data(line)
    with pytest.raises(ProtocolError) as info:
        conn.next_events()
    assert info.value.body == b"E_INVALID cannot " + name + b" in current state (TLS required)"
    assert info.value.fatal


def test_tls_required_lifted_once_tls_is_established() -> None:
    conn = ServerConnection(Limits(tls_available=True, tls_required=True))
    conn.receive_data(MAGIC + identify(tls_v1=True) + b"garbage")
    assert [type(e) for e in conn.next_events()] == [Identify]
    assert conn.take_unparsed() == b"garbage"
    conn.tls_established()
    conn.resume()
    conn.receive_data(b"PUB t\n" + sized(b"x") + b"FOO\n")
    assert conn.next_events() == [Pub(topic="t", body=b"x")]
    with pytest.raises(ProtocolError) as info:
        conn.next_events()
    assert info.value.body == b"E_INVALID invalid command FOO"

"""``LookupdPeer``, the sans-IO state machine of one lookupd, driven with explicit times.

Rules for this module: no trio, no sockets; every call gets its ``now``; the bytes a peer
queues are checked against what the lookupd side of the codec (``LookupServerConnection``)
parses from them, and answers are the bytes a lookupd sends (``Ok().encode()`` ...).
"""

from __future__ import annotations

import math

import pytest

from lmqd.lookup import (
    Error,
    Identify,
    IdentifyResponse,
    LookupServerConnection,
    Ok,
    Ping,
    Register,
    Unregister,
)
from lmqd.registration import LookupdPeer, PeerFailed, PeerStatus

IDENTIFY = Identify(
    broadcast_address="node1", tcp_port=4150, http_port=4151, version="1.3.0", hostname="h"
)
ANSWER = IdentifyResponse(broadcast_address="lookupd", tcp_port=4160, http_port=4161,
                          version="1.3.0", hostname="lh")  # fmt: skip
OK = Ok().encode()


def parse(data: bytes) -> list[object]:
    """What a lookupd would read from ``data`` (the magic included)."""
    server = LookupServerConnection()
    server.receive_data(data)
    events: list[object] = []
    while (event := server.next_event()) is not None:
        events.append(event)
    return events


def connected_peer(now: float = 0.0, **kwargs: float) -> LookupdPeer:
    peer = LookupdPeer("127.0.0.1:4160", **kwargs)
    peer.start_connect(now)
    peer.connected(now, IDENTIFY, [Register(topic="t", channel="c"), Register(topic="u")])
    return peer


def test_handshake_is_magic_identify_and_every_registration_in_one_write() -> None:
    peer = connected_peer()
    data = peer.data_to_send()
    body = (b'{"broadcast_address":"node1","hostname":"h","http_port":4151,"tcp_port":4150,'
            b'"version":"1.3.0"}')  # nsqd's exact IDENTIFY body: Go's sorted map keys
    assert data == (b"  V1IDENTIFY\n" + len(body).to_bytes(4, "big") + body
                    + b"REGISTER t c\nREGISTER u\n")  # fmt: skip
    assert parse(data) == [IDENTIFY, Register(topic="t", channel="c"), Register(topic="u")]
    assert peer.pending == 3
    assert peer.data_to_send() == b""


def test_identify_answer_is_kept_and_resets_the_failure_count() -> None:
    peer = LookupdPeer("127.0.0.1:4160")
    peer.start_connect(0.0)
    peer.connect_failed(0.0, "refused")
    assert peer.failures == 1
    peer.start_connect(1.0)
    peer.connected(1.0, IDENTIFY, [])
    peer.receive_data(ANSWER.encode(), 1.0)
    assert peer.info == ANSWER
    assert peer.failures == 0
    assert peer.connections == 1
    assert peer.pending == 0


def test_answers_may_arrive_one_byte_at_a_time() -> None:
    peer = connected_peer()
    peer.data_to_send()
    for byte in ANSWER.encode() + OK + OK:
        peer.receive_data(bytes([byte]), 0.5)
    assert peer.info == ANSWER
    assert peer.pending == 0


def test_ping_every_interval_from_the_connection() -> None:
    peer = connected_peer(now=3.0)
    peer.receive_data(ANSWER.encode() + OK + OK, 3.0)
    peer.data_to_send()
    assert peer.next_deadline() == 18.0
    peer.timer(17.999)
    assert peer.data_to_send() == b""
    peer.timer(18.0)
    assert peer.data_to_send() == Ping().encode()
    peer.receive_data(OK, 18.01)
    assert peer.next_deadline() == 33.0


def test_an_event_is_one_command_while_connected_and_dropped_otherwise() -> None:
    peer = LookupdPeer("127.0.0.1:4160")
    assert not peer.send(Register(topic="t"), 0.0)  # waiting: the next handshake covers it
    peer.start_connect(0.0)
    assert not peer.send(Register(topic="t"), 0.0)  # still dialling
    peer.connected(0.0, IDENTIFY, [])
    peer.data_to_send()
    assert peer.send(Unregister(topic="t", channel="c"), 0.5)
    assert peer.data_to_send() == b"UNREGISTER t c\n"


def test_an_overdue_answer_fails_the_connection() -> None:
    peer = connected_peer(now=10.0, response_timeout=5.0)
    peer.data_to_send()
    assert peer.next_deadline() == 15.0  # the IDENTIFY answer is due before the first PING
    peer.timer(14.9)
    with pytest.raises(PeerFailed, match="no answer within 5s"):
        peer.timer(15.0)


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        (Error(code="E_BAD_TOPIC", text="REGISTER topic name 'x' is not valid").encode(),
         "error E_BAD_TOPIC REGISTER topic name 'x' is not valid"),
        (b"\x00\x00\x00\x02NO", "invalid answer"),  # IDENTIFY's answer must be a JSON object
        (b"\xff\xff\xff\xff", "invalid answer"),  # a negative size
    ],
)  # fmt: skip
def test_bad_answers_fail_the_connection(answer: bytes, message: str) -> None:
    peer = connected_peer()
    with pytest.raises(PeerFailed, match=message):
        peer.receive_data(answer, 0.1)


def test_eof_fails_the_connection() -> None:
    peer = connected_peer()
    with pytest.raises(PeerFailed, match="closed by the lookupd"):
        peer.receive_data(b"", 0.1)


def test_reconnect_backoff_doubles_to_the_ping_interval_and_resets_after_identify() -> None:
    peer = LookupdPeer("127.0.0.1:4160")
    assert peer.next_deadline() == -math.inf  # the first attempt is at once
    now = 0.0
    attempts = []
    for _ in range(7):
        peer.start_connect(now)
        attempts.append(now)
        peer.connect_failed(now, "refused")
        assert peer.status is PeerStatus.WAITING
        now = peer.next_deadline()
    assert attempts == [0.0, 1.0, 3.0, 7.0, 15.0, 30.0, 45.0]
    assert now == 60.0
    peer.start_connect(now)
    peer.connected(now, IDENTIFY, [])
    peer.receive_data(ANSWER.encode(), now)
    peer.disconnected(70.0, "reset")
    assert peer.next_deadline() == 71.0  # one failure since the last IDENTIFY


def test_a_connection_lost_before_identify_counts_as_a_failure() -> None:
    peer = connected_peer()
    peer.disconnected(0.5, "reset")
    peer.start_connect(1.5)
    peer.connected(1.5, IDENTIFY, [])
    peer.disconnected(2.0, "reset")  # no IDENTIFY answer in between
    assert peer.next_deadline() == 4.0


def test_close_stops_for_good() -> None:
    peer = connected_peer()
    peer.close()
    assert peer.status is PeerStatus.WAITING
    assert peer.next_deadline() == math.inf
    assert not peer.send(Register(topic="t"), 1.0)

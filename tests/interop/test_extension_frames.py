"""lmq's message extension is invisible to NSQ's clients: a topic published with headers and
priorities (XPUB from lmq_client: single, multi, deferred; HTTP ``/pub`` and ``/mpub`` with
``Lmq-Header-*`` and ``priority``) is consumed by unmodified pynsq, gnsq and ansq consumers, and
by raw sockets that check every byte of every frame.

Rules for this module (see STYLE.md, Tests):
- one fresh ``lmqd`` subprocess per test (``lmqd_server``), on 127.0.0.1 with port 0;
- the NSQ libraries run in their own interpreters (``clients/<library>_client.py``, bounded by a
  hard time limit and a subprocess timeout) and report what they decoded;
- the reference for ids and timestamps is a consumer that negotiated the extension
  (``lmq_client``'s blocking Consumer) on a channel of its own: every channel gets the same
  message (id, timestamp), as with nsqd;
- expected bytes are written out by hand from docs/protocol.md and nsqd's frame layout, never
  produced by lmqd's own encoders; delivery order is not asserted (priorities may reorder).
"""

from __future__ import annotations

import struct
from typing import Any

import pytest

from lmq_client.http import HTTPClient
from lmq_client.sync import Consumer, Producer
from tests.support.process import LmqdProcess
from tests.support.rawbytes import NsqSocket, identify, rdy, sub

from .runner import run_client

pytestmark = pytest.mark.interop

TOPIC = "fields"
CHANNELS = ("pynsq", "gnsq", "ansq", "raw", "raw_ext", "reference")

# body -> (headers, priority) as published
PUBLISHED: dict[bytes, tuple[dict[str, str], int]] = {
    b"xpub-single": ({"trace": "t-1"}, 7),
    b"xpub-multi-0": ({"batch": "b"}, 0),
    b"xpub-multi-1": ({"batch": "b"}, 0),
    b"xpub-deferred": ({}, 9),
    b"plain": ({}, 0),
    b"http-single": ({"source": "http"}, 5),
    b"http-multi-0": ({"tenant": "acme"}, 1),
    b"http-multi-1": ({"tenant": "acme"}, 1),
}

# The extension block a negotiating consumer gets with each message (docs/protocol.md: flags,
# then priority [1], then headers [2 count]([1 k][key][2 v][value])...); None: frame type 2.
BLOCKS: dict[bytes, bytes | None] = {
    b"xpub-single": b"\x09" + b"\x07" + b"\x00\x01" + b"\x05trace" + b"\x00\x03t-1",
    b"xpub-multi-0": b"\x08" + b"\x00\x01" + b"\x05batch" + b"\x00\x01b",
    b"xpub-multi-1": b"\x08" + b"\x00\x01" + b"\x05batch" + b"\x00\x01b",
    b"xpub-deferred": b"\x01" + b"\x09",
    b"plain": None,
    b"http-single": b"\x09" + b"\x05" + b"\x00\x01" + b"\x06source" + b"\x00\x04http",
    b"http-multi-0": b"\x09" + b"\x01" + b"\x00\x01" + b"\x06tenant" + b"\x00\x04acme",
    b"http-multi-1": b"\x09" + b"\x01" + b"\x00\x01" + b"\x06tenant" + b"\x00\x04acme",
}
COUNT = len(PUBLISHED)


def publish_with_fields(server: LmqdProcess) -> dict[bytes, tuple[str, int]]:
    """Create the topic and every channel, publish ``PUBLISHED``; return what the reference
    consumer received: body -> (id, timestamp), each on its first attempt."""
    assert server.http_address is not None
    client = HTTPClient(server.http_address)
    client.topic_action("create", TOPIC)
    for channel in CHANNELS:
        client.channel_action("create", TOPIC, channel)
    with Producer(server.tcp_address, connect_timeout=5) as producer:
        producer.publish(TOPIC, b"xpub-single", headers={"trace": "t-1"}, priority=7)
        producer.mpub(TOPIC, [b"xpub-multi-0", b"xpub-multi-1"], headers={"batch": "b"})
        producer.dpub(TOPIC, 0.05, b"xpub-deferred", priority=9)
        producer.publish(TOPIC, b"plain")
    base = f"http://{server.http_address}"
    for path, body, header in [
        ("/pub?topic=fields&priority=5", b"http-single", ("Lmq-Header-source", "http")),
        ("/mpub?topic=fields&priority=1", b"http-multi-0\nhttp-multi-1", ("Lmq-Header-tenant",
                                                                           "acme")),
    ]:  # fmt: skip
        answer = HTTPClient.fetch(
            base + path, address=server.http_address, timeout=5, method="POST", body=body,
            headers=dict([header]),
        )  # fmt: skip
        assert answer == b"OK"
    reference: dict[bytes, tuple[str, int]] = {}
    with Consumer(TOPIC, "reference", server.tcp_address, max_in_flight=COUNT,
                  connect_timeout=5) as c:
        for _ in range(COUNT):
            m = c.get(timeout=5)
            assert m is not None, f"reference consumer got {len(reference)} of {COUNT}"
            assert (m.headers, m.priority) == PUBLISHED[m.body], m.body
            assert m.attempts == 1
            reference[m.body] = (m.id.decode("ascii"), m.timestamp)
            m.finish()
    assert set(reference) == set(PUBLISHED)
    return reference


def expected_deliveries(reference: dict[bytes, tuple[str, int]]) -> list[dict[str, Any]]:
    """Every message once, on its first attempt, as nsqd would deliver it: its id, its publish
    timestamp and its body, nothing of the extension in it."""
    return sorted(
        (
            {"id": msg_id, "timestamp": ts, "attempts": 1, "body_hex": body.hex()}
            for body, (msg_id, ts) in reference.items()
        ),
        key=lambda d: d["body_hex"],
    )


@pytest.mark.parametrize("library", ["pynsq", "gnsq", "ansq"])
def test_an_unmodified_nsq_consumer_gets_nsqd_s_messages(
    lmqd_server: LmqdProcess, library: str
) -> None:
    reference = publish_with_fields(lmqd_server)
    result = run_client(
        library, "consume", timeout=40, address=lmqd_server.tcp_address, topic=TOPIC,
        channel=library, action="finish", expect=COUNT, consume_timeout_s=20, quiet_s=0.5,
    )  # fmt: skip
    got = sorted(result["messages"], key=lambda d: d["body_hex"])
    assert got == expected_deliveries(reference), result["stderr"]


def _read_frames(address: str, channel: str, negotiate: bool) -> list[tuple[int, bytes]]:
    with NsqSocket(address) as s:
        if negotiate:
            s.send(identify(feature_negotiation=True, lmq_ext=1))
            answer = s.read_skipping_heartbeats()
            assert answer.type == 0 and b'"lmq_ext":1' in answer.data.replace(b" ", b"")
        s.send(sub(TOPIC, channel))
        s.expect_response()
        s.send(rdy(COUNT))
        frames = [s.read_skipping_heartbeats() for _ in range(COUNT)]
        with pytest.raises(TimeoutError):  # and nothing more
            s.read_frame(timeout=0.3)
        return [(f.type, f.data) for f in frames]


def _body_of(frame_type: int, data: bytes) -> bytes:
    """The body of a message frame, by the layout of its type (2: nsqd's, 3: protocol.md's)."""
    if frame_type == 2:
        return data[26:]
    assert frame_type == 3, frame_type
    (n,) = struct.unpack(">H", data[26:28])
    return data[28 + n :]


def test_raw_frames_nsqd_s_layout_without_the_extension_type_3_with_it(
    lmqd_server: LmqdProcess,
) -> None:
    reference = publish_with_fields(lmqd_server)
    address = lmqd_server.tcp_address

    plain = {_body_of(t, d): (t, d) for t, d in _read_frames(address, "raw", negotiate=False)}
    assert set(plain) == set(PUBLISHED)
    for body, (frame_type, data) in plain.items():
        msg_id, ts = reference[body]
        # nsqd's frame type 2: [8 timestamp][2 attempts][16 id][body] (the size word and the
        # type were checked by the framing: the data is exactly the rest of the frame).
        assert (frame_type, data) == (2, struct.pack(">qH", ts, 1) + msg_id.encode() + body)

    negotiated = {
        _body_of(t, d): (t, d) for t, d in _read_frames(address, "raw_ext", negotiate=True)
    }
    assert set(negotiated) == set(PUBLISHED)
    for body, (frame_type, data) in negotiated.items():
        msg_id, ts = reference[body]
        head = struct.pack(">qH", ts, 1) + msg_id.encode()
        block = BLOCKS[body]
        if block is None:
            assert (frame_type, data) == (2, head + body)
        else:
            assert (frame_type, data) == (3, head + struct.pack(">H", len(block)) + block + body)

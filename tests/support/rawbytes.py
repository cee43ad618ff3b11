"""Raw bytes for bad input: commands built by hand and a deliberately dumb blocking V2 client.

The command builders (``pub``, ``mpub``, ``identify``, ...) give the bytes a client would send,
so a test can cut, corrupt or repeat them. ``NsqSocket`` speaks to a daemon over a blocking raw
socket and returns frames as ``(type, data)`` byte strings, exactly as sent: it trusts no codec
of ours (``tests.support.wire`` is the client built on ``ClientConnection``). Frames are parsed
by their size prefix from a receive buffer, never by assuming one ``recv`` is one frame
(nsqio/nsq#1250: a reader that trusts read boundaries breaks as soon as frames coalesce or
split). Everything has a timeout so a daemon that hangs fails the test instead of hanging it.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
import uuid
from typing import Any, NamedTuple

MAGIC_V2 = b"  V2"
FRAME_RESPONSE = 0
FRAME_ERROR = 1
FRAME_MESSAGE = 2
HEARTBEAT = b"_heartbeat_"


class Frame(NamedTuple):
    """One server frame: its type and its data (without the size and type words)."""

    type: int
    data: bytes


class Message(NamedTuple):
    """A decoded message frame."""

    timestamp: int
    attempts: int
    id: bytes
    body: bytes


class ConnectionClosed(Exception):
    """The daemon closed (or reset) the connection."""


def decode_message(data: bytes) -> Message:
    timestamp, attempts = struct.unpack(">qH", data[:10])
    return Message(timestamp, attempts, data[10:26], data[26:])


def size_prefixed(body: bytes) -> bytes:
    return struct.pack(">l", len(body)) + body


def pub(topic: str, body: bytes) -> bytes:
    return b"PUB " + topic.encode() + b"\n" + size_prefixed(body)


def dpub(topic: str, defer_ms: int, body: bytes) -> bytes:
    return b"DPUB %s %d\n" % (topic.encode(), defer_ms) + size_prefixed(body)


def mpub(topic: str, bodies: list[bytes]) -> bytes:
    payload = struct.pack(">l", len(bodies)) + b"".join(size_prefixed(b) for b in bodies)
    return b"MPUB " + topic.encode() + b"\n" + size_prefixed(payload)


def sub(topic: str, channel: str) -> bytes:
    return b"SUB %s %s\n" % (topic.encode(), channel.encode())


def rdy(count: int) -> bytes:
    return b"RDY %d\n" % count


def fin(msg_id: bytes) -> bytes:
    return b"FIN " + msg_id + b"\n"


def identify(**fields: Any) -> bytes:
    return b"IDENTIFY\n" + size_prefixed(json.dumps(fields).encode())


def unique(prefix: str) -> str:
    """A topic or channel name no other test uses (valid for nsqd's name regex)."""
    return f"{prefix}_{uuid.uuid4().hex[:12]}"


class NsqSocket:
    """One raw TCP connection to the daemon."""

    def __init__(
        self,
        address: str,
        *,
        timeout: float = 5.0,
        rcvbuf: int | None = None,
        magic: bool = True,
    ) -> None:
        host, _, port = address.rpartition(":")
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf is not None:
            # Must be set before connect() so the advertised window (and its scaling) is small.
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.settimeout(timeout)
        self.sock.connect((host, int(port)))
        self.timeout = timeout
        self._buffer = bytearray()
        self._eof = False
        if magic:
            self.send(MAGIC_V2)

    def __enter__(self) -> NsqSocket:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.sock.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self, deadline: float) -> None:
        """Receive more bytes into the buffer; ConnectionClosed at EOF or reset."""
        if self._eof:
            raise ConnectionClosed("EOF")
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("no frame from lmqd in time")
        self.sock.settimeout(remaining)
        try:
            chunk = self.sock.recv(65536)
        except ConnectionResetError as exc:
            self._eof = True
            raise ConnectionClosed("reset") from exc
        except TimeoutError:
            raise TimeoutError("no frame from lmqd in time") from None
        finally:
            self.sock.settimeout(self.timeout)
        if not chunk:
            self._eof = True
            raise ConnectionClosed("EOF")
        self._buffer += chunk

    def read_frame(self, timeout: float | None = None) -> Frame:
        """The next complete frame (heartbeats included)."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while len(self._buffer) < 4:
            self._fill(deadline)
        (size,) = struct.unpack(">l", self._buffer[:4])
        assert 4 <= size <= 64 * 1024 * 1024, f"implausible frame size {size}"
        while len(self._buffer) < 4 + size:
            self._fill(deadline)
        frame_type = struct.unpack(">l", self._buffer[4:8])[0]
        data = bytes(self._buffer[8 : 4 + size])
        del self._buffer[: 4 + size]
        return Frame(frame_type, data)

    def read_skipping_heartbeats(self, timeout: float | None = None) -> Frame:
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            frame = self.read_frame(max(0.0, deadline - time.monotonic()))
            if frame != Frame(FRAME_RESPONSE, HEARTBEAT):
                return frame

    def expect_response(self, data: bytes = b"OK", timeout: float | None = None) -> None:
        frame = self.read_skipping_heartbeats(timeout)
        assert frame == Frame(FRAME_RESPONSE, data), frame

    def read_message(self, timeout: float | None = None) -> Message:
        frame = self.read_skipping_heartbeats(timeout)
        assert frame.type == FRAME_MESSAGE, frame
        return decode_message(frame.data)

    def frames_until_closed(self, timeout: float | None = None) -> list[Frame]:
        """Every frame the daemon sends before it closes the connection (fail if it doesn't)."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        frames: list[Frame] = []
        while True:
            try:
                frames.append(self.read_frame(max(0.0, deadline - time.monotonic())))
            except ConnectionClosed:
                return frames
            except TimeoutError:
                raise AssertionError(
                    f"lmqd kept the connection open; frames so far: {frames}"
                ) from None

    def expect_fatal_error(self, body: bytes, timeout: float | None = None) -> None:
        """Exactly one error frame with ``body`` (heartbeats aside), then the daemon closes."""
        frames = [
            f for f in self.frames_until_closed(timeout) if f != Frame(FRAME_RESPONSE, HEARTBEAT)
        ]
        assert frames == [Frame(FRAME_ERROR, body)], frames

    def subscribe(self, topic: str, channel: str, ready: int = 1) -> None:
        self.send(sub(topic, channel))
        self.expect_response()
        self.send(rdy(ready))


def assert_daemon_serves(address: str, *, timeout: float = 5.0) -> None:
    """A fresh subscriber receives what a fresh publisher publishes: the daemon still works."""
    topic, channel = unique("probe"), "probe"
    body = uuid.uuid4().hex.encode()
    with (
        NsqSocket(address, timeout=timeout) as consumer,
        NsqSocket(address, timeout=timeout) as producer,
    ):
        consumer.subscribe(topic, channel)
        producer.send(pub(topic, body))
        producer.expect_response()
        message = consumer.read_message()
        assert message.body == body
        assert message.attempts == 1
        consumer.send(fin(message.id))


class FinningConsumer(threading.Thread):
    """A consumer thread on a raw socket that reads and FINs everything on its channel, as fast
    as it can, noting the first ``prefix`` bytes of each body in ``bodies`` (bodies made to be
    told apart by their start); ``error`` holds what ended it early. ``stop`` it, ``join`` it,
    then close ``conn``."""

    def __init__(
        self, address: str, topic: str, channel: str, *, ready: int, prefix: int
    ) -> None:
        super().__init__(name=f"finning-consumer-{channel}", daemon=True)
        self.conn = NsqSocket(address, timeout=20)
        self.conn.subscribe(topic, channel, ready=ready)
        self.prefix = prefix
        self.bodies: set[bytes] = set()
        self.error: BaseException | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                try:
                    frame = self.conn.read_frame(timeout=0.5)
                except TimeoutError:
                    continue
                if frame.type != FRAME_MESSAGE:
                    continue
                message = decode_message(frame.data)
                self.bodies.add(message.body[: self.prefix])
                self.conn.send(fin(message.id))
        except (ConnectionClosed, OSError) as exc:
            if not self.stop.is_set():
                self.error = exc

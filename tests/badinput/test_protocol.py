"""Bad input on the V2 TCP protocol: wrong magic, garbage commands, torn and endless frames.

Rules for this module (see STYLE.md, Tests):
- one real ``lmqd`` subprocess shared by the module (``daemon`` fixture), 127.0.0.1, port 0;
- plain blocking sockets with timeouts on every read, so a hanging daemon fails, never hangs;
- every case gets nsqd's exact error frame (or lmq's documented one where nsqd has none) and then
  the ``daemon`` fixture checks that a fresh publisher and subscriber are still served and that
  nothing was logged as a traceback;
- frames are parsed by their size prefix, never by read boundaries (nsqio/nsq#1250).
"""

from __future__ import annotations

import socket
import struct
import threading
import time

import pytest

from tests.support.process import LmqdProcess
from tests.support.rawbytes import (
    FRAME_ERROR,
    FRAME_RESPONSE,
    HEARTBEAT,
    MAGIC_V2,
    Frame,
    NsqSocket,
    fin,
    identify,
    mpub,
    pub,
    rdy,
    size_prefixed,
    sub,
    unique,
)

LMQD_ARGS: tuple[str, ...] = ()

# lmqd's command-line limit (lmqd/protocol/limits.py MAX_LINE_LENGTH; nsqd's bufio size).
MAX_LINE_LENGTH = 16 * 1024


@pytest.mark.parametrize(
    "garbage",
    [
        pytest.param(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", id="http-request"),
        pytest.param(b"\x00\x00\x00\x00", id="zeros"),
        pytest.param(b"  V1", id="lookupd-magic"),
        pytest.param(b"V2  PUB t\n", id="shifted-magic"),
    ],
)
def test_garbage_instead_of_magic(daemon: LmqdProcess, garbage: bytes) -> None:
    with NsqSocket(daemon.tcp_address, magic=False) as conn:
        conn.send(garbage)
        conn.expect_fatal_error(b"E_BAD_PROTOCOL")


def test_magic_then_disconnect_and_half_magic(daemon: LmqdProcess) -> None:
    # nsqd closes silently when the 4 magic bytes never arrive (#1153); the daemon must not care.
    with NsqSocket(daemon.tcp_address, magic=False) as conn:
        conn.send(b"  ")
    with NsqSocket(daemon.tcp_address, magic=True):
        pass


@pytest.mark.parametrize(
    ("line", "error"),
    [
        pytest.param(
            b"\x01\x02GARBAGE\xff\n",
            b"E_INVALID invalid command \x01\x02GARBAGE\xff",
            id="binary-bytes",
        ),
        pytest.param(b"ASDF\r\n", b"E_INVALID invalid command ASDF", id="crlf"),
        pytest.param(b"\n", b"E_INVALID invalid command ", id="empty-line"),
        pytest.param(b"pub topic\n", b"E_INVALID invalid command pub", id="lowercase"),
        pytest.param(b" PUB topic\n", b"E_INVALID invalid command ", id="leading-space"),
    ],
)
def test_garbage_after_magic(daemon: LmqdProcess, line: bytes, error: bytes) -> None:
    with NsqSocket(daemon.tcp_address) as conn:
        conn.send(line)
        conn.expect_fatal_error(error)


def test_valid_commands_before_garbage_are_answered_first(daemon: LmqdProcess) -> None:
    topic = unique("before_garbage")
    with NsqSocket(daemon.tcp_address) as conn:
        conn.send(
            pub(topic, b"one") + b"NOP\n" + pub(topic, b"two") + b"BOGUS\n" + pub(topic, b"x")
        )
        frames = conn.frames_until_closed()
    assert frames == [
        Frame(FRAME_RESPONSE, b"OK"),
        Frame(FRAME_RESPONSE, b"OK"),
        Frame(FRAME_ERROR, b"E_INVALID invalid command BOGUS"),
    ]
    # The two good publishes were kept, the one after the garbage was not.
    with NsqSocket(daemon.tcp_address) as consumer:
        consumer.subscribe(topic, "c", ready=10)
        bodies = {consumer.read_message().body for _ in range(2)}
        assert bodies == {b"one", b"two"}
        with pytest.raises(TimeoutError):
            consumer.read_skipping_heartbeats(timeout=0.3)


def test_over_long_command_line_is_refused(daemon: LmqdProcess) -> None:
    with NsqSocket(daemon.tcp_address) as conn:
        conn.send(b"PUB " + b"a" * (MAX_LINE_LENGTH + 4096))
        conn.expect_fatal_error(b"E_INVALID command line too long (limit 16384 bytes)")


def test_endless_command_line_is_not_buffered(daemon: LmqdProcess) -> None:
    # A client streaming a line that never ends: the daemon must cut it off after a bounded
    # amount, so our sendall() of 64 MiB has to fail long before it completes.
    before = daemon.rss_bytes()
    sent = 0
    chunk = b"x" * 65536
    with NsqSocket(daemon.tcp_address) as conn:
        # A small send buffer keeps what the kernels hold for us well below the bound below.
        conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
        conn.send(b"NOP\nPUB ")
        with pytest.raises((BrokenPipeError, ConnectionResetError)):
            for _ in range(1024):
                conn.send(chunk)
                sent += len(chunk)
    assert sent < 16 * 1024 * 1024, f"lmqd swallowed {sent} bytes of one command line"
    assert daemon.rss_bytes() - before < 32 * 1024 * 1024


def test_commands_split_at_every_byte(daemon: LmqdProcess) -> None:
    # Commands trickling in one byte per send are parsed by size, not by read boundaries.
    topic = unique("trickle")
    with NsqSocket(daemon.tcp_address) as consumer, NsqSocket(daemon.tcp_address) as producer:
        consumer.subscribe(topic, "c", ready=5)
        data = (
            identify(feature_negotiation=False) + pub(topic, b"a\nb c") + mpub(topic, [b"1", b"22"])
        )
        for i in range(len(data)):
            producer.send(data[i : i + 1])
        for _ in range(3):
            producer.expect_response()
        received = []
        for _ in range(3):
            message = consumer.read_message()
            received.append(message.body)
            consumer.send(fin(message.id))
        assert sorted(received) == [b"1", b"22", b"a\nb c"]


def test_many_commands_in_one_send(daemon: LmqdProcess) -> None:
    topic = unique("coalesced")
    count = 2000
    with NsqSocket(daemon.tcp_address) as consumer, NsqSocket(daemon.tcp_address) as producer:
        consumer.subscribe(topic, "c", ready=count)
        producer.send(b"".join(pub(topic, b"%d" % i) for i in range(count)))
        for _ in range(count):
            producer.expect_response()
        ids = []
        bodies: set[bytes] = set()
        for _ in range(count):
            message = consumer.read_message()
            bodies.add(message.body)
            ids.append(message.id)
        consumer.send(b"".join(fin(i) for i in ids))
        assert bodies == {b"%d" % i for i in range(count)}


@pytest.mark.parametrize(
    ("payload", "error"),
    [
        pytest.param(
            struct.pack(">l", 3) + size_prefixed(b"one") + size_prefixed(b"two"),
            b"E_BAD_BODY MPUB messages do not add up to body size 18",
            id="count-larger-than-messages",
        ),
        pytest.param(
            struct.pack(">l", 1) + size_prefixed(b"one") + b"tail",
            b"E_BAD_BODY MPUB messages do not add up to body size 15",
            id="bytes-left-over",
        ),
        pytest.param(
            struct.pack(">l", 1) + struct.pack(">l", 10) + b"short",
            b"E_BAD_BODY MPUB messages do not add up to body size 13",
            id="message-overruns-body",
        ),
        pytest.param(
            struct.pack(">l", 0),
            b"E_BAD_BODY MPUB invalid message count 0",
            id="zero-count",
        ),
        pytest.param(
            struct.pack(">l", -1) + size_prefixed(b"one"),
            b"E_BAD_BODY MPUB invalid message count -1",
            id="negative-count",
        ),
        pytest.param(
            struct.pack(">l", 2_000_000) + size_prefixed(b"one"),
            b"E_BAD_BODY MPUB invalid message count 2000000",
            id="count-above-what-max-body-can-hold",
        ),
        pytest.param(
            struct.pack(">l", 6) + size_prefixed(b"a") * 5 + struct.pack(">l", 0),
            b"E_BAD_MESSAGE MPUB invalid message(5) body size 0",
            id="empty-message-5",
        ),
        pytest.param(
            b"\x00\x00", b"E_BAD_BODY MPUB messages do not add up to body size 2", id="no-count"
        ),
    ],
)
def test_mpub_parts_that_do_not_add_up(daemon: LmqdProcess, payload: bytes, error: bytes) -> None:
    topic = unique("mpub_mismatch")
    with NsqSocket(daemon.tcp_address) as conn:
        # The good MPUB first shows that the bad one's error belongs to it alone.
        conn.send(mpub(topic, [b"fine"]))
        conn.expect_response()
        conn.send(b"MPUB " + topic.encode() + b"\n" + size_prefixed(payload) + b"NOP\n")
        conn.expect_fatal_error(error)
    # Nothing of the refused MPUB was published ("atomic"): only "fine" is there.
    with NsqSocket(daemon.tcp_address) as consumer:
        consumer.subscribe(topic, "c", ready=10)
        assert consumer.read_message().body == b"fine"
        with pytest.raises(TimeoutError):
            consumer.read_skipping_heartbeats(timeout=0.3)


@pytest.mark.parametrize(
    "partial",
    [
        pytest.param(b"PUB torn", id="command-line"),
        pytest.param(b"PUB torn\n\x00\x00", id="size"),
        pytest.param(b"PUB torn\n" + struct.pack(">l", 100) + b"x" * 50, id="body"),
        pytest.param(b"MPUB torn\n" + struct.pack(">ll", 100, 2) + size_prefixed(b"a"), id="mpub"),
        pytest.param(b"IDENTIFY\n" + struct.pack(">l", 100) + b'{"client_id":', id="identify"),
    ],
)
def test_half_sent_frame_then_disconnect(daemon: LmqdProcess, partial: bytes) -> None:
    with NsqSocket(daemon.tcp_address) as conn:
        conn.send(partial)
    # Nothing of the torn command may have been published.
    with NsqSocket(daemon.tcp_address) as consumer:
        consumer.subscribe("torn", "c", ready=10)
        with pytest.raises(TimeoutError):
            consumer.read_skipping_heartbeats(timeout=0.3)


def test_half_sent_frame_then_silence_is_dropped_after_two_heartbeats(daemon: LmqdProcess) -> None:
    with NsqSocket(daemon.tcp_address) as conn:
        conn.send(identify(heartbeat_interval=1000, feature_negotiation=False))
        conn.expect_response()
        conn.send(b"PUB silent\n" + struct.pack(">l", 100) + b"x" * 10)
        start = time.monotonic()
        frames = conn.frames_until_closed(timeout=10)
        elapsed = time.monotonic() - start
    # nsqd's read deadline is 2 x heartbeat_interval; heartbeats keep coming until then.
    assert 1.8 <= elapsed <= 4.0, elapsed
    assert Frame(FRAME_RESPONSE, HEARTBEAT) in frames
    # nsqd also reports the body read that timed out; lmqd may just close.
    allowed = {
        Frame(FRAME_RESPONSE, HEARTBEAT),
        Frame(FRAME_ERROR, b"E_BAD_MESSAGE PUB failed to read message body"),
    }
    assert set(frames) <= allowed, frames


def test_idle_connection_answering_heartbeats_is_kept(daemon: LmqdProcess) -> None:
    # The counterpart of the previous case: NOP answers keep a connection alive past 2 intervals.
    with NsqSocket(daemon.tcp_address) as conn:
        conn.send(identify(heartbeat_interval=1000, feature_negotiation=False))
        conn.expect_response()
        deadline = time.monotonic() + 3.5
        beats = 0
        while time.monotonic() < deadline:
            try:
                frame = conn.read_frame(timeout=deadline - time.monotonic())
            except TimeoutError:
                break
            assert frame == Frame(FRAME_RESPONSE, HEARTBEAT)
            beats += 1
            conn.send(b"NOP\n")
        assert beats == 3
        conn.send(pub("kept_alive", b"x"))
        conn.expect_response()


def test_bad_input_on_one_connection_leaves_others_alone(daemon: LmqdProcess) -> None:
    topic = unique("bystander")
    with NsqSocket(daemon.tcp_address) as consumer, NsqSocket(daemon.tcp_address) as producer:
        consumer.subscribe(topic, "c", ready=100)
        for i in range(20):
            with NsqSocket(daemon.tcp_address) as bad:
                bad.send(b"GARBAGE %d\n" % i)
                bad.expect_fatal_error(b"E_INVALID invalid command GARBAGE")
            producer.send(pub(topic, b"%d" % i))
            producer.expect_response()
            message = consumer.read_message()
            assert message.body == b"%d" % i
            consumer.send(fin(message.id))


def test_abrupt_disconnects_while_subscribed(daemon: LmqdProcess) -> None:
    # Consumers that vanish with messages in flight: the messages go to the next consumer.
    topic = unique("vanish")
    with NsqSocket(daemon.tcp_address) as producer:
        producer.send(mpub(topic, [b"%d" % i for i in range(10)]))
        producer.expect_response()
    for _ in range(3):
        conn = NsqSocket(daemon.tcp_address)
        conn.subscribe(topic, "c", ready=10)
        conn.read_message()
        conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conn.close()  # SO_LINGER 0: a reset, not a clean close
    with NsqSocket(daemon.tcp_address) as consumer:
        consumer.subscribe(topic, "c", ready=10)
        bodies: set[bytes] = set()
        while len(bodies) < 10:
            message = consumer.read_message()
            bodies.add(message.body)
            consumer.send(fin(message.id))
        assert bodies == {b"%d" % i for i in range(10)}


def test_subscriber_that_never_sends_rdy_gets_nothing(daemon: LmqdProcess) -> None:
    topic = unique("no_rdy")
    with NsqSocket(daemon.tcp_address) as idle, NsqSocket(daemon.tcp_address) as producer:
        idle.send(sub(topic, "c"))
        idle.expect_response()
        producer.send(pub(topic, b"x"))
        producer.expect_response()
        with pytest.raises(TimeoutError):
            idle.read_skipping_heartbeats(timeout=0.3)
        idle.send(rdy(1))
        assert idle.read_message().body == b"x"


def test_writes_after_fatal_error_are_ignored(daemon: LmqdProcess) -> None:
    # A client that keeps writing after its fatal error: the daemon closes, reads nothing more.
    topic = unique("after_fatal")
    with NsqSocket(daemon.tcp_address) as conn:
        conn.send(b"BAD\n" + pub(topic, b"must not be published"))
        conn.expect_fatal_error(b"E_INVALID invalid command BAD")
        stop = threading.Event()

        def keep_writing() -> None:
            try:
                while not stop.is_set():
                    conn.send(pub(topic, b"must not be published"))
            except OSError:
                return

        writer = threading.Thread(target=keep_writing)
        writer.start()
        writer.join(5)
        stop.set()
        assert not writer.is_alive(), "the daemon kept reading a connection it had failed"
    with NsqSocket(daemon.tcp_address) as consumer:
        consumer.subscribe(topic, "c", ready=10)
        with pytest.raises(TimeoutError):
            consumer.read_skipping_heartbeats(timeout=0.3)


def test_magic_twice(daemon: LmqdProcess) -> None:
    # The second "  V2" is a command line starting with two spaces: nsqd splits it on spaces and
    # the empty first field is the command.
    with NsqSocket(daemon.tcp_address) as conn:
        conn.send(MAGIC_V2 + b"\n")
        conn.expect_fatal_error(b"E_INVALID invalid command ")

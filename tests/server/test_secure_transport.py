"""TLS, snappy and deflate on lmqd's TCP connections, driven over in-memory streams.

Rules for this module (STYLE.md):
- A real ``LmqDaemon`` runs (listening on 127.0.0.1 port 0, unused); each client talks to a
  ``TcpConnection`` through ``trio.testing.memory_stream_pair()``: real TLS (trio's
  ``SSLStream``, a test PKI made by ``tests/transport/certs.py``) and lmqd's codecs, but no
  sockets, so the autojump clock gives exact virtual times.
- Bytes are checked raw (``secure_wire.WireClient``), as a client sees them.
- Every test is bounded by ``trio.fail_after``.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from lmqd.options import Options
from lmqd.server import TcpConnection
from lmqd.service import LmqDaemon
from lmqd.transport.compression import DeflateStream, SnappyStream
from lmqd.transport.tls import client_context
from tests.transport.certs import Certs, make_certs

from .secure_wire import MAGIC, WireClient, command, identify, pub

TIMEOUT = 20


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


def tls_options(certs: Certs, tmp_path: Path, **extra: Any) -> Options:
    return Options(
        tcp_address="127.0.0.1:0",
        http_address="",
        https_address="",  # nsqd's default 0.0.0.0:4152 would listen with the certificate
        data_path=str(tmp_path),
        tls_cert=certs.server.cert_file,
        tls_key=certs.server.key_file,
        **extra,
    )


class Daemon:
    """A running LmqDaemon and a way to open in-memory connections to it."""

    def __init__(self, daemon: LmqDaemon, nursery: trio.Nursery) -> None:
        self.daemon = daemon
        self.broker = daemon.broker
        self.nursery = nursery
        self.count = 0

    async def connect(self) -> WireClient:
        self.count += 1
        client_end, server_end = trio.testing.memory_stream_pair()
        connection = TcpConnection(
            self.broker, server_end, f"10.0.0.{self.count}:1234", self.daemon.security
        )

        async def serve() -> None:
            try:
                await connection.serve()
            finally:
                await server_end.aclose()  # as lmqd.server.tcp does for a socket

        self.nursery.start_soon(serve)
        client = WireClient(client_end)
        await client.send(MAGIC)
        return client

    def client_stats(self) -> list[dict[str, Any]]:
        return [c.statistics().to_dict() for c in self.broker.clients.values()]


@pytest.fixture
async def start(nursery: trio.Nursery) -> AsyncIterator[Callable[[Options], Any]]:
    daemons: list[LmqDaemon] = []

    async def start_daemon(options: Options) -> Daemon:
        daemon = LmqDaemon(options)
        await nursery.start(daemon.run)
        daemons.append(daemon)
        return Daemon(daemon, nursery)

    yield start_daemon
    for daemon in daemons:
        daemon.shutdown()


def socket_of(client: WireClient) -> trio.StapledStream[Any, Any]:
    """The in-memory "socket" under the client's layers."""
    stream: Any = client.stream
    while not isinstance(stream, trio.StapledStream):
        stream = stream.transport_stream if isinstance(stream, trio.SSLStream) else stream.stream
    return stream


def ca_context(certs: Certs, **kwargs: Any) -> ssl.SSLContext:
    return client_context(ca_file=certs.ca_file, **kwargs)


async def pubsub(client: WireClient, topic: str) -> None:
    """PUB, SUB, RDY, and the message back: proves both directions of the current layers."""
    await client.send(pub(topic, b"hello through the layers"))
    assert await client.response() == b"OK"
    await client.send(command(f"SUB {topic} ch") + command("RDY 1"))
    assert await client.response() == b"OK"
    assert await client.message_body() == b"hello through the layers"


# -- negotiation and upgrades --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tls", "codec"),
    [(True, None), (False, "snappy"), (False, "deflate"), (True, "snappy"), (True, "deflate")],
)
async def test_upgrades_in_nsqd_order_then_traffic_both_ways(
    start: Any, certs: Certs, tmp_path: Path, tls: bool, codec: str | None
) -> None:
    with trio.fail_after(TIMEOUT):
        daemon = await start(tls_options(certs, tmp_path))
        client = await daemon.connect()
        answer = await client.identify(
            tls_v1=tls, snappy=codec == "snappy", deflate=codec == "deflate", deflate_level=3
        )
        # The IDENTIFY answer itself is plaintext and says what was granted.
        assert (answer["tls_v1"], answer["snappy"], answer["deflate"]) == (
            tls,
            codec == "snappy",
            codec == "deflate",
        )
        assert answer["auth_required"] is False
        if codec == "deflate":
            assert (answer["deflate_level"], answer["max_deflate_level"]) == (3, 6)
        if tls:
            await client.start_tls(ca_context(certs))
        if codec:
            await client.start_compression(codec, 3)
        await pubsub(client, "layers")
        (stats,) = daemon.client_stats()
        assert stats["tls"] is tls
        assert stats["snappy"] is (codec == "snappy")
        assert stats["deflate"] is (codec == "deflate")
        if tls:
            assert stats["tls_version"] == "TLS1.3"
            assert stats["tls_cipher_suite"].startswith("TLS_")
            assert stats["tls_negotiated_protocol_is_mutual"] is True
        else:
            assert stats["tls_version"] == ""


async def test_nothing_is_upgraded_unless_offered(start: Any, certs: Certs, tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        options = Options(
            tcp_address="127.0.0.1:0",
            http_address="",
            data_path=str(tmp_path),
            snappy=False,
            deflate=False,
        )
        daemon = await start(options)
        client = await daemon.connect()
        answer = await client.identify(tls_v1=True, snappy=True, deflate=True)
        assert (answer["tls_v1"], answer["snappy"], answer["deflate"]) == (False, False, False)
        await pubsub(client, "plain")  # still plaintext, nothing else was sent


async def test_snappy_and_deflate_together_are_refused(
    start: Any, certs: Certs, tmp_path: Path
) -> None:
    with trio.fail_after(TIMEOUT):
        daemon = await start(tls_options(certs, tmp_path))
        client = await daemon.connect()
        await client.send(identify(snappy=True, deflate=True))
        assert (
            await client.error()
            == b"E_IDENTIFY_FAILED cannot enable both deflate and snappy compression"
        )
        assert await client.closed()


async def test_commands_sent_right_behind_identify_go_through_the_new_layer(
    start: Any, certs: Certs, tmp_path: Path
) -> None:
    # A client may write its first compressed command in the same segment as IDENTIFY: those
    # bytes belong to the codec, not to the plaintext parser.
    with trio.fail_after(TIMEOUT):
        daemon = await start(tls_options(certs, tmp_path))
        client = await daemon.connect()
        codec = SnappyStream()
        await client.send(identify(snappy=True) + codec.compress(pub("early", b"x")))
        answer = json.loads(await client.response())
        assert answer["snappy"] is True
        # Read the rest as the codec's output: the upgrade's OK, then the PUB's.
        received = b""
        while received.count(b"OK") < 2:
            received += codec.decompress(bytes(await client.stream.receive_some(65536)))
        assert received == b"\x00\x00\x00\x06\x00\x00\x00\x00OK" * 2


# -- --tls-required ------------------------------------------------------------------------------


@pytest.mark.parametrize("line", [b"PUB t", b"SUB t c", b"NOP", b"FOO"])
async def test_tls_required_refuses_every_plaintext_command_but_identify(
    start: Any, certs: Certs, tmp_path: Path, line: bytes
) -> None:
    with trio.fail_after(TIMEOUT):
        daemon = await start(tls_options(certs, tmp_path, tls_required="true"))
        client = await daemon.connect()
        answer = await client.identify()  # IDENTIFY is allowed, without asking for TLS too
        assert answer["tls_v1"] is False
        await client.send(line + b"\n" + (b"\x00\x00\x00\x01x" if line.startswith(b"PUB") else b""))
        name = line.split(b" ")[0]
        expected = b"E_INVALID cannot " + name + b" in current state (TLS required)"
        assert await client.error() == expected
        assert await client.closed()
        assert daemon.broker.topics == {}


async def test_tls_required_accepts_commands_once_upgraded(
    start: Any, certs: Certs, tmp_path: Path
) -> None:
    with trio.fail_after(TIMEOUT):
        daemon = await start(tls_options(certs, tmp_path, tls_required="tcp-https"))
        client = await daemon.connect()
        assert (await client.identify(tls_v1=True))["tls_v1"] is True
        await client.start_tls(ca_context(certs))
        await pubsub(client, "secured")


# -- client certificates -------------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["require", "require-verify"])
async def test_client_certificate_policy(
    start: Any, certs: Certs, tmp_path: Path, policy: str
) -> None:
    with trio.fail_after(TIMEOUT):
        options = tls_options(
            certs, tmp_path, tls_client_auth_policy=policy, tls_root_ca_file=certs.ca_file
        )
        daemon = await start(options)
        without = await daemon.connect()
        await without.identify(tls_v1=True)
        # No certificate: the daemon drops the connection (during or right after the handshake).
        with pytest.raises((trio.BrokenResourceError, EOFError)):
            await without.start_tls(ca_context(certs))
            await without.frame()
        with_cert = await daemon.connect()
        await with_cert.identify(tls_v1=True)
        await with_cert.start_tls(
            ca_context(certs, cert_file=certs.client.cert_file, key_file=certs.client.key_file)
        )
        await pubsub(with_cert, "mutual")


# -- bad input -----------------------------------------------------------------------------------


async def test_garbage_instead_of_a_tls_handshake_gets_identify_failed_in_plaintext(
    start: Any, certs: Certs, tmp_path: Path
) -> None:
    with trio.fail_after(TIMEOUT):
        daemon = await start(tls_options(certs, tmp_path))
        client = await daemon.connect()
        await client.identify(tls_v1=True)
        await client.send(b"PUB t\n\x00\x00\x00\x01x" * 20)  # a client that never does TLS
        received = b""
        while True:
            chunk = await client.stream.receive_some(65536)
            if not chunk:
                break
            received += chunk
        # nsqd's fatal error frame, written on the plain stream (after any TLS alert), then EOF.
        assert b"\x00\x00\x00\x01E_IDENTIFY_FAILED IDENTIFY failed " in received
        assert daemon.broker.topics == {}
        # The daemon carries on.
        other = await daemon.connect()
        await other.identify(tls_v1=True)
        await other.start_tls(ca_context(certs))
        await pubsub(other, "after-garbage")


async def test_a_client_that_never_starts_tls_is_dropped_after_5_s(
    start: Any, certs: Certs, tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    # Started outside the guard: with the autojump clock, the restore's worker thread lets
    # virtual time run to the next deadline.
    daemon = await start(tls_options(certs, tmp_path))
    with trio.fail_after(TIMEOUT):
        client = await daemon.connect()
        await client.identify(tls_v1=True)
        started = trio.current_time()
        assert await client.error() == b"E_IDENTIFY_FAILED IDENTIFY failed i/o timeout"
        assert trio.current_time() - started == pytest.approx(5.0)
        assert await client.closed()


@pytest.mark.parametrize(
    ("name", "bad"),
    [
        ("snappy", b"\xff\x06\x00\x00sNaPpY" + b"\x00\x08\x00\x00" + b"\xde\xad\xbe\xef" * 2),
        ("deflate", b"\xff\xff\xff\xff not deflate"),
    ],
)
async def test_corrupt_compressed_input_closes_that_connection_only(
    start: Any, certs: Certs, tmp_path: Path, name: str, bad: bytes
) -> None:
    with trio.fail_after(TIMEOUT):
        daemon = await start(tls_options(certs, tmp_path))
        client = await daemon.connect()
        await client.identify(snappy=name == "snappy", deflate=name == "deflate")
        await client.start_compression(name)
        await socket_of(client).send_all(bad)  # bytes that no codec wrote
        assert await client.closed()
        other = await daemon.connect()
        await other.identify(snappy=name == "snappy", deflate=name == "deflate")
        await other.start_compression(name)
        await pubsub(other, "after-corruption")


@pytest.mark.parametrize("name", ["snappy", "deflate"])
async def test_truncated_compressed_stream_is_dropped_and_nothing_half_applied(
    start: Any, certs: Certs, tmp_path: Path, name: str
) -> None:
    with trio.fail_after(TIMEOUT):
        daemon = await start(tls_options(certs, tmp_path))
        client = await daemon.connect()
        await client.identify(snappy=name == "snappy", deflate=name == "deflate")
        await client.start_compression(name)
        codec = SnappyStream() if name == "snappy" else DeflateStream()
        whole = codec.compress(pub("cut", b"y" * 1000))
        raw = socket_of(client)
        await raw.send_all(whole[: len(whole) // 2])
        await raw.send_eof()  # the peer vanished half-way through a write
        assert await client.closed()
        assert "cut" not in daemon.broker.topics


async def test_durable_ok_held_before_identify_goes_out_in_plaintext_first(
    start: Any, certs: Certs, tmp_path: Path
) -> None:
    # With --durable a PUB's OK waits for its fsync; an IDENTIFY right behind it must not let the
    # upgrade overtake it: the OK and the IDENTIFY answer are plaintext, then the codec's OK.
    with trio.fail_after(TIMEOUT):
        daemon = await start(tls_options(certs, tmp_path, durable=True))
        client = await daemon.connect()
        await client.send(pub("durable", b"synced first") + identify(snappy=True))
        assert await client.response() == b"OK"
        assert json.loads(await client.response())["snappy"] is True
        await client.start_compression("snappy")
        await pubsub(client, "durable-after")

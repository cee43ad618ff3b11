"""The clients' TLS, snappy, deflate and AUTH against a scripted fake daemon that does them for
real (lmqd's TLS server side and codecs, see ``fakes.py``).

Rules for this module: the trio clients get memory streams from ``FakeNetwork`` (no sockets) and
run on the ``autojump_clock``; the blocking client needs a socket, so its fake daemon listens on
127.0.0.1 (port 0) and the client runs in a worker thread, on the real clock. Every test is
bounded by ``trio.fail_after``. Certificates come from the session's ``certs`` fixture.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any

import pytest
import trio

from lmq_client import errors, sync
from lmq_client.connection import Connection
from lmq_client.consumer import Consumer
from lmq_client.message import Message
from lmq_client.producer import Producer
from lmq_client.transport import PLAIN, TransportOptions, plan_upgrades
from lmqd.protocol import Auth, Cls, Fin, Identify, Nop, Pub, Rdy, Sub, encode_response
from lmqd.transport.compression import DeflateStream, SnappyStream, StreamCodec
from lmqd.transport.streams import CompressedStream, start_tls_server
from lmqd.transport.tls import ServerTLS, peer_common_name, server_tls
from tests.transport.certs import Certs

from .fakes import IDENTIFY_RESPONSE, FakeDaemon, FakeNetwork, serve_one, upgrade

AUTH_ANSWER = {"identity": "alice", "identity_url": "", "permission_count": 1}


def _server_tls(certs: Certs, **kwargs: str) -> ServerTLS:
    return server_tls(cert_file=certs.server.cert_file, key_file=certs.server.key_file, **kwargs)


def _tls_options(certs: Certs, **kwargs: Any) -> TransportOptions:
    return TransportOptions(tls=True, tls_root_ca_file=certs.ca_file, **kwargs)


def _no_codec() -> StreamCodec | None:
    return None


COMPRESSIONS: dict[str, tuple[Callable[[], StreamCodec | None], dict[str, Any]]] = {
    "none": (_no_codec, {}),
    "snappy": (SnappyStream, {"snappy": True}),
    "deflate": (lambda: DeflateStream(3), {"deflate": True, "deflate_level": 3}),
}


@pytest.mark.parametrize("use_tls", [False, True], ids=["plain", "tls"])
@pytest.mark.parametrize("compression", list(COMPRESSIONS))
async def test_producer_tls_compression_matrix(
    use_tls: bool, compression: str, certs: Certs, autojump_clock: trio.abc.Clock
) -> None:
    make_codec, options = COMPRESSIONS[compression]
    transport = _tls_options(certs, **options) if use_tls else TransportOptions(**options)
    net = FakeNetwork()
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:

            async def daemon() -> None:
                fake = await net.accept()
                identify = await upgrade(
                    fake, tls=_server_tls(certs) if use_tls else None, codec=make_codec()
                )
                assert identify.get("tls_v1", False) is use_tls
                assert identify.get("snappy", False) is (compression == "snappy")
                assert identify.get("deflate", False) is (compression == "deflate")
                if compression == "deflate":
                    assert identify["deflate_level"] == 3
                for body in (b"hello", b"x" * 200_000):
                    pub = await fake.expect(Pub)
                    assert pub.body == body
                    await fake.respond()

            nursery.start_soon(daemon)
            async with Producer(
                "fake:4150", open_stream=net.open_stream, transport=transport
            ) as producer:
                await producer.publish("t", b"hello")
                await producer.publish("t", b"x" * 200_000)


async def test_consumer_over_tls_and_snappy(certs: Certs, autojump_clock: trio.abc.Clock) -> None:
    net = FakeNetwork()
    handled: list[bytes] = []
    done = trio.Event()

    async def handler(message: Message) -> None:
        handled.append(message.body)

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:

            async def daemon() -> None:
                fake = await net.accept()
                await upgrade(fake, tls=_server_tls(certs), codec=SnappyStream())
                await fake.expect(Sub)
                await fake.respond()
                assert (await fake.expect(Rdy)).count == 5
                await fake.deliver(b"%016x" % 1, b"secret message")
                assert (await fake.expect(Fin)).id == b"%016x" % 1
                done.set()
                await fake.expect(Cls)
                await fake.respond(b"CLOSE_WAIT")

            nursery.start_soon(daemon)
            consumer = Consumer(
                "t",
                "c",
                "fake:4150",
                handler=handler,
                max_in_flight=5,
                open_stream=net.open_stream,
                transport=_tls_options(certs, snappy=True),
            )
            async with consumer:
                await done.wait()
    assert handled == [b"secret message"]


async def test_auth_secret_sent_after_upgrades(
    certs: Certs, autojump_clock: trio.abc.Clock
) -> None:
    net = FakeNetwork()
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:

            async def daemon() -> None:
                fake = await net.accept()
                await upgrade(fake, tls=_server_tls(certs), codec=DeflateStream(), auth=True)
                auth = await fake.expect(Auth)
                assert auth.secret == b"s3cret"
                await fake.respond(json.dumps(AUTH_ANSWER).encode())
                await fake.expect(Pub)
                await fake.respond()

            nursery.start_soon(daemon)
            conn = Connection(
                "fake:4150",
                open_stream=net.open_stream,
                transport=_tls_options(certs, deflate=True, auth_secret="s3cret"),
            )
            await nursery.start(conn.run)
            assert conn.auth_identity == AUTH_ANSWER
            assert await conn.request(Pub(topic="t", body=b"x").encode()) == b"OK"
            await conn.aclose()


async def test_auth_required_without_secret_and_auth_refusals(
    autojump_clock: trio.abc.Clock,
) -> None:
    net = FakeNetwork()
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:

            async def daemon() -> None:
                # 1: no secret configured: the client gives up before sending anything more
                fake = await net.accept()
                await fake.handshake(auth_required=True)
                with pytest.raises(EOFError):
                    await fake.next_command()
                # 2: the auth server refused the secret
                fake = await net.accept()
                await fake.handshake(auth_required=True)
                await fake.expect(Auth)
                await fake.error(b"E_AUTH_FAILED AUTH failed")
                await fake.close()
                # 3: authorised, but not for this topic
                fake = await net.accept()
                await fake.handshake(auth_required=True)
                await fake.expect(Auth)
                await fake.respond(json.dumps(AUTH_ANSWER).encode())
                await fake.expect(Pub)
                await fake.error(b'E_UNAUTHORIZED AUTH failed for PUB on "t" ""')
                await fake.close()

            nursery.start_soon(daemon)
            with pytest.raises(errors.AuthRequired, match="requires AUTH") as required:
                async with Producer("fake:1", open_stream=net.open_stream):
                    pass
            assert required.value.code == "E_AUTH_FIRST"
            with_secret = TransportOptions(auth_secret=b"wrong")
            with pytest.raises(errors.AuthError) as refused:
                async with Producer("fake:1", open_stream=net.open_stream, transport=with_secret):
                    pass
            assert (refused.value.code, refused.value.text) == ("E_AUTH_FAILED", "AUTH failed")
            async with Producer(
                "fake:1", open_stream=net.open_stream, transport=with_secret
            ) as producer:
                with pytest.raises(errors.AuthError) as unauthorized:
                    await producer.publish("t", b"x")
            assert unauthorized.value.code == "E_UNAUTHORIZED"


async def test_tls_asked_but_not_offered_is_refused(
    certs: Certs, autojump_clock: trio.abc.Clock
) -> None:
    net = FakeNetwork()
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:

            async def daemon() -> None:
                fake = await net.accept()
                identify = await fake.handshake(tls_v1=False)
                assert identify["tls_v1"] is True

            nursery.start_soon(daemon)
            with pytest.raises(errors.ConnectionFailed, match="does not offer it"):
                async with Producer(
                    "fake:1", open_stream=net.open_stream, transport=_tls_options(certs)
                ):
                    pass


async def test_untrusted_daemon_certificate_is_refused_unless_skipping_verification(
    certs: Certs, autojump_clock: trio.abc.Clock
) -> None:
    net = FakeNetwork()
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:

            async def daemon() -> None:
                fake = await net.accept()
                await fake.handshake(tls_v1=True)
                with pytest.raises(trio.BrokenResourceError):
                    await fake.start_tls(_server_tls(certs).context)
                fake = await net.accept()
                await upgrade(fake, tls=_server_tls(certs))
                await fake.expect(Pub)
                await fake.respond()

            nursery.start_soon(daemon)
            with pytest.raises(errors.ConnectionFailed, match="CERTIFICATE_VERIFY_FAILED"):
                async with Producer(
                    "fake:1", open_stream=net.open_stream, transport=TransportOptions(tls=True)
                ):
                    pass
            insecure = TransportOptions(tls=True, tls_insecure_skip_verify=True)
            async with Producer(
                "fake:1", open_stream=net.open_stream, transport=insecure
            ) as producer:
                await producer.publish("t", b"x")


async def test_client_certificate_for_require_verify(
    certs: Certs, autojump_clock: trio.abc.Clock
) -> None:
    net = FakeNetwork()
    tls = _server_tls(certs, client_auth_policy="require-verify", root_ca_file=certs.ca_file)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:

            async def daemon() -> None:
                fake = await net.accept()
                await fake.handshake(tls_v1=True)
                secure = await fake.start_tls(tls.context)
                tls.check_peer(secure)
                assert peer_common_name(secure) == certs.client_cn
                await fake.expect(Pub)
                await fake.respond()

            nursery.start_soon(daemon)
            transport = _tls_options(
                certs, tls_cert=certs.client.cert_file, tls_key=certs.client.key_file
            )
            async with Producer(
                "fake:1", open_stream=net.open_stream, transport=transport
            ) as producer:
                await producer.publish("t", b"x")


async def test_corrupt_compressed_stream_closes_the_connection(
    autojump_clock: trio.abc.Clock,
) -> None:
    net = FakeNetwork()
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:

            async def daemon() -> None:
                fake = await net.accept()
                await upgrade(fake, codec=SnappyStream())
                await fake.expect(Pub)
                # bypass the codec: garbage where a compressed frame belongs
                assert isinstance(fake.stream, CompressedStream)
                await fake.stream.stream.send_all(b"\x00\x10\x00\x00garbage-garbage!")

            nursery.start_soon(daemon)
            async with Producer(
                "fake:1", open_stream=net.open_stream, transport=TransportOptions(snappy=True)
            ) as producer:
                with pytest.raises(errors.ConnectionFailed, match="corrupt snappy stream"):
                    await producer.publish("t", b"x")


def test_transport_options_validation_and_identify_fields(certs: Certs) -> None:
    assert PLAIN.identify_fields() == {}
    options = TransportOptions(tls=True, deflate=True, deflate_level=9, auth_secret="pw")
    assert options.identify_fields() == {"tls_v1": True, "deflate": True, "deflate_level": 9}
    assert options.secret == b"pw"
    assert "pw" not in repr(options)
    with pytest.raises(ValueError, match="not both"):
        TransportOptions(snappy=True, deflate=True)
    with pytest.raises(ValueError, match="without tls=True"):
        TransportOptions(tls_root_ca_file=certs.ca_file)
    with pytest.raises(ValueError, match=r"1\.\.9"):
        TransportOptions(deflate=True, deflate_level=0)
    with pytest.raises(ValueError, match="no such file"):
        TransportOptions(tls=True, tls_root_ca_file="/nonexistent/ca.pem").ssl_context()
    # the daemon must not grant what was not asked for
    with pytest.raises(errors.ConnectionFailed, match="not asked for"):
        plan_upgrades(PLAIN, {"snappy": True}, "a:1")
    plan = plan_upgrades(TransportOptions(deflate=True), {"deflate": True, "deflate_level": 2}, "a")
    assert isinstance(plan.codec, DeflateStream) and plan.codec.level == 2
    assert not plan.tls and plan.auth_secret is None


# -- the blocking client ---------------------------------------------------------------------------


@pytest.mark.parametrize("compression", list(COMPRESSIONS))
async def test_blocking_producer_tls_compression_and_auth(compression: str, certs: Certs) -> None:
    make_codec, options = COMPRESSIONS[compression]

    async def script(fake: FakeDaemon) -> None:
        await upgrade(fake, tls=_server_tls(certs), codec=make_codec(), auth=True)
        assert (await fake.expect(Auth)).secret == b"pw"
        await fake.respond(json.dumps(AUTH_ANSWER).encode())
        for _ in range(2):
            await fake.expect(Pub)
            await fake.respond()

    transport = _tls_options(certs, auth_secret="pw", **options)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            address = await nursery.start(serve_one, script)

            def publish() -> None:
                with sync.Producer(address, transport=transport, connect_timeout=10) as producer:
                    producer.publish("t", b"one")
                    producer.publish("t", b"two" * 100_000)

            await trio.to_thread.run_sync(publish)


async def test_blocking_consumer_over_tls_and_deflate(certs: Certs) -> None:
    async def script(fake: FakeDaemon) -> None:
        await upgrade(fake, tls=_server_tls(certs), codec=DeflateStream())
        await fake.expect(Sub)
        await fake.respond()
        await fake.expect(Rdy)
        await fake.deliver(b"%016x" % 7, b"deflated over tls")
        assert (await fake.expect(Fin)).id == b"%016x" % 7

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            address = await nursery.start(serve_one, script)

            def consume() -> bytes:
                transport = _tls_options(certs, deflate=True)
                with sync.Consumer("t", "c", address, transport=transport) as consumer:
                    message = consumer.get(10)
                    assert message is not None
                    message.finish()
                    return message.body

            assert await trio.to_thread.run_sync(consume) == b"deflated over tls"


async def test_blocking_client_refuses_untrusted_certificate(certs: Certs) -> None:
    async def script(fake: FakeDaemon) -> None:
        await fake.handshake(tls_v1=True)
        with pytest.raises(trio.BrokenResourceError):
            await fake.start_tls(_server_tls(certs).context)

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            address = await nursery.start(serve_one, script)
            producer = sync.Producer(address, transport=TransportOptions(tls=True),
                                     connect_timeout=10)
            with pytest.raises(errors.ConnectionFailed, match="CERTIFICATE_VERIFY_FAILED"):
                await trio.to_thread.run_sync(functools.partial(producer.publish, "t", b"x"))


async def _eager_upgrade(fake: FakeDaemon, codec: StreamCodec, tls: ServerTLS | None) -> None:
    """Like nsqd on a fast link: every answer of the handshake that can go out together does,
    in one write, so the client reads compressed bytes along with the plaintext before them."""
    await fake.expect(Identify)
    answer = encode_response(
        json.dumps(
            {**IDENTIFY_RESPONSE, "tls_v1": tls is not None, "snappy": True, "deflate": False}
        ).encode()
    )
    compressed_ok = codec.compress(encode_response(b"OK"))
    if tls is None:
        await fake.send(answer + compressed_ok)
    else:
        await fake.send(answer)
        fake.stream = await start_tls_server(fake.stream, tls.context)
        await fake.send(encode_response(b"OK") + compressed_ok)
    fake.stream = CompressedStream(fake.stream, codec)
    await fake.expect(Pub)
    # the answer to PUB and a heartbeat, in one compressed write
    await fake.send(encode_response(b"OK") + encode_response(b"_heartbeat_"))
    await fake.expect(Nop)


@pytest.mark.parametrize("use_tls", [False, True], ids=["plain", "tls"])
async def test_bytes_behind_a_handshake_frame_reach_the_next_layer(
    use_tls: bool, certs: Certs, autojump_clock: trio.abc.Clock
) -> None:
    net = FakeNetwork()
    transport = _tls_options(certs, snappy=True) if use_tls else TransportOptions(snappy=True)
    tls = _server_tls(certs) if use_tls else None
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_eager_upgrade_accept, net, tls)
            async with Producer(
                "fake:1", open_stream=net.open_stream, transport=transport
            ) as producer:
                await producer.publish("t", b"x")
                await trio.sleep(1)  # time for the NOP


async def _eager_upgrade_accept(net: FakeNetwork, tls: ServerTLS | None) -> None:
    await _eager_upgrade(await net.accept(), SnappyStream(), tls)


@pytest.mark.parametrize("use_tls", [False, True], ids=["plain", "tls"])
async def test_blocking_client_keeps_bytes_behind_a_handshake_frame(
    use_tls: bool, certs: Certs
) -> None:
    transport = _tls_options(certs, snappy=True) if use_tls else TransportOptions(snappy=True)
    tls = _server_tls(certs) if use_tls else None

    async def script(fake: FakeDaemon) -> None:
        await _eager_upgrade(fake, SnappyStream(), tls)

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            address = await nursery.start(serve_one, script)

            def publish_then_idle() -> None:
                with sync.Producer(address, transport=transport, connect_timeout=10) as producer:
                    producer.publish("t", b"x")
                    # the heartbeat came with the OK: an idle check answers it with NOP
                    assert producer.address is not None
                    producer.poll()

            await trio.to_thread.run_sync(publish_then_idle)

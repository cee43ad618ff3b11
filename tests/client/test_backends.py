"""The async clients under both of anyio's backends, asyncio and trio, against real daemons.

Rules for this module: the daemons (lmqd, lmqlookupd) are subprocesses (``tests.support.process``)
on 127.0.0.1, port 0 except where a restart reuses the port the first daemon got, data in
``tmp_path``; so the event loop in the test is only the client's, and asyncio really is asyncio.
Every test is a plain function parametrized over the backend that runs its body with
``anyio.run`` under an ``anyio.fail_after`` guard; blocking calls on the subprocesses go through
``anyio.to_thread``. Warnings are errors (pyproject), so an unclosed asyncio transport or a
coroutine never awaited fails the test. Delays (backoff, reconnect, lookupd polls) are a few
tenths of a second on the real clock; exact timings are tested on trio's virtual clock against
the fake daemon (test_consumer_fake.py).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import anyio
import anyio.lowlevel
import anyio.to_thread
import attrs
import pytest
import trio
import trio.lowlevel

from lmq_client import errors
from lmq_client.backoff import Backoff
from lmq_client.consumer import Consumer
from lmq_client.message import Message
from lmq_client.producer import Producer
from lmq_client.transport import TransportOptions
from tests.security.authserver_thread import auth_server, grant
from tests.support.process import DaemonProcess, LmqdProcess, start_lmqd, stop_lmqd
from tests.transport.certs import Certs

BACKENDS = ["asyncio", "trio"]
TEST_TIMEOUT_S = 20.0
FAST = Backoff(base=0.05, max_delay=0.2, jitter=0.0)

pytestmark = pytest.mark.parametrize("backend", BACKENDS)


def run(backend: str, main: Callable[[], Awaitable[None]]) -> None:
    """``main()`` on ``backend``, bounded by ``TEST_TIMEOUT_S``."""

    async def bounded() -> None:
        if backend == "asyncio":
            asyncio.get_running_loop()  # raises unless asyncio really runs this
        else:
            trio.lowlevel.current_trio_token()
        with anyio.fail_after(TEST_TIMEOUT_S):
            await main()

    anyio.run(bounded, backend=backend)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LmqdProcess]:
    """One plain lmqd for the tests that do not stop it (each uses its own topic)."""
    server = start_lmqd(tmp_path_factory.mktemp("lmqd"))
    yield server
    stop_lmqd(server)


def test_publish_and_consume_with_handler(backend: str, daemon: LmqdProcess) -> None:
    address = daemon.tcp_address
    topic = f"pub-{backend}"
    got: list[bytes] = []

    async def main() -> None:
        done = anyio.Event()

        async def handler(message: Message) -> None:
            got.append(message.body)
            if len(got) == 5:
                done.set()

        async with Producer(address) as producer:
            await producer.publish(topic, b"one")
            await producer.mpub(topic, [b"two", b"three"])
            async with anyio.create_task_group() as tasks:  # pipelined from several tasks
                tasks.start_soon(producer.publish, topic, b"four")
                tasks.start_soon(producer.dpub, topic, 0.3, b"deferred")
            published_at = anyio.current_time()
        async with Consumer(topic, "c", address, handler=handler, max_in_flight=10) as consumer:
            await done.wait()
            # the deferred message came last, not before its delay
            assert anyio.current_time() - published_at >= 0.25
            assert consumer.statistics().finished == 5

    run(backend, main)
    assert sorted(got[:4]) == sorted([b"one", b"two", b"three", b"four"])
    assert got[4] == b"deferred"


def test_consume_by_iteration_and_publish_errors(backend: str, daemon: LmqdProcess) -> None:
    address = daemon.tcp_address
    topic = f"iter-{backend}"

    async def main() -> None:
        async with Producer(address) as producer:
            await producer.mpub(topic, [b"%d" % i for i in range(20)])
            with pytest.raises(errors.BadMessageError) as info:
                await producer.publish(topic, b"")
            assert info.value.code == "E_BAD_MESSAGE"
            await producer.publish(topic, b"after the error")  # reconnects on demand
        seen: list[bytes] = []
        async with Consumer(topic, "c", address, max_in_flight=7) as consumer:
            assert consumer.rdy_counts() == {address: 7}
            async for message in consumer:
                if message.body == b"3" and message.attempts == 1:
                    message.requeue(0.0, backoff=False)
                    continue
                seen.append(message.body)
                message.finish()
                if len(seen) == 21:
                    break
        assert sorted(seen) == sorted([b"%d" % i for i in range(20)] + [b"after the error"])

    run(backend, main)


def test_backoff_and_give_up(backend: str, daemon: LmqdProcess) -> None:
    """A failure stops the flow (RDY 0) for the backoff delay; a message that keeps failing is
    handed to ``on_give_up`` after ``max_attempts``."""
    address = daemon.tcp_address
    topic = f"backoff-{backend}"
    backoff = Backoff(base=0.4, max_delay=0.4, jitter=0.0)
    calls: list[tuple[bytes, int, float]] = []
    gave_up: list[tuple[bytes, int]] = []

    async def main() -> None:
        finished = anyio.Event()
        given_up = anyio.Event()
        first_call = anyio.Event()

        async def handler(message: Message) -> None:
            calls.append((message.body, message.attempts, anyio.current_time()))
            first_call.set()
            if message.body == b"poison" or message.attempts == 1:
                raise RuntimeError("handler failure")
            finished.set()

        async def give_up(message: Message) -> None:
            await anyio.lowlevel.checkpoint()  # an async hook is awaited
            gave_up.append((message.body, message.attempts))
            given_up.set()

        async with Consumer(
            topic, "c", address, handler=handler, requeue_delay=0.0, backoff=backoff,
            max_attempts=3, on_give_up=give_up,
        ) as consumer:
            async with Producer(address) as producer:
                await producer.publish(topic, b"flaky")
            await first_call.wait()
            await anyio.sleep(0.1)
            assert consumer.rdy_counts() == {address: 0}  # backing off
            assert consumer.statistics().backoff_level == 1
            await finished.wait()
            await anyio.sleep(0.05)
            assert consumer.statistics().backoff_level == 0
            assert consumer.rdy_counts() == {address: 1}
            async with Producer(address) as producer:
                await producer.publish(topic, b"poison")
            await given_up.wait()

    run(backend, main)
    (_, first, t1), (_, second, t2) = calls[:2]
    assert (first, second) == (1, 2)
    assert t2 - t1 >= 0.4 - 0.01  # redelivered at once, but held back by the backoff
    assert [a for body, a, _ in calls if body == b"poison"] == [1, 2, 3]
    assert gave_up == [(b"poison", 4)]


def test_reconnect_after_daemon_restart(backend: str, tmp_path: Path) -> None:
    server = start_lmqd(tmp_path)
    address = server.tcp_address
    topic = "restart"
    got: list[bytes] = []

    def restart_on_same_port() -> None:
        nonlocal server
        server.stop()
        server = LmqdProcess(
            tmp_path, [f"--tcp-address={address}", "--http-address=", f"--data-path={tmp_path}"],
            bare=True, http=False,
        )
        server.wait_started()

    async def main() -> None:
        arrived = anyio.Event()

        async def handler(message: Message) -> None:
            nonlocal arrived
            got.append(message.body)
            arrived.set()

        async with (
            Consumer(topic, "c", address, handler=handler, reconnect_backoff=FAST) as consumer,
            Producer(address) as producer,
        ):
            await producer.publish(topic, b"before")
            await arrived.wait()
            arrived = anyio.Event()
            await anyio.to_thread.run_sync(server.stop)
            await consumer.wait_connections(0)
            with pytest.raises(errors.ConnectionFailed):
                await producer.publish(topic, b"while down")
            await anyio.to_thread.run_sync(restart_on_same_port)
            await consumer.wait_connections(1)
            await producer.publish(topic, b"after")  # the producer reconnects on demand
            await arrived.wait()

    try:
        run(backend, main)
    finally:
        stop_lmqd(server)
    assert got == [b"before", b"after"]


def test_tls_compression_and_auth(backend: str, tmp_path: Path, certs: Certs) -> None:
    answer = grant({"topic": "^secure$", "channels": [".*"], "permissions": ["publish",
                                                                             "subscribe"]})
    with auth_server(answer) as auth:
        server = start_lmqd(tmp_path, [
            f"--tls-cert={certs.server.cert_file}", f"--tls-key={certs.server.key_file}",
            f"--auth-http-address={auth.address}",
        ])  # fmt: skip
        address = server.tcp_address
        secure = TransportOptions(tls=True, tls_root_ca_file=certs.ca_file, auth_secret="s3cret")
        snappy = attrs.evolve(secure, snappy=True)
        deflate = attrs.evolve(secure, deflate=True)
        bodies = [b"small", b"x" * 300_000, b"last"]

        async def main() -> None:
            async with Producer(address, transport=snappy) as producer:
                for body in bodies:
                    await producer.publish("secure", body)
                with pytest.raises(errors.AuthError, match="E_UNAUTHORIZED"):
                    await producer.publish("forbidden", b"no")
            got = []
            async with Consumer("secure", "c", address, transport=deflate) as consumer:
                async for message in consumer:
                    got.append(message.body)
                    message.finish()
                    if len(got) == len(bodies):
                        break
            assert got == bodies
            with pytest.raises(errors.ConnectionFailed, match="CERTIFICATE_VERIFY_FAILED"):
                no_ca = TransportOptions(tls=True, auth_secret="s3cret")  # system CAs only
                async with Producer(address, transport=no_ca):
                    pass

        try:
            run(backend, main)
        finally:
            stop_lmqd(server)
    assert {q["secret"] for q in auth.queries} == {"s3cret"}
    assert {q["tls"] for q in auth.queries} == {"true"}


def test_discovery_through_lmqlookupd(backend: str, tmp_path: Path) -> None:
    lookupd = DaemonProcess([
        sys.executable, "-m", "lmqd.lookupd", "--tcp-address=127.0.0.1:0",
        "--http-address=127.0.0.1:0", "--broadcast-address=127.0.0.1",
    ])  # fmt: skip
    lookupd.wait_started()
    servers: list[LmqdProcess] = []
    try:
        lookupd_tcp, lookupd_http = lookupd.address("TCP"), lookupd.address("HTTP")
        assert lookupd_tcp is not None and lookupd_http is not None
        for name in ("a", "b"):
            servers.append(start_lmqd(
                tmp_path / name,
                [f"--lookupd-tcp-address={lookupd_tcp}", "--broadcast-address=127.0.0.1"],
            ))  # fmt: skip
        addresses = sorted(s.tcp_address for s in servers)

        async def main() -> None:
            for address in addresses:
                async with Producer(address) as producer:
                    await producer.publish("found", address.encode())
            got: set[bytes] = set()
            async with Consumer(
                "found", "c", lookupd_http_addresses=[lookupd_http], lookupd_poll_interval=0.3,
                max_in_flight=4,
            ) as consumer:
                async for message in consumer:
                    got.add(message.body)
                    message.finish()
                    if len(got) == 2:
                        break
                assert sorted(consumer.connected_addresses) == addresses
                assert consumer.discovered_addresses == addresses
                assert consumer.rdy_counts() == dict.fromkeys(addresses, 2)  # 4 split evenly
            assert got == {a.encode() for a in addresses}

        run(backend, main)
    finally:
        for server in servers:
            stop_lmqd(server)
        lookupd.check_stop()


def test_built_outside_the_loop_and_body_errors_unwrapped(
    backend: str, daemon: LmqdProcess
) -> None:
    """Clients built in synchronous code work in the loop that runs them; an exception in the
    ``async with`` body reaches the caller as itself, not in an exception group."""
    address = daemon.tcp_address
    topic = f"outside-{backend}"
    producer = Producer(address)
    consumer = Consumer(topic, "c", address)

    async def main() -> None:
        async with producer:
            await producer.publish(topic, b"x")
        with pytest.raises(KeyError, match="from the body"):
            async with consumer:
                message = await consumer.__anext__()
                assert message.body == b"x"
                message.finish()
                raise KeyError("from the body")

    run(backend, main)


def test_heartbeats_answered_while_idle(backend: str, daemon: LmqdProcess) -> None:
    """Idle for more than two 1 s heartbeat intervals: the writer answered every heartbeat with
    NOP, so both clients are still connected on their first connection."""
    address = daemon.tcp_address
    topic = f"idle-{backend}"

    async def main() -> None:
        async with (
            Producer(address, heartbeat_interval=1.0) as producer,
            Consumer(topic, "c", address, heartbeat_interval=1.0) as consumer,
        ):
            connection = await producer.connect()
            await anyio.sleep(2.6)
            assert await producer.connect() is connection  # not replaced
            assert consumer.connected_addresses == [address]
            await producer.publish(topic, b"still here")
            async for message in consumer:
                assert message.body == b"still here"
                message.finish()
                break
            assert consumer.statistics().connections == 1

    run(backend, main)


def test_headers_priority_ttl_and_dedup_ids(backend: str, daemon: LmqdProcess) -> None:
    """lmq's per-message fields: published with XPUB (negotiated in IDENTIFY), consumed with
    their headers and priority; a message without them has none; bad values are refused before
    anything is sent."""
    address = daemon.tcp_address
    topic = f"ext-{backend}"
    got: list[tuple[bytes, dict[str, str], int]] = []

    async def main() -> None:
        done = anyio.Event()

        async def handler(message: Message) -> None:
            got.append((message.body, message.headers, message.priority))
            if len(got) == 5:
                done.set()

        async with Producer(address) as producer:
            await producer.publish(
                topic, b"one", headers={"trace": "t-1"}, priority=7, ttl=60, dedup_id="o-1"
            )
            await producer.mpub(topic, [b"two", b"three"], headers={"batch": "b"},
                                dedup_ids=["b-1", "b-2"])  # fmt: skip
            await producer.dpub(topic, 0.05, b"four", priority=1)
            await producer.publish(topic, b"plain")
            with pytest.raises(ValueError, match="priority"):
                await producer.publish(topic, b"x", priority=10)
            with pytest.raises(ValueError, match="one id per message"):
                await producer.mpub(topic, [b"x", b"y"], dedup_ids=["only-one"])
        async with Consumer(topic, "c", address, handler=handler, max_in_flight=10):
            await done.wait()

    run(backend, main)
    assert sorted(got) == sorted([
        (b"one", {"trace": "t-1"}, 7),
        (b"two", {"batch": "b"}, 0),
        (b"three", {"batch": "b"}, 0),
        (b"four", {}, 1),
        (b"plain", {}, 0),
    ])  # fmt: skip

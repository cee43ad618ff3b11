"""lmqadmin's TLS/compression/AUTH flags and the Spark sink's options, down to the wire.

Rules for this module: the fake daemon (``fakes.FakeDaemon``, doing real TLS and compression)
listens on 127.0.0.1, port 0; the blocking code under test (the CLI, a Spark write task) runs in
a worker thread; every test is bounded by ``trio.fail_after``.
"""

from __future__ import annotations

import json
import pickle
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]
import pytest
import trio
from click.testing import CliRunner

from lmq_client.admin.cli import cli
from lmq_client.spark import SinkOptions
from lmq_client.spark.pool import PRODUCERS
from lmq_client.spark.publish import write_partition
from lmq_client.transport import TransportOptions
from lmqd.protocol import Auth, Mpub, Pub
from lmqd.transport.compression import DeflateStream, SnappyStream
from lmqd.transport.tls import server_tls
from tests.transport.certs import Certs

from .fakes import FakeDaemon, serve_one, upgrade


async def test_lmqadmin_pub_over_tls_snappy_with_auth(certs: Certs) -> None:
    tls = server_tls(cert_file=certs.server.cert_file, key_file=certs.server.key_file)
    received: list[bytes] = []

    async def script(fake: FakeDaemon) -> None:
        await upgrade(fake, tls=tls, codec=SnappyStream(), auth=True)
        assert (await fake.expect(Auth)).secret == b"from-env"
        await fake.respond(json.dumps({"identity": "cli", "permission_count": 1}).encode())
        mpub = await fake.expect(Mpub)
        received.extend(mpub.bodies)
        await fake.respond()

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            address = await nursery.start(serve_one, script)
            args = [
                "--tcp-address",
                address,
                "--tls-root-ca-file",
                certs.ca_file,
                "--snappy",
                "pub",
                "t",
                "hello",
                "world",
            ]

            def run() -> Any:
                env = {"LMQ_AUTH_SECRET": "from-env"}
                return CliRunner().invoke(cli, args, env=env, catch_exceptions=False)

            result = await trio.to_thread.run_sync(run)
    assert result.exit_code == 0, result.output
    assert received == [b"hello", b"world"]


async def test_lmqadmin_auth_refusal_exit_code(certs: Certs) -> None:
    async def script(fake: FakeDaemon) -> None:
        await upgrade(fake, codec=DeflateStream(2), auth=True)
        await fake.expect(Auth)
        await fake.error(b"E_AUTH_FAILED AUTH failed")

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            address = await nursery.start(serve_one, script)
            args = [
                "--tcp-address",
                address,
                "--deflate",
                "--deflate-level",
                "2",
                "--auth-secret",
                "bad",
                "pub",
                "t",
                "x",
            ]
            result = await trio.to_thread.run_sync(
                lambda: CliRunner().invoke(cli, args, catch_exceptions=False)
            )
    assert result.exit_code == 1
    assert "E_AUTH_FAILED AUTH failed" in result.output


def test_lmqadmin_flag_errors(certs: Certs) -> None:
    runner = CliRunner()
    both = runner.invoke(cli, ["--snappy", "--deflate", "pub", "t", "x"])
    assert both.exit_code == 2 and "not both" in both.output
    key_only = runner.invoke(cli, ["--tls-key", certs.client.key_file, "pub", "t", "x"])
    assert key_only.exit_code == 2 and "--tls-key needs --tls-cert" in key_only.output
    level = runner.invoke(cli, ["--deflate", "--deflate-level", "10", "pub", "t", "x"])
    assert level.exit_code == 2


def test_sink_options_build_the_transport(certs: Certs) -> None:
    base = {"address": "h:1", "topic": "t"}
    assert SinkOptions.parse(base).transport == TransportOptions()
    options = SinkOptions.parse(
        {
            **base,
            "TLSROOTCAFILE": certs.ca_file,  # Spark's option keys are case-insensitive
            "tlsCert": certs.client.cert_file,
            "tlsKey": certs.client.key_file,
            "deflate": "true",
            "deflateLevel": "9",
            "authSecret": "pw",
        }
    )
    transport = options.transport
    assert transport.tls and transport.deflate and transport.deflate_level == 9
    assert transport.secret == b"pw"
    assert "pw" not in repr(options)
    assert pickle.loads(pickle.dumps(options)) == options  # travels to the executors
    bad = [
        ({"snappy": "yes"}, "must be true or false"),
        ({"snappy": "true", "deflate": "true"}, "not both"),
        ({"deflateLevel": "0"}, "at least 1"),
        ({"deflate": "true", "deflateLevel": "12"}, "deflate_level must be 1..9"),
        ({"tlsRootCaFile": "/nonexistent.pem"}, "no such file"),
    ]
    for extra, reason in bad:
        with pytest.raises(ValueError, match=reason) as info:
            SinkOptions.parse({**base, **extra})
        assert str(info.value).startswith("lmq sink:")


async def test_sink_write_task_publishes_over_tls_and_deflate(certs: Certs) -> None:
    tls = server_tls(cert_file=certs.server.cert_file, key_file=certs.server.key_file)
    received: list[bytes] = []

    async def script(fake: FakeDaemon) -> None:
        await upgrade(fake, tls=tls, codec=DeflateStream(4))
        while True:
            try:
                event = await fake.next_command()
            except EOFError:
                return
            if isinstance(event, Mpub | Pub):
                received.extend(event.bodies if isinstance(event, Mpub) else [event.body])
                await fake.respond()

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            address = await nursery.start(serve_one, script)
            options = SinkOptions.parse(
                {
                    "address": address,
                    "topic": "t",
                    "bodyColumn": "body",
                    "tls": "true",
                    "tlsRootCaFile": certs.ca_file,
                    "deflate": "true",
                    "deflateLevel": "4",
                }
            )
            batch = pa.record_batch([pa.array(["a", "b", "c"])], names=["body"])
            await trio.to_thread.run_sync(lambda: write_partition(options, [batch]))
            # The task gave its connection back to the executor's pool: close it, as the
            # executor's exit does, so the fake daemon sees the end of the stream.
            await trio.to_thread.run_sync(PRODUCERS.close_all)
    assert received == [b"a", b"b", b"c"]

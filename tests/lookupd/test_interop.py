"""Real NSQ clients from PyPI against a real ``lmqlookupd`` subprocess.

Rules for this module:
- one ``lmqlookupd`` subprocess per test, 127.0.0.1 port 0 (``process.LookupdProcess``);
- each client library runs in its own interpreter (``clients/*.py``): gevent and tornado never
  enter the pytest process; the script has a hard time limit and the test a subprocess timeout;
- in ``test_gnsq_lookupd_client`` a node registers through a plain socket speaking V1 with the
  client codec; in the discovery tests a real ``lmqd`` subprocess registers itself
  (``--lookupd-tcp-address``).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lmqd.lookup import (
    Command,
    ConnectionClosed,
    LookupClientConnection,
    Register,
)
from tests.support.process import LmqdProcess as LmqdServer
from tests.support.process import start_lmqd, stop_lmqd

from .process import LookupdProcess
from .wire import identify

pytestmark = pytest.mark.interop

CLIENTS_DIR = Path(__file__).resolve().parent / "clients"
SOCKET_TIMEOUT_S = 5.0


def run_client(library: str, scenario: str, *, timeout: float = 40.0, **params: Any) -> Any:
    """Run ``clients/<library>_lookupd.py <scenario>``; its JSON result."""
    params["hard_limit_s"] = max(1, int(timeout) - 2)
    command = [sys.executable, str(CLIENTS_DIR / f"{library}_lookupd.py"), scenario,
               json.dumps(params)]  # fmt: skip
    done = subprocess.run(
        command, capture_output=True, timeout=timeout, cwd=CLIENTS_DIR, check=False
    )
    stderr = done.stderr.decode("utf-8", "replace")
    assert done.returncode == 0, f"{library} {scenario}: exit {done.returncode}:\n{stderr}"
    return json.loads(done.stdout.decode().strip().splitlines()[-1])


class Node:
    """A registering node on a blocking socket."""

    def __init__(self, address: tuple[str, int]) -> None:
        self.sock = socket.create_connection(address, timeout=SOCKET_TIMEOUT_S)
        self.codec = LookupClientConnection()
        self.sock.sendall(self.codec.initial_bytes())
        host, port = self.sock.getsockname()[:2]
        self.local_address = f"{host}:{port}"

    def command(self, *commands: Command) -> list[object]:
        self.sock.sendall(b"".join(self.codec.send(c) for c in commands))
        responses: list[object] = []
        while len(responses) < len(commands):
            event = self.codec.next_event()
            if event is None:
                self.codec.receive_data(self.sock.recv(4096))
            else:
                assert not isinstance(event, ConnectionClosed), responses
                responses.append(event)
        return responses


@pytest.fixture
def lmqlookupd() -> Iterator[LookupdProcess]:
    process = LookupdProcess(
        "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0", "--broadcast-address=127.0.0.1"
    )
    try:
        yield process
    finally:
        code = process.stop()
        assert code == 0, process.output()
        assert "Traceback" not in process.output(), process.output()


def test_gnsq_lookupd_client(lmqlookupd: LookupdProcess) -> None:
    node = Node(lmqlookupd.tcp)
    node.command(identify(4150, hostname="n1"), Register(topic="live", channel="c"))
    host, port = lmqlookupd.http
    out = run_client(
        "gnsq", "lookupd_client", host=host, port=port, registered_topic="live",
        node="127.0.0.1:4151",
    )  # fmt: skip
    peer = {
        "remote_address": node.local_address, "hostname": "n1",
        "broadcast_address": "127.0.0.1", "tcp_port": 4150, "http_port": 4151,
        "version": "1.3.0",
    }  # fmt: skip
    assert out["ping"] == "OK"
    assert out["info"] == {"version": "1.3.0"}
    assert out["create_topic"] == out["create_channel"] == ""
    assert out["topics"] == {"topics": ["live", "made"]}
    assert out["channels"] == {"channels": ["chan"]}
    assert out["lookup_made"] == {"channels": ["chan"], "producers": []}
    assert out["lookup_registered"] == {"channels": ["c"], "producers": [peer]}
    assert out["nodes"] == {"producers": [{**peer, "tombstones": [False], "topics": ["live"]}]}
    assert out["tombstone"] == ""
    assert out["lookup_tombstoned"] == {"channels": ["c"], "producers": []}
    assert out["nodes_tombstoned"]["producers"][0]["tombstones"] == [True]
    assert out["delete_channel"] == ""
    assert out["channels_after"] == {"channels": []}
    assert out["delete_topic"] == ""
    assert out["topics_after"] == {"topics": ["live"]}
    assert out["lookup_missing"] == {"error": "http error <404>"}
    assert out["delete_missing_channel"] == {"error": "http error <404>"}
    node.sock.close()


def _publish(lmqd: LmqdServer, topic: str, bodies: list[bytes]) -> None:
    for body in bodies:
        request = urllib.request.Request(
            f"http://{lmqd.http_address}/pub?topic={topic}", data=body, method="POST"
        )
        with urllib.request.urlopen(request, timeout=SOCKET_TIMEOUT_S) as response:
            assert response.read() == b"OK"


@pytest.mark.parametrize("library", ["gnsq", "pynsq"])
def test_consumer_discovers_lmqd_through_lmqlookupd(
    library: str, lmqlookupd: LookupdProcess, tmp_path: Path
) -> None:
    host, port = lmqlookupd.tcp
    lmqd = start_lmqd(tmp_path / "lmqd", [f"--lookupd-tcp-address={host}:{port}",
                                          "--broadcast-address=127.0.0.1"])  # fmt: skip
    try:
        bodies = [f"{library}-{i}".encode() for i in range(5)]
        _publish(lmqd, "found", bodies)  # creates the topic, which lmqd registers
        http_host, http_port = lmqlookupd.http
        _wait_registered(f"{http_host}:{http_port}", "found")
        out = run_client(
            library, "consume", topic="found", channel="workers",
            lookupd_url=f"http://{http_host}:{http_port}", count=len(bodies), within_s=20,
        )  # fmt: skip
        assert sorted(out["bodies"]) == sorted(b.decode() for b in bodies)
        assert len(out["connections"]) == 1, out
    finally:
        stop_lmqd(lmqd)


def _wait_registered(lookupd_http: str, topic: str) -> None:
    deadline = time.monotonic() + SOCKET_TIMEOUT_S
    while True:
        try:
            with urllib.request.urlopen(
                f"http://{lookupd_http}/lookup?topic={topic}", timeout=SOCKET_TIMEOUT_S
            ) as response:
                if json.loads(response.read())["producers"]:
                    return
        except urllib.error.HTTPError:
            pass  # 404 TOPIC_NOT_FOUND until the REGISTER arrives
        assert time.monotonic() < deadline, f"{topic} not registered with {lookupd_http}"
        time.sleep(0.05)

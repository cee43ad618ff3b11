"""``lmqadmin bench --incompressible``: every message body differs and looks random, so a
compressed transport has nothing to shrink (scripts/bench_transport.py measures with it); and
lmq's per-message fields (``--priority``, ``--headers``) on every message.

Rules for this module: the shared lmqd subprocess (``lmqd_module_server``, 127.0.0.1 port 0);
messages are read back over a raw socket with a timeout.
"""

from __future__ import annotations

import json
import socket
import struct
import urllib.request
import zlib
from typing import TYPE_CHECKING

from click.testing import CliRunner

from lmq_client.admin.cli import cli

if TYPE_CHECKING:
    from tests.conftest import LmqdServer

COUNT = 300


def read_bodies(server: LmqdServer, topic: str, count: int) -> list[bytes]:
    with socket.create_connection(server.tcp_host_port, timeout=10) as sock:
        sock.sendall(b"  V2" + f"SUB {topic} c\nRDY {count}\n".encode())
        buffer, bodies = b"", []
        while len(bodies) < count:
            while len(buffer) < 4 or len(buffer) < 4 + struct.unpack(">i", buffer[:4])[0]:
                chunk = sock.recv(65536)
                assert chunk, "lmqd closed the connection"
                buffer += chunk
            size = struct.unpack(">i", buffer[:4])[0]
            frame_type, data = struct.unpack(">i", buffer[4:8])[0], buffer[8 : 4 + size]
            buffer = buffer[4 + size :]
            if frame_type == 2:
                bodies.append(data[26:])
        return bodies


def test_incompressible_bodies_all_differ_and_do_not_compress(
    lmqd_module_server: LmqdServer,
) -> None:
    server = lmqd_module_server
    result = CliRunner().invoke(
        cli,
        ["--tcp-address", server.tcp_address, "--json", "bench", "--topic", "random-bodies",
         "--writers", "1", "--readers", "0", "--count", str(COUNT), "--batch-size", "100",
         "--size", "100", "--incompressible", "--keep-topic"],
        catch_exceptions=False,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    bodies = read_bodies(server, "random-bodies", COUNT)
    assert {len(b) for b in bodies} == {100}
    pads = [b[8:] for b in bodies]  # after the 8-byte send time
    assert len(set(pads)) == COUNT
    joined = b"".join(pads)
    assert len(zlib.compress(joined, 6)) > 0.95 * len(joined)


def test_priority_and_headers_go_on_every_message(lmqd_module_server: LmqdServer) -> None:
    """``--priority N`` and ``--headers N`` publish with XPUB: ``/peek`` shows them on every
    message the bench left in its topic."""
    server = lmqd_module_server
    result = CliRunner().invoke(
        cli,
        ["--tcp-address", server.tcp_address, "--json", "bench", "--topic", "ranked-bench",
         "--writers", "1", "--readers", "0", "--count", "50", "--batch-size", "10",
         "--priority", "7", "--headers", "2", "--keep-topic"],
        catch_exceptions=False,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert server.http_address is not None
    with urllib.request.urlopen(
        f"http://{server.http_address}/peek?topic=ranked-bench&n=100", timeout=10
    ) as response:
        peeked = json.load(response)["messages"]
    assert len(peeked) == 50
    assert {(m["priority"], tuple(sorted(m["headers"].items()))) for m in peeked} == {
        (7, (("h0", "v0"), ("h1", "v1")))
    }

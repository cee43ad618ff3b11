"""``--statsd-*``: nsqd's statsd keys pushed over UDP to a listener in the test.

Rules for this module: an in-process daemon (127.0.0.1, port 0) and a UDP socket on 127.0.0.1 that
stands in for statsd; the push interval is short (0.2 s) and every wait is bounded by
``fail_after``.
"""

from __future__ import annotations

import trio

from lmqd.statsd_push import host_key
from tests.support.daemon import StartDaemon

TIMEOUT_S = 10.0


async def receive_keys(sock: trio.socket.SocketType, want: set[str]) -> dict[str, str]:
    """statsd lines received until every key in ``want`` came at least once: key -> last value
    and type (``"3|c"``)."""
    seen: dict[str, str] = {}
    while not want <= set(seen):
        data = await sock.recv(65536)
        for line in data.decode().splitlines():
            key, _, value = line.partition(":")
            seen[key] = value
    return seen


async def test_topic_channel_and_memory_keys_with_nsqd_names(start_daemon: StartDaemon) -> None:
    with trio.fail_after(TIMEOUT_S):
        sock = trio.socket.socket(type=trio.socket.SOCK_DGRAM)
        await sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        running = await start_daemon(
            http=True,
            statsd_address=f"127.0.0.1:{port}",
            statsd_interval=0.2,
            broadcast_address="node.example",
        )
        broker = running.broker
        broker.get_topic("orders").get_channel("billing")
        broker.publish("orders", [b"a", b"bb", b"ccc"])
        http_port = running.http[1]
        prefix = f"nsq.{host_key('node.example', http_port)}."
        assert prefix == f"nsq.node_example_{http_port}."
        t, c = f"{prefix}topic.orders", f"{prefix}topic.orders.channel.billing"
        first = await receive_keys(
            sock,
            {f"{t}.message_count", f"{t}.message_bytes", f"{t}.depth", f"{c}.depth",
             f"{c}.clients", f"{c}.in_flight_count", f"{prefix}mem.heap_objects"},
        )  # fmt: skip
        assert first[f"{t}.message_count"] == "3|c"
        assert first[f"{t}.message_bytes"] == "6|c"
        assert first[f"{c}.message_count"] == "3|c"
        assert first[f"{c}.depth"] == "3|g"
        assert first[f"{c}.clients"] == "0|g"
        # Counters send their increase: two more messages, then "2|c", not "5|c".
        broker.publish("orders", [b"d", b"e"])
        second = await receive_keys(sock, {f"{t}.message_count"})
        assert second[f"{t}.message_count"] == "2|c"
        sock.close()


async def test_ephemeral_names_can_be_left_out(start_daemon: StartDaemon) -> None:
    with trio.fail_after(TIMEOUT_S):
        sock = trio.socket.socket(type=trio.socket.SOCK_DGRAM)
        await sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        running = await start_daemon(
            statsd_address=f"127.0.0.1:{port}",
            statsd_interval=0.2,
            statsd_exclude_ephemeral=True,
            statsd_mem_stats=False,
            statsd_prefix="lmq",
        )
        running.broker.get_topic("kept").get_channel("gone#ephemeral")
        running.broker.get_topic("gone#ephemeral").get_channel("c")
        seen = await receive_keys(sock, {"lmq.topic.kept.depth"})
        assert not [k for k in seen if "#ephemeral" in k or ".mem." in k]
        sock.close()

"""nsqadmin's JSON API in ``lmqadmin web``, as a script written against nsqadmin uses it.

Rules for this module: the module's ``cluster`` and consoles (as ``test_pages.py``); requests
with urllib from the test (no browser: the API's callers are scripts); what an action did is
checked on the daemons' own ``/stats``.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from .conftest import Cluster, Console


def call(console: Console, method: str, path: str, body: Any = None,
         content_type: str = "application/json") -> tuple[int, Any]:  # fmt: skip
    data = body if body is None or isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(console.url(path), data=data, method=method,
                                     headers={"Content-Type": content_type})  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=20) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_reads_in_nsqadmins_shapes(cluster: Cluster, console_factory: Any) -> None:
    cluster.create("api-read", "c1")
    a, b = cluster.nodes
    cluster.post(a, "/pub?topic=api-read", b"x")
    console = console_factory()
    console.settle()
    status, doc = call(console, "GET", "/api/topics")
    assert status == 200 and "api-read" in doc["topics"] and doc["message"] == ""
    status, doc = call(console, "GET", "/api/topics/api-read")
    assert status == 200 and doc["node"] == "*" and doc["message_count"] == 1
    assert sorted(n["node"] for n in doc["nodes"]) == sorted([a.http, b.http])
    [channel] = doc["channels"]
    assert channel["channel_name"] == "c1" and channel["depth"] == 1
    status, doc = call(console, "GET", "/api/topics/api-read/c1")
    assert status == 200 and len(doc["nodes"]) == 2 and doc["clients"] == []
    status, doc = call(console, "GET", "/api/nodes")
    ports = {n["tcp_port"] for n in doc["nodes"]}
    assert {a.tcp_port, b.tcp_port} <= ports
    status, doc = call(console, "GET", f"/api/nodes/{a.http}")
    [entry] = [t for t in doc["topics"] if t["topic_name"] == "api-read"]
    assert entry["node"] == a.http and entry["message_count"] == 1
    assert [c["channel_name"] for c in entry["channels"]] == ["c1"]
    status, doc = call(console, "GET", "/api/counter")
    assert doc["stats"][f"api-read:c1:{a.http}"] == {
        "node": a.http, "topic_name": "api-read", "channel_name": "c1", "message_count": 1}
    assert call(console, "GET", "/api/topics/nope")[0] == 404


def test_actions_need_json_and_pass_the_acl(cluster: Cluster, console_factory: Any) -> None:
    cluster.create("api-act", "c1")
    console = console_factory()
    console.settle()
    # A form post (what a cross-site page can send without a preflight) is refused.
    status, _ = call(console, "POST", "/api/topics/api-act", b"action=pause",
                     "application/x-www-form-urlencoded")
    assert status == 415
    assert not any(cluster.stats(n, "api-act")["paused"] for n in cluster.nodes)  # type: ignore[index]
    status, doc = call(console, "POST", "/api/topics/api-act", {"action": "pause"})
    assert (status, doc) == (200, {"message": ""})
    assert all(cluster.stats(n, "api-act")["paused"] for n in cluster.nodes)  # type: ignore[index]
    status, _ = call(console, "POST", "/api/topics/api-act/c1", {"action": "pause"})
    assert status == 200 and cluster.channel(cluster.nodes[0], "api-act", "c1")["paused"]  # type: ignore[index]
    status, _ = call(console, "DELETE", "/api/topics/api-act/c1")
    assert status == 200
    assert all(cluster.channel(n, "api-act", "c1") is None for n in cluster.nodes)

    read_only = console_factory("--read-only")
    status, doc = call(read_only, "DELETE", "/api/topics/api-act")
    assert (status, doc) == (403, {"message": "FORBIDDEN"})
    assert all(cluster.stats(n, "api-act") is not None for n in cluster.nodes)
    status, _ = call(console, "DELETE", "/api/topics/api-act")
    assert status == 200
    assert all(cluster.stats(n, "api-act") is None for n in cluster.nodes)

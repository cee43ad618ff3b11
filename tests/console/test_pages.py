"""nsqadmin's pages and actions in ``lmqadmin web``, in a real browser against real daemons.

Rules for this module: the module's ``cluster`` (an lmqlookupd and two lmqd subprocesses,
127.0.0.1, port 0) and consoles (``lmqadmin web`` subprocesses on port 0, knowing only the
lookupd); Debian's Chromium through Playwright, a fresh context per test; each test uses topic
names of its own; what a page shows is checked in the page, what an action did is checked on
the daemons' own ``/stats``; waits are Playwright's (bounded by ``WITHIN_S``) or ``eventually``.
"""

from __future__ import annotations

from typing import Any

import pytest

from lmq_client.sync import Consumer
from lmq_client.transport import TransportOptions
from tests.cluster.procs import eventually, http

from .conftest import WITHIN_S, Cluster, Console, Notifications


@pytest.fixture
def console(console_factory: Any, notifications: Notifications) -> Console:
    return console_factory(f"--notification-http-endpoint={notifications.url}")


def rows(page: Any, table: str) -> list[list[str]]:
    return page.eval_on_selector_all(
        f"#{table} tbody tr",
        "trs => trs.map(tr => Array.from(tr.cells).map(td => td.innerText.trim()))",
    )


def test_streams_topic_and_channel_pages_show_what_the_daemons_have(
    cluster: Cluster, console: Console, page: Any
) -> None:
    cluster.create("pages", "billing")
    a, b = cluster.nodes
    cluster.post(a, "/pub?topic=pages", b"one")
    cluster.post(a, "/pub?topic=pages", b"two")
    cluster.post(b, "/pub?topic=pages", b"three")
    console.settle()
    page.goto(console.url("/"))
    row = page.locator('#topics tr[data-topic="pages"]')
    row.wait_for()
    cells = row.locator("td").all_inner_texts()
    assert cells[0] == "pages"
    assert cells[3] == "3"  # messages, both nodes
    assert cells[5:] == ["1", "2"]  # one channel, two nodes

    page.click('a[href$="/topics/pages"]')
    page.wait_for_selector("#topic-nodes")
    by_node = {r[0].split()[0]: r for r in rows(page, "topic-nodes")}
    assert by_node[a.http][7] == "2" and by_node[b.http][7] == "1"
    assert by_node["Total"][7] == "3"
    channels = rows(page, "channels")
    assert [c[0] for c in channels] == ["billing"]
    assert channels[0][1] == "3"  # depth: what the channel has waiting on both nodes

    # The channel page: per-node rows, and a connected client with its attributes.
    transport = TransportOptions(deflate=True)
    with Consumer("pages", "billing", a.tcp, max_in_flight=7, transport=transport) as consumer:
        message = consumer.get(timeout=WITHIN_S)
        assert message is not None
        console.settle()
        page.goto(console.url("/topics/pages/billing"))
        page.wait_for_function(
            "() => document.querySelectorAll('#clients tbody tr').length === 1")
        [client] = rows(page, "clients")
        assert "lmq_client/" in client[2]
        assert "deflate" in client[3]
        assert client[4] == a.http
        assert client[5] == "7"  # RDY
        assert client[6] == "2"  # in flight: node a had two
        message.finish()
    by_node = {r[0].split()[0]: r for r in rows(page, "channel-nodes")}
    assert set(by_node) == {a.http, b.http, "Total"}


def test_nodes_node_counter_and_lookup_pages(
    cluster: Cluster, console: Console, page: Any
) -> None:
    cluster.create("nodes-page", "c1")
    console.settle()
    page.goto(console.url("/nodes"))
    shown = {r[0]: r for r in rows(page, "nodes")}
    for node in cluster.nodes:
        row = shown[node.http]
        assert row[2] == "127.0.0.1"
        assert row[3] == str(node.tcp_port) and row[4] == str(node.http_port)
        assert row[5] == "1.3.0"  # the nsqd version lmqd answers as
        assert row[6] == "1"  # lookupd connections
    node = cluster.nodes[0]
    page.click(f'#nodes a:text-is("{node.http}")')
    page.wait_for_selector('#node-topics tr[data-topic="nodes-page"]')
    assert page.locator('#node-topics tr[data-channel="c1"]').count() >= 1

    cluster.post(node, "/pub?topic=nodes-page", b"x")
    console.settle()
    total = sum(c["message_count"] for n in cluster.nodes
                for t in (http_stats(n)["topics"] or []) for c in t["channels"])  # fmt: skip
    page.goto(console.url("/counter"))
    shown = "() => document.getElementById('counter').innerText.replace(/,/g, '')"
    page.wait_for_function(f"{shown} >= {total}")

    page.goto(console.url("/lookup"))
    row = page.locator('#lookup tr[data-topic="nodes-page"]')
    assert "c1" in row.locator("td").nth(1).inner_text()
    assert row.locator("td").nth(2).inner_text() == "2"  # producers


def http_stats(node: Any) -> dict[str, Any]:
    return http(node.http, "GET", "/stats?format=json")[1]  # type: ignore[no-any-return]


def test_actions_change_the_daemons_and_notify(
    cluster: Cluster, console: Console, page: Any, notifications: Notifications
) -> None:
    a, b = cluster.nodes
    page.goto(console.url("/"))
    page.fill('#create-topic input[name="topic"]', "acts")
    page.click('#create-topic button')
    page.wait_for_selector("#flash")
    assert "created topic acts on" in page.inner_text("#flash")
    assert all(cluster.stats(n, "acts") is not None for n in cluster.nodes)
    notifications.wait_for("create_topic", "acts")

    page.goto(console.url("/topics/acts"))
    page.fill("#new-channel", "work")
    page.click('form:has(#new-channel) button')
    page.wait_for_selector('#channels tr[data-channel="work"]')
    assert all(cluster.channel(n, "acts", "work") is not None for n in cluster.nodes)

    page.click('button:text-is("Pause topic")')
    page.wait_for_selector('button:text-is("Unpause topic")')
    assert all(cluster.stats(n, "acts")["paused"] for n in cluster.nodes)  # type: ignore[index]
    doc = notifications.wait_for("pause_topic", "acts")
    assert doc["content_type"] == "application/json"
    assert doc["url"] == "/actions/topic" and doc["remote_ip"] == "127.0.0.1"
    assert set(doc) >= {"action", "topic", "timestamp", "user_agent", "remote_ip", "url", "via"}
    page.click('button:text-is("Unpause topic")')
    page.wait_for_selector('button:text-is("Pause topic")')
    assert not any(cluster.stats(n, "acts")["paused"] for n in cluster.nodes)  # type: ignore[index]

    cluster.post(a, "/pub?topic=acts", b"m")
    console.settle()
    page.goto(console.url("/topics/acts/work"))
    page.click('button:text-is("Pause channel")')
    page.wait_for_selector('button:text-is("Unpause channel")')
    assert cluster.channel(a, "acts", "work")["paused"]  # type: ignore[index]
    notifications.wait_for("pause_channel", "acts")

    # Destructive actions ask first: dismissed, nothing happens; accepted, it is done.
    page.confirm_answer = False
    page.click('button:text-is("Empty channel")')
    assert page.dialogs[-1].startswith("Empty channel acts/work")
    assert cluster.channel(a, "acts", "work")["depth"] == 1  # type: ignore[index]
    page.confirm_answer = True
    page.click('button:text-is("Empty channel")')
    page.wait_for_selector("#flash")
    assert cluster.channel(a, "acts", "work")["depth"] == 0  # type: ignore[index]
    notifications.wait_for("empty_channel", "acts")

    page.click('button:text-is("Delete channel")')
    page.wait_for_selector("#flash")
    assert all(cluster.channel(n, "acts", "work") is None for n in cluster.nodes)
    notifications.wait_for("delete_channel", "acts")

    # Tombstone on one node: the lookupd stops listing it there.
    page.goto(console.url("/topics/acts"))
    page.click(f'#topic-nodes tr[data-node="{b.http}"] button:text-is("Tombstone")')
    page.wait_for_selector("#flash")
    doc = notifications.wait_for("tombstone_topic_producer", "acts")
    assert doc["node"] == b.http

    def tombstoned() -> list[bool]:
        found = http(cluster.lookupd.http, "GET", "/nodes")[1]["producers"]
        return [p["tombstones"][p["topics"].index("acts")] for p in found
                if p["http_port"] == b.http_port and "acts" in p["topics"]]  # fmt: skip

    eventually(tombstoned, lambda t: t == [True], WITHIN_S)

    page.click('button:text-is("Delete topic")')
    page.wait_for_url(console.url("/"))
    assert all(cluster.stats(n, "acts") is None for n in cluster.nodes)
    notifications.wait_for("delete_topic", "acts")
    assert page.locator('#topics tr[data-topic="acts"]').count() == 0


def test_lookup_page_creates_and_removes_in_the_lookupds(
    cluster: Cluster, console: Console, page: Any, notifications: Notifications
) -> None:
    page.goto(console.url("/lookup"))
    page.fill('#lookup-create input[name="topic"]', "planned")
    page.fill('#lookup-create input[name="channel"]', "later")
    page.click("#lookup-create button")
    row = page.locator('#lookup tr[data-topic="planned"]')
    row.wait_for()
    assert "later" in row.inner_text()
    assert row.locator("td").nth(2).inner_text() == "0"  # no producer: inactive
    notifications.wait_for("create_topic", "planned")
    page.confirm_answer = True
    row.locator('button:text-is("Delete inactive topic")').click()
    page.wait_for_selector("#flash")
    assert page.locator('#lookup tr[data-topic="planned"]').count() == 0


def test_phone_width_pages_fit_the_screen(cluster: Cluster, console: Console, browser: Any) -> None:
    cluster.create("phone", "c")
    console.settle()
    context = browser.new_context(viewport={"width": 375, "height": 740}, is_mobile=True)
    try:
        page = context.new_page()
        for path in ("/", "/topics/phone", "/topics/phone/c", "/nodes", "/browse/phone/c"):
            page.goto(console.url(path))
            width = page.evaluate("() => document.documentElement.scrollWidth")
            assert width <= 375, f"{path} is {width}px wide on a 375px screen"
    finally:
        context.close()


def test_base_path_serves_every_page_and_asset_under_it(
    cluster: Cluster, console_factory: Any, page: Any
) -> None:
    cluster.create("based", "c")
    console = console_factory("--base-path=/admin/nsq")
    console.settle()
    page.goto(console.url("/"))
    page.click('a[href="/admin/nsq/topics/based"]')
    page.wait_for_selector("#topic-nodes")
    assert page.url == console.url("/topics/based")
    assert page.evaluate("() => typeof htmx") == "object"  # the scripts came from /admin/nsq
    page.click('button:text-is("Pause topic")')
    page.wait_for_selector('button:text-is("Unpause topic")')
    assert page.url == console.url("/topics/based")


def test_nodes_given_without_a_lookupd(cluster: Cluster, console_factory: Any, page: Any) -> None:
    """``--http-address`` twice, no lookupd: the nodes answer for themselves (``/info``), the
    live tail reaches them on their TCP ports, and the lookupd-only parts are absent."""
    cluster.create("direct", "c")
    a, b = cluster.nodes
    console = console_factory(group=("--http-address", a.http, "--http-address", b.http))
    console.settle()
    page.goto(console.url("/nodes"))
    shown = {r[0]: r for r in rows(page, "nodes")}
    assert shown[a.http][3] == str(a.tcp_port) and shown[b.http][3] == str(b.tcp_port)
    assert shown[a.http][6] == "0"  # no lookupd connections
    assert page.locator('nav a:text-is("Lookup")').count() == 0
    page.goto(console.url("/topics/direct"))
    assert page.locator('button:text-is("Tombstone")').count() == 0
    page.goto(console.url("/tail/direct"))
    page.wait_for_selector("#tail-status:text-matches('live on 2 node')")
    cluster.post(b, "/pub?topic=direct", b"straight to b")
    page.wait_for_selector("#tail-messages .message")
    assert page.inner_text("#tail-messages pre.body") == "straight to b"
    assert page.goto(console.url("/lookup")).status == 404


def test_ephemeral_names_survive_links_forms_and_redirects(
    cluster: Cluster, console: Console, page: Any
) -> None:
    """``#`` in a name (``#ephemeral``) is a fragment to a browser unless encoded."""
    name = "eph#ephemeral"
    for node in cluster.nodes:
        cluster.post(node, "/topic/create?topic=eph%23ephemeral")
        cluster.post(node, "/channel/create?topic=eph%23ephemeral&channel=c%23ephemeral")
    console.settle()
    page.goto(console.url("/"))
    page.click(f'#topics tr[data-topic="{name}"] a')
    page.wait_for_selector("#topic-nodes")
    assert page.url.endswith("/topics/eph%23ephemeral")
    page.click('button:text-is("Pause topic")')
    page.wait_for_selector('button:text-is("Unpause topic")')
    assert page.url.endswith("/topics/eph%23ephemeral")
    assert all(cluster.stats(n, "eph%23ephemeral")["paused"] for n in cluster.nodes)  # type: ignore[index]
    page.click('#channels a:text-is("c#ephemeral")')
    page.wait_for_selector("#channel-nodes")
    assert page.url.endswith("/topics/eph%23ephemeral/c%23ephemeral")
    # The live part reloads itself from the same, encoded, URL.
    assert page.get_attribute("#live", "hx-get").endswith("/topics/eph%23ephemeral/c%23ephemeral")

"""lmq's side of the console -- message browser, publish form, replay, dead letters and redrive,
policy editor, live tail, charts -- and its safety with hostile message bodies, in a real
browser against real daemons.

Rules for this module: as ``test_pages.py`` (the module's cluster and consoles, Chromium through
Playwright, a fresh context per test, topic names of the test's own); what an action delivered
is counted by a real consumer (``lmq_client.sync.Consumer``) with a bounded wait; XSS is checked
in the browser (a dialog, a script's side effect, an element created), never by reading HTML.
"""

from __future__ import annotations

import json
import re
import urllib.request
from typing import Any

import pytest

from lmq_client.sync import Consumer
from tests.cluster.procs import eventually, http

from .conftest import WITHIN_S, Cluster, Console

XSS = "<img src=x onerror=\"window.__pwned=1;alert(1)\"><script>window.__pwned=2</script>"


@pytest.fixture
def console(console_factory: Any) -> Console:
    return console_factory()


def drain(cluster: Cluster, topic: str, channel: str, expected: int) -> list[bytes]:
    """Consume ``topic``/``channel`` on every node until ``expected`` messages came (or none
    came for 2 s after that many): the bodies."""
    bodies: list[bytes] = []
    addresses = [n.tcp for n in cluster.nodes]
    with Consumer(topic, channel, addresses, max_in_flight=100, max_attempts=0) as consumer:
        while True:
            message = consumer.get(timeout=WITHIN_S if len(bodies) < expected else 2.0)
            if message is None:
                return bodies
            bodies.append(message.body)
            message.finish()


def test_browser_shows_headers_priority_and_body_and_filters(
    cluster: Cluster, console: Console, page: Any
) -> None:
    cluster.create("browse", "c")
    a, b = cluster.nodes
    status, _ = http(a.http, "POST", "/pub?topic=browse&priority=7", b'{"user": {"id": 42}}')
    assert status == 200
    request_headers = {"Lmq-Header-trace-id": "t-123"}
    urllib.request.urlopen(urllib.request.Request(
        f"http://{b.http}/pub?topic=browse", data=b'{"user": {"id": 7}}', method="POST",
        headers=request_headers,
    ), timeout=WITHIN_S).read()  # fmt: skip
    console.settle()
    page.goto(console.url("/browse/browse/c?view=json"))
    messages = page.locator("#messages .message")
    assert messages.count() == 2
    first = page.locator('#messages .message:has(.msg-priority)')
    assert first.locator(".msg-priority").inner_text() == "7"
    assert json.loads(first.locator("pre.body").inner_text()) == {"user": {"id": 42}}
    assert "\n  " in first.locator("pre.body").inner_text()  # pretty-printed
    traced = page.locator('#messages .message:has(.msg-header-name:text-is("trace-id"))')
    assert traced.locator(".msg-header-value").inner_text() == "t-123"

    page.goto(console.url("/browse/browse/c?field=user.id%3D7"))
    assert page.locator("#messages .message").count() == 1
    assert "7" in page.locator("#messages pre.body").inner_text()
    page.goto(console.url("/browse/browse/c?view=hex&q=42"))
    assert page.locator("#messages .message").count() == 1
    assert page.locator("#messages pre.body").inner_text().startswith("00000000  7b 22 75")

    # The topic's log by offset, on one node.
    page.goto(console.url(f"/browse/browse?node={a.http}&at=earliest"))
    assert "stores offsets" in page.inner_text("#log-range")


def test_hostile_bodies_and_headers_run_nothing(
    cluster: Cluster, console: Console, page: Any
) -> None:
    cluster.create("xss", "c")
    a = cluster.nodes[0]
    urllib.request.urlopen(urllib.request.Request(
        f"http://{a.http}/pub?topic=xss", data=XSS.encode(), method="POST",
        headers={"Lmq-Header-x": "<svg onload=alert(2)>"},
    ), timeout=WITHIN_S).read()  # fmt: skip
    console.settle()
    for path in ("/browse/xss/c", f"/browse/xss?node={a.http}&at=earliest",
                 "/browse/xss/c?view=json"):
        page.goto(console.url(path))
        body = page.locator("#messages pre.body").first
        assert body.inner_text() == XSS  # shown as the text it is
        assert page.locator("#messages img, #messages script, #messages svg").count() == 0
        assert page.evaluate("() => window.__pwned") is None
        assert page.locator(".msg-header-value").first.inner_text() == "<svg onload=alert(2)>"
    assert page.dialogs == []


def test_publish_form_sends_fields_and_shows_lmqds_errors_at_the_field(
    cluster: Cluster, console: Console, page: Any
) -> None:
    cluster.create("pubform", "c")
    console.settle()
    page.goto(console.url("/publish/pubform"))
    page.fill("#field-body", "from the form")
    page.fill("#field-headers", "source: console\nkind: test")
    page.fill("#field-priority", "5")
    page.click("#publish-form button")
    page.wait_for_selector("#flash")
    node = page.inner_text("#flash").rpartition(" on ")[2]
    node_http = next(n for n in cluster.nodes if n.http == node)
    doc = http(node_http.http, "GET", "/peek?topic=pubform&channel=c")[1]
    [message] = doc["messages"]
    assert message["body"] == "from the form"
    assert message["priority"] == 5
    assert message["headers"] == {"source": "console", "kind": "test"}

    page.fill("#field-body", "bad")
    page.fill("#field-priority", "12")
    page.click("#publish-form button")
    assert page.inner_text("#error-priority").endswith("INVALID_PRIORITY")
    assert page.input_value("#field-body") == "bad"  # what was typed stays


def test_policy_editor_saves_and_shows_validation_errors_at_the_field(
    cluster: Cluster, console: Console, page: Any
) -> None:
    cluster.create("policed", "c")
    console.settle()
    page.goto(console.url("/policy/policed"))
    page.fill("#field-ttl_ms", "soon")
    page.click("#policy-form button")
    error = page.inner_text("#error-ttl_ms")
    assert "INVALID_POLICY: ttl_ms must be an integer" in error
    assert page.input_value("#field-ttl_ms") == "soon"
    for node in cluster.nodes:
        assert http(node.http, "GET", "/topic/policy?topic=policed")[1]["ttl_ms"] == 0

    page.fill("#field-ttl_ms", "60000")
    page.click("#policy-form button")
    page.wait_for_selector("#flash")
    assert page.input_value("#field-ttl_ms") == "60000"
    for node in cluster.nodes:
        policy = http(node.http, "GET", "/topic/policy?topic=policed")[1]
        assert policy["ttl_ms"] == 60000 and policy["max_depth"] == 0

    # Compression at rest (issue 27): a codec lmqd does not know is refused at its field.
    page.fill("#field-compression", "brotli")
    page.click("#policy-form button")
    assert "unknown compression 'brotli'" in page.inner_text("#error-compression")
    page.fill("#field-compression", "zstd:9")
    page.click("#policy-form button")
    page.wait_for_selector("#flash")
    for node in cluster.nodes:
        assert http(node.http, "GET", "/topic/policy?topic=policed")[1]["compression"] == "zstd:9"

    page.goto(console.url("/policy/policed/c"))
    page.fill("#field-backoff_jitter", "2")
    page.click("#policy-form button")
    assert "backoff_jitter" in page.inner_text("#error-backoff_jitter")


def test_replay_delivers_what_it_announced(
    cluster: Cluster, console: Console, page: Any
) -> None:
    cluster.create("replayed", "first")
    for node in cluster.nodes:
        cluster.post(node, "/topic/policy?topic=replayed", b'{"retention_ms": 3600000}')
    for i in range(7):
        cluster.post(cluster.nodes[i % 2], "/pub?topic=replayed", f"m{i}".encode())
    assert len(drain(cluster, "replayed", "first", 7)) == 7  # consumed: only retention keeps them
    console.settle()
    page.goto(console.url("/topics/replayed"))
    page.click('a:text-is("Replay")')
    page.fill('#replay-preview input[name="channel"]', "again")
    page.fill('#replay-preview input[name="to"]', "earliest")
    page.click("#replay-preview button")
    assert page.inner_text("#replay-count") == "7"
    page.confirm_answer = True
    page.click("#replay-confirm button")
    page.wait_for_selector("#flash")
    assert page.dialogs[-1] == "Deliver 7 messages to replayed/again?"
    assert "7 messages announced" in page.inner_text("#flash")
    bodies = drain(cluster, "replayed", "again", 7)
    assert sorted(bodies) == sorted(f"m{i}".encode() for i in range(7))

    # An existing channel moved back to an offset: the count is what it gets again.
    ends = [http(n.http, "GET", "/topic/offsets?topic=replayed")[1]["end"] for n in cluster.nodes]
    assert ends == [4, 3]  # m0 m2 m4 m6 on node 0, m1 m3 m5 on node 1
    page.goto(console.url("/replay/replayed?channel=first&to=offset:2&preview=1"))
    announced = int(page.inner_text("#replay-count"))
    assert announced == 2 + 1  # offsets 2 and 3 of node 0, offset 2 of node 1
    page.confirm_answer = True
    page.click("#replay-confirm button")
    page.wait_for_selector("#flash")
    assert len(drain(cluster, "replayed", "first", announced)) == announced


def test_dead_letters_are_listed_and_redriven_as_announced(
    cluster: Cluster, console: Console, page: Any
) -> None:
    cluster.create("orders-dl", "work")
    a = cluster.nodes[0]
    for node in cluster.nodes:
        cluster.post(node, "/channel/policy?topic=orders-dl&channel=work",
                     b'{"max_attempts": 1, "dead_letter_topic": "orders-dead"}')
    for i in range(3):
        cluster.post(a, "/pub?topic=orders-dl", f"d{i}".encode())
    # One delivery each, then REQ: out of attempts, to the dead-letter topic.
    with Consumer("orders-dl", "work", a.tcp, max_in_flight=10, max_attempts=0) as consumer:
        for _ in range(3):
            message = consumer.get(timeout=WITHIN_S)
            assert message is not None
            message.requeue(backoff=False)
    eventually(lambda: (cluster.channel(a, "orders-dead", "lmq.redrive") or {}).get("depth"),
               lambda depth: depth == 3, WITHIN_S)  # fmt: skip
    console.settle()
    page.goto(console.url("/topics/orders-dl/work"))
    page.click('a:text-is("Dead letters")')
    assert page.inner_text("#waiting") == "3"
    row = page.locator(f'#dead-letter-nodes tr[data-node="{a.http}"]')
    assert "orders-dead" in row.inner_text()
    names = page.locator(".msg-header-name").all_inner_texts()
    assert {"lmq-dead-letter-topic", "lmq-dead-letter-channel", "lmq-dead-letter-reason",
            "lmq-dead-letter-attempts"} <= set(names)  # fmt: skip

    page.confirm_answer = True
    page.fill('#redrive-some input[name="max"]', "2")
    page.click("#redrive-some button")
    page.wait_for_selector("#flash")
    assert page.inner_text("#flash").startswith("redrove 2 messages into orders-dl/work")
    assert page.inner_text("#waiting") == "1"
    assert len(drain(cluster, "orders-dl", "work", 2)) == 2
    page.click("#redrive-all button")
    page.wait_for_selector("#flash")
    assert page.dialogs[-1] == "Move all 1 dead letters back into orders-dl/work?"
    assert page.inner_text("#flash").startswith("redrove 1 messages")
    assert len(drain(cluster, "orders-dl", "work", 1)) == 1


def test_live_tail_shows_a_message_published_after_it_opened(
    cluster: Cluster, console: Console, page: Any
) -> None:
    cluster.create("tailed")
    console.settle()
    page.goto(console.url("/tail/tailed"))
    page.wait_for_selector("#tail-status:text-matches('live on 2 node')")
    b = cluster.nodes[1]
    cluster.post(b, "/pub?topic=tailed", XSS.encode())
    cluster.post(cluster.nodes[0], "/pub?topic=tailed", b"second")
    page.wait_for_function("() => document.querySelectorAll('#tail-messages .message').length == 2")
    bodies = page.locator("#tail-messages pre.body").all_inner_texts()
    assert sorted(bodies) == sorted([XSS, "second"])
    assert page.locator("#tail-messages img, #tail-messages script").count() == 0
    assert page.evaluate("() => window.__pwned") is None
    page.close()
    # Closing the page ends the tail's ephemeral channel on every node.
    eventually(lambda: [c["channel_name"] for n in cluster.nodes
                        for c in (cluster.stats(n, "tailed") or {}).get("channels") or []],
               lambda names: names == [], WITHIN_S)  # fmt: skip


def test_charts_draw_the_sampled_history(
    cluster: Cluster, console: Console, page: Any
) -> None:
    cluster.create("charted", "c")
    for i in range(5):
        cluster.post(cluster.nodes[0], "/pub?topic=charted", f"c{i}".encode())
    console.settle()
    console.settle()
    page.goto(console.url("/topics/charted/c"))
    page.wait_for_selector("#charts .uplot")
    assert page.locator("#charts .uplot").count() == 4
    data = page.evaluate(
        "(url) => fetch(url).then(r => r.json())",
        console.url("/charts/data?topic=charted&channel=c"),
    )
    assert data["depth"][-1] == 5
    assert len(data["t"]) == len(data["depth"]) >= 2
    assert re.fullmatch(r"[\d.]+", str(data["t"][-1]))


def test_browser_pages_a_channel_back_and_forth(
    cluster: Cluster, console: Console, page: Any
) -> None:
    cluster.create("paged", "c")
    a, b = cluster.nodes
    cluster.post(a, "/mpub?topic=paged", "\n".join(f"p{i:02d}" for i in range(25)).encode())
    cluster.post(b, "/mpub?topic=paged", b"b0\nb1\nb2")
    console.settle()

    def bodies() -> list[str]:
        return sorted(page.locator("#messages pre.body").all_inner_texts())

    page.goto(console.url("/browse/paged/c?n=10"))
    assert bodies() == sorted([f"p{i:02d}" for i in range(10)] + ["b0", "b1", "b2"])
    assert page.locator("#page-previous").count() == 0
    page.click("#page-next")
    page.wait_for_url("**skip=10**")
    assert bodies() == [f"p{i:02d}" for i in range(10, 20)]  # b has no more
    page.click("#page-next")
    page.wait_for_url("**skip=20**")
    assert bodies() == [f"p{i:02d}" for i in range(20, 25)]
    assert page.locator("#page-next").count() == 0  # the last page
    page.click("#page-previous")
    page.wait_for_url("**skip=10**")
    assert bodies() == [f"p{i:02d}" for i in range(10, 20)]

    # Filtered, a page ends after its n-th match: p10..p19 match "p1", four at a time.
    page.goto(console.url(f"/browse/paged/c?n=4&q=p1&node={a.http}"))
    seen = [bodies()]
    while page.locator("#page-next").count():
        page.click("#page-next")
        page.wait_for_load_state()
        seen.append(bodies())
    assert seen == [["p10", "p11", "p12", "p13"], ["p14", "p15", "p16", "p17"], ["p18", "p19"]]
    # Paging consumed nothing.
    assert cluster.channel(a, "paged", "c")["depth"] == 25  # type: ignore[index]

"""Screenshots of ``lmqadmin web`` for docs/console.md, taken in a real browser.

    .venv/bin/python scripts/console_shots.py [--out docs/console]

Starts an lmqlookupd and two lmqd nodes (``LocalCluster``: 127.0.0.1, free ports, a temporary
data directory) and ``lmqadmin --lookupd-http-address=... web --listen 127.0.0.1:0``, fills the
nodes with a small shop (topics, channels, messages with headers and priorities, a connected
consumer, dead letters, a refused policy), publishes for a while so that the rates and charts
have something to show, then opens each main page in Debian's Chromium (headless, through
Playwright, the flags of tests/console) and saves a PNG of it, and two at a phone's width.
Everything it started is stopped at the end. Takes about a minute.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from cluster import REPO, LocalCluster

sys.path.insert(0, str(REPO))
from lmq_client.sync import Consumer
from tests.support.browser import CHROMIUM, CHROMIUM_FLAGS
from tests.support.process import DaemonProcess

SAMPLE_S = 1.0
LOAD_S = 25.0
"""Publishing before the shots: the charts show 25 s of rates at one sample a second."""


def post(address: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
    request = urllib.request.Request(f"http://{address}{path}", data=body, method="POST",
                                     headers=headers or {})  # fmt: skip
    urllib.request.urlopen(request, timeout=10).read()


def seed(nodes: list[str], tcp: list[str]) -> None:
    for node in nodes:
        post(node, "/topic/create?topic=orders")
        for channel in ("billing", "shipping", "analytics"):
            post(node, f"/channel/create?topic=orders&channel={channel}")
        post(node, "/topic/create?topic=payments")
        post(node, "/channel/create?topic=payments&channel=settle")
        post(node, "/channel/policy?topic=payments&channel=settle",
             b'{"max_attempts": 1, "dead_letter_topic": "payments-dead"}')
        post(node, "/topic/policy?topic=orders", b'{"retention_ms": 86400000}')
        post(node, "/topic/create?topic=audit")
        # A channel from the start: the tail's own channel then sees only new messages (the
        # first channel of a topic would get its whole backlog, as in nsqd).
        post(node, "/channel/create?topic=audit&channel=archive")
    for i in range(12):
        body = json.dumps({"order": 1000 + i, "customer": {"id": 40 + i % 3},
                           "items": [{"sku": "BOOK-1", "qty": 1 + i % 2}], "total": 12.5 + i})
        post(nodes[i % 2], f"/pub?topic=orders&priority={i % 3 * 3}", body.encode(),
             {"Lmq-Header-trace-id": f"tr-{i:04x}", "Lmq-Header-source": "web-shop"})
    post(nodes[0], "/pub?topic=orders", b'<img src=x onerror=alert(1)> is shown as text')
    for i in range(4):
        post(nodes[0], "/pub?topic=payments", json.dumps({"payment": i, "amount": 20 + i}).encode())
    with Consumer("payments", "settle", tcp[0], max_in_flight=10, max_attempts=0) as consumer:
        for _ in range(4):
            message = consumer.get(timeout=10)
            assert message is not None
            message.requeue(backoff=False)  # max_attempts 1: to payments-dead


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=str(REPO / "docs" / "console"))
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    flags = ["--e2e-processing-latency-percentile=0.5,0.99"]
    with (tempfile.TemporaryDirectory(prefix="lmq-console-shots-") as data,
          LocalCluster(2, data, base_port=0, echo=False, lmqd_flags=flags) as cluster):
        assert cluster.lookupd is not None
        nodes = [n.http for n in cluster.nodes]
        tcp = [n.tcp for n in cluster.nodes]
        console = DaemonProcess([
            sys.executable, "-m", "lmq_client.admin", "--lookupd-http-address",
            cluster.lookupd.http, "web", "--listen", "127.0.0.1:0",
            f"--sample-interval={SAMPLE_S}",
        ], wanted=("HTTP",))  # fmt: skip
        try:
            console.wait_started()
            base = f"http://{console.address('HTTP')}"
            seed(nodes, tcp)
            with Consumer("orders", "shipping", tcp, max_in_flight=3,
                          max_attempts=0) as holder:  # in flight on the channel page
                holder.get(timeout=10)
                with Consumer("orders", "billing", tcp, max_in_flight=50) as billing:
                    deadline = time.monotonic() + LOAD_S
                    i = 0
                    while time.monotonic() < deadline:
                        batch = "\n".join(json.dumps({"event": "view", "n": i * 20 + k})
                                          for k in range(20))  # fmt: skip
                        post(nodes[i % 2], "/mpub?topic=audit", batch.encode())
                        post(nodes[i % 2], "/pub?topic=orders",
                             json.dumps({"order": 2000 + i}).encode())
                        while (message := billing.get(timeout=0)) is not None:
                            message.finish()
                        i += 1
                        time.sleep(0.2)
                    shoot(base, nodes, out)
        finally:
            console.terminate()


def shoot(base: str, nodes: list[str], out: Path) -> None:
    from playwright.sync_api import sync_playwright

    pages = [
        ("streams", "/", None),
        ("topic", "/topics/orders", None),
        ("channel", "/topics/orders/shipping", None),
        ("nodes", "/nodes", None),
        ("node", f"/nodes/{nodes[0]}", None),
        ("counter", "/counter", None),
        ("lookup", "/lookup", None),
        ("messages", "/browse/orders/analytics?view=json&n=4", None),
        ("topic-log", f"/browse/orders?node={nodes[0]}&at=earliest&n=3&view=hex", None),
        ("publish", "/publish/orders", None),
        ("replay", "/replay/orders?channel=replay-1&to=earliest&preview=1", None),
        ("dead-letters", "/dead-letters/payments/settle", None),
        ("policy-error", "/policy/orders", "policy"),
        ("tail", "/tail/audit", "tail"),
    ]
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True,
                                             args=CHROMIUM_FLAGS)  # fmt: skip
        try:
            context = browser.new_context(viewport={"width": 1280, "height": 800})
            page = context.new_page()
            for name, path, special in pages:
                page.goto(base + path)
                if special == "policy":
                    page.fill("#field-ttl_ms", "one hour")
                    page.click("#policy-form button")
                if special == "tail":
                    page.wait_for_selector("#tail-status:text-matches('live')")
                    for k in range(3):
                        post(nodes[k % 2], "/pub?topic=audit",
                             json.dumps({"event": "click", "n": k}).encode())
                    page.wait_for_function(
                        "() => document.querySelectorAll('#tail-messages .message').length >= 3")
                if page.locator("#charts").count():
                    page.wait_for_selector("#charts .uplot")
                page.wait_for_timeout(300)
                page.screenshot(path=str(out / f"{name}.png"), full_page=True)
                print(f"{name}: {out / name}.png", flush=True)
            context.close()
            phone = browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True,
                                        device_scale_factor=1)  # fmt: skip
            page = phone.new_page()
            for name, path in (("phone-streams", "/"), ("phone-topic", "/topics/orders")):
                page.goto(base + path)
                if page.locator("#charts").count():
                    page.wait_for_selector("#charts .uplot")
                page.screenshot(path=str(out / f"{name}.png"), full_page=True)
                print(f"{name}: {out / name}.png", flush=True)
            phone.close()
        finally:
            browser.close()


if __name__ == "__main__":
    main()

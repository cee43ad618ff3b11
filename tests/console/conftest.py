"""Fixtures of the console tests: real daemons, the real ``lmqadmin web``, a real browser.

- ``cluster``: one ``lmqlookupd`` and two ``lmqd`` subprocesses (127.0.0.1, port 0, data in a
  temp dir, both registered with the lookupd), one set per module: every test uses topic names
  of its own. Module scope, not session: nothing of the console tests (a console sampling the
  daemons, the threads reading their logs) outlives its module into other modules' tests.
- ``console_factory(*flags, group=...)``: an ``lmqadmin --lookupd-http-address L web --listen
  127.0.0.1:0`` subprocess with those flags (``group``: other options instead of the lookupd),
  started once per set of flags and stopped at the end of the module with a check that it
  logged no traceback; it samples every ``SAMPLE_S``.
- ``browser`` (one per module): Debian's Chromium (``/usr/bin/chromium``, installed by
  scripts/test) driven by Playwright, headless, with the flags this machine needs and a fresh
  profile; each test opens its own context (``page``), so cookies never leak between tests.
  Without Chromium or Playwright the browser tests are skipped, saying which is missing.
- ``notifications``: an HTTP endpoint on 127.0.0.1 port 0 recording nsqadmin's notification
  POSTs.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.cluster import procs
from tests.cluster.procs import Daemon, eventually, http
from tests.support.browser import CHROMIUM, CHROMIUM_FLAGS
from tests.support.process import DaemonProcess

SAMPLE_S = 0.5
"""The consoles' sampling interval in the tests: pages catch up with the daemons within it."""
WITHIN_S = 20.0


class Cluster:
    def __init__(self, lookupd: Daemon, nodes: list[Daemon]) -> None:
        self.lookupd = lookupd
        self.nodes = nodes

    def stats(self, node: Daemon, topic: str) -> dict[str, Any] | None:
        """The node's /stats entry for ``topic`` (None if it has none)."""
        status, doc = http(node.http, "GET", f"/stats?format=json&topic={topic}")
        assert status == 200, doc
        topics = doc["topics"] or []
        return topics[0] if topics else None

    def channel(self, node: Daemon, topic: str, channel: str) -> dict[str, Any] | None:
        entry = self.stats(node, topic)
        for found in (entry or {}).get("channels") or []:
            if found["channel_name"] == channel:
                return dict(found)
        return None

    def post(self, node: Daemon, path: str, body: bytes | None = None) -> Any:
        status, doc = http(node.http, "POST", path, body)
        assert status == 200, (path, status, doc)
        return doc

    def create(self, topic: str, *channels: str) -> None:
        """``topic`` (and channels) on both nodes, listed by the lookupd."""
        for node in self.nodes:
            self.post(node, f"/topic/create?topic={topic}")
            for channel in channels:
                self.post(node, f"/channel/create?topic={topic}&channel={channel}")
        wanted = sorted(n.tcp for n in self.nodes)

        def producers() -> list[str]:
            status, doc = http(self.lookupd.http, "GET", f"/lookup?topic={topic}")
            found = doc.get("producers", []) if status == 200 and isinstance(doc, dict) else []
            return sorted(f"{p['broadcast_address']}:{p['tcp_port']}" for p in found)

        eventually(producers, lambda p: p == wanted, WITHIN_S)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    lookupd = procs.lookupd()
    nodes: list[Daemon] = []
    try:
        data = tmp_path_factory.mktemp("console-cluster")
        for i in range(2):
            nodes.append(procs.lmqd(
                data / f"n{i}", f"--lookupd-tcp-address={lookupd.tcp}",
                "--e2e-processing-latency-percentile=0.5,0.99",
            ))  # fmt: skip
        wanted = sorted(n.tcp_port for n in nodes)

        def ports() -> list[int]:
            producers = http(lookupd.http, "GET", "/nodes")[1]["producers"]
            return sorted(p["tcp_port"] for p in producers)

        eventually(ports, lambda found: found == wanted, WITHIN_S)
        yield Cluster(lookupd, nodes)
    finally:
        for node in nodes:
            node.check_stop()
        lookupd.check_stop()


class Console:
    """A running ``lmqadmin web``."""

    def __init__(
        self, cluster: Cluster | None, flags: tuple[str, ...], group: tuple[str, ...] = ()
    ) -> None:
        """``group``: lmqadmin's options before ``web`` (default: the cluster's lookupd)."""
        if not group:
            assert cluster is not None
            group = ("--lookupd-http-address", cluster.lookupd.http)
        command = [
            sys.executable, "-m", "lmq_client.admin", *group, "web", "--listen", "127.0.0.1:0",
            f"--sample-interval={SAMPLE_S}", *flags,
        ]  # fmt: skip
        self.process = DaemonProcess(command, wanted=("HTTP",))
        self.process.wait_started()
        address = self.process.address("HTTP")
        assert address is not None
        self.address = address
        base = next((f.partition("=")[2] for f in flags if f.startswith("--base-path=")), "")
        self.base = f"http://{address}{base.rstrip('/')}"

    def url(self, path: str) -> str:
        return self.base + path

    def vars(self) -> dict[str, Any]:
        status, doc = http(self.address, "GET", self.url("/debug/vars").split(self.address, 1)[1])
        assert status == 200, doc
        return dict(doc)

    def settle(self) -> None:
        """Wait for a sampling round that started after now: pages show the daemons' state."""
        since = time.time()
        eventually(self.vars, lambda v: v["sampled_at"] > since, WITHIN_S)


@pytest.fixture(scope="module")
def console_factory(cluster: Cluster) -> Iterator[Callable[..., Console]]:
    started: dict[tuple[tuple[str, ...], tuple[str, ...]], Console] = {}

    def start(*flags: str, group: tuple[str, ...] = ()) -> Console:
        """A console with these ``web`` flags; ``group``: lmqadmin's options before ``web``
        (default: the cluster's lookupd)."""
        if (group, flags) not in started:
            started[(group, flags)] = Console(cluster, flags, group)
        return started[(group, flags)]

    try:
        yield start
    finally:
        for console in started.values():
            early = console.process.process.poll()
            console.process.terminate()
            output = console.process.output()
            assert early is None, f"the console exited early ({early}):\n{output}"
            assert console.process.process.returncode == 0, output
            assert "Traceback" not in output, output


class Notifications:
    """nsqadmin's notification endpoint: every POST body it got, decoded."""

    def __init__(self) -> None:
        self.received: list[dict[str, Any]] = []
        self.changed = threading.Condition()
        received, changed = self.received, self.changed

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with changed:
                    received.append({"content_type": self.headers.get("Content-Type"),
                                     **json.loads(body)})
                    changed.notify_all()
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/notify"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def wait_for(self, action: str, topic: str, within: float = WITHIN_S) -> dict[str, Any]:
        deadline = time.monotonic() + within
        with self.changed:
            while True:
                for doc in self.received:
                    if doc["action"] == action and doc["topic"] == topic:
                        return doc
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no {action} notification for {topic}: {self.received}")
                self.changed.wait(left)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def notifications() -> Iterator[Notifications]:
    endpoint = Notifications()
    try:
        yield endpoint
    finally:
        endpoint.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM} (scripts/test installs Debian's chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed (the test extra has it)")
    profile = tempfile.mkdtemp(prefix="lmq-console-chromium-")
    with sync_playwright() as playwright:
        instance = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS,
            env={**os.environ, "HOME": profile},
        )  # fmt: skip
        try:
            yield instance
        finally:
            instance.close()
    shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A fresh browser context (no cookies) and page; failing on any script error, and on any
    dialog that a test did not expect (an XSS would open one)."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(WITHIN_S * 1000)
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.dialogs = []  # type: ignore[attr-defined]

    def on_dialog(dialog: Any) -> None:
        page.dialogs.append(dialog.message)  # type: ignore[attr-defined]
        if dialog.type == "confirm" and getattr(page, "confirm_answer", None) is not None:
            dialog.accept() if page.confirm_answer else dialog.dismiss()  # type: ignore[attr-defined]
        else:
            dialog.dismiss()

    page.on("dialog", on_dialog)
    try:
        yield page
    finally:
        context.close()
    assert errors == [], f"script errors in the page: {errors}"

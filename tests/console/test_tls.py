"""The console towards daemons that want TLS and AUTH: a real lmqd with ``--https-address`` and
``--tls-client-auth-policy=require-verify`` (so its plain HTTP port answers ``TLS_REQUIRED``
and TCP needs TLS) and ``--auth-http-address``; the console is given the plain address and
lmqadmin's ``--tls-*`` and ``--auth-secret`` options.

Rules for this module: as ``test_pages.py`` (Chromium through Playwright, a fresh context per
test); one daemon, one auth server (a thread) and certificates made for this module; what the
console did is checked on the daemon over HTTPS with a client certificate.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
from click.testing import CliRunner

from lmq_client.admin.cli import cli
from lmq_client.errors import ConnectionFailed
from lmq_client.http import HTTPClient, HTTPOptions
from lmqd.transport.tls import client_context
from tests.cluster import procs
from tests.cluster.procs import Daemon
from tests.security.authserver_thread import ThreadedAuthServer, auth_server, grant
from tests.transport.certs import Certs, make_certs

from .conftest import WITHIN_S, Console

SECRET = "console-secret"


@attrs.frozen
class Secure:
    daemon: Daemon
    certs: Certs
    auth: ThreadedAuthServer
    client: HTTPClient
    """The daemon's API over HTTPS with the client certificate (found through TLS_REQUIRED)."""

    def tls_flags(self, *, with_cert: bool = True) -> tuple[str, ...]:
        flags = (f"--tls-root-ca-file={self.certs.ca_file}",)
        if with_cert:
            flags += (f"--tls-cert={self.certs.client.cert_file}",
                      f"--tls-key={self.certs.client.key_file}")  # fmt: skip
        return flags


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secure]:
    certs = make_certs(tmp_path_factory.mktemp("certs"))
    everything = {"topic": ".*", "channels": [".*"], "permissions": ["subscribe", "publish"]}
    with auth_server(grant(everything)) as auth:
        daemon = procs.lmqd(
            tmp_path_factory.mktemp("secure-lmqd"), "--https-address=127.0.0.1:0",
            f"--tls-cert={certs.server.cert_file}", f"--tls-key={certs.server.key_file}",
            f"--tls-root-ca-file={certs.ca_file}", "--tls-client-auth-policy=require-verify",
            f"--auth-http-address={auth.address}",
        )  # fmt: skip
        try:
            context = client_context(ca_file=certs.ca_file, cert_file=certs.client.cert_file,
                                     key_file=certs.client.key_file)  # fmt: skip
            client = HTTPClient(daemon.http, options=HTTPOptions(tls_context=context))
            yield Secure(daemon, certs, auth, client)
        finally:
            daemon.check_stop()


@pytest.fixture(scope="module")
def consoles(secure: Secure) -> Iterator[dict[str, Console]]:
    started: dict[str, Console] = {}
    group = ("--http-address", secure.daemon.http)
    try:
        started["mutual"] = Console(
            None, ("--http-client-connect-timeout=1s", "--log-prefix=[tls console] "),
            group=(*group, *secure.tls_flags(), f"--auth-secret={SECRET}"))
        started["no-cert"] = Console(None, (), group=(*group, *secure.tls_flags(with_cert=False)))
        yield started
    finally:
        for console in started.values():
            console.process.terminate()
            output = console.process.output()
            assert console.process.process.returncode == 0, output
            assert "Traceback" not in output, output
        assert "[tls console] " in started["mutual"].process.output()


def test_the_shared_client_follows_tls_required_to_https(secure: Secure) -> None:
    plain = HTTPClient(secure.daemon.http)
    with pytest.raises(ConnectionFailed) as refused:  # sent on to HTTPS, where the system's
        plain.ping()  # CAs do not know the daemon's certificate
    assert "CERTIFICATE_VERIFY_FAILED" in str(refused.value)
    assert secure.client.ping() == "OK"
    https_port = secure.daemon.address("HTTPS").rpartition(":")[2]  # type: ignore[union-attr]
    assert secure.client.options.https_hosts == {secure.daemon.http: f"127.0.0.1:{https_port}"}


def test_lmqadmin_commands_reach_the_https_port(secure: Secure, tmp_path: Path) -> None:
    secure.client.topic_action("create", "cli-tls")
    done = subprocess.run(
        [sys.executable, "-m", "lmq_client.admin", "--http-address", secure.daemon.http,
         *secure.tls_flags(), "--json", "stats", "cli-tls"],
        capture_output=True, text=True, timeout=WITHIN_S * 2,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert '"cli-tls"' in done.stdout
    without = subprocess.run(
        [sys.executable, "-m", "lmq_client.admin", "--http-address", secure.daemon.http,
         *secure.tls_flags(with_cert=False), "stats"],
        capture_output=True, text=True, timeout=WITHIN_S * 2,
    )  # fmt: skip
    assert without.returncode == 3, without.stderr
    assert without.stderr.startswith("lmqadmin: error: cannot reach the daemon at")
    assert "Traceback" not in without.stderr


def test_console_pages_actions_browser_and_tail_over_https_and_auth(
    secure: Secure, consoles: dict[str, Console], page: Any
) -> None:
    client = secure.client
    client.topic_action("create", "secured")
    client.channel_action("create", "secured", "work")
    client.pub("secured", b"stored over https")
    console = consoles["mutual"]
    console.settle()

    page.goto(console.url("/"))
    page.wait_for_selector('a:text-is("secured")')
    page.goto(console.url("/nodes"))
    assert "TLS_REQUIRED" not in page.inner_text("main")
    page.goto(console.url("/browse/secured/work"))
    page.wait_for_selector('pre.body:text-is("stored over https")')

    page.goto(console.url("/topics/secured"))
    page.click('button:text-is("Pause topic")')
    page.wait_for_selector('button:text-is("Unpause topic")')
    assert client.stats("secured")["topics"][0]["paused"] is True
    page.click('button:text-is("Unpause topic")')
    page.wait_for_selector('button:text-is("Pause topic")')
    assert client.stats("secured")["topics"][0]["paused"] is False

    # The live tail: TCP with TLS and the client certificate, then AUTH with the secret.
    asked = len(secure.auth.queries)
    page.goto(console.url("/tail/secured"))
    page.wait_for_selector("#tail-status:text-matches('live on 1 node')")
    client.pub("secured", b"tailed over tls")
    page.wait_for_selector('#tail-messages pre.body:text-is("tailed over tls")')
    queries = secure.auth.queries[asked:]
    assert any(q.get("secret") == SECRET and q.get("tls") == "true" for q in queries), queries


def test_console_without_the_client_certificate_shows_the_refusal(
    secure: Secure, consoles: dict[str, Console], page: Any
) -> None:
    console = consoles["no-cert"]
    page.goto(console.url("/nodes"))
    error = page.locator("span.error").first
    error.wait_for()
    assert "unreachable" in error.inner_text()


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--http-client-connect-timeout=0"], "must be more than 0"),
        (["--http-client-request-timeout=soon"], "a duration such as"),
        (["--log-level=loud"], "'loud' is not one of"),
        (["--http-client-tls-root-ca-file=/nonexistent/ca.pem"], "--http-client-tls-*"),
        (["--http-client-tls-key=/nonexistent/key.pem"], "--http-client-tls-*"),
    ],
)
def test_bad_nsqadmin_flags_are_one_line_and_exit_2(flags: list[str], said: str) -> None:
    result = CliRunner().invoke(cli, ["web", "--listen=127.0.0.1:0", *flags])
    assert result.exit_code == 2, result.output
    assert said in result.output and "Traceback" not in result.output

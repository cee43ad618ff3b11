"""Fail closed: every security flag of nsqd either works or stops lmqd from starting.

Rules for this module (STYLE.md):
- Start-up failures run the real ``lmqd`` command in a subprocess (``python -m lmqd``), each with
  a timeout, on 127.0.0.1 port 0; nothing is left running.
- Certificates are made by the test (``tests/transport/certs.py``), none are checked in.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from lmqd import config
from tests.transport.certs import Certs, make_certs

REPO_ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 30

# nsqd's flags that protect connections: none may be accepted and ignored.
SECURITY_FLAGS = {
    "tls-cert",
    "tls-key",
    "tls-client-auth-policy",
    "tls-root-ca-file",
    "tls-required",
    "tls-min-version",
    "https-address",
    "auth-http-address",
    "auth-http-request-method",
    "http-client-connect-timeout",
    "http-client-request-timeout",
    "snappy",
    "deflate",
    "max-deflate-level",
}


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


def test_no_security_flag_is_inert() -> None:
    by_flag = {s.flag: s for s in config.SETTINGS}
    assert set(by_flag) >= SECURITY_FLAGS
    assert [f for f in sorted(SECURITY_FLAGS) if by_flag[f].inert] == []


def run_lmqd(tmp_path: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "lmqd",
            "--tcp-address=127.0.0.1:0",
            "--http-address=127.0.0.1:0",
            "--https-address=127.0.0.1:0",
            f"--data-path={tmp_path / 'data'}",
            *flags,
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )


def error_line(proc: subprocess.CompletedProcess[str]) -> str:
    """The one ``Error:`` line; lmqd must not have started listening before it."""
    assert proc.returncode == 1, (proc.returncode, proc.stderr)
    assert "listening on" not in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1, proc.stderr
    return errors[0]


def test_tls_required_without_a_certificate(tmp_path: Path) -> None:
    proc = run_lmqd(tmp_path, "--tls-required=true")
    assert error_line(proc) == (
        "Error: cannot require TLS client connections without TLS key and cert"
    )


def test_client_auth_policy_without_a_certificate(tmp_path: Path) -> None:
    proc = run_lmqd(tmp_path, "--tls-client-auth-policy=require")
    assert error_line(proc) == (
        "Error: cannot require TLS client connections without TLS key and cert"
    )


def test_missing_certificate_file(tmp_path: Path) -> None:
    proc = run_lmqd(tmp_path, "--tls-cert=/nonexistent/cert.pem", "--tls-key=/nonexistent/k.pem")
    line = error_line(proc)
    assert line.startswith("Error: --tls-cert/--tls-key: no such file /nonexistent/")


def test_certificate_without_key(tmp_path: Path, certs: Certs) -> None:
    proc = run_lmqd(tmp_path, f"--tls-cert={certs.server.cert_file}")
    assert error_line(proc) == "Error: --tls-cert and --tls-key must be given together"


def test_key_of_another_certificate(tmp_path: Path, certs: Certs) -> None:
    proc = run_lmqd(
        tmp_path, f"--tls-cert={certs.server.cert_file}", f"--tls-key={certs.client.key_file}"
    )
    line = error_line(proc)
    assert line.startswith("Error: --tls-cert ") and "does not match" in line


def test_unknown_client_auth_policy(tmp_path: Path, certs: Certs) -> None:
    proc = run_lmqd(
        tmp_path,
        f"--tls-cert={certs.server.cert_file}",
        f"--tls-key={certs.server.key_file}",
        "--tls-client-auth-policy=requir",
    )
    assert error_line(proc) == (
        "Error: --tls-client-auth-policy: unknown policy 'requir' (want require or require-verify)"
    )


def test_unreadable_root_ca_file(tmp_path: Path, certs: Certs) -> None:
    bogus = tmp_path / "ca.pem"
    bogus.write_text("not a certificate\n")
    proc = run_lmqd(
        tmp_path,
        f"--tls-cert={certs.server.cert_file}",
        f"--tls-key={certs.server.key_file}",
        f"--tls-root-ca-file={bogus}",
        "--tls-client-auth-policy=require-verify",
    )
    assert error_line(proc) == f"Error: --tls-root-ca-file {bogus}: no PEM certificate found"


def test_bad_auth_request_method(tmp_path: Path) -> None:
    proc = run_lmqd(tmp_path, "--auth-http-address=127.0.0.1:1", "--auth-http-request-method=put")
    assert error_line(proc) == "Error: --auth-http-request-method must be post or get"

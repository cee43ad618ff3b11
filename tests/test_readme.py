"""The README's first steps, run literally against a daemon (so they stay true).

Rules for this module: the README's ```python and ```bash blocks of "Try it" are run as written,
with the default addresses (127.0.0.1:4150 / :4151) replaced by those of the ``lmqd_server``
subprocess (127.0.0.1, port 0); every command has a timeout, so a step that hangs fails.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Protocol

REPO_ROOT = Path(__file__).resolve().parent.parent
README = REPO_ROOT / "README.md"


class LmqdServer(Protocol):
    """What the tests use of the ``lmqd_server`` fixture's daemon."""

    @property
    def tcp_address(self) -> str: ...

    @property
    def http_address(self) -> str | None: ...

    @property
    def tcp_host_port(self) -> tuple[str, int]: ...
STEP_TIMEOUT_S = 30


def blocks(language: str) -> list[str]:
    text = README.read_text()
    section = text[text.index("## Try it") : text.index("\n## ", text.index("## Try it") + 1)]
    found = re.findall(rf"```{language}\n(.*?)```", section, re.DOTALL)
    assert found, f"no {language} block in the README's 'Try it'"
    return found


def localise(code: str, server: LmqdServer) -> str:
    http = server.http_address
    assert http is not None
    tcp_host, tcp_port = server.tcp_host_port
    http_port = http.rpartition(":")[2]
    return (
        code.replace("127.0.0.1:4150", server.tcp_address)
        .replace("127.0.0.1:4151", http)
        .replace("/dev/tcp/127.0.0.1/4150", f"/dev/tcp/{tcp_host}/{tcp_port}")
        .replace(":4151/", f":{http_port}/")
    )


def test_the_python_example_publishes_and_consumes(lmqd_server: LmqdServer, tmp_path: Path) -> None:
    (code,) = blocks("python")
    script = tmp_path / "try_lmq.py"
    script.write_text(localise(code, lmqd_server))
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=STEP_TIMEOUT_S,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "b'hello'"


def test_the_shell_lines_return_at_once_with_ok(lmqd_server: LmqdServer) -> None:
    (code,) = blocks("bash")
    assert shutil.which("curl") and shutil.which("bash")
    done = subprocess.run(
        ["bash", "-c", "set -e\n" + localise(code, lmqd_server)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=STEP_TIMEOUT_S,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "OK"  # /pub
    assert '"topic_name":"greetings"' in lines[1]  # /stats
    assert lines[2].split()[-2:] == ["O", "K"]  # the raw PUB's response frame

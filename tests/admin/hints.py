"""Running an lmqadmin command past its "nothing new" hint (tail's, archive's), for the tests."""

from __future__ import annotations

import os
import subprocess
import time

from lmq_client.admin.tail_hint import TAIL_HINT_AFTER_S
from lmq_client.http import HTTPClient
from tests.support.process import REPO_ROOT, LmqdProcess, lmqadmin_command

__all__ = ["past_the_hint"]

DEADLINE_S = 10.0


def past_the_hint(
    server: LmqdProcess, topic: str, channel: str, *command: str
) -> tuple[str, str]:
    """Run lmqadmin ``command`` (its ``-n 1`` making it exit after a message) as a subprocess;
    once it has subscribed on ``channel`` (a prefix of its name) and its hint time has passed,
    publish one message; return (stdout, stderr)."""
    assert server.http_address is not None
    proc = subprocess.Popen(
        [*lmqadmin_command(server.tcp_address, "--http-address", server.http_address), *command],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )  # fmt: skip
    try:
        http = HTTPClient(server.http_address)
        deadline = time.monotonic() + DEADLINE_S
        while not any(
            c["channel_name"].startswith(channel)
            for c in http.stats(topic)["topics"][0]["channels"]
        ):
            assert time.monotonic() < deadline, f"{command[0]} never subscribed"
            time.sleep(0.02)
        time.sleep(TAIL_HINT_AFTER_S + 0.5)
        http.pub(topic, b"new")
        out, err = proc.communicate(timeout=DEADLINE_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    return out.decode(), err.decode()

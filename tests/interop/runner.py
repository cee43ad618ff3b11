"""Run an interop client script (``clients/<library>_client.py``) and return its JSON result."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

CLIENTS_DIR = Path(__file__).resolve().parent / "clients"


def run_client(
    library: str, scenario: str, *, timeout: float = 60.0, **params: Any
) -> dict[str, Any]:
    """Run ``scenario`` of the ``library`` client script in its own interpreter.

    The script stops itself after ``timeout - 2`` seconds (``signal.alarm``); this process kills it
    after ``timeout``. A failure shows the script's stderr (the library's logging included).
    """
    params["hard_limit_s"] = max(1, int(timeout) - 2)
    command = [
        sys.executable,
        str(CLIENTS_DIR / f"{library}_client.py"),
        scenario,
        json.dumps(params),
    ]
    try:
        done = subprocess.run(
            command, capture_output=True, timeout=timeout, cwd=CLIENTS_DIR, check=False
        )
    except subprocess.TimeoutExpired as exc:
        stderr = (exc.stderr or b"").decode("utf-8", "replace")
        pytest.fail(f"{library} {scenario}: no result within {timeout:.0f}s; stderr:\n{stderr}")
    stderr = done.stderr.decode("utf-8", "replace")
    if done.returncode != 0:
        pytest.fail(f"{library} {scenario}: exit code {done.returncode}; stderr:\n{stderr}")
    lines = done.stdout.decode().strip().splitlines()
    assert lines, f"{library} {scenario}: no output; stderr:\n{stderr}"
    result: dict[str, Any] = json.loads(lines[-1])
    result["stderr"] = stderr
    return result


def assert_every_message_once(
    result: dict[str, Any], *, prefix: str, count: int, batch: int, single: int, per: str
) -> None:
    """Check a ``pubsub`` scenario's result: every publish answered OK (the MPUBs of ``batch``
    messages and the ``single`` PUBs), each of the ``count`` bodies ``<prefix>-NNNNNN`` delivered
    exactly once and on its first attempt, and every consumer (``result[per]``) took part."""
    assert result["responses"] == {"OK": -(-(count - single) // batch) + single}, result["stderr"]
    bodies = result["bodies"]
    duplicates = [b for b, n in Counter(bodies).items() if n > 1]
    assert not duplicates, f"{len(duplicates)} delivered twice, e.g. {duplicates[:5]}"
    assert set(bodies) == {f"{prefix}-{i:06d}" for i in range(count)}
    assert len(bodies) == count
    assert all(n > 0 for n in result[per]), result[per]
    assert result["attempts"] == {"1": count}

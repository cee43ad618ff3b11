"""Shared by the interop client scripts: arguments, a hard time limit, the JSON result.

Each script is run as ``python <script> <scenario> '<json params>'`` by ``tests/interop/runner.py``
in its own process, so the client library's event loop (tornado, gevent, asyncio) never meets
pytest's or trio's, and prints exactly one JSON object on stdout. Logging goes to stderr, which the
test shows when it fails.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

Params = dict[str, Any]
Result = dict[str, Any]
Scenario = Callable[[Params], Result]


def _hard_limit(signum: int, frame: FrameType | None) -> None:
    sys.stderr.write("interop client: hard time limit reached, exiting\n")
    sys.stderr.flush()
    os._exit(124)


def main(scenarios: dict[str, Scenario]) -> None:
    """Run the scenario named in argv with its JSON params; print its JSON result."""
    name, params = sys.argv[1], json.loads(sys.argv[2])
    # The runner kills us too, but only after its own timeout; this bounds the work itself.
    signal.signal(signal.SIGALRM, _hard_limit)
    signal.alarm(int(params["hard_limit_s"]))
    logging.basicConfig(
        level=logging.WARNING,
        stream=sys.stderr,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    started = time.monotonic()
    result = scenarios[name](params)
    result["scenario_seconds"] = round(time.monotonic() - started, 3)
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: a library's reconnect timers or greenlets must not keep the
    # process alive (or log noise) once the result is out.
    os._exit(0)


def deadline_after(seconds: float) -> float:
    return time.monotonic() + seconds


class Timeout(Exception):
    """A scenario waited longer than it allows for something."""


def check_deadline(deadline: float, what: str) -> None:
    if time.monotonic() > deadline:
        raise Timeout(f"timed out waiting for {what}")

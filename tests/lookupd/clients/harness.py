"""Shared by the client scripts here: ``python <script> <scenario> '<json params>'`` runs one
scenario in its own interpreter (the library's event loop never meets trio's), under a hard
time limit, and prints its result as one JSON line; logging goes to stderr.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

Params = dict[str, Any]
Result = dict[str, Any]


def _hard_limit(signum: int, frame: FrameType | None) -> None:
    sys.stderr.write("client script: hard time limit reached\n")
    sys.stderr.flush()
    os._exit(124)


def main(scenarios: dict[str, Callable[[Params], Result]]) -> None:
    name, params = sys.argv[1], json.loads(sys.argv[2])
    signal.signal(signal.SIGALRM, _hard_limit)
    signal.alarm(int(params["hard_limit_s"]))
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    result = scenarios[name](params)
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # no library timers or greenlets may keep the process alive

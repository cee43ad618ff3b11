"""Shared by the client scripts here: ``python <script> '<json params>'`` runs one scenario in
its own interpreter (the library's event loop never meets trio's), under a hard time limit, and
prints its result as one JSON line; logging goes to stderr.
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


def main(scenario: Callable[[Params], Result]) -> None:
    params = json.loads(sys.argv[1])
    signal.signal(signal.SIGALRM, _hard_limit)
    signal.alarm(int(params["hard_limit_s"]))
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    result = scenario(params)
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # no library timers may keep the process alive

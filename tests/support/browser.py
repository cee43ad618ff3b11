"""Debian's Chromium for the console's tests and scripts (tests/console, scripts/console_shots.py,
scripts/bench_console.py), driven by Playwright with ``executable_path``: nothing is downloaded.

The flags are what this machine needs: headless, no sandbox (the tests run as root), no GPU, and
nothing that reaches for the network on its own (the network is closed). Playwright gives every
launch a fresh temporary ``--user-data-dir``. No pytest here, so the scripts can import it.
"""

from __future__ import annotations

import os

__all__ = ["CHROMIUM", "CHROMIUM_FLAGS"]

CHROMIUM = os.environ.get("LMQ_CHROMIUM", "/usr/bin/chromium")
"""Where Debian's ``chromium`` package puts it (scripts/test installs it when missing)."""

CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
]  # fmt: skip

"""``scripts/soak`` checks something: a short soak with kill -9 and SIGTERM must pass.

Rules for this module: the soak script runs as a subprocess (``python scripts/soak.py``, its own
lmqd subprocesses on 127.0.0.1 with fixed free ports), bounded in time by its flags and by
``subprocess.run``'s timeout; its JSON report is checked, not only its exit status. The long
run (10 minutes) is recorded in docs/durability.md ("Soak"); this keeps it from rotting.
"""

from __future__ import annotations

import json
import subprocess
import sys

from tests.support.process import REPO_ROOT

SOAK_TIMEOUT_S = 150


def test_a_short_soak_with_crashes_finishes_every_acknowledged_message() -> None:
    """Issue 30: the soak's consumers backed off at every requeue (the client's default) and
    gave up after five deliveries, so it reported ~289k "lost" per channel and exited 1."""
    run = subprocess.run(
        [
            sys.executable, str(REPO_ROOT / "scripts" / "soak.py"),
            "--duration", "16", "--restart-every", "4", "--publishers", "2",
            "--drain-timeout", "60",
        ],
        capture_output=True, text=True, timeout=SOAK_TIMEOUT_S, cwd=REPO_ROOT,
    )  # fmt: skip
    report = json.loads(run.stdout[run.stdout.index("{") :])
    assert run.returncode == 0, (report, run.stderr[-2000:])
    assert report["kill_9"] >= 1 and report["sigterm"] >= 1, report
    assert report["acknowledged"] > 1000, report
    assert report["requeued"] > 0 and report["left_to_time_out"] > 0, report
    for channel in ("a", "b"):
        assert report[f"{channel}_lost"] == 0, report
        assert report[f"{channel}_finished_unique"] == report["acknowledged"], report

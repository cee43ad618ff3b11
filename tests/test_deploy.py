"""The deployment files (Dockerfile, deploy/compose.yaml, deploy/*.service, deploy/lmqd.toml) say
what they should and run as written.

Rules for this module: no Docker engine runs here or in CI, so the Dockerfile is read as text and
its command is run as the container would run it, with the data path and ports moved to a
temporary directory and free loopback ports; the health check is the Dockerfile's own command.
systemd units are checked with ``systemd-analyze verify`` where it exists (Debian ships it).
Daemons are subprocesses on 127.0.0.1, stopped with SIGTERM, every wait bounded.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import yaml

from lmqd import config as lmq_config

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
START_TIMEOUT_S = 20.0


def dockerfile() -> list[tuple[str, str]]:
    """The Dockerfile's instructions as (KEYWORD, arguments), continuations joined."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        pending += line.rstrip("\\").strip() + " "
        if line.endswith("\\"):
            continue
        keyword, _, args = pending.strip().partition(" ")
        instructions.append((keyword.upper(), args.strip()))
        pending = ""
    return instructions


def one(keyword: str) -> str:
    found = [args for kw, args in dockerfile() if kw == keyword]
    assert len(found) == 1, f"{keyword}: {found}"
    return found[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_image_is_slim_non_root_with_a_data_volume_and_a_ping_health_check() -> None:
    assert re.fullmatch(r"python:3\.1[1-9]-slim", one("FROM"))
    assert one("USER") not in ("root", "0")
    assert json.loads(one("VOLUME")) == ["/data"]
    assert one("EXPOSE").split() == ["4150", "4151"]
    assert "/ping" in one("HEALTHCHECK")
    assert one("STOPSIGNAL") == "SIGTERM"
    assert json.loads(one("ENTRYPOINT")) == ["lmqd"]
    # The image installs lmq without extras (no pyspark in a daemon image).
    runs = " ".join(args for kw, args in dockerfile() if kw == "RUN")
    assert "pip install ." in runs and "[spark" not in runs


def test_the_containers_command_starts_lmqd_and_its_health_check_passes(tmp_path: Path) -> None:
    tcp, http = free_port(), free_port()
    flags = [
        flag.replace("/data", str(tmp_path))
        .replace("0.0.0.0:4150", f"127.0.0.1:{tcp}")
        .replace("0.0.0.0:4151", f"127.0.0.1:{http}")
        for flag in json.loads(one("CMD"))
    ]
    health = json.loads(one("HEALTHCHECK").partition("CMD ")[2])
    assert health[0] == "python"
    health = [sys.executable, *(a.replace(":4151/", f":{http}/") for a in health[1:])]
    daemon = subprocess.Popen(
        [sys.executable, "-m", "lmqd", *flags],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:  # bounded: the deadline
            if subprocess.run(health, capture_output=True, timeout=10).returncode == 0:
                break
            assert daemon.poll() is None, "lmqd exited"
            assert time.monotonic() < deadline, "the health check never passed"
            time.sleep(0.2)
        assert any(p.name.startswith("lmqd.") for p in tmp_path.iterdir())  # data on the volume
    finally:
        daemon.send_signal(signal.SIGTERM)
        _, stderr = daemon.communicate(timeout=30)
    assert daemon.returncode == 0, stderr.decode()
    assert b"Traceback" not in stderr


def test_compose_runs_a_lookupd_and_two_nodes_with_valid_flags() -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    assert set(services) == {"lmqlookupd", "lmqd1", "lmqd2"}
    for name in ("lmqd1", "lmqd2"):
        command = services[name]["command"]
        assert f"--broadcast-address={name}" in command
        assert "--lookupd-tcp-address=lmqlookupd:4160" in command
        flags: dict[str, list[str]] = {}
        for arg in command:
            flag, _, value = arg.removeprefix("--").partition("=")
            flags.setdefault(flag, []).append(value)
        given = {f: v[0] if len(v) == 1 else v for f, v in flags.items()}
        repeatable = {"lookupd-tcp-address"}
        options = lmq_config.resolve(
            {f: (v if f not in repeatable else flags[f]) for f, v in given.items()}
        ).options
        assert options.data_path == "/data"
    ports = {p for s in services.values() for p in s.get("ports", ())}
    assert len(ports) == 6  # no two services publish the same host port


def test_the_config_example_loads() -> None:
    values = lmq_config.load_toml(DEPLOY / "lmqd.toml")
    options = lmq_config.resolve({}, values, source="deploy/lmqd.toml").options
    assert options.data_path == "/var/lib/lmqd"
    assert options.tcp_address == "0.0.0.0:4150"


def test_systemd_units_point_at_the_console_scripts_and_verify(tmp_path: Path) -> None:
    venv_bin = Path(sys.executable).parent
    for unit, script in (("lmqd.service", "lmqd"), ("lmqlookupd.service", "lmqlookupd")):
        text = (DEPLOY / unit).read_text()
        exec_start = re.search(r"^ExecStart=(\S+)", text, re.MULTILINE)
        assert exec_start is not None and exec_start.group(1) == f"/opt/lmq/bin/{script}"
        assert "KillSignal=SIGTERM" in text
        analyze = shutil.which("systemd-analyze")
        if analyze is None:
            continue  # no systemd tools on this machine: the text checks above still ran
        installed = venv_bin / script
        assert installed.exists(), installed
        copy = tmp_path / unit
        copy.write_text(text.replace(f"/opt/lmq/bin/{script}", str(installed)))
        done = subprocess.run(
            [analyze, "verify", str(copy)], capture_output=True, text=True, timeout=60
        )
        problems = [
            line
            for line in (done.stdout + done.stderr).splitlines()
            # Documentation= points into an installation this machine does not have.
            if line.strip() and "Documentation" not in line and "file:///opt/lmq" not in line
        ]
        assert done.returncode == 0 and not problems, done.stdout + done.stderr

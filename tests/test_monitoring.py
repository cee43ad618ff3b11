"""The Grafana dashboard and the Prometheus alert rules in docs/monitoring/ hold up.

Rules for this module: ``promtool`` (Debian's ``prometheus`` package; ``./scripts/test`` installs
it when missing) checks every expression's syntax and runs the alerts' unit tests
(tests/monitoring/alerts_test.yml); a real ``lmqd`` subprocess (127.0.0.1, port 0) serves the
``/metrics`` whose metric names every expression may use, and nothing else.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any, Protocol

import pytest
import yaml

from tests.support.process import start_lmqd, stop_lmqd

ROOT = Path(__file__).resolve().parent.parent
MONITORING = ROOT / "docs" / "monitoring"
ALERTS = MONITORING / "lmqd-alerts.yml"
DASHBOARD = MONITORING / "grafana-dashboard.json"
PROMTOOL_TIMEOUT_S = 60
# Metrics Prometheus itself adds to every target, and the standard process collector's.
NOT_FROM_LMQD = {"up"}
_METRIC = re.compile(r"\b((?:lmqd|process)_[a-z_]+)\b")


class LmqdServer(Protocol):
    @property
    def http_address(self) -> str | None: ...

    @property
    def tcp_address(self) -> str: ...


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["promtool", *args], capture_output=True, text=True, timeout=PROMTOOL_TIMEOUT_S, cwd=cwd
    )


def dashboard_exprs() -> list[str]:
    dashboard: dict[str, Any] = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    exprs += [v["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    assert exprs
    return exprs


def alert_exprs() -> list[str]:
    rules = yaml.safe_load(ALERTS.read_text())
    return [r["expr"] for g in rules["groups"] for r in g["rules"]]


def test_alert_rules_are_valid_and_their_unit_tests_pass() -> None:
    checked = promtool("check", "rules", str(ALERTS))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = promtool("test", "rules", "alerts_test.yml", cwd=ROOT / "tests" / "monitoring")
    assert tested.returncode == 0, tested.stdout + tested.stderr
    names = {r["alert"] for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]}
    tests_text = (ROOT / "tests" / "monitoring" / "alerts_test.yml").read_text()
    untested = {n for n in names if f"alertname: {n}" not in tests_text}
    assert not untested, f"alerts without a unit test: {untested}"


def test_dashboard_queries_are_valid_promql(tmp_path: Path) -> None:
    grafana = {
        "$__rate_interval": "1m",
        '"$instance"': '".*"',
        '"$topic"': '".*"',
        '"$job"': '".*"',
    }
    rules = []
    for i, expr in enumerate(dashboard_exprs()):
        if expr.startswith("label_values("):
            inner = re.fullmatch(r"label_values\((.*), \w+\)", expr)
            assert inner is not None, expr
            expr = inner.group(1)
        for variable, value in grafana.items():
            expr = expr.replace(variable, value)
        assert "$" not in expr, expr
        rules.append({"record": f"dashboard:expr{i}", "expr": expr})
    path = tmp_path / "dashboard-rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    checked = promtool("check", "rules", str(path))
    assert checked.returncode == 0, checked.stdout + checked.stderr


# (--min-insync-mirrors: the families of the publishes held for the mirrors too)
@pytest.mark.lmqd_args("--e2e-processing-latency-percentile=0.99", "--min-insync-mirrors=1")
def test_every_metric_used_is_one_lmqd_exports(lmqd_server: LmqdServer, tmp_path: Path) -> None:
    http = lmqd_server.http_address
    assert http is not None
    # A topic and a channel, so that their families have samples too.
    for path in ("/topic/create?topic=t", "/channel/create?topic=t&channel=c"):
        request = urllib.request.Request(f"http://{http}{path}", method="POST")
        urllib.request.urlopen(request, timeout=10).read()
    # And a mirror of it (docs/mirrors.md): its families, and the primary's of its mirrors.
    mirror = start_lmqd(tmp_path / "mirror", [f"--mirror-of={http}"])
    try:
        assert mirror.http_address is not None
        texts = [_metrics_with(mirror.http_address, "lmqd_mirror_lag_seconds{"),
                 _metrics_with(http, "lmqd_primary_mirror_lag_messages{")]  # fmt: skip
    finally:
        stop_lmqd(mirror)
    families = {f for text in texts for f in re.findall(r"^# TYPE (\S+) (\S+)$", text,
                                                         re.MULTILINE)}  # fmt: skip
    exported: set[str] = set()
    for name, kind in families:
        exported.add(name)
        if kind == "counter":
            exported.add(f"{name}_total")
        if kind == "histogram":
            exported.update(f"{name}_{suffix}" for suffix in ("bucket", "sum", "count"))
    used = {m for e in dashboard_exprs() + alert_exprs() for m in _METRIC.findall(e)}
    assert used, "no metric names found in the expressions"
    missing = used - exported - NOT_FROM_LMQD
    assert not missing, f"dashboard/alerts use metrics lmqd does not export: {sorted(missing)}"


def _metrics_with(http: str, sample: str) -> str:
    """The node's ``/metrics`` once it has a sample starting with ``sample`` (bounded)."""
    text = ""
    for _ in range(200):
        text = urllib.request.urlopen(f"http://{http}/metrics", timeout=10).read().decode()
        if sample in text:
            return text
        time.sleep(0.05)
    raise AssertionError(f"{http}/metrics has no {sample}: {text[-2000:]}")


class LoggingServer(LmqdServer, Protocol):
    def output_lines(self) -> list[str]: ...


def test_scrapes_and_health_checks_are_not_logged_at_info(lmqd_server: LoggingServer) -> None:
    http = lmqd_server.http_address
    assert http is not None
    for path in ("/metrics", "/ping", "/metrics", "/stats?format=json"):
        urllib.request.urlopen(f"http://{http}{path}", timeout=10).read()
    deadline_lines: list[str] = []
    for _ in range(100):  # the daemon logs from its own process: wait (bounded) for the line
        deadline_lines = lmqd_server.output_lines()
        if any("GET /stats" in line for line in deadline_lines):
            break
        time.sleep(0.05)
    requests = [line for line in deadline_lines if " GET /" in line]
    assert any("GET /stats" in line for line in requests), requests
    assert not [line for line in requests if "GET /metrics" in line or "GET /ping" in line]

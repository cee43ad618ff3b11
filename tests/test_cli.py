"""The ``lmqd`` command line: nsqd's flag syntaxes, config file, errors, logging set-up.

The daemon is replaced by a fake ``lmqd.service`` module (injected into ``sys.modules``; the CLI
imports it lazily) whose ``run_daemon`` records the Options it is given, so these tests check
exactly what the CLI hands to the daemon without opening a socket. Two tests run the real thing
as a subprocess: ``python -m lmqd -version``, and one daemon started with nsqd-style flags on
127.0.0.1 port 0, stopped with SIGTERM (it must exit 0).
"""

from __future__ import annotations

import logging
import re
import socket
import subprocess
import sys
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from lmqd import __version__, cli, logging_setup
from lmqd.options import Options
from tests.support.process import LmqdProcess

WARNING_LINE = re.compile(
    r"^\[lmqd\] \d{4}/\d\d/\d\d \d\d:\d\d:\d\d\.\d{6} WARNING: "
    r"--(?P<flag>[a-z0-9-]+) is accepted for nsqd compatibility and has no effect$"
)


@pytest.fixture(autouse=True)
def _restore_root_logger() -> Iterator[None]:
    # cli.main installs a stderr handler on the root logger; leave the root as it was found.
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


class FakeDaemon:
    """Stands in for ``lmqd.service``: records each ``run_daemon(options)`` call."""

    def __init__(self) -> None:
        self.calls: list[Options] = []
        self.error: OSError | None = None

    def run_daemon(self, options: Options) -> None:
        self.calls.append(options)
        logging.getLogger("lmqd.server").info("TCP: listening on %s", options.tcp_address)
        if self.error is not None:
            raise self.error


@pytest.fixture
def daemon(monkeypatch: pytest.MonkeyPatch) -> FakeDaemon:
    fake = FakeDaemon()
    module = types.ModuleType("lmqd.service")
    module.run_daemon = fake.run_daemon  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "lmqd.service", module)
    return fake


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli.main, list(args), catch_exceptions=False)


@pytest.fixture
def options_for(daemon: FakeDaemon) -> Callable[..., Options]:
    """Run lmqd with these arguments; return the Options it would have started the daemon with."""

    def run(*args: str) -> Options:
        result = invoke(*args)
        assert result.exit_code == 0, result.output
        assert len(daemon.calls) == 1
        return daemon.calls.pop()

    return run


# -- every syntax, every kind --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "field", "value"),
    [
        # string
        (["-tcp-address", "127.0.0.1:5150"], "tcp_address", "127.0.0.1:5150"),
        (["-tcp-address=127.0.0.1:5150"], "tcp_address", "127.0.0.1:5150"),
        (["--tcp-address", "127.0.0.1:5150"], "tcp_address", "127.0.0.1:5150"),
        (["--tcp-address=127.0.0.1:5150"], "tcp_address", "127.0.0.1:5150"),
        (["-http-address="], "http_address", ""),
        (["--log-prefix", "-x- "], "log_prefix", "-x- "),  # a value may start with "-"
        (["--log-prefix=a=b "], "log_prefix", "a=b "),  # only the first "=" splits
        # int
        (["-mem-queue-size", "0"], "mem_queue_size", 0),
        (["-mem-queue-size=123"], "mem_queue_size", 123),
        (["--mem-queue-size", "0x100"], "mem_queue_size", 256),
        (["--mem-queue-size=1_000"], "mem_queue_size", 1000),
        (["--node-id", "5"], "node_id", 5),
        # duration
        (["-msg-timeout", "1m30s"], "msg_timeout", 90.0),
        (["-msg-timeout=1m30s"], "msg_timeout", 90.0),
        (["--msg-timeout", "250ms"], "msg_timeout", 0.25),
        (["--msg-timeout=1.5s"], "msg_timeout", 1.5),
        (["--max-msg-timeout=2h45m"], "max_msg_timeout", 9900.0),
        (["--output-buffer-timeout=300µs"], "output_buffer_timeout", 0.0003),
        (["--min-output-buffer-timeout=0"], "min_output_buffer_timeout", 0.0),
        # bool
        (["-durable"], "durable", True),
        (["--durable"], "durable", True),
        (["-durable=true"], "durable", True),
        (["--durable=1"], "durable", True),
        (["-snappy=false"], "snappy", False),
        (["--snappy=F"], "snappy", False),
        (["--snappy=false", "-snappy"], "snappy", True),  # the last one wins, as in Go
        # repeatable
        (
            ["-lookupd-tcp-address", "a:4160", "--lookupd-tcp-address=b:4160"],
            "nsqlookupd_tcp_addresses",
            ("a:4160", "b:4160"),
        ),
        (["--auth-http-address=http://a/auth"], "auth_http_addresses", ("http://a/auth",)),
        (
            [
                "-e2e-processing-latency-percentile=0.5,0.99",
                "-e2e-processing-latency-percentile",
                "1",
            ],
            "e2e_processing_latency_percentiles",
            (1.0, 0.99, 0.5),
        ),
        # the others
        (["-log-level", "DEBUG"], "log_level", "debug"),
        (["--log-level=warn"], "log_level", "warn"),
        (["-data-path", "/srv/lmq"], "data_path", "/srv/lmq"),
    ],
)
def test_flag_syntaxes_round_trip_into_options(
    options_for: Callable[..., Options], args: list[str], field: str, value: object
) -> None:
    options = options_for(*args)
    assert getattr(options, field) == value
    assert type(getattr(options, field)) is type(value)


def test_nsqd_style_command_line_of_a_test_harness(options_for: Callable[..., Options]) -> None:
    # How gnsq/pynsq-style harnesses start nsqd: single dashes, separate values, bare bools.
    options = options_for(
        "-verbose",
        "-tcp-address=127.0.0.1:4150",
        "-http-address",
        "127.0.0.1:4151",
        "-data-path",
        "/tmp/nsqd-data",
        "-msg-timeout=1m30s",
        "-max-deflate-level=9",
        "-snappy",
        "-deflate",
        "--durable",
    )
    assert options == Options(
        node_id=options.node_id,
        tcp_address="127.0.0.1:4150",
        http_address="127.0.0.1:4151",
        data_path="/tmp/nsqd-data",
        msg_timeout=90.0,
        max_deflate_level=9,
        durable=True,
    )


def test_defaults_are_options_defaults(options_for: Callable[..., Options]) -> None:
    assert options_for() == Options()


# -- config file ---------------------------------------------------------------------------------


def test_config_file_with_flag_precedence(
    options_for: Callable[..., Options], tmp_path: Path
) -> None:
    path = tmp_path / "lmqd.toml"
    path.write_text(
        'tcp_address = "127.0.0.1:6150"\n'
        "mem_queue_size = 50\n"
        'msg_timeout = "2m"\n'
        "sync_timeout = 500\n"  # integer milliseconds, as nsqd's config
        "id = 42\n"
        'nsqlookupd_tcp_addresses = ["l1:4160", "l2:4160"]\n'
        "e2e_processing_latency_percentiles = [0.99, 1.0]\n"
    )
    options = options_for("-config", str(path), "--mem-queue-size=7", "-msg-timeout", "10s")
    assert options.tcp_address == "127.0.0.1:6150"  # config
    assert options.mem_queue_size == 7  # flag over config
    assert options.msg_timeout == 10.0  # flag over config
    assert options.sync_timeout == 0.5
    assert options.node_id == 42
    assert options.nsqlookupd_tcp_addresses == ("l1:4160", "l2:4160")
    assert options.e2e_processing_latency_percentiles == (1.0, 0.99)
    assert options.max_rdy_count == 2500  # default


def test_unknown_config_key_is_an_error_naming_it(daemon: FakeDaemon, tmp_path: Path) -> None:
    path = tmp_path / "lmqd.toml"
    path.write_text("mem_queue_size = 1\nmem_queu_size = 2\n")
    result = invoke(f"--config={path}")
    assert result.exit_code == 1
    assert result.stderr == f"Error: unknown option(s) in {path}: mem_queu_size\n"
    assert daemon.calls == []


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('mem_queue_size = "lots"\n', "invalid value 'lots' for mem_queue_size in {path}: "
         "not an integer"),
        ("tcp_address = 5\n", "invalid value 5 for tcp_address in {path}: want a string"),
        ("msg_timeout = 1.5\n", "invalid value 1.5 for msg_timeout in {path}: want a duration "
         'string such as "1m30s", or integer milliseconds'),
        ("metrics_clients = \"maybe\"\n", "invalid value 'maybe' for metrics_clients in {path}: "
         "not a boolean (true, false, 1, 0, t, f)"),
        ("max_deflate_level = 12\n", "--max-deflate-level must be [1,9]"),
        ('tcp_address = "127.0.0.1:99999"\n', "--tcp-address: "),
        ("x = [\n", "failed to load config file {path} - "),
    ],
)
def test_a_bad_config_value_is_one_line_and_exit_1(
    daemon: FakeDaemon, tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "lmqd.toml"
    path.write_text(text)
    result = invoke("--config", str(path))
    assert result.exit_code == 1
    assert result.stderr.startswith("Error: " + message.format(path=path)), result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.output
    assert daemon.calls == []


def test_unreadable_config_file(daemon: FakeDaemon, tmp_path: Path) -> None:
    result = invoke("--config", str(tmp_path / "nope.toml"))
    assert result.exit_code == 1
    assert result.stderr.startswith(f"Error: failed to load config file {tmp_path}/nope.toml - ")
    assert result.stderr.count("\n") == 1


# -- errors --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max-deflate-level=10"], "--max-deflate-level must be [1,9]"),
        (["-node-id", "1024"], "--node-id must be [0,1024)"),
        (["-msg-timeout=60"], 'invalid value "60" for --msg-timeout: time: missing unit in '
         'duration "60" (a duration needs a unit, e.g. 60s or 60ms)'),
        (["--sync-timeout=1d"], 'invalid value "1d" for --sync-timeout: time: unknown unit "d" '
         'in duration "1d"'),
        (["--mem-queue-size=lots"], 'invalid value "lots" for --mem-queue-size: not an integer'),
        (["--durable=yes"], 'invalid value "yes" for --durable: not a boolean (true, false, 1, 0, '
         "t, f)"),
        (["--msg-timeout=20m"], "--msg-timeout must be <= --max-msg-timeout"),
        (["-e2e-processing-latency-percentile=0"], "invalid E2E processing latency percentile: "
         "0.0"),
        (["--tls-required"], "cannot require TLS client connections without TLS key and cert"),
    ],
)  # fmt: skip
def test_validation_errors_exit_1_with_one_line(
    daemon: FakeDaemon, args: list[str], message: str
) -> None:
    result = invoke(*args)
    assert result.exit_code == 1
    assert result.stderr == f"Error: {message}\n"
    assert result.stdout == ""
    assert daemon.calls == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-foo"], "No such option '-foo'"),
        (["--statsd-adress=x:1"], "No such option '--statsd-adress'"),
        (["-Snappy"], "No such option '-Snappy'"),
        (["stray"], "unexpected extra argument (stray)"),
        (["-snappy", "false"], "bool flag -snappy takes its value after '=': use --snappy=false"),
        (["-msg-timeout"], "flag needs an argument: -msg-timeout"),
    ],
)
def test_usage_errors_exit_2(daemon: FakeDaemon, args: list[str], message: str) -> None:
    result = invoke(*args)
    assert result.exit_code == 2
    assert message in result.stderr
    assert daemon.calls == []


def test_misspelt_flag_gets_a_suggestion(daemon: FakeDaemon) -> None:
    result = invoke("--statsd-adress=x:1")
    assert "Did you mean '--statsd-address'?" in result.stderr


def test_listen_failure_exits_1_with_a_fatal_log_line(daemon: FakeDaemon) -> None:
    daemon.error = OSError(98, "Address already in use")
    result = invoke("--tcp-address=127.0.0.1:4150")
    assert result.exit_code == 1
    last = result.stderr.splitlines()[-1]
    assert re.fullmatch(
        r"\[lmqd\] \S+ \S+ FATAL: failed to start: \[Errno 98\] Address already in use", last
    )


# -- version and help ----------------------------------------------------------------------------


@pytest.mark.parametrize("flag", ["--version", "-version", "-version=true"])
def test_version(daemon: FakeDaemon, flag: str) -> None:
    result = invoke(flag)
    assert result.exit_code == 0
    assert result.stdout == "nsqd v1.3.0 (built w/lmq-0.1.0)\n"
    assert daemon.calls == []


HARNESS_VERSION = re.compile(r"(\w+) v(\d+\.\d+\.\d+) \(built w/([a-z0-9.-]+)\)")
"""How test harnesses (gnsq's integration server among them) read a daemon's version line:
``NAME vX.Y.Z (built w/TOKEN)``, the token without spaces (nsqd's is ``go1.19.8``)."""


def test_version_line_parses_as_harnesses_parse_it(daemon: FakeDaemon) -> None:
    match = HARNESS_VERSION.fullmatch(invoke("--version").stdout.rstrip("\n"))
    assert match is not None
    assert match.groups() == ("nsqd", "1.3.0", f"lmq-{__version__}")


def test_version_false_is_not_a_request(options_for: Callable[..., Options]) -> None:
    options_for("-version=false")


def test_version_as_a_module_subprocess() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "lmqd", "-version"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert (proc.returncode, proc.stdout, proc.stderr) == (
        0,
        "nsqd v1.3.0 (built w/lmq-0.1.0)\n",
        "",
    )


@pytest.mark.parametrize("flag", ["--help", "-help", "-h"])
def test_help_lists_flags_with_nsqd_defaults(daemon: FakeDaemon, flag: str) -> None:
    result = invoke(flag)
    assert result.exit_code == 0
    text = " ".join(result.stdout.split())  # undo click's line wrapping
    assert "--msg-timeout DURATION" in text
    assert "[default: 1m0s]" in text
    assert "[default: 0.0.0.0:4150]" in text
    assert '[default: "[lmqd] "]' in text
    assert "--statsd-address TEXT UDP <addr>:<port> of a statsd daemon" in text
    assert daemon.calls == []


# -- startup warnings and the log format ---------------------------------------------------------


def test_inert_flags_warn_once_each_only_when_not_default(daemon: FakeDaemon) -> None:
    result = invoke(
        "-queue-scan-selection-count=30",
        "-queue-scan-worker-pool-max=4",  # the default: no warning
        "-snappy",  # the default: no warning
        "-verbose",
        "-lookupd-tcp-address=a:4160",
        "-lookupd-tcp-address=b:4160",
    )
    assert result.exit_code == 0, result.output
    warned = [m.group("flag") for m in map(WARNING_LINE.match, result.stderr.splitlines()) if m]
    # --lookupd-tcp-address and the statsd flags take effect
    assert warned == ["verbose", "queue-scan-selection-count"]


def test_log_lines_use_nsqd_format_prefix_and_level(daemon: FakeDaemon) -> None:
    result = invoke("--tcp-address=127.0.0.1:4150", "--log-prefix=[nsqd] ")
    assert result.exit_code == 0
    stamp = r"\[nsqd\] \d{4}/\d\d/\d\d \d\d:\d\d:\d\d\.\d{6} INFO: "
    # nsqd's first line is its version, then the listeners.
    assert re.fullmatch(
        stamp + r"nsqd v1\.3\.0 \(built w/lmq-0\.1\.0\)\n"
        + stamp + r"TCP: listening on 127.0.0.1:4150\n",
        result.stderr,
    )


def test_log_level_filters(daemon: FakeDaemon) -> None:
    result = invoke("--log-level=error", "-verbose")
    assert result.exit_code == 0
    assert result.stderr == ""  # neither the warning nor the INFO line


def test_formatter_exact_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    try:
        formatter = logging_setup.NsqdFormatter("[lmqd] ")
        expected = {
            logging.DEBUG: "DEBUG",
            logging.INFO: "INFO",
            logging.WARNING: "WARNING",
            logging.ERROR: "ERROR",
            logging.CRITICAL: "FATAL",
        }
        for level, name in expected.items():
            record = logging.LogRecord(
                "lmqd.server", level, __file__, 1, "TCP: listening on %s", ("127.0.0.1:4150",),
                None,
            )  # fmt: skip
            record.created = 1700000000.123456
            assert formatter.format(record) == (
                f"[lmqd] 2023/11/14 22:13:20.123456 {name}: TCP: listening on 127.0.0.1:4150"
            )
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()


def test_formatter_appends_the_traceback() -> None:
    formatter = logging_setup.NsqdFormatter("")
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        record = logging.LogRecord("lmqd", logging.ERROR, __file__, 1, "bad", (), sys.exc_info())
    first, *rest = formatter.format(record).splitlines()
    assert first.endswith(" ERROR: bad")
    assert rest[0] == "Traceback (most recent call last):"
    assert rest[-1] == "RuntimeError: boom"


def test_configure_replaces_its_handler_and_set_level(capsys: pytest.CaptureFixture[str]) -> None:
    logging_setup.configure(Options(log_level="warn", log_prefix="[a] "))
    handler = logging_setup.configure(Options(log_level="info", log_prefix="[b] "))
    root = logging.getLogger()
    assert [h for h in root.handlers if type(h) is type(handler)] == [handler]
    log = logging.getLogger("lmqd.test")
    log.info("one")
    logging_setup.set_level("error")
    log.warning("two")
    log.error("three")
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(" ", 1)[0] + " " + line.split(" ", 3)[3] for line in lines] == [
        "[b] INFO: one",
        "[b] ERROR: three",
    ]
    with pytest.raises(ValueError, match="invalid log level 'loud'"):
        logging_setup.set_level("loud")


def test_real_daemon_started_with_nsqd_flags(tmp_path: Path) -> None:
    args = [
        *("-tcp-address", "127.0.0.1:0", "-http-address=127.0.0.1:0"),
        *("-data-path", str(tmp_path), "-msg-timeout", "1m30s", "-snappy"),
        *("-queue-scan-selection-count=30", "--log-prefix=[nsqd] "),
    ]
    server = LmqdProcess(tmp_path, args, bare=True)
    try:
        server.wait_started()
    finally:
        server.terminate()
    returncode = server.process.returncode
    lines = server.output_lines()
    assert returncode == 0, lines
    stamp = r"\d{4}/\d\d/\d\d \d\d:\d\d:\d\d\.\d{6}"
    assert any(
        re.fullmatch(rf"\[nsqd\] {stamp} INFO: TCP: listening on 127\.0\.0\.1:\d+", line)
        for line in lines
    ), lines
    warning = (
        "WARNING: --queue-scan-selection-count is accepted for nsqd compatibility and has no effect"
    )
    assert [line.split(" ", 3)[3] for line in lines if "WARNING:" in line] == [warning]
    assert "Traceback" not in server.output()


# -- what a user can get wrong: one line, an exit code, never a traceback (issue 17) -----------


def _lmqd(tmp_path: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lmqd", f"--data-path={tmp_path / 'data'}", *flags],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        stdin=subprocess.DEVNULL,
    )


def _one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [
        line for line in proc.stderr.splitlines() if "Error:" in line or "FATAL:" in line
    ]
    assert len(errors) == 1, proc.stderr
    return errors[0]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ("--tcp-address=127.0.0.1:99999",),
            "Error: --tcp-address: invalid address '127.0.0.1:99999': port 99999 is out of range",
        ),
        (("--tcp-address=localhost",), "Error: --tcp-address: invalid address 'localhost'"),
        (("--http-address=::1:4151",), "an IPv6 host needs brackets"),
        (("--https-address=127.0.0.1:x",), "Error: --https-address: invalid address"),
    ],
)
def test_a_bad_listen_address_is_one_line_and_exit_1(
    tmp_path: Path, flags: tuple[str, ...], message: str
) -> None:
    proc = _lmqd(tmp_path, *flags)
    assert proc.returncode == 1
    assert message in _one_error_line(proc)


def test_an_address_in_use_is_named(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        proc = _lmqd(tmp_path, f"--tcp-address={address}", "--http-address=")
    assert proc.returncode == 1
    line = _one_error_line(proc)
    assert f"TCP listen ({address}) failed - Address already in use" in line


def test_an_http_address_in_use_is_named(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        proc = _lmqd(tmp_path, "--tcp-address=127.0.0.1:0", f"--http-address={address}")
    assert proc.returncode == 1
    assert f"HTTP listen ({address}) failed - Address already in use" in _one_error_line(proc)


def test_a_data_path_that_is_a_file_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "data").write_text("not a directory")
    proc = _lmqd(tmp_path, "--tcp-address=127.0.0.1:0", "--http-address=")
    assert proc.returncode == 1
    assert "--data-path" in _one_error_line(proc) and "not a directory" in proc.stderr

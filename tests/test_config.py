"""lmqd.config: Go value syntaxes, config-file loading, resolution onto Options, the settings table.

No I/O beyond tmp_path files; no network. Expected values come from Go's documented behaviour
(time.ParseDuration, strconv.ParseInt base 0, strconv.ParseBool, go-options' coercions).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import attrs
import pytest

from lmqd import config
from lmqd.config import ConfigError, Kind, resolve
from lmqd.options import Options

DOCS = Path(__file__).resolve().parent.parent / "docs" / "operations.md"


# -- durations -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "ns"),
    [
        ("0", 0),
        ("-0", 0),
        ("1m0s", 60_000_000_000),
        ("60s", 60_000_000_000),
        ("1m30s", 90_000_000_000),
        ("250ms", 250_000_000),
        ("1h", 3_600_000_000_000),
        ("1.5s", 1_500_000_000),
        ("2h45m", 9_900_000_000_000),
        ("300us", 300_000),
        ("300µs", 300_000),  # U+00B5 micro sign
        ("300μs", 300_000),  # U+03BC greek mu
        ("15ns", 15),
        (".5s", 500_000_000),
        ("1.s", 1_000_000_000),
        ("+5s", 5_000_000_000),
        ("-1.5h", -5_400_000_000_000),
        ("1h1m1s1ms1us1ns", 3_661_001_001_001),
        ("0.000000001s", 1),
        ("0.0000000019s", 1),  # Go truncates below a nanosecond
        ("2562047h47m16.854775807s", 2**63 - 1),  # the largest Go duration
    ],
)
def test_parse_duration_matches_go(text: str, ns: int) -> None:
    assert config.parse_duration_ns(text) == ns
    assert config.parse_duration(text) == ns / 1e9


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("60", 'time: missing unit in duration "60"'),
        ("", 'time: invalid duration ""'),
        ("-", 'time: invalid duration "-"'),
        ("s", 'time: invalid duration "s"'),
        (".s", 'time: invalid duration ".s"'),
        ("1d", 'time: unknown unit "d" in duration "1d"'),
        ("1 s", 'time: unknown unit " s" in duration "1 s"'),
        ("1.2.3s", 'time: missing unit in duration "1.2.3s"'),
        ("2562047h47m16.854775808s", 'time: invalid duration "2562047h47m16.854775808s"'),
    ],
)
def test_parse_duration_rejects_like_go(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        config.parse_duration(text)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.0, "0s"),
        (60.0, "1m0s"),
        (90.0, "1m30s"),
        (900.0, "15m0s"),
        (3600.0, "1h0m0s"),
        (9900.0, "2h45m0s"),
        (2.0, "2s"),
        (1.5, "1.5s"),
        (0.25, "250ms"),
        (0.025, "25ms"),
        (0.0003, "300µs"),
        (0.0000015, "1.5µs"),
        (15e-9, "15ns"),
        (-90.0, "-1m30s"),
    ],
)
def test_format_duration_is_gos_string(seconds: float, text: str) -> None:
    assert config.format_duration(seconds) == text
    assert config.parse_duration(text) == pytest.approx(seconds)


# -- integers and booleans -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("0", 0),
        ("10000", 10000),
        ("+7", 7),
        ("-1", -1),
        ("0x10", 16),
        ("0X1f", 31),
        ("0o17", 15),
        ("017", 15),  # Go: a leading 0 is octal
        ("0b101", 5),
        ("1_000_000", 1_000_000),
        ("9223372036854775807", 2**63 - 1),
    ],
)
def test_parse_int_is_go_base_zero(text: str, value: int) -> None:
    assert config.parse_int(text) == value


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "not an integer"),
        ("abc", "not an integer"),
        (" 5", "not an integer"),
        ("1.5", "not an integer"),
        ("08", "not an integer"),
        ("1__0", "not an integer"),
        ("9223372036854775808", "value out of range"),
    ],
)
def test_parse_int_rejects(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=f"^{message}$"):
        config.parse_int(text)


@pytest.mark.parametrize("text", ["1", "t", "T", "TRUE", "true", "True"])
def test_parse_bool_true(text: str) -> None:
    assert config.parse_bool(text) is True


@pytest.mark.parametrize("text", ["0", "f", "F", "FALSE", "false", "False"])
def test_parse_bool_false(text: str) -> None:
    assert config.parse_bool(text) is False


@pytest.mark.parametrize("text", ["yes", "no", "on", "tRUE", "", "2"])
def test_parse_bool_rejects_what_go_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="not a boolean"):
        config.parse_bool(text)


# -- resolution: flags, config, defaults ---------------------------------------------------------


def test_no_flags_no_config_gives_options_defaults() -> None:
    resolved = resolve({})
    assert resolved.options == Options()
    assert resolved.inert == ()
    assert resolved.warnings() == []


def test_flag_beats_config_beats_default() -> None:
    file = {"mem_queue_size": 5, "msg_timeout": "30s", "max_rdy_count": 10}
    options = resolve({"mem-queue-size": "7"}, file).options
    assert options.mem_queue_size == 7  # flag
    assert options.msg_timeout == 30.0  # config
    assert options.max_rdy_count == 10  # config
    assert options.sync_every == 2500  # default


def test_repeatable_flag_replaces_the_config_list() -> None:
    file = {"nsqlookupd_tcp_addresses": ["a:4160", "b:4160"]}
    assert resolve({}, file).options.nsqlookupd_tcp_addresses == ("a:4160", "b:4160")
    options = resolve({"lookupd-tcp-address": ("c:4160",)}, file).options
    assert options.nsqlookupd_tcp_addresses == ("c:4160",)


def test_unknown_config_keys_are_named() -> None:
    with pytest.raises(ConfigError, match=r"^unknown option\(s\) in my.toml: bogus, mem_queue$"):
        resolve({}, {"mem_queue": 1, "bogus": True, "sync_every": 1}, source="my.toml")


def test_flag_only_names_are_not_config_keys() -> None:
    # nsqd's renamed keys: the underscored flag name is not a key for them.
    with pytest.raises(ConfigError, match="lookupd_tcp_address"):
        resolve({}, {"lookupd_tcp_address": ["a:4160"]})
    with pytest.raises(ConfigError, match="version"):
        resolve({}, {"version": True})


def test_node_id_key_is_nsqds_id_or_node_id() -> None:
    assert resolve({}, {"id": 5}).options.node_id == 5
    assert resolve({}, {"node_id": 6}).options.node_id == 6
    with pytest.raises(ConfigError, match=r"^id and node_id in config file set the same option$"):
        resolve({}, {"id": 5, "node_id": 6})


def test_config_durations_are_go_strings_or_integer_milliseconds() -> None:
    options = resolve({}, {"msg_timeout": "1m30s", "sync_timeout": 1500}).options
    assert options.msg_timeout == 90.0
    assert options.sync_timeout == 1.5
    with pytest.raises(ConfigError, match="integer milliseconds"):
        resolve({}, {"sync_timeout": 1.5})
    with pytest.raises(ConfigError, match=r"^invalid value '60' for msg_timeout in config file"):
        resolve({}, {"msg_timeout": "60"})


def test_config_value_types() -> None:
    file: dict[str, Any] = {
        "tcp_address": "127.0.0.1:5150",
        "mem_queue_size": "0x100",  # go-options parses strings as the flag would
        "durable": "true",
        "snappy": False,
        "tls_required": False,
        "auth_http_addresses": "a:1,b:2",  # go-options splits a string on commas
        "e2e_processing_latency_percentiles": [0.5, 1, 0.99],
        "log_level": "DEBUG",
    }
    options = resolve({}, file).options
    assert options.tcp_address == "127.0.0.1:5150"
    assert options.mem_queue_size == 256
    assert options.durable is True
    assert options.snappy is False
    assert options.auth_http_addresses == ("a:1", "b:2")
    assert options.e2e_processing_latency_percentiles == (1.0, 0.99, 0.5)
    assert options.log_level == "debug"


@pytest.mark.parametrize(
    ("key", "value", "want"),
    [
        ("tcp_address", 4150, "want a string"),
        ("mem_queue_size", 1.5, "want a int"),
        ("durable", 1, "want a bool"),
        ("nsqlookupd_tcp_addresses", [1, 2], "want a list of strings"),
        ("e2e_processing_latency_percentiles", ["0.5"], "want a list of numbers"),
    ],
)
def test_config_type_errors_name_the_key(key: str, value: object, want: str) -> None:
    with pytest.raises(ConfigError, match=f"for {key} in config file: {want}"):
        resolve({}, {key: value})


def test_percentiles_flag_is_repeatable_and_comma_separated_sorted_like_nsqd() -> None:
    flags = {"e2e-processing-latency-percentile": ("0.5,0.99", "1.0")}
    assert resolve(flags).options.e2e_processing_latency_percentiles == (1.0, 0.99, 0.5)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"max-deflate-level": "10"}, "--max-deflate-level must be [1,9]"),
        ({"max-deflate-level": "0"}, "--max-deflate-level must be [1,9]"),
        ({"node-id": "1024"}, "--node-id must be [0,1024)"),
        ({"node-id": "-1"}, "--node-id must be [0,1024)"),
        ({"e2e-processing-latency-percentile": ("1.5",)}, "invalid E2E processing latency "),
        ({"msg-timeout": "16m"}, "--msg-timeout must be <= --max-msg-timeout"),
        (
            {"tls-required": "true"},
            "cannot require TLS client connections without TLS key and cert",
        ),
        ({"auth-http-request-method": "put"}, "--auth-http-request-method must be post or get"),
        ({"log-level": "loud"}, "invalid log level 'loud' (debug, info, warn, error, fatal)"),
        ({"tls-min-version": "ssl3.0"}, 'unknown tlsVersionOption "ssl3.0"'),
        ({"msg-timeout": "90"}, 'missing unit in duration "90" (a duration needs a unit, e.g. 90s'),
        ({"sync-every": "many"}, 'invalid value "many" for --sync-every: not an integer'),
        ({"durable": "yes"}, 'invalid value "yes" for --durable: not a boolean'),
        ({"overflow": "drop_newest"}, "--overflow must be reject or drop_oldest"),
        ({"max-depth": "-1"}, "--max-depth must be >= 0"),
        ({"publish-rate": "-5"}, "--publish-rate must be >= 0"),
    ],
)
def test_validation_errors(flags: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        resolve(flags)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_nsqd_start_up_rules() -> None:
    # A client-auth policy implies --tls-required (nsqd.New), which then needs a cert and key.
    with pytest.raises(ConfigError, match="without TLS key and cert"):
        resolve({"tls-client-auth-policy": "require"})
    tls = {"tls-cert": "c.pem", "tls-key": "k.pem"}
    assert resolve({**tls, "tls-client-auth-policy": "require"}).options.tls_required == "true"
    assert resolve({**tls, "tls-required": "TCP-HTTPS"}).options.tls_required == "tcp-https"
    assert resolve({**tls, "tls-required": "1"}).options.tls_required == "true"
    assert resolve({"auth-http-request-method": "post"}).options.auth_http_request_method == "post"


def test_empty_data_path_means_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert resolve({"data-path": ""}).options.data_path == os.getcwd()
    assert resolve({"data-path": "/var/lib/lmq"}).options.data_path == "/var/lib/lmq"


@pytest.mark.parametrize(("given", "limit"), [("-1", 0), ("-10000", 0), ("0", 0), ("7", 7)])
def test_negative_mem_queue_size_starts_as_nsqd_starts_and_means_0(given: str, limit: int) -> None:
    # nsqd v1.3.0 takes any int64 and reports it at /config/mem_queue_size; its channels keep
    # a memory queue only for a size > 0 (its topics panic on a negative one).
    resolved = resolve({"mem-queue-size": given})
    assert (resolved.options.mem_queue_size, resolved.options.mem_queue_limit) == (
        int(given), limit
    )
    warned = [w for w in resolved.warnings() if "--mem-queue-size" in w]
    assert warned == (
        [f"--mem-queue-size={given} keeps no message in memory, as 0 does (nsqd v1.3.0 starts "
         "with it but cannot create a topic)"] if int(given) < 0 else []
    )  # fmt: skip


def test_inert_settings_warn_only_when_not_default() -> None:
    resolved = resolve(
        {"queue-scan-selection-count": "30", "snappy": "true", "verbose": "true"},
        {"queue_scan_worker_pool_max": 4, "max_deflate_level": 9},
    )
    assert resolved.warnings() == [
        "--verbose is accepted for nsqd compatibility and has no effect",
        "--queue-scan-selection-count is accepted for nsqd compatibility and has no effect",
    ]
    assert resolved.options.queue_scan_selection_count == 30
    assert resolved.extras == {"verbose": True}


def test_settings_without_an_options_field_land_in_extras() -> None:
    resolved = resolve(
        {"enable-experiment": ("topology-aware-consumption",), "topology-zone": "z1"},
        {"worker_id": True},
    )
    assert resolved.extras == {
        "enable-experiment": ("topology-aware-consumption",),
        "topology-zone": "z1",
        "worker-id": True,
    }
    assert [s.flag for s in resolved.inert] == ["worker-id", "topology-zone", "enable-experiment"]


# -- config files --------------------------------------------------------------------------------


def test_load_toml(tmp_path: Path) -> None:
    path = tmp_path / "lmqd.toml"
    path.write_text('mem_queue_size = 10\nmsg_timeout = "2m"\nid = 3\n')
    assert config.load_toml(path) == {"mem_queue_size": 10, "msg_timeout": "2m", "id": 3}


def test_load_toml_errors_are_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "missing.toml"
    with pytest.raises(ConfigError, match=f"^failed to load config file {missing} - "):
        config.load_toml(missing)
    bad = tmp_path / "bad.toml"
    bad.write_text("mem_queue_size = = 1\n")
    with pytest.raises(ConfigError, match=f"^failed to load config file {bad} - "):
        config.load_toml(bad)


# nsqd's contrib/nsqd.cfg.example (percentiles as 1.3.0 requires them, in (0,1]).
NSQD_EXAMPLE_CFG = """
verbose = false
# id = 5150
tcp_address = "0.0.0.0:4150"
http_address = "0.0.0.0:4151"
# https_address = "0.0.0.0:4152"
nsqlookupd_tcp_addresses = [
    "127.0.0.1:4160"
]
http_client_connect_timeout = "2s"
http_client_request_timeout = "5s"
mem_queue_size = 10000
max_bytes_per_file = 104857600
sync_every = 2500
sync_timeout = "2s"
msg_timeout = "60s"
max_msg_timeout = "15m"
max_msg_size = 1024768
max_req_timeout = "1h"
max_body_size = 5123840
max_heartbeat_interval = "60s"
max_rdy_count = 2500
max_output_buffer_size = 65536
max_output_buffer_timeout = "1s"
statsd_prefix = "nsq.%s"
statsd_interval = "60s"
statsd_mem_stats = true
e2e_processing_latency_percentiles = [
    1.0,
    0.99,
    0.95
]
e2e_processing_latency_window_time = "10m"
tls_cert = ""
tls_key = ""
tls_required = false
tls_min_version = ""
deflate = true
max_deflate_level = 6
snappy = true
"""


def test_nsqds_example_config_file_loads(tmp_path: Path) -> None:
    path = tmp_path / "nsqd.cfg"
    path.write_text(NSQD_EXAMPLE_CFG)
    resolved = resolve({}, config.load_toml(path), source=str(path))
    options = resolved.options
    assert options.max_msg_size == 1024768
    assert options.max_output_buffer_timeout == 1.0
    assert options.max_msg_timeout == 900.0
    assert options.tls_min_version == "tls1.0"
    assert options.e2e_processing_latency_percentiles == (1.0, 0.99, 0.95)
    assert resolved.warnings() == []  # its lookupd addresses take effect


# -- the table itself ----------------------------------------------------------------------------

# Options fields that nsqd has no flag for (nsqd's ClientTimeout): not settable from the CLI.
NOT_SETTINGS = {"client_timeout"}


def test_every_options_field_has_exactly_one_setting() -> None:
    fields = [s.field for s in config.SETTINGS if s.field is not None]
    assert len(fields) == len(set(fields))
    assert set(fields) == {a.name for a in attrs.fields(Options)} - NOT_SETTINGS


def test_flags_and_config_keys_are_unique() -> None:
    flags = [s.flag for s in config.SETTINGS]
    keys = [k for s in config.SETTINGS for k in s.config_keys]
    assert len(flags) == len(set(flags))
    assert len(keys) == len(set(keys))


def test_settings_without_a_field_are_inert_and_have_defaults() -> None:
    for s in config.SETTINGS:
        if s.field is None:
            assert s.inert, s.flag
            assert s.default is not None, s.flag


def test_setting_kinds_match_options_types() -> None:
    want = {
        Kind.STRING: str,
        Kind.INT: int,
        Kind.FLOAT: float,
        Kind.DURATION: float,
        Kind.BOOL: bool,
        Kind.STRING_LIST: tuple,
        Kind.FLOAT_LIST: tuple,
        Kind.LOG_LEVEL: str,
        Kind.TLS_REQUIRED: str,
        Kind.TLS_MIN_VERSION: str,
    }
    defaults = Options()
    for s in config.SETTINGS:
        value = config.default_value(s, defaults)
        assert type(value) is want[s.kind], s.flag


def test_operations_doc_lists_every_flag_and_marks_the_inert_ones() -> None:
    rows = {}
    for line in DOCS.read_text().splitlines():
        m = re.match(r"\| `--([a-z0-9-]+)` \|", line)
        if m:
            rows[m.group(1)] = line
    assert set(rows) == {s.flag for s in config.SETTINGS} | {"config", "version"}
    for s in config.SETTINGS:
        assert ("**inert**" in rows[s.flag]) == bool(s.inert), s.flag


def test_topic_policy_defaults_from_flags_and_config() -> None:
    file = {"max_depth": 100, "overflow": "drop_oldest", "dedup_window_ms": 300_000}
    options = resolve({"publish-rate": "50", "publish-burst": "80"}, file).options
    assert (options.max_depth, options.overflow, options.dedup_window_ms) == (
        100, "drop_oldest", 300_000,
    )
    assert (options.publish_rate, options.publish_burst) == (50, 80)
    assert resolve({}).options.overflow == "reject"


def test_at_rest_settings_from_flags_and_config() -> None:
    file = {"compression": "lz4", "encryption_key_files": ["/keys/old"], "rewrite_at_rest": True}
    options = resolve({}, file).options
    assert (options.compression, options.encryption_key_files, options.rewrite_at_rest) == (
        "lz4", ("/keys/old",), True,
    )
    flags = {"encryption-key-file": ["/keys/new", "/keys/old"], "compression": "zstd:9",
             "encryption-cipher": "chacha20-poly1305"}  # fmt: skip
    options = resolve(flags, file).options
    assert options.encryption_key_files == ("/keys/new", "/keys/old")  # the first seals
    assert (options.compression, options.encryption_cipher) == ("zstd:9", "chacha20-poly1305")
    defaults = resolve({}).options
    assert (defaults.compression, defaults.encryption_key_files) == ("none", ())

"""IDENTIFY: Go-compatible JSON decoding, nsqd's per-field validation, and the JSON response."""

from __future__ import annotations

import json
from typing import Any

import pytest

from lmqd.options import Options
from lmqd.protocol import (
    IdentifySettings,
    Limits,
    ProtocolError,
    decode_identify_body,
    default_settings,
    identify_response,
    negotiate,
)

from .feeding import parse_error, server, sized

LIMITS = Limits()


def settings(data: dict[str, Any], limits: Limits = LIMITS) -> IdentifySettings:
    return negotiate(data, limits)


def invalid(data: dict[str, Any], limits: Limits = LIMITS) -> str:
    with pytest.raises(ProtocolError) as info:
        negotiate(data, limits)
    assert info.value.code == "E_BAD_BODY"
    return info.value.text


def test_defaults() -> None:
    s = settings({})
    assert s == default_settings(LIMITS)
    assert s.heartbeat_interval_ms == 30000
    assert s.output_buffer_size == 16384
    assert s.output_buffer_timeout_ms == 250
    assert s.msg_timeout_ms == 60000
    assert s.sample_rate == 0
    assert (s.feature_negotiation, s.tls_v1, s.deflate, s.snappy) == (False,) * 4


@pytest.mark.parametrize(
    ("value", "effective"),
    [(-1, 0), (0, 30000), (1000, 1000), (60000, 60000)],
)
def test_heartbeat_interval(value: int, effective: int) -> None:
    assert settings({"heartbeat_interval": value}).heartbeat_interval_ms == effective


@pytest.mark.parametrize("value", [-2, 1, 999, 60001])
def test_heartbeat_interval_invalid(value: int) -> None:
    assert (
        invalid({"heartbeat_interval": value})
        == f"IDENTIFY heartbeat interval ({value}) is invalid"
    )


@pytest.mark.parametrize(
    ("value", "effective"),
    [(-1, 0), (0, 250), (25, 25), (30000, 30000)],
)
def test_output_buffer_timeout(value: int, effective: int) -> None:
    assert settings({"output_buffer_timeout": value}).output_buffer_timeout_ms == effective


@pytest.mark.parametrize("value", [-2, 1, 24, 30001])
def test_output_buffer_timeout_invalid(value: int) -> None:
    expected = f"IDENTIFY output buffer timeout ({value}) is invalid"
    assert invalid({"output_buffer_timeout": value}) == expected


@pytest.mark.parametrize(
    ("value", "size", "timeout"),
    [(-1, 1, 0), (0, 16384, 250), (64, 64, 250), (65536, 65536, 250)],
)
def test_output_buffer_size(value: int, size: int, timeout: int) -> None:
    s = settings({"output_buffer_size": value})
    assert (s.output_buffer_size, s.output_buffer_timeout_ms) == (size, timeout)


@pytest.mark.parametrize("value", [-2, 1, 63, 65537])
def test_output_buffer_size_invalid(value: int) -> None:
    assert (
        invalid({"output_buffer_size": value})
        == f"IDENTIFY output buffer size ({value}) is invalid"
    )


def test_unbuffered_overrides_a_requested_timeout() -> None:
    s = settings({"output_buffer_size": -1, "output_buffer_timeout": 100})
    assert (s.output_buffer_size, s.output_buffer_timeout_ms) == (1, 0)


@pytest.mark.parametrize("value", [0, 1, 99])
def test_sample_rate(value: int) -> None:
    assert settings({"sample_rate": value}).sample_rate == value


@pytest.mark.parametrize("value", [-1, 100])
def test_sample_rate_invalid(value: int) -> None:
    assert invalid({"sample_rate": value}) == f"IDENTIFY sample rate ({value}) is invalid"


@pytest.mark.parametrize(("value", "effective"), [(0, 60000), (1000, 1000), (900000, 900000)])
def test_msg_timeout(value: int, effective: int) -> None:
    assert settings({"msg_timeout": value}).msg_timeout_ms == effective


@pytest.mark.parametrize("value", [-1, 999, 900001])
def test_msg_timeout_invalid(value: int) -> None:
    assert invalid({"msg_timeout": value}) == f"IDENTIFY msg timeout ({value}) is invalid"


def test_fields_are_checked_in_nsqd_order() -> None:
    everything_bad = {
        "msg_timeout": 1,
        "sample_rate": 100,
        "output_buffer_size": 1,
        "output_buffer_timeout": 1,
        "heartbeat_interval": 1,
    }
    order = ["heartbeat_interval", "output_buffer_timeout", "output_buffer_size", "sample_rate"]
    expected = [
        "heartbeat interval (1)",
        "output buffer timeout (1)",
        "output buffer size (1)",
        "sample rate (100)",
        "msg timeout (1)",
    ]
    data = dict(everything_bad)
    for field, text in zip([*order, "msg_timeout"], expected, strict=True):
        assert invalid(data) == f"IDENTIFY {text} is invalid"
        del data[field]


def test_limits_come_from_the_limits() -> None:
    limits = Limits(
        max_heartbeat_interval_ms=5000,
        max_output_buffer_size=1000,
        min_output_buffer_timeout_ms=10,
        max_output_buffer_timeout_ms=100,
        max_msg_timeout_ms=2000,
        default_heartbeat_interval_ms=4000,
        msg_timeout_ms=1500,
        output_buffer_timeout_ms=50,
    )
    s = settings({"output_buffer_timeout": 10, "output_buffer_size": 1000}, limits)
    assert (s.output_buffer_timeout_ms, s.output_buffer_size) == (10, 1000)
    assert (s.heartbeat_interval_ms, s.msg_timeout_ms) == (4000, 1500)
    assert invalid({"heartbeat_interval": 5001}, limits).endswith("(5001) is invalid")
    assert invalid({"msg_timeout": 2001}, limits).endswith("(2001) is invalid")
    assert invalid({"output_buffer_timeout": 101}, limits).endswith("(101) is invalid")
    assert invalid({"output_buffer_size": 1001}, limits).endswith("(1001) is invalid")


def test_identity_fields() -> None:
    s = settings({"client_id": "c", "hostname": "h", "user_agent": "ua/1", "short_id": "legacy"})
    assert (s.client_id, s.hostname, s.user_agent) == ("c", "h", "ua/1")


def test_lone_surrogates_become_replacement_characters() -> None:
    # Go strings cannot hold an unpaired surrogate; its decoder substitutes U+FFFD.
    data = decode_identify_body(b'{"client_id": "a\\ud800b", "hostname": "\\ud83d\\ude00"}')
    s = settings(data)
    assert s.client_id == "a\ufffdb"
    assert s.hostname == "\U0001f600"


# -- compression and TLS negotiation ---------------------------------------------------------------

OFFERS_ALL = Limits(deflate_available=True, snappy_available=True, tls_available=True)


def test_nothing_is_negotiated_without_feature_negotiation() -> None:
    s = settings({"tls_v1": True, "deflate": True, "snappy": True}, OFFERS_ALL)
    assert (s.tls_v1, s.deflate, s.snappy) == (False, False, False)


def test_nothing_is_negotiated_when_not_offered() -> None:
    offers_none = Limits(deflate_available=False, snappy_available=False)
    s = settings(
        {"feature_negotiation": True, "tls_v1": True, "deflate": True, "snappy": True},
        offers_none,
    )
    assert (s.tls_v1, s.deflate, s.snappy) == (False, False, False)


def test_offered_upgrades_are_negotiated() -> None:
    s = settings({"feature_negotiation": True, "tls_v1": True, "snappy": True}, OFFERS_ALL)
    assert (s.tls_v1, s.deflate, s.snappy) == (True, False, True)


def test_deflate_and_snappy_together_fail() -> None:
    with pytest.raises(ProtocolError) as info:
        settings({"feature_negotiation": True, "deflate": True, "snappy": True}, OFFERS_ALL)
    assert info.value.body == b"E_IDENTIFY_FAILED cannot enable both deflate and snappy compression"


@pytest.mark.parametrize(
    ("requested", "max_level", "deflate", "effective"),
    [
        (0, 6, True, 6),  # 0 asks for the default, 6
        (3, 6, True, 3),
        (9, 6, True, 6),  # clamped to --max-deflate-level
        (9, 9, True, 9),
        (-1, 6, True, 6),
        (3, 6, False, 6),  # a level without deflate is ignored
        (0, 4, False, 4),  # the default is clamped too
    ],
)
def test_deflate_level(requested: int, max_level: int, deflate: bool, effective: int) -> None:
    limits = Limits(deflate_available=True, max_deflate_level=max_level)
    data = {"feature_negotiation": True, "deflate": deflate, "deflate_level": requested}
    assert settings(data, limits).deflate_level == effective


# -- JSON decoding as Go does it -------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        b"{",
        b"",
        b"[]",
        b"1",
        b'"x"',
        b"true",
        b"{} {}",
        b"{'a': 1}",
        b'{"heartbeat_interval": 1.5}',
        b'{"heartbeat_interval": 1000.0}',
        b'{"heartbeat_interval": 1e3}',
        b'{"heartbeat_interval": "1000"}',
        b'{"heartbeat_interval": true}',
        b'{"heartbeat_interval": 9223372036854775808}',
        b'{"sample_rate": 2147483648}',
        b'{"feature_negotiation": 1}',
        b'{"feature_negotiation": "true"}',
        b'{"client_id": 5}',
        b'{"client_id": ["a"]}',
        b'{"msg_timeout": NaN}',
        b'{"other": Infinity}',
        b'{"HEARTBEAT_INTERVAL": "x"}',  # keys match case-insensitively, types still apply
        b'{"heartbeat_interval": "x", "heartbeat_interval": 1000}',  # every occurrence counts
        b"\xef\xbb\xbf{}",  # a BOM
        b'{"a": 1}\xff',
        b'{"client_id": "a\x01"}',  # raw control character in a string
        b"[" * 100000,
    ],
)
def test_bodies_go_refuses(body: bytes) -> None:
    with pytest.raises(ProtocolError) as info:
        decode_identify_body(body)
    assert info.value.body == b"E_BAD_BODY IDENTIFY failed to decode JSON body"


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b"null", {}),
        (b" {} ", {}),
        (b'{"heartbeat_interval": null}', {"heartbeat_interval": None}),
        (
            b'{"unknown": 1.5, "nested": {"x": [1, 2.5]}}',
            {"unknown": 1.5, "nested": {"x": [1, 2.5]}},
        ),
        (b'{"client_id": "caf\xc3\xa9"}', {"client_id": "caf\u00e9"}),
        (b'{"client_id": "a\xffb"}', {"client_id": "a\ufffdb"}),  # Go replaces invalid UTF-8
    ],
)
def test_bodies_go_accepts(body: bytes, expected: dict[str, Any]) -> None:
    assert decode_identify_body(body) == expected


def test_null_leaves_the_default() -> None:
    assert settings(decode_identify_body(b'{"msg_timeout": null}')).msg_timeout_ms == 60000


def test_keys_match_case_insensitively() -> None:
    s = settings(decode_identify_body(b'{"Heartbeat_Interval": 5000, "MSG_TIMEOUT": 2000}'))
    assert (s.heartbeat_interval_ms, s.msg_timeout_ms) == (5000, 2000)


def test_negotiate_checks_types_of_a_dict_it_is_given() -> None:
    with pytest.raises(ProtocolError, match="failed to decode JSON body"):
        negotiate({"heartbeat_interval": True}, LIMITS)


def test_identify_over_the_wire_carries_the_raw_data() -> None:
    body = b'{"feature_negotiation":true,"extra":{"a":[1]},"msg_timeout":2000}'
    conn = server()
    conn.receive_data(b"IDENTIFY\n" + sized(body))
    (event,) = conn.next_events()
    assert event.data == json.loads(body)  # type: ignore[union-attr]
    assert event.settings.msg_timeout_ms == 2000  # type: ignore[union-attr]
    assert conn.identify == event.settings  # type: ignore[union-attr]


def test_identify_wire_error_for_bad_json() -> None:
    error = parse_error(b"IDENTIFY\n" + sized(b'{"heartbeat_interval":"x"}'), "whole")
    assert error.body == b"E_BAD_BODY IDENTIFY failed to decode JSON body"


# -- the response --------------------------------------------------------------------------------


def test_response_is_nsqds_json_in_v130_key_order() -> None:
    response = identify_response(settings({"feature_negotiation": True}), LIMITS)
    assert response == (
        b'{"max_rdy_count":2500,"version":"1.3.0","max_msg_timeout":900000,"msg_timeout":60000,'
        b'"tls_v1":false,"deflate":false,"deflate_level":6,"max_deflate_level":6,"snappy":false,'
        b'"sample_rate":0,"auth_required":false,"output_buffer_size":16384,'
        b'"output_buffer_timeout":250}'
    )


def test_response_echoes_the_effective_settings() -> None:
    limits = Limits(max_rdy_count=100, max_msg_timeout_ms=120000, max_deflate_level=4)
    s = settings(
        {"msg_timeout": 5000, "sample_rate": 10, "output_buffer_size": -1, "deflate_level": 9},
        limits,
    )
    response = json.loads(identify_response(s, limits))
    assert list(response) == [
        "max_rdy_count",
        "version",
        "max_msg_timeout",
        "msg_timeout",
        "tls_v1",
        "deflate",
        "deflate_level",
        "max_deflate_level",
        "snappy",
        "sample_rate",
        "auth_required",
        "output_buffer_size",
        "output_buffer_timeout",
    ]
    assert response["max_rdy_count"] == 100
    assert response["max_msg_timeout"] == 120000
    assert response["msg_timeout"] == 5000
    assert response["sample_rate"] == 10
    assert response["output_buffer_size"] == 1
    assert response["output_buffer_timeout"] == 0
    assert response["deflate_level"] == 4
    assert response["max_deflate_level"] == 4


def test_limits_from_options() -> None:
    limits = Limits.from_options(Options())
    assert limits == Limits()  # every default is nsqd's
    custom = Limits.from_options(
        Options(
            msg_timeout=1.5,
            max_msg_timeout=30.0,
            max_req_timeout=0.25,
            min_output_buffer_timeout=0.025,
            output_buffer_timeout=0.1,
            max_output_buffer_timeout=2.0,
            max_heartbeat_interval=10.0,
            client_timeout=8.0,
            max_msg_size=100,
            max_body_size=1000,
            max_rdy_count=50,
            max_output_buffer_size=4096,
            max_deflate_level=9,
            deflate=True,
            snappy=True,
        )
    )
    assert custom.msg_timeout_ms == 1500
    assert custom.max_msg_timeout_ms == 30000
    assert custom.max_req_timeout_ms == 250
    assert custom.min_output_buffer_timeout_ms == 25
    assert custom.output_buffer_timeout_ms == 100
    assert custom.max_output_buffer_timeout_ms == 2000
    assert custom.max_heartbeat_interval_ms == 10000
    assert custom.default_heartbeat_interval_ms == 4000
    assert (custom.max_msg_size, custom.max_body_size, custom.max_rdy_count) == (100, 1000, 50)
    assert (custom.max_output_buffer_size, custom.max_deflate_level) == (4096, 9)
    # The flags decide what IDENTIFY offers: compression by default, TLS with a certificate.
    assert custom.deflate_available and custom.snappy_available
    assert not (custom.tls_available or custom.tls_required or custom.auth_required)
    off = Limits.from_options(Options(deflate=False, snappy=False, auth_http_addresses=("a:1",)))
    assert not (off.deflate_available or off.snappy_available)
    assert off.auth_required
    tls = Limits.from_options(
        Options(tls_cert="c.pem", tls_key="k.pem", tls_client_auth_policy="require")
    )
    assert tls.tls_available and tls.tls_required


def test_the_http_address_is_answered_only_to_a_client_that_asks() -> None:
    asked = settings({"feature_negotiation": True, "lmq_http_address": True})
    assert asked.lmq_http_address
    answer = identify_response(asked, LIMITS, http_address="127.0.0.1:4151")
    assert answer.endswith(b',"output_buffer_timeout":250,"lmq_http_address":"127.0.0.1:4151"}')
    assert json.loads(identify_response(asked, LIMITS))["lmq_http_address"] == ""
    # Not asked (or not with true, or without feature negotiation): nsqd's answer exactly.
    for data in (
        {"feature_negotiation": True},
        {"feature_negotiation": True, "lmq_http_address": 1},
        {"feature_negotiation": True, "lmq_http_address": "yes"},
        {"lmq_http_address": True},
    ):
        s = settings(data)
        assert not s.lmq_http_address
        assert b"lmq_http_address" not in identify_response(s, LIMITS, http_address="h:1")

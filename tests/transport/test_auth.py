"""The AUTH state: decoding the auth server's answer, nsqd's regex rules, expiry, AUTH's reply.

Rules for this module: no I/O and no trio; time is a number passed in as ``now`` and asserted
exactly; error texts are nsqd's, word for word.
"""

from __future__ import annotations

import json

import pytest

from lmqd.protocol.errors import ProtocolError
from lmqd.transport.auth import (
    AuthExpired,
    AuthResponseError,
    AuthState,
    Permission,
    auth_outcome,
    auth_response_body,
    check_authorized,
    parse_auth_response,
)

GRANT = {
    "ttl": 3600,
    "identity": "alice",
    "identity_url": "https://example.invalid/alice",
    "authorizations": [
        {"topic": "^orders$", "channels": [".*"], "permissions": ["publish"]},
        {"topic": "events", "channels": ["^archive$", "^audit"], "permissions": ["subscribe"]},
    ],
}


def _parse(doc: object, now: float = 100.0) -> AuthState:
    return parse_auth_response(json.dumps(doc).encode(), now)


def test_grant_is_decoded_with_expiry_from_ttl() -> None:
    state = _parse(GRANT, now=100.0)
    assert (state.identity, state.identity_url, state.ttl_s) == (
        "alice",
        "https://example.invalid/alice",
        3600,
    )
    assert len(state.authorizations) == 2
    assert state.expires_at == 3700.0
    assert not state.is_expired(3700.0)  # Go: Expires.Before(now) — equal is still valid
    assert state.is_expired(3700.001)


def test_regexes_are_searched_not_anchored() -> None:
    state = _parse(GRANT)
    sub = Permission.SUBSCRIBE
    # "events" matches anywhere in the topic (nsqd's MatchString)
    for topic in ("events", "old-events", "events2"):
        assert state.is_authorized(topic, "archive", sub)
    assert not state.is_authorized("event", "archive", sub)
    # "^audit" is anchored at the start only
    assert state.is_authorized("events", "audit-log", sub)
    assert not state.is_authorized("events", "my-audit", sub)
    assert not state.is_authorized("events", "archive2", sub)
    # "^orders$" is a single topic
    assert state.is_authorized("orders", None, Permission.PUBLISH)
    assert not state.is_authorized("orders2", None, Permission.PUBLISH)


def test_permissions_are_kept_apart() -> None:
    state = _parse(GRANT)
    assert not state.is_authorized("orders", "any", Permission.SUBSCRIBE)
    assert not state.is_authorized("events", None, Permission.PUBLISH)


def test_publish_needs_a_channel_regex_matching_the_empty_string() -> None:
    narrow = {
        "ttl": 60,
        "authorizations": [{"topic": ".*", "channels": ["^c$"], "permissions": ["publish"]}],
    }
    assert not _parse(narrow).is_authorized("t", None, Permission.PUBLISH)
    no_channels = {
        "ttl": 60,
        "authorizations": [{"topic": ".*", "permissions": ["publish", "subscribe"]}],
    }
    state = _parse(no_channels)
    assert not state.is_authorized("t", None, Permission.PUBLISH)
    assert not state.is_authorized("t", "c", Permission.SUBSCRIBE)
    with pytest.raises(ValueError):
        state.is_authorized("t", None, Permission.SUBSCRIBE)
    with pytest.raises(ValueError):
        state.is_authorized("t", "c", Permission.PUBLISH)


def _protocol_error(call: object) -> ProtocolError:
    assert callable(call)
    with pytest.raises(ProtocolError) as info:
        call()
    return info.value


def test_check_authorized_answers_as_nsqd() -> None:
    state = _parse(GRANT, now=0.0)
    check_authorized(state, "PUB", "orders", None, now=10.0)
    check_authorized(state, "SUB", "events", "archive", now=10.0)

    first = _protocol_error(lambda: check_authorized(None, "MPUB", "orders", None, 1.0))
    assert first.body == b"E_AUTH_FIRST AUTH required before MPUB"
    assert first.fatal

    refused = _protocol_error(lambda: check_authorized(state, "SUB", "events", "web", 1.0))
    assert refused.body == b'E_UNAUTHORIZED AUTH failed for SUB on "events" "web"'
    refused = _protocol_error(lambda: check_authorized(state, "DPUB", "other", None, 1.0))
    assert refused.body == b'E_UNAUTHORIZED AUTH failed for DPUB on "other" ""'

    with pytest.raises(AuthExpired):
        check_authorized(state, "PUB", "orders", None, now=3600.5)
    # an answer that grants nothing is no AUTH at all
    empty = _parse({"ttl": 60, "authorizations": []})
    first = _protocol_error(lambda: check_authorized(empty, "PUB", "t", None, 1.0))
    assert first.code == "E_AUTH_FIRST"


def test_auth_outcome_and_reply_body() -> None:
    assert auth_outcome(_parse(GRANT)) is None
    nothing = _parse({"ttl": 60, "identity": "bob"})
    error = auth_outcome(nothing)
    assert error is not None and error.body == b"E_UNAUTHORIZED AUTH no authorizations found"
    assert auth_response_body(_parse(GRANT)) == (
        b'{"identity":"alice","identity_url":"https://example.invalid/alice","permission_count":2}'
    )
    # Go's json.Marshal: UTF-8 as is, HTML characters and line separators escaped
    odd = _parse({"ttl": 1, "identity": "<é&>\u2028", "identity_url": "a?b=1&c"})
    assert auth_response_body(odd) == (
        b'{"identity":"\\u003c\xc3\xa9\\u0026\\u003e\\u2028",'
        b'"identity_url":"a?b=1\\u0026c","permission_count":0}'
    )


def test_decoding_follows_gos_json_rules() -> None:
    # unknown keys ignored, keys matched case-insensitively, null leaves the zero value
    state = _parse(
        {
            "TTL": 5,
            "Identity": "x",
            "identity_url": None,
            "extra": [1, 2],
            "expires": "2030-01-01T00:00:00Z",  # decoded by Go, then replaced by now + ttl
            "authorizations": [
                {"Topic": "t", "CHANNELS": [None, "c"], "permissions": ["subscribe"], "x": 1},
                None,
            ],
        },
        now=1.0,
    )
    assert (state.ttl_s, state.identity, state.identity_url, state.expires_at) == (5, "x", "", 6.0)
    assert state.is_authorized("t", "c", Permission.SUBSCRIBE)
    assert len(state.authorizations) == 2


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"not json", "invalid JSON"),
        (b"[]", "not a JSON object"),
        (b"null", "invalid TTL 0"),
        (b"{}", "invalid TTL 0"),
        (b'{"ttl": -1}', "invalid TTL -1"),
        (b'{"ttl": 1.5}', "ttl: cannot decode 1.5 as int"),
        (b'{"ttl": "60"}', "ttl: cannot decode"),
        (b'{"ttl": true}', "ttl: cannot decode"),
        (b'{"ttl": 60, "identity": 7}', "identity: cannot decode"),
        (b'{"ttl": 60, "expires": 12}', "expires: cannot decode"),
        (b'{"ttl": 60, "authorizations": {}}', "authorizations: cannot decode"),
        (b'{"ttl": 60, "authorizations": [7]}', "not a JSON object"),
        (
            b'{"ttl": 60, "authorizations": [{"topic": ".*", "permissions": ["admin"]}]}',
            "unknown permission admin",
        ),
        (
            b'{"ttl": 60, "authorizations": [{"topic": ".*", "permissions": ["Publish"]}]}',
            "unknown permission Publish",
        ),
        (b'{"ttl": 60, "authorizations": [{"topic": "("}]}', "unable to compile topic"),
        (b'{"ttl": 60, "authorizations": [{"topic": "a", "channels": ["[z-a]"]}]}', "channel"),
        (b'{"ttl": 60, "authorizations": [{"topic": "a", "channels": [3]}]}', "not a string"),
    ],
)
def test_invalid_answers_are_refused(body: bytes, reason: str) -> None:
    with pytest.raises(AuthResponseError, match=reason):
        parse_auth_response(body, 0.0)

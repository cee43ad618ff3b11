"""AUTH: the auth server's answer, what it authorises, and the checks on PUB/MPUB/DPUB/SUB.

With ``--auth-http-address`` set, nsqd tells clients ``auth_required`` in the IDENTIFY response;
a client sends ``AUTH <secret>``, nsqd asks the auth server (``lmqd.transport.auth_http``) and
keeps the answer for its ``ttl``. This module is the sans-I/O part, after
``nsqd/internal/auth/authorizations.go`` and ``nsqd/protocol_v2.go: CheckAuth``:

* ``parse_auth_response`` decodes the server's JSON as Go's ``encoding/json`` decodes it into
  nsqd's ``State`` (unknown keys ignored, keys matched case-insensitively, ``null`` leaves a
  field at its zero value, a wrong type is an error), then validates it as nsqd does: each
  permission is ``subscribe`` or ``publish``, each regex compiles, ``ttl`` > 0.
* Regexes are **not anchored**: nsqd uses Go's ``MatchString``, which finds a match anywhere, so
  ``"orders"`` authorises ``"orders"``, ``"old-orders"`` and ``"orders2"``. Auth servers that mean
  one topic write ``^orders$``. Python's ``re.search`` is the same search. The dialects differ a
  little (RE2 has no backreferences or lookaround, Python lacks ``\\pL`` classes); patterns in
  the common subset behave identically.
* A publish is checked with the channel ``""``: an authorisation allows PUB/MPUB/DPUB only if
  one of its channel regexes matches the empty string (``.*`` does). This nsqd quirk is kept so
  that an auth server written for nsqd grants the same things here.
* Expiry uses the trio clock, passed in as ``now``: the state is expired once ``now`` is past
  ``expires_at`` (= time of the answer + ``ttl`` s), and the next check re-asks the server.

No trio and no sockets here.
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Mapping
from typing import Any

import attrs

from lmqd.protocol import errors
from lmqd.protocol.errors import ProtocolError

__all__ = [
    "AuthExpired",
    "AuthResponseError",
    "AuthState",
    "Authorization",
    "Permission",
    "auth_outcome",
    "auth_response_body",
    "check_authorized",
    "parse_auth_response",
]


class AuthResponseError(ValueError):
    """The auth server's answer is not one nsqd would accept (AUTH then fails: refusal)."""


class AuthExpired(Exception):
    """The cached answer's ttl has passed: ask the auth server again, then check again."""


class Permission(enum.Enum):
    """What an authorisation grants."""

    SUBSCRIBE = "subscribe"
    PUBLISH = "publish"


@attrs.frozen
class Authorization:
    """One entry of ``authorizations``: a topic regex, channel regexes, permissions."""

    topic: re.Pattern[str]
    channels: tuple[re.Pattern[str], ...]
    permissions: frozenset[Permission]

    def allows(self, topic: str, channel: str, permission: Permission) -> bool:
        """nsqd's ``Authorization.IsAllowed`` (unanchored regex search)."""
        if permission not in self.permissions:
            return False
        if self.topic.search(topic) is None:
            return False
        return any(pattern.search(channel) is not None for pattern in self.channels)


@attrs.frozen
class AuthState:
    """The auth server's answer for one connection, valid until ``expires_at``."""

    identity: str
    identity_url: str
    ttl_s: int
    authorizations: tuple[Authorization, ...]
    expires_at: float
    """On the trio clock: the time of the answer plus ``ttl_s``."""

    @property
    def has_authorizations(self) -> bool:
        """nsqd's ``HasAuthorizations``: an answer that grants nothing counts as no AUTH."""
        return bool(self.authorizations)

    def is_expired(self, now: float) -> bool:
        """True once ``now`` is past ``expires_at`` (Go: ``Expires.Before(time.Now())``)."""
        return self.expires_at < now

    def is_authorized(self, topic: str, channel: str | None, permission: Permission) -> bool:
        """Whether ``permission`` on ``topic`` (and ``channel``, for SUBSCRIBE) is granted.

        A publish passes ``channel=None`` and is matched against the channel ``""`` (nsqd's
        quirk, see the module docstring). Expiry is not looked at: see ``check_authorized``.
        """
        if permission is Permission.SUBSCRIBE:
            if channel is None:
                raise ValueError("a subscribe check needs the channel")
            wanted_channel = channel
        else:
            if channel is not None:
                raise ValueError("a publish check has no channel")
            wanted_channel = ""
        return any(a.allows(topic, wanted_channel, permission) for a in self.authorizations)


def check_authorized(
    state: AuthState | None, cmd: str, topic: str, channel: str | None, now: float
) -> None:
    """nsqd's ``CheckAuth`` for a daemon with auth enabled, for ``cmd`` (``"SUB"``, ``"PUB"``,
    ``"MPUB"``, ``"DPUB"``; ``channel`` only for SUB).

    Raises ``E_AUTH_FIRST`` before a successful AUTH, ``AuthExpired`` when the answer must be
    fetched again (the caller does that, then calls again; a failed fetch is ``E_AUTH_FAILED``),
    and ``E_UNAUTHORIZED AUTH failed for <cmd> on "<topic>" "<channel>"`` when not granted.
    """
    if state is None or not state.has_authorizations:
        raise errors.auth_first(cmd)
    if state.is_expired(now):
        raise AuthExpired()
    permission = Permission.PUBLISH if channel is None else Permission.SUBSCRIBE
    if not state.is_authorized(topic, channel, permission):
        raise errors.auth_unauthorized(cmd, topic, channel or "")


def auth_outcome(state: AuthState) -> ProtocolError | None:
    """After a successful query for AUTH: nsqd's ``E_UNAUTHORIZED AUTH no authorizations
    found`` when the answer grants nothing, else None (send ``auth_response_body``)."""
    return None if state.has_authorizations else errors.auth_no_authorizations()


def auth_response_body(state: AuthState) -> bytes:
    """nsqd's answer to AUTH: ``{"identity":..,"identity_url":..,"permission_count":N}``,
    encoded as Go's ``json.Marshal`` does (compact, UTF-8, ``<``, ``>``, ``&``, U+2028 and
    U+2029 escaped)."""
    body = json.dumps(
        {
            "identity": state.identity,
            "identity_url": state.identity_url,
            "permission_count": len(state.authorizations),
        },
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return _go_html_escape(body).encode("utf-8", "surrogatepass")


_GO_HTML_ESCAPES = str.maketrans(
    {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}
)


def _go_html_escape(text: str) -> str:
    # Only string contents can hold these characters in a JSON document, so translating the
    # whole document is the same as Go escaping inside strings.
    return text.translate(_GO_HTML_ESCAPES)


# -- decoding the auth server's answer -------------------------------------------------------------

_STATE_FIELDS = ("ttl", "authorizations", "identity", "identity_url", "expires")
_AUTHORIZATION_FIELDS = ("topic", "channels", "permissions")
_INT_RANGE = (-(1 << 63), (1 << 63) - 1)  # Go's int on the 64-bit platforms nsqd ships for


def parse_auth_response(body: bytes, now: float) -> AuthState:
    """Decode and validate the auth server's JSON answer received at ``now`` (trio clock).

    Raises ``AuthResponseError`` with the reason nsqd would log.
    """
    try:
        data = json.loads(body.decode("utf-8", "replace"))
    except (ValueError, RecursionError) as exc:
        raise AuthResponseError(f"invalid JSON ({exc})") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise AuthResponseError("the answer is not a JSON object")
    fields = _go_fields(data, _STATE_FIELDS)

    ttl = _typed(fields, "ttl", int, 0)
    identity = _typed(fields, "identity", str, "")
    identity_url = _typed(fields, "identity_url", str, "")
    # Go decodes "expires" into State.Expires (a time.Time, from an RFC 3339 string) and then
    # overwrites it with now + ttl: only its type matters.
    _typed(fields, "expires", str, "")
    raw_authorizations = _typed(fields, "authorizations", list, [])

    authorizations = tuple(_authorization(item) for item in raw_authorizations)
    if ttl <= 0:
        raise AuthResponseError(f"invalid TTL {ttl} (must be >0)")
    return AuthState(
        identity=identity,
        identity_url=identity_url,
        ttl_s=ttl,
        authorizations=authorizations,
        expires_at=now + ttl,
    )


def _authorization(item: Any) -> Authorization:
    if item is None:
        item = {}
    if not isinstance(item, dict):
        raise AuthResponseError("an authorization is not a JSON object")
    fields = _go_fields(item, _AUTHORIZATION_FIELDS)
    topic = _typed(fields, "topic", str, "")
    channels = _typed(fields, "channels", list, [])
    permissions = _typed(fields, "permissions", list, [])
    granted: set[Permission] = set()
    for permission in permissions:
        if not isinstance(permission, str):
            raise AuthResponseError("a permission is not a string")
        try:
            granted.add(Permission(permission))
        except ValueError:
            raise AuthResponseError(f"unknown permission {permission}") from None
    channel_patterns = []
    for channel in channels:
        if channel is None:
            channel = ""  # Go decodes null in a []string as ""
        if not isinstance(channel, str):
            raise AuthResponseError("a channel regex is not a string")
        channel_patterns.append(_compile("channel", channel))
    return Authorization(
        topic=_compile("topic", topic),
        channels=tuple(channel_patterns),
        permissions=frozenset(granted),
    )


def _compile(kind: str, pattern: str) -> re.Pattern[str]:
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise AuthResponseError(f"unable to compile {kind} {pattern!r} {exc}") from None


def _go_fields(data: Mapping[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    """Known fields by name, matched as Go does (exact, else case-insensitive); later keys win;
    ``null`` leaves a field unset."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = key if key in names else key.lower() if key.lower() in names else None
        if name is not None and value is not None:
            out[name] = value
    return out


def _typed(fields: Mapping[str, Any], name: str, kind: type, default: Any) -> Any:
    value = fields.get(name, default)
    if kind is int:
        ok = type(value) is int and _INT_RANGE[0] <= value <= _INT_RANGE[1]
    else:
        ok = isinstance(value, kind) and not isinstance(value, bool)
    if not ok:
        shown = json.dumps(value)[:40]
        raise AuthResponseError(f"{name}: cannot decode {shown} as {kind.__name__}")
    return value

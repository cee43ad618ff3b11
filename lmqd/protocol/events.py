"""One event class per V2 command: what ``ServerConnection`` parses and ``encode()`` writes.

The server receives these from ``ServerConnection.next_events()``; a client builds them and sends
``event.encode()`` (or ``ClientConnection.send(event)``). Names are ``str`` (a valid name is
ASCII), message IDs and bodies ``bytes``.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable, Mapping
from typing import Any, TypeAlias

import attrs

from lmqd.message_ext import NO_EXT, MessageExt
from lmqd.protocol.extension import XpubMessage, encode_xpub
from lmqd.protocol.identify import IdentifySettings

_SIZE = struct.Struct(">i")


def encode_identify(data: Mapping[str, Any]) -> bytes:
    """``IDENTIFY`` with ``data`` as its JSON body."""
    body = json.dumps(data, separators=(",", ":")).encode()
    return b"IDENTIFY\n" + _SIZE.pack(len(body)) + body


@attrs.frozen(kw_only=True, slots=True)
class Identify:
    """IDENTIFY: the negotiated settings, and the JSON object exactly as the client sent it."""

    settings: IdentifySettings
    data: dict[str, Any] = attrs.field(hash=False)

    def encode(self) -> bytes:
        """The command with ``data`` as its body."""
        return encode_identify(self.data)


@attrs.frozen(kw_only=True, slots=True)
class Auth:
    """AUTH: the secret for the auth server."""

    secret: bytes

    def encode(self) -> bytes:
        """The command on the wire."""
        return b"AUTH\n" + _SIZE.pack(len(self.secret)) + self.secret


@attrs.frozen(kw_only=True, slots=True)
class Sub:
    """SUB: subscribe this connection to a topic's channel (once per connection)."""

    topic: str
    channel: str

    def encode(self) -> bytes:
        """The command on the wire."""
        return b"SUB %s %s\n" % (self.topic.encode(), self.channel.encode())


@attrs.frozen(kw_only=True, slots=True)
class Pub:
    """PUB: publish one message."""

    topic: str
    body: bytes

    def encode(self) -> bytes:
        """The command on the wire."""
        return b"PUB %s\n%s%s" % (self.topic.encode(), _SIZE.pack(len(self.body)), self.body)


@attrs.frozen(kw_only=True, slots=True)
class Mpub:
    """MPUB: publish several messages atomically."""

    topic: str
    bodies: list[bytes] = attrs.field(hash=False)

    def encode(self) -> bytes:
        """The command on the wire."""
        parts = [b""]
        size = 4
        for body in self.bodies:
            parts.append(_SIZE.pack(len(body)))
            parts.append(body)
            size += 4 + len(body)
        parts[0] = b"MPUB %s\n%s%s" % (
            self.topic.encode(),
            _SIZE.pack(size),
            _SIZE.pack(len(self.bodies)),
        )
        return b"".join(parts)


@attrs.frozen(kw_only=True, slots=True)
class Dpub:
    """DPUB: publish one message, delivered no earlier than ``defer_ms`` from now."""

    topic: str
    defer_ms: int
    body: bytes

    def encode(self) -> bytes:
        """The command on the wire."""
        return b"DPUB %s %d\n%s%s" % (
            self.topic.encode(),
            self.defer_ms,
            _SIZE.pack(len(self.body)),
            self.body,
        )


@attrs.frozen(kw_only=True, slots=True)
class Xpub:
    """XPUB (lmq's extension): publish messages with their extension fields, deferred by
    ``defer_ms`` (0: not deferred); all or none, one ``OK``."""

    topic: str
    bodies: list[bytes] = attrs.field(hash=False)
    exts: list[MessageExt | None] = attrs.field(hash=False)
    """Each body's extension as a message holds it: None for the empty block."""
    defer_ms: int = 0

    @classmethod
    def of(cls, topic: str, messages: Iterable[XpubMessage], defer_ms: int = 0) -> Xpub:
        """The command publishing ``messages``."""
        pairs = [(m.body, m.ext if m.ext != NO_EXT else None) for m in messages]
        return cls(topic=topic, bodies=[b for b, _ in pairs], exts=[e for _, e in pairs],
                   defer_ms=defer_ms)  # fmt: skip

    @property
    def messages(self) -> list[XpubMessage]:
        """The messages, each with its extension (``NO_EXT`` for none)."""
        return [XpubMessage(b, e or NO_EXT) for b, e in zip(self.bodies, self.exts, strict=True)]

    def encode(self) -> bytes:
        """The command on the wire."""
        return encode_xpub(self.topic, self.messages, self.defer_ms or None)


@attrs.frozen(kw_only=True, slots=True)
class Rdy:
    """RDY: how many messages this consumer may have in flight at once."""

    count: int

    def encode(self) -> bytes:
        """The command on the wire."""
        return b"RDY %d\n" % self.count


def encode_fin(msg_id: bytes) -> bytes:
    """``Fin(id=msg_id).encode()`` without the event object (a consumer's per-message path)."""
    return b"FIN " + msg_id + b"\n"


@attrs.frozen(kw_only=True, slots=True)
class Fin:
    """FIN: the message was processed."""

    id: bytes

    def encode(self) -> bytes:
        """The command on the wire."""
        return encode_fin(self.id)


@attrs.frozen(kw_only=True, slots=True)
class Fins:
    """A run of consecutive FIN commands, as ``ServerConnection`` gives them: one event per run.

    A consumer sends one FIN per message, so FINs arrive in runs of hundreds; one event holding
    the ids keeps the server's per-message work to a slice of the buffer.
    """

    ids: list[bytes]

    def encode(self) -> bytes:
        """The commands on the wire, one ``FIN`` line per id."""
        return b"".join([b"FIN " + i + b"\n" for i in self.ids])


@attrs.frozen(kw_only=True, slots=True)
class Req:
    """REQ: requeue the message after ``timeout_ms``.

    ``timeout_ms`` is the number the client sent: the server clamps it to
    ``[0, max_req_timeout]`` (nsqd logs that instead of failing).
    """

    id: bytes
    timeout_ms: int

    def encode(self) -> bytes:
        """The command on the wire."""
        return b"REQ %s %d\n" % (self.id, self.timeout_ms)


@attrs.frozen(kw_only=True, slots=True)
class Touch:
    """TOUCH: reset the message's timeout."""

    id: bytes

    def encode(self) -> bytes:
        """The command on the wire."""
        return b"TOUCH " + self.id + b"\n"


@attrs.frozen(kw_only=True, slots=True)
class Cls:
    """CLS: the consumer is closing; the server answers ``CLOSE_WAIT`` and stops delivering."""

    def encode(self) -> bytes:
        """The command on the wire."""
        return b"CLS\n"


@attrs.frozen(kw_only=True, slots=True)
class Nop:
    """NOP: no operation (the answer to a heartbeat)."""

    def encode(self) -> bytes:
        """The command on the wire."""
        return b"NOP\n"


Command: TypeAlias = (
    Identify | Auth | Sub | Pub | Mpub | Dpub | Xpub | Rdy | Fin | Fins | Req | Touch | Cls | Nop
)
"""Any command event (``ServerConnection`` gives FINs as ``Fins``, clients may send either)."""

Event: TypeAlias = Command
"""What ``ServerConnection.next_events()`` returns."""


def one_per_command(events: Iterable[Event]) -> list[Event]:
    """``events`` with each ``Fins`` replaced by one ``Fin`` per id: one event per command, for
    code that handles commands one at a time (tests, fakes)."""
    out: list[Event] = []
    for event in events:
        if isinstance(event, Fins):
            out += [Fin(id=i) for i in event.ids]
        else:
            out.append(event)
    return out


# -- fast constructors for the parser's hot paths ----------------------------------------------
# attrs' frozen __init__ takes keyword arguments and sets each field through object.__setattr__:
# about 0.3-0.5 µs per event on the target machine, as much as parsing the line. The parser
# builds its most frequent events by setting the slots directly instead; the objects are
# identical to ones built by __init__ (no field of these classes has a default, converter or
# validator to skip).

_new = object.__new__
_set_fins_ids = Fins.__dict__["ids"].__set__
_set_pub_topic = Pub.__dict__["topic"].__set__
_set_pub_body = Pub.__dict__["body"].__set__
_set_mpub_topic = Mpub.__dict__["topic"].__set__
_set_mpub_bodies = Mpub.__dict__["bodies"].__set__


def make_fins(ids: list[bytes]) -> Fins:
    """``Fins(ids=ids)``, faster."""
    event: Fins = _new(Fins)
    _set_fins_ids(event, ids)
    return event


def make_pub(topic: str, body: bytes) -> Pub:
    """``Pub(topic=topic, body=body)``, faster."""
    event: Pub = _new(Pub)
    _set_pub_topic(event, topic)
    _set_pub_body(event, body)
    return event


def make_mpub(topic: str, bodies: list[bytes]) -> Mpub:
    """``Mpub(topic=topic, bodies=bodies)``, faster."""
    event: Mpub = _new(Mpub)
    _set_mpub_topic(event, topic)
    _set_mpub_bodies(event, bodies)
    return event

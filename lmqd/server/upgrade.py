"""The stream upgrades an IDENTIFY negotiated: TLS on the same socket, then snappy or deflate.

nsqd's sequence (``protocol_v2.go: IDENTIFY``), which every NSQ client expects byte for byte:
the IDENTIFY answer goes out in plaintext (the connection sends it before calling this); then
the server-side TLS handshake (5 s deadline) and an ``OK`` frame over TLS; then the codec wraps
whatever the connection is by then and an ``OK`` frame goes through it. TLS outside,
compression inside.

``prefix`` holds what the client sent after its IDENTIFY and the parser did not touch (the
first bytes of the new layer); it is put in front of the stream (``PrefixedStream``).

Failures raise ``UpgradeFailed``; the connection must then close. A failed TLS handshake
(garbage instead of a ClientHello, a refused client certificate, too slow) carries nsqd's
``E_IDENTIFY_FAILED IDENTIFY failed <reason>`` to be written in plaintext on the raw stream, as
nsqd does (only a client that is not speaking TLS can read it).
"""

from __future__ import annotations

import logging

import attrs
import trio

from lmqd.protocol import OK_FRAME, ProtocolError, errors
from lmqd.server.session import Upgrade
from lmqd.transport.compression import codec_for
from lmqd.transport.streams import CompressedStream, PrefixedStream, start_tls_server
from lmqd.transport.tls import (
    TLS_HANDSHAKE_TIMEOUT_S,
    PeerCertificateError,
    ServerTLS,
    TLSState,
    connection_state,
    peer_common_name,
)

__all__ = ["UpgradeFailed", "Upgraded", "upgrade_stream"]

log = logging.getLogger("lmqd.server")

OK_SEND_TIMEOUT_S = TLS_HANDSHAKE_TIMEOUT_S
"""How long the ``OK`` after each upgrade may take to send: a client in the middle of its own
handshake reads it at once, so this only bounds one that stopped reading."""


class UpgradeFailed(Exception):
    """The upgrade failed; ``error`` (if any) is to be sent in plaintext before closing."""

    def __init__(self, reason: str, error: ProtocolError | None = None) -> None:
        super().__init__(reason)
        self.error = error


@attrs.frozen
class Upgraded:
    """The connection after its upgrades."""

    stream: trio.abc.Stream
    tls: TLSState | None
    common_name: str
    """The subject CN of the client's certificate ("" without one): the auth servers get it."""
    codec_name: str
    """``"snappy"``, ``"deflate"`` or ""."""


async def upgrade_stream(
    stream: trio.abc.Stream, prefix: bytes, upgrade: Upgrade, tls: ServerTLS | None
) -> Upgraded:
    """Run the negotiated upgrades on ``stream`` (see the module docstring)."""
    current: trio.abc.Stream = PrefixedStream(stream, prefix) if prefix else stream
    tls_state = None
    common_name = ""
    if upgrade.tls:
        assert tls is not None, "IDENTIFY offers tls_v1 only with a certificate"
        try:
            ssl_stream = await start_tls_server(current, tls.context)
            tls.check_peer(ssl_stream)
        except trio.TooSlowError:
            raise UpgradeFailed(
                "TLS handshake timed out", errors.identify_failed("i/o timeout")
            ) from None
        except trio.BrokenResourceError as exc:
            reason = str(exc.__cause__ or exc) or "TLS handshake failed"
            raise UpgradeFailed(reason, errors.identify_failed(reason)) from None
        except PeerCertificateError as exc:
            raise UpgradeFailed(str(exc)) from None
        tls_state = connection_state(ssl_stream)
        common_name = peer_common_name(ssl_stream)
        await _send_ok(ssl_stream)
        current = ssl_stream
    codec = codec_for(
        snappy=upgrade.snappy, deflate=upgrade.deflate, deflate_level=upgrade.deflate_level
    )
    if codec is not None:
        current = CompressedStream(current, codec)
        await _send_ok(current)
    return Upgraded(
        stream=current,
        tls=tls_state,
        common_name=common_name,
        codec_name=codec.name if codec is not None else "",
    )


async def _send_ok(stream: trio.abc.Stream) -> None:
    try:
        with trio.fail_after(OK_SEND_TIMEOUT_S):
            await stream.send_all(OK_FRAME)
    except trio.TooSlowError:
        raise UpgradeFailed("the client does not read the upgrade's OK") from None
    except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
        raise UpgradeFailed(f"peer gone during the upgrade ({exc})") from None

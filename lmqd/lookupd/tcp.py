"""The V1 TCP side of lmqlookupd: one task per registering node, moving bytes and applying events.

One connection is one producer, identified by its remote ``ip:port``. The bytes go through
``LookupServerConnection`` (``lmqd.lookup``); each command it returns is applied to the DB and
answered in order. Every command gets exactly one answer, so a connection is one task that
parses everything received, applies it, and sends all the answers in one write before reading
again (nsqlookupd's loop, batched): a node that pipelines without reading its answers blocks
its own connection in ``send_all`` and is not read further, so nothing grows without bound.

An error is fatal, as in nsqlookupd: the answers to the commands before it, then the error,
then the connection is closed. Closing a socket that still has unread input makes the kernel
reset the connection, and a reset can destroy the error frame before the peer reads it; so
after an error the server half-closes (the peer reads the error, then EOF) and reads and
discards what is still coming for at most ``LINGER_S`` seconds and ``LINGER_BYTES`` bytes
before it closes (the "lingering close" of HTTP servers). However the connection ends (EOF,
reset, error, shutdown), its producer records are removed from every key
(``RegistrationDB.disconnect``); the keys stay.

There is no idle timeout, as in nsqlookupd: a node that stops PINGing stays connected and
becomes inactive after ``--inactive-producer-timeout``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio

from lmqd.lookup import (
    ConnectionClosed,
    Identify,
    IdentifyResponse,
    LookupProtocolError,
    LookupServerConnection,
    Ok,
    Ping,
    Register,
    Unregister,
)
from lmqd.lookupd.db import PeerInfo, RegistrationDB
from lmqd.net import format_address

__all__ = ["RECEIVE_SIZE", "TcpPeerHandler"]

log = logging.getLogger("lmqd.lookupd.tcp")

RECEIVE_SIZE = 4096
"""Bytes asked for per receive: a node sends lines of under 150 bytes and one ~100-byte
IDENTIFY body, so even its start-up burst (one REGISTER per channel) takes few receives."""

LINGER_S = 1.0
"""How long a failed connection is drained before it is closed: a peer that reads our error
frame closes within milliseconds; one that doesn't is not waited for longer."""

LINGER_BYTES = 64 * 1024
"""How much input a failed connection discards at most while it lingers."""

_OK = Ok().encode()


def peer_address(stream: trio.SocketStream) -> str:
    """The remote ``ip:port`` of a TCP stream, as Go's ``RemoteAddr().String()`` writes it."""
    name = stream.socket.getpeername()
    return format_address((str(name[0]), int(name[1])))


class TcpPeerHandler:
    """Serves V1 connections against one DB; ``identify_response`` is what IDENTIFY answers
    (the lookupd's broadcast address, real ports and version)."""

    def __init__(
        self,
        db: RegistrationDB,
        identify_response: IdentifyResponse,
        *,
        clock: Callable[[], float] = trio.current_time,
    ) -> None:
        self.db = db
        self._identify_answer = identify_response.encode()
        self._clock = clock

    async def serve_socket(self, stream: trio.SocketStream) -> None:
        """``trio.serve_listeners``' handler."""
        try:
            remote = peer_address(stream)
        except OSError:  # reset before we looked
            await trio.aclose_forcefully(stream)
            return
        await self.serve(stream, remote)

    async def serve(self, stream: trio.abc.Stream, remote: str) -> None:
        """Serve one connection from ``remote`` until it ends, then close ``stream``."""
        log.info("TCP: new client(%s)", remote)
        conn = LookupServerConnection()
        peer: PeerInfo | None = None
        try:
            while True:
                replies: list[bytes] = []
                ending = failed = False
                while True:
                    try:
                        event = conn.next_event()
                    except LookupProtocolError as exc:
                        log.error("CLIENT(%s): %s", remote, exc)
                        replies.append(exc.frame())
                        ending = failed = True
                        break
                    if event is None:
                        break
                    if isinstance(event, ConnectionClosed):
                        ending = True
                        break
                    if isinstance(event, Identify):
                        peer = self._identify(event, remote)
                        replies.append(self._identify_answer)
                    else:
                        self._apply(peer, event)
                        replies.append(_OK)
                if replies:
                    await stream.send_all(b"".join(replies))
                if ending:
                    if failed:
                        # Unregister now: lingering is about the peer's bytes, not its topics.
                        if peer is not None:
                            self.db.disconnect(peer.id)
                            peer = None
                        await _linger(stream)
                    return
                conn.receive_data(await stream.receive_some(RECEIVE_SIZE))
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            log.info("CLIENT(%s): connection lost: %s", remote, exc)
        finally:
            if peer is not None:
                self.db.disconnect(peer.id)
            log.info("CLIENT(%s): closing", remote)
            await trio.aclose_forcefully(stream)

    def _identify(self, event: Identify, remote: str) -> PeerInfo:
        peer = PeerInfo(
            id=remote,
            remote_address=remote,
            hostname=event.hostname,
            broadcast_address=event.broadcast_address,
            tcp_port=event.tcp_port,
            http_port=event.http_port,
            version=event.version,
            last_update=self._clock(),
        )
        log.info(
            "CLIENT(%s): IDENTIFY Address:%s TCP:%d HTTP:%d Version:%s",
            remote, peer.broadcast_address, peer.tcp_port, peer.http_port, peer.version,
        )  # fmt: skip
        self.db.identify(peer)
        return peer

    def _apply(self, peer: PeerInfo | None, event: Ping | Register | Unregister) -> None:
        # The codec's state table refuses REGISTER and UNREGISTER before IDENTIFY, so ``peer``
        # is set for them; a PING before IDENTIFY is answered and changes nothing.
        if peer is None:
            return
        match event:
            case Ping():
                now = self._clock()
                log.info("CLIENT(%s): pinged (last ping %.3fs)", peer.id, now - peer.last_update)
                peer.last_update = now
            case Register(topic=topic, channel=channel):
                self.db.register(peer, topic, channel)
            case Unregister(topic=topic, channel=channel):
                self.db.unregister(peer, topic, channel)


async def _linger(stream: trio.abc.Stream) -> None:
    """Half-close, then discard input until EOF or the linger bounds (see the module doc)."""
    if isinstance(stream, trio.abc.HalfCloseableStream):
        await stream.send_eof()
    discarded = 0
    with trio.move_on_after(LINGER_S):
        while discarded < LINGER_BYTES:
            data = await stream.receive_some(RECEIVE_SIZE)
            if not data:
                return
            discarded += len(data)

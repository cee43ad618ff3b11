"""A scripted lookupd for the registration tests: records what a node sends, and when.

``FakeLookupd`` listens on 127.0.0.1 (port 0 the first time, the same port when restarted),
parses each connection with the real lookupd-side codec (``LookupServerConnection``) and
answers as nsqlookupd does: ``OK``, or its own peer info for IDENTIFY. Every command is kept
in ``received`` as ``(trio.current_time(), connection number, command)``, so a test on the
autojump clock asserts exact virtual times. The script knobs: ``drop()`` closes the live
connections, ``stop()`` / ``start()`` take the listener down and up, ``silent`` stops
answering (the node's response timeout), ``refuse`` answers the next command with an error.
"""

from __future__ import annotations

import attrs
import trio

from lmqd.lookup import (
    Command,
    ConnectionClosed,
    Error,
    Identify,
    IdentifyResponse,
    LookupProtocolError,
    LookupServerConnection,
    Ok,
)


@attrs.frozen
class Received:
    at: float
    connection: int
    command: Command


class FakeLookupd:
    def __init__(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery
        self.port = 0
        self.received: list[Received] = []
        self.connections = 0
        self.silent = False
        self.refuse: Error | None = None
        self._scope: trio.CancelScope | None = None
        self._streams: set[trio.SocketStream] = set()
        self._changed = trio.Event()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> None:
        """Listen (again, on the same port once one was chosen)."""
        listeners = await trio.open_tcp_listeners(self.port, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        self._scope = trio.CancelScope()
        scope = self._scope

        async def serve() -> None:
            with scope:
                await trio.serve_listeners(self._handle, listeners)

        self._nursery.start_soon(serve)

    def stop(self) -> None:
        """Close the listener and every connection (a lookupd that went away)."""
        if self._scope is not None:
            self._scope.cancel()
            self._scope = None
        self.drop()

    def drop(self) -> None:
        """Close the live connections (the node sees EOF)."""
        for stream in list(self._streams):
            stream.socket.close()

    @property
    def live(self) -> int:
        """Connections open now."""
        return len(self._streams)

    def commands(self, connection: int | None = None) -> list[Command]:
        return [r.command for r in self.received if connection in (None, r.connection)]

    def times(self, kind: type) -> list[float]:
        return [r.at for r in self.received if isinstance(r.command, kind)]

    async def wait_for(self, count: int) -> None:
        """Until ``count`` commands have been received in all."""
        while len(self.received) < count:
            await self._changed.wait()

    async def wait_no_connections(self) -> None:
        """Until no node is connected."""
        while self._streams:
            await self._changed.wait()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def _handle(self, stream: trio.SocketStream) -> None:
        self.connections += 1
        number = self.connections
        self._streams.add(stream)
        conn = LookupServerConnection()
        try:
            async with stream:
                while True:
                    data = await stream.receive_some(4096)
                    conn.receive_data(data)
                    replies = []
                    while True:
                        try:
                            event = conn.next_event()
                        except LookupProtocolError as exc:
                            await stream.send_all(exc.frame())
                            return
                        if event is None or isinstance(event, ConnectionClosed):
                            break
                        self.received.append(Received(trio.current_time(), number, event))
                        self._notify()
                        if self.refuse is not None:
                            replies.append(self.refuse.encode())
                            self.refuse = None
                            await stream.send_all(b"".join(replies))
                            return
                        if isinstance(event, Identify):
                            replies.append(IdentifyResponse(
                                broadcast_address="127.0.0.1", tcp_port=self.port,
                                http_port=self.port + 1, version="1.3.0", hostname="fake",
                            ).encode())  # fmt: skip
                        else:
                            replies.append(Ok().encode())
                    if replies and not self.silent:
                        await stream.send_all(b"".join(replies))
                    if not data:
                        return
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            return
        finally:
            self._streams.discard(stream)
            self._notify()

"""``Registration``: lmqd registers with every ``--lookupd-tcp-address``, as nsqd does.

The broker tells the registration about topics and channels as they come and go (it is a
``BrokerObserver``); each event becomes one command for every connected lookupd (nsqd's
``Notify`` and lookup loop):

=================================================  ==============================================
event                                              command(s)
=================================================  ==============================================
topic created (PUB, SUB, HTTP, restore)            ``REGISTER t``
channel created                                    ``REGISTER t c``
channel deleted (HTTP, ephemeral: last consumer)   ``UNREGISTER t c``
topic deleted (HTTP, ephemeral: last channel)      ``UNREGISTER t``, then ``UNREGISTER t c`` for
                                                   each of its channels
=================================================  ==============================================

``#ephemeral`` topics and channels are registered like any other (nsqd does too). Names ending
in lmq's own ``#tmp`` are **not** registered: the real nsqlookupd answers them with a fatal
error and closes the connection, so registering one would cut the node off from that lookupd
for good (every reconnect would send it again). A topic whose channels are all ``#tmp`` is
registered bare.

Each lookupd has a ``LookupdPeer`` (the sans-IO state machine in ``peer.py``: handshake,
PING schedule, answers, backoff) and one task here that only dials, moves bytes and sleeps
until the peer's next deadline. ``options_changed`` (``PUT /config/nsqlookupd_tcp_addresses``)
starts a task for each new address at once and cancels the tasks of the addresses no longer
listed (the lookupd sees a disconnect), keeping the others' connections, as nsqd does.

The node's IDENTIFY: ``broadcast_address`` is ``--broadcast-address`` (default: the host
name); ``tcp_port`` / ``http_port`` are ``--broadcast-tcp-port`` / ``--broadcast-http-port``
or, when those are 0, the ports the daemon really listens on; ``hostname`` the OS host name;
``version`` the nsqd version lmqd speaks for. Without an HTTP listener the HTTP port is 0, and
a lookupd refuses the IDENTIFY (``E_BAD_BODY``), as it refuses nsqd's in that case.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable, Iterator, Sequence

import trio

from lmqd import NSQD_COMPAT_VERSION
from lmqd.broker import Broker
from lmqd.lookup import Command, Identify, Register, Unregister
from lmqd.names import is_nsq_name
from lmqd.net import split_address
from lmqd.options import Options
from lmqd.registration.peer import LookupdPeer, PeerFailed, PeerStatus

__all__ = ["DIAL_TIMEOUT", "RECEIVE_SIZE", "WRITE_TIMEOUT", "Registration"]

log = logging.getLogger("lmqd.registration")

DIAL_TIMEOUT = 1.0
"""nsqd's dial timeout for a lookupd; a lookupd that does not accept within it is retried after
the backoff."""

WRITE_TIMEOUT = 5.0
"""Longest a write to a lookupd may block (nsqd: 1 s); see ``peer.RESPONSE_TIMEOUT``."""

RECEIVE_SIZE = 4096
"""Bytes asked for per read: a lookupd's answers are ``OK`` (6 bytes) and one ~100-byte IDENTIFY
answer, so a node's whole start-up burst of answers fits a few reads."""


_Fail = Callable[[str, trio.CancelScope], None]
"""How a connection's task reports why the connection must end (and ends both tasks)."""


class _Link:
    """A peer and what its task needs: a wake-up for queued bytes, a scope to end it."""

    __slots__ = ("peer", "scope", "wake")

    def __init__(self, peer: LookupdPeer) -> None:
        self.peer = peer
        self.wake = trio.Event()
        self.scope = trio.CancelScope()

    def notify(self) -> None:
        self.wake.set()


class Registration:
    """lmqd's registration with its lookupds; see the module docstring."""

    def __init__(self, broker: Broker) -> None:
        self._broker = broker
        self._links: dict[str, _Link] = {}
        self._nursery: trio.Nursery | None = None
        broker.add_observer(self)

    @property
    def peers(self) -> list[LookupdPeer]:
        """The lookupds registered with (or being connected to), in the configured order."""
        return [link.peer for link in self._links.values()]

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Register with every configured lookupd until cancelled. Needs the daemon's bound
        addresses (``broker.addresses``) for IDENTIFY: start it once the listeners listen."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            try:
                addresses = self._broker.options.nsqlookupd_tcp_addresses
                if addresses and not self.identify().http_port:
                    # nsqd has the same trap: every lookupd refuses such an IDENTIFY.
                    log.error("LOOKUPD: no HTTP listener and no --broadcast-http-port: "
                              "lookupds will refuse this node's IDENTIFY")
                self._reconcile(addresses)
                task_status.started()
                await trio.sleep_forever()
            finally:
                self._nursery = None
                self._links.clear()  # their tasks end with this nursery

    # -- BrokerObserver --------------------------------------------------------------------------

    def _registered(self, topic: str) -> bool:
        """Whether ``topic`` is registered: an NSQ name, and not a topic this node mirrors
        (``lmqd.mirror``: consumers must find the primary while it is one)."""
        guard = self._broker.guard
        return is_nsq_name(topic) and (guard is None or guard.refuse_topic(topic) is None)

    def announce(self) -> None:
        """Register every topic and channel with every connected lookupd again (a mirror
        promoted to primary: its topics were not registered while it mirrored)."""
        self._broadcast(list(self.registrations()))

    def topic_created(self, topic: str) -> None:
        if self._registered(topic):
            self._broadcast([Register(topic=topic)])

    def topic_deleted(self, topic: str, channels: Sequence[str]) -> None:
        if self._registered(topic):
            commands: list[Command] = [Unregister(topic=topic)]
            commands += [Unregister(topic=topic, channel=c) for c in channels if is_nsq_name(c)]
            self._broadcast(commands)

    def channel_created(self, topic: str, channel: str) -> None:
        if self._registered(topic) and is_nsq_name(channel):
            self._broadcast([Register(topic=topic, channel=channel)])

    def channel_deleted(self, topic: str, channel: str) -> None:
        if self._registered(topic) and is_nsq_name(channel):
            self._broadcast([Unregister(topic=topic, channel=channel)])

    def options_changed(self, options: Options) -> None:
        self._reconcile(options.nsqlookupd_tcp_addresses)

    def _broadcast(self, commands: list[Command]) -> None:
        if not self._links:
            return  # also: a broker used outside trio (restore, tests) never needs the clock
        now = trio.current_time()
        for link in self._links.values():
            sent = False
            for command in commands:
                sent = link.peer.send(command, now) or sent
            if sent:
                link.notify()

    # -- what a node says about itself -------------------------------------------------------------

    def identify(self) -> Identify:
        """This node's IDENTIFY (ports: the broadcast ones, else the bound ones)."""
        options = self._broker.options
        addresses = self._broker.addresses
        tcp_port = options.broadcast_tcp_port or (addresses.tcp[1] if addresses else 0)
        http_bound = addresses.http[1] if addresses is not None and addresses.http else 0
        return Identify(
            broadcast_address=options.broadcast_address,
            tcp_port=tcp_port,
            http_port=options.broadcast_http_port or http_bound,
            version=NSQD_COMPAT_VERSION,
            hostname=socket.gethostname(),
        )

    def registrations(self) -> Iterator[Command]:
        """What a new connection registers: each topic bare if it has no (registrable)
        channels, otherwise once per channel (nsqd's connect callback)."""
        for topic in list(self._broker.topics.values()):
            if not self._registered(topic.name):
                continue
            channels = [name for name in topic.channels if is_nsq_name(name)]
            if not channels:
                yield Register(topic=topic.name)
            for channel in channels:
                yield Register(topic=topic.name, channel=channel)

    # -- peers -----------------------------------------------------------------------------------

    def _reconcile(self, addresses: Sequence[str]) -> None:
        wanted = list(dict.fromkeys(addresses))  # duplicates ignored, order kept (nsqd)
        for address in list(self._links):
            if address not in wanted:
                link = self._links.pop(address)
                link.scope.cancel()
                log.info("LOOKUPD(%s): removed", address)
        nursery = self._nursery
        if nursery is None:
            return
        for address in wanted:
            if address not in self._links:
                try:
                    split_address(address)
                except ValueError as exc:
                    log.error("LOOKUPD(%s): not registering - %s", address, exc)
                    continue
                link = _Link(LookupdPeer(address))
                self._links[address] = link
                nursery.start_soon(self._run_link, link)

    async def _run_link(self, link: _Link) -> None:
        peer = link.peer
        host, port = split_address(peer.address)
        with link.scope:
            while True:
                await trio.sleep_until(peer.connect_at)
                peer.start_connect(trio.current_time())
                stream: trio.SocketStream | None = None
                with trio.move_on_after(DIAL_TIMEOUT):
                    try:
                        stream = await trio.open_tcp_stream(host, port)
                    except OSError as exc:
                        peer.connect_failed(trio.current_time(), exc.strerror or str(exc))
                        continue
                if stream is None:
                    peer.connect_failed(trio.current_time(), f"timeout after {DIAL_TIMEOUT:g}s")
                    continue
                reason: str | None = None
                try:
                    async with stream:
                        peer.connected(trio.current_time(), self.identify(), self.registrations())
                        reason = await self._serve(link, stream)
                finally:
                    if reason is None:  # cancelled: shutdown, or the address was removed
                        peer.close()
                    else:
                        peer.disconnected(trio.current_time(), reason)

    async def _serve(self, link: _Link, stream: trio.SocketStream) -> str:
        """Move bytes until the connection fails; the reason."""
        failure: list[str] = []

        def fail(reason: str, scope: trio.CancelScope) -> None:
            if not failure:
                failure.append(reason)
            scope.cancel()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._read, link, stream, fail, nursery.cancel_scope)
            await self._write(link, stream, fail, nursery.cancel_scope)
        return failure[0] if failure else "closed"

    @staticmethod
    async def _read(link: _Link, stream: trio.SocketStream, fail: _Fail,
                    scope: trio.CancelScope) -> None:
        peer = link.peer
        try:
            while True:
                data = await stream.receive_some(RECEIVE_SIZE)
                peer.receive_data(data, trio.current_time())
        except PeerFailed as exc:
            fail(str(exc), scope)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            fail(f"read failed ({exc.__cause__ or exc})", scope)

    @staticmethod
    async def _write(link: _Link, stream: trio.SocketStream, fail: _Fail,
                     scope: trio.CancelScope) -> None:
        peer = link.peer
        try:
            while True:
                peer.timer(trio.current_time())
                data = peer.data_to_send()
                if data:
                    with trio.fail_after(WRITE_TIMEOUT):
                        await stream.send_all(data)
                    continue
                if peer.status is not PeerStatus.CONNECTED:
                    return
                link.wake = trio.Event()
                with trio.move_on_at(peer.next_deadline()):
                    await link.wake.wait()
        except PeerFailed as exc:
            fail(str(exc), scope)
        except trio.TooSlowError:
            fail(f"write blocked for {WRITE_TIMEOUT:g}s", scope)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            fail(f"write failed ({exc.__cause__ or exc})", scope)



"""One V2 TCP connection's I/O: a reader task and a writer task around a ``Session``.

Theory of operation
-------------------
The reader receives up to ``RECEIVE_SIZE`` bytes and hands them to the session, which parses
*every* complete command in them and applies them to the broker with plain calls; the channels
deliver once per buffer on their own. Responses and message frames collect in the session's
``OutputBuffer`` and the writer is woken once; the writer sends everything pending in one
``send_all``. So a buffer of a thousand FINs costs one receive, one delivery round and one send,
never an await per message.

Memory bounds. A consumer's output is bounded in bytes (``lmqd.server.session``: its byte room
caps each delivery round, and past ``OUTPUT_HIGH_WATER`` it takes no messages until its writer
drains), a publisher's input by the protocol limits, and all connections' buffers together by
the daemon-wide ``BufferBudget`` (``--max-buffered-bytes``, ``lmqd.server.budget``): past it a
publish is held (``Backpressure``) and nothing more is read from its client until the total is
back under the bound, while every other command is read and applied as usual; a body already
begun is completed, one connection at a time. The writer never pauses, so buffers drain.

The writer also emits heartbeats on nsqd's ticker (every ``heartbeat_interval`` from the protocol
magic, the ticker replaced at IDENTIFY) and bounds each send by the heartbeat interval, as nsqd's
write deadline does: a client that stops reading is dropped. Before the magic nothing is sent
(nsqd's IOLoop, and its ticker, start only once the 4 bytes are read). The reader drops a client
that sends nothing for two heartbeat intervals -- also one that never sent the magic, closed
without a frame as nsqd closes a connection whose magic it cannot read (nsqd itself would wait
for it forever) -- and stops reading while more than ``READ_PAUSE_WATER`` bytes wait to be sent,
so a client that publishes without reading its responses cannot grow our memory.

A fatal protocol error queues its error frame after the responses already due; the writer flushes
them and the connection closes. When the connection ends for any reason its in-flight messages are
requeued at once (nsqd waits for their timeout).

When the session waits (``Session.waiting``) the reader does the work: an AUTH query to the auth
servers, a sleep for a rate-limited publish (``Throttle``), or the stream upgrade an IDENTIFY
negotiated. For an upgrade the writer is paused once
it has sent the IDENTIFY answer (no heartbeat may follow it in plaintext); the reader runs the
TLS handshake and the codec on the stream (``lmqd.server.upgrade``), swaps ``stream`` for the
upgraded one and lets the writer go on. A plain connection pays nothing for this: one flag test
per receive and per send.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Awaitable, Callable

import trio

from lmqd.broker import Broker
from lmqd.net import split_address
from lmqd.protocol import HEARTBEAT_FRAME, Limits, ServerConnection
from lmqd.server.budget import OVER_BOUND_RECEIVE_SIZE, BufferBudget
from lmqd.server.output import OutputBuffer
from lmqd.server.security import ServerSecurity
from lmqd.server.session import (
    OUTPUT_HIGH_WATER,
    AuthQuery,
    Backpressure,
    Session,
    Throttle,
    Upgrade,
    Wait,
)
from lmqd.server.upgrade import UpgradeFailed, upgrade_stream
from lmqd.stats import ClientStats
from lmqd.transport.auth_http import AuthQueryError

log = logging.getLogger("lmqd.server")

ReceiveSome = Callable[[int], Awaitable[bytes | bytearray]]

# One receive takes up to this much: large enough that a burst of MPUBs or FINs is parsed and
# applied as one batch, small enough that one connection can't hog the loop for long.
RECEIVE_SIZE = 256 * 1024
# Stop reading from a client while this much output waits for it: only responses can push the
# output this far past the message high-water mark, so it publishes without reading its answers.
READ_PAUSE_WATER = 2 * OUTPUT_HIGH_WATER
# How long the writer may take to flush what's left once the connection is ending.
CLOSE_FLUSH_TIMEOUT = 5.0
# How long the plaintext E_IDENTIFY_FAILED after a failed TLS handshake may take to send: it is
# a courtesy to a client that is not speaking TLS; one that stops reading is not waited for.
FAILED_UPGRADE_SEND_TIMEOUT = 1.0


class TcpConnection:
    """A connected V2 client: its stream, its session and the two tasks between them."""

    def __init__(
        self,
        broker: Broker,
        stream: trio.abc.Stream,
        remote_address: str,
        security: ServerSecurity | None = None,
        budget: BufferBudget | None = None,
    ) -> None:
        self.broker = broker
        self.stream = stream
        self.remote_address = remote_address
        # The service passes the daemon's one ServerSecurity; building it here serves embedders
        # and tests that drive a single connection.
        self.security = security or ServerSecurity.from_options(broker.options)
        # The service passes the daemon's one budget (all connections count against it).
        self.budget = budget or BufferBudget(broker.options.max_buffered_bytes)
        self.output = OutputBuffer(self._wake, self.budget)
        self._input_bytes = 0
        """This connection's parser buffer as last counted in ``budget``."""
        self._input_peak = 0
        """The largest ``_input_bytes`` so far (a large partial command: ``trim_after``)."""
        self.session = Session(
            broker,
            ServerConnection(Limits.from_options(broker.options)),
            self.output,
            remote_address,
            on_close=self._stop_reading,
            on_heartbeat_interval=self._set_heartbeat_interval,
        )
        self.id = self.session.id
        self._wake_writer = trio.Event()
        self._drained = trio.Event()
        self._writer_done = False
        self._reader_scope = trio.CancelScope()
        self._heartbeat_interval = broker.options.default_heartbeat_interval
        self._next_heartbeat = math.inf
        """When the next heartbeat is due: never before the protocol magic (``_apply``)."""
        # Pausing the writer for a stream upgrade (one per connection at most).
        self._pause_writer = False
        self._writer_paused = trio.Event()
        self._writer_resumed = trio.Event()
        self._common_name = ""

    # -- what the broker sees (``lmqd.broker.Connection``) -------------------------------------

    @property
    def pub_counts(self) -> dict[str, int]:
        return self.session.pub_counts

    def statistics(self) -> ClientStats:
        return self.session.statistics()

    def close(self) -> None:
        """Stop reading; the writer flushes what is owed, then both tasks stop."""
        self.session.close()

    async def wait_sent(self) -> None:
        """Return once nothing waits to be sent (or the connection has ended)."""
        while self.output.has_unsent and not self._writer_done:
            await self._drained.wait()

    # -- callbacks from the session and the output ---------------------------------------------

    def _wake(self) -> None:
        self._wake_writer.set()

    def _stop_reading(self) -> None:
        self._reader_scope.cancel()
        self._wake_writer.set()

    def _set_heartbeat_interval(self, interval: float, now: float) -> None:
        self._heartbeat_interval = interval
        self._next_heartbeat = now + interval
        self._wake_writer.set()  # the writer re-reads its heartbeat deadline

    # -- the tasks ---------------------------------------------------------------------------

    async def serve(self) -> None:
        """Run the connection until either side ends it, then leave the channel."""
        broker = self.broker
        broker.clients[self.id] = self
        log.info("CLIENT(%s): connected", self.remote_address)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._writer)
                with self._reader_scope:
                    await self._reader()
                self.session.closing = True
                self._wake_writer.set()
        finally:
            broker.clients.pop(self.id, None)
            self.session.leave(trio.current_time())
            self.output.discard()
            # A body its client abandoned is freed now, not when the collector finds this
            # connection's cycles (its callbacks): 280 abandoned 4 MiB MPUBs held 1.1 GB.
            self.session.conn.discard_input()
            self.budget.release(self._input_bytes)
            self._input_bytes = 0
            self.budget.trim_after(self._input_peak)
            log.info("CLIENT(%s): closed", self.remote_address)

    async def _reader(self) -> None:
        session = self.session
        output = self.output
        budget = self.budget
        conn = session.conn
        receive = self.stream.receive_some
        while not session.closing:
            if session.waiting is not None:
                if not await self._serve(session.waiting):
                    return
                receive = self.stream.receive_some  # the stream may have been upgraded
                if not session.resume(trio.current_time()):
                    return
                continue
            if budget.used > budget.limit and conn.receiving_body:
                # Past the daemon-wide bound with a body begun: only its client's next bytes
                # can release it, so it is completed (one connection at a time) and applied.
                if not await self._finish_turn(receive):
                    return
                continue
            timeout = 2 * self._heartbeat_interval if self._heartbeat_interval > 0 else math.inf
            size = RECEIVE_SIZE if budget.used <= budget.limit else OVER_BOUND_RECEIVE_SIZE
            with trio.move_on_after(timeout) as scope:
                try:
                    data = await receive(size)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    return
            if scope.cancelled_caught:
                log.warning(
                    "CLIENT(%s): no data for %.1fs (2 heartbeats)%s, closing",
                    self.remote_address,
                    timeout,
                    "" if conn.started else " and no protocol magic",
                )
                return
            # Past the daemon-wide bound a publish waits (``Backpressure``); the rest applies.
            session.hold_publishes = budget.used > budget.limit
            if not self._apply(data):
                return
            if output.pending_bytes > READ_PAUSE_WATER:
                await self._drained.wait()

    def _apply(self, data: bytes | bytearray) -> bool:
        """Hand received bytes to the session and recount the parser's buffer; False once the
        connection must end."""
        now = trio.current_time()
        ok = self.session.receive(data, now) and bool(data)
        conn = self.session.conn
        if self._next_heartbeat == math.inf and conn.started and ok:
            self._set_heartbeat_interval(self._heartbeat_interval, now)  # nsqd's ticker starts
        buffered = conn.buffered_bytes
        delta = buffered - self._input_bytes
        if delta:
            self._input_bytes = buffered
            if delta > 0:
                self.budget.used += delta
                if buffered > self._input_peak:
                    self._input_peak = buffered
            else:
                self.budget.release(-delta)
        return ok

    async def _finish_turn(self, receive: ReceiveSome) -> bool:
        """Over the bound with a body begun: wait for this connection's turn (or for the total
        to drop under the bound), then complete it. False once the connection must end."""
        budget = self.budget
        with trio.CancelScope() as waiting:
            budget.cancel_when_below(waiting)
            await budget.finishing.acquire()
        budget.forget(waiting)
        if waiting.cancelled_caught:
            return True  # under the bound again: the main loop reads as usual
        try:
            return await self._finish_command(receive)
        finally:
            budget.finishing.release()

    async def _finish_command(self, receive: ReceiveSome) -> bool:
        """Over the bound: read only what the command being received still needs, until it is
        complete (or the total is back under the bound). False once the connection must end."""
        conn = self.session.conn
        budget = self.budget
        while (missing := conn.missing_bytes) and budget.over and not self.session.closing:
            if self.session.waiting is not None:
                return True  # the main loop serves it
            timeout = 2 * self._heartbeat_interval if self._heartbeat_interval > 0 else math.inf
            with trio.move_on_after(timeout) as scope:
                try:
                    data = await receive(min(missing, RECEIVE_SIZE))
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    return False
            if scope.cancelled_caught:
                log.warning(
                    "CLIENT(%s): no data for %.1fs (2 heartbeats) in a command, closing",
                    self.remote_address,
                    timeout,
                )
                return False
            self.session.hold_publishes = False  # the command it completes applies
            if not self._apply(data):
                return False
        return True

    async def _serve(self, wait: Wait) -> bool:
        """Do what the session waits for; False if the connection must end."""
        if isinstance(wait, Backpressure):
            # Nothing more is read from this client until the total is under the bound again.
            # What its parser holds (the start of a command after the held ones) stops counting
            # meanwhile: it cannot drain until then (the next receive counts it again).
            self.budget.release(self._input_bytes)
            self._input_bytes = 0
            await self.budget.wait_below()
            self.session.hold_publishes = False
            return True
        if isinstance(wait, AuthQuery):
            await self._query_auth(wait)
            return True
        if isinstance(wait, Throttle):
            # A publish waits for its topic's rate-limit tokens (at most PUBLISH_WAIT_MAX);
            # only this connection waits, the writer (heartbeats, OKs) goes on.
            await trio.sleep_until(wait.until)
            return True
        return await self._upgrade(wait)

    async def _query_auth(self, query: AuthQuery) -> None:
        auth = self.security.auth
        assert auth is not None, "the session asks only when auth is enabled"
        state = None
        try:
            state = await auth.query(
                remote_ip=split_address(self.remote_address)[0],
                tls=self.session.tls_state is not None,
                secret=query.secret,
                common_name=self._common_name,
            )
        except AuthQueryError as exc:
            log.warning("CLIENT(%s): AUTH failed: %s", self.remote_address, exc)
        self.session.auth_answered(state)

    async def _upgrade(self, upgrade: Upgrade) -> bool:
        # The writer sends what is ready (the IDENTIFY answer, in plaintext) and parks.
        self._pause_writer = True
        self._wake_writer.set()
        try:
            await self._writer_paused.wait()
            if self._writer_done:
                return False
            raw = self.stream
            prefix = self.session.conn.take_unparsed()
            try:
                upgraded = await upgrade_stream(raw, prefix, upgrade, self.security.tls)
            except UpgradeFailed as exc:
                log.warning("CLIENT(%s): IDENTIFY upgrade failed: %s", self.remote_address, exc)
                if exc.error is not None:
                    with (
                        trio.move_on_after(FAILED_UPGRADE_SEND_TIMEOUT),
                        contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError),
                    ):
                        await raw.send_all(exc.error.frame())
                return False
            layers = ("TLS" if upgraded.tls else "", upgraded.codec_name)
            log.info(
                "CLIENT(%s): upgraded to %s",
                self.remote_address,
                " + ".join(layer for layer in layers if layer),
            )
            self.stream = upgraded.stream
            self._common_name = upgraded.common_name
            self.session.upgraded(upgraded.tls, upgraded.codec_name)
            return True
        finally:
            # Success, failure or cancellation: the writer goes on (and ends if closing).
            self._pause_writer = False
            self._writer_resumed.set()

    async def _writer(self) -> None:
        session = self.session
        output = self.output
        try:
            while True:
                if not output.has_ready:
                    if session.closing and not output.has_unsent:
                        return
                    if self._pause_writer:
                        # Park for the upgrade once everything before it is out, durable
                        # publishes held for their fsync included (they answer commands sent
                        # before IDENTIFY, so they go in plaintext).
                        if not output.has_unsent:
                            self._writer_paused.set()
                            await self._writer_resumed.wait()
                            continue
                        deadline = math.inf  # no heartbeat now: wait for the held frames
                    elif self._heartbeat_interval > 0:
                        deadline = self._next_heartbeat
                    else:
                        deadline = math.inf
                    with trio.move_on_at(deadline):
                        await self._wake_writer.wait()
                self._wake_writer = trio.Event()
                # nsqd's heartbeat is a ticker: it fires on time whatever else is being sent.
                # No heartbeat may follow the IDENTIFY answer before an upgrade, in plaintext.
                if self._heartbeat_interval > 0 and not self._pause_writer:
                    now = trio.current_time()
                    if now >= self._next_heartbeat:
                        output.write_now(HEARTBEAT_FRAME)
                        self._next_heartbeat += self._heartbeat_interval
                        if self._next_heartbeat <= now:  # fell behind: skip, don't burst
                            self._next_heartbeat = now + self._heartbeat_interval
                data = output.take()
                if not data:
                    continue
                timeout = self._heartbeat_interval if self._heartbeat_interval > 0 else math.inf
                if session.closing:
                    timeout = min(timeout, CLOSE_FLUSH_TIMEOUT)
                with trio.move_on_after(timeout) as scope:
                    await self.stream.send_all(data)
                if scope.cancelled_caught:
                    log.warning("CLIENT(%s): write timed out, closing", self.remote_address)
                    return
                output.sent()
                self._drained.set()
                self._drained = trio.Event()
                session.output_drained()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            log.debug("CLIENT(%s): peer gone while writing", self.remote_address)
        finally:
            # The writer is done: nothing more can be sent, so the reader must stop too.
            session.closing = True
            self._writer_done = True
            self._drained.set()
            self._writer_paused.set()
            self._reader_scope.cancel()

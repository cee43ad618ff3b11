"""One V2 TCP connection's I/O: a reader task and a writer task around a ``Session``.

Theory of operation
-------------------
The reader receives up to ``RECEIVE_SIZE`` bytes and hands them to the session, which parses
*every* complete command in them and applies them to the broker with plain calls; the channels
deliver once per buffer on their own. Responses and message frames collect in the session's
``OutputBuffer`` and the writer is woken once; the writer sends everything pending in one
``send_all``. So a buffer of a thousand FINs costs one receive, one delivery round and one send,
never an await per message.

The writer also emits heartbeats on nsqd's ticker (every ``heartbeat_interval`` from connect, the
ticker replaced at IDENTIFY) and bounds each send by the heartbeat interval, as nsqd's write
deadline does: a client that stops reading is dropped. The reader drops a client that sends nothing
for two heartbeat intervals, and stops reading while more than ``READ_PAUSE_WATER`` bytes wait to
be sent, so a client that publishes without reading its responses cannot grow our memory.

A fatal protocol error queues its error frame after the responses already due; the writer flushes
them and the connection closes. When the connection ends for any reason its in-flight messages are
requeued at once (nsqd waits for their timeout).
"""

from __future__ import annotations

import logging
import math

import trio

from lmqd.broker import Broker
from lmqd.protocol import HEARTBEAT_FRAME, Limits, ServerConnection
from lmqd.server.output import OutputBuffer
from lmqd.server.session import OUTPUT_HIGH_WATER, Session
from lmqd.stats import ClientStats

log = logging.getLogger("lmqd.server")

# One receive takes up to this much: large enough that a burst of MPUBs or FINs is parsed and
# applied as one batch, small enough that one connection can't hog the loop for long.
RECEIVE_SIZE = 256 * 1024
# Stop reading from a client while this much output waits for it: only responses can push the
# output this far past the message high-water mark, so it publishes without reading its answers.
READ_PAUSE_WATER = 2 * OUTPUT_HIGH_WATER
# How long the writer may take to flush what's left once the connection is ending.
CLOSE_FLUSH_TIMEOUT = 5.0


class TcpConnection:
    """A connected V2 client: its stream, its session and the two tasks between them."""

    def __init__(self, broker: Broker, stream: trio.abc.Stream, remote_address: str) -> None:
        self.broker = broker
        self.stream = stream
        self.remote_address = remote_address
        self.output = OutputBuffer(self._wake)
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
        self._next_heartbeat = trio.current_time() + self._heartbeat_interval

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
            self.session.leave()
            log.info("CLIENT(%s): closed", self.remote_address)

    async def _reader(self) -> None:
        session = self.session
        output = self.output
        receive = self.stream.receive_some
        while not session.closing:
            timeout = 2 * self._heartbeat_interval if self._heartbeat_interval > 0 else math.inf
            with trio.move_on_after(timeout) as scope:
                try:
                    data = await receive(RECEIVE_SIZE)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    return
            if scope.cancelled_caught:
                log.warning(
                    "CLIENT(%s): no data for %.1fs (2 heartbeats), closing",
                    self.remote_address,
                    timeout,
                )
                return
            if not session.receive(data, trio.current_time()) or not data:
                return
            if output.pending_bytes > READ_PAUSE_WATER:
                await self._drained.wait()

    async def _writer(self) -> None:
        session = self.session
        output = self.output
        try:
            while True:
                if not output.has_ready:
                    if session.closing and not output.has_unsent:
                        return
                    deadline = self._next_heartbeat if self._heartbeat_interval > 0 else math.inf
                    with trio.move_on_at(deadline):
                        await self._wake_writer.wait()
                self._wake_writer = trio.Event()
                # nsqd's heartbeat is a ticker: it fires on time whatever else is being sent.
                if self._heartbeat_interval > 0:
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
            self._reader_scope.cancel()

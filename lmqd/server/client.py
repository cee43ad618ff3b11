"""One V2 TCP connection: a reader task and a writer task around the sans-IO protocol.

Theory of operation
-------------------
The reader receives up to ``RECEIVE_SIZE`` bytes, hands them to the protocol's
``ServerConnection`` and gets back *every* complete command in them. It applies those commands to
the engine with plain function calls (consecutive publishes to one topic are coalesced into one
``daemon.publish``), then asks the subscribed channel to deliver once. Responses and message frames
are appended to ``_output`` and the writer is woken once; the writer sends everything pending in
one ``send_all``. So a buffer of a thousand FINs costs one receive, one delivery round and one send,
never an await per message.

The writer also emits heartbeats on nsqd's ticker (every ``heartbeat_interval`` from connect, the
ticker replaced at IDENTIFY) and bounds each send by the heartbeat interval, as nsqd's write
deadline does: a client that stops reading is dropped. The reader drops a client that sends nothing
for two heartbeat intervals, and stops reading while more than ``OUTPUT_HIGH_WATER`` bytes wait to
be sent, so a client that publishes without reading its responses cannot grow our memory.

A fatal protocol error queues its error frame after the responses already due; the writer flushes
them and the connection closes. When the connection ends for any reason its in-flight messages are
requeued at once (nsqd waits for their timeout).

With ``--durable`` a publish's ``OK`` must wait for the fsync of its records. The reader does not
wait (it goes on applying the buffer and reading, so one connection pipelining many publishes
shares an fsync, and other connections are never blocked): the publish opens a *hold*, a segment
of output that starts with its ``OK`` frames and collects everything written after it (responses
stay FIFO, as clients match them in order). ``Syncer.when_durable`` resolves holds in order; a
resolved hold's frames move to the output, and a failed sync turns the ``OK`` into nsqd's fatal
``E_PUB_FAILED`` / ``E_MPUB_FAILED`` / ``E_DPUB_FAILED`` and closes the connection.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING

import trio

from lmqd.backend import BackendError
from lmqd.channel import Channel, NotInFlight, NotOwner, TooManyConsumers
from lmqd.message import Message
from lmqd.protocol import (
    CLOSE_WAIT_FRAME,
    HEARTBEAT_FRAME,
    OK_FRAME,
    Auth,
    ClientState,
    Cls,
    Dpub,
    Event,
    Fins,
    Identify,
    Limits,
    Mpub,
    Nop,
    ProtocolError,
    Pub,
    Rdy,
    Req,
    ServerConnection,
    Sub,
    Touch,
    errors,
    identify_response,
    message_frame_parts,
)
from lmqd.stats import ClientStats, PubCount
from lmqd.topic import TopicExiting

if TYPE_CHECKING:
    from lmqd.daemon import LmqDaemon

log = logging.getLogger("lmqd.server")

# One receive takes up to this much: large enough that a burst of MPUBs or FINs is parsed and
# applied as one batch, small enough that one connection can't hog the loop for long.
RECEIVE_SIZE = 256 * 1024
# A subscriber with this much unsent output gets no more messages until its writer catches up
# (it reports an RDY window of 0): a consumer that stops reading costs at most about this much
# memory, instead of collecting every redelivery of its own timed-out messages.
OUTPUT_HIGH_WATER = 4 * 1024 * 1024
# Stop reading from a client while this much output waits for it: only responses can push the
# output this far past the message high-water mark, so it publishes without reading its answers.
READ_PAUSE_WATER = 2 * OUTPUT_HIGH_WATER
# How long the writer may take to flush what's left once the connection is ending.
CLOSE_FLUSH_TIMEOUT = 5.0


class _Hold:
    """Output held until a durable publish's records are fsynced (see the module docstring)."""

    __slots__ = ("done", "error", "frames", "kind", "nbytes")

    def __init__(self, kind: str, frames: list[bytes]) -> None:
        self.kind = kind
        self.frames = frames
        self.nbytes = sum(map(len, frames))
        self.done = False
        self.error: OSError | None = None


class TcpClient:
    """A connected V2 client; implements ``lmqd.subscriber.Subscriber`` once subscribed."""

    def __init__(self, daemon: LmqDaemon, stream: trio.abc.Stream, remote_address: str) -> None:
        options = daemon.options
        self.daemon = daemon
        self.stream = stream
        self.remote_address = remote_address
        self.id = daemon.new_client_id()
        self.connect_ts = int(time.time())
        self.conn = ServerConnection(Limits.from_options(options))
        # Subscriber fields (the channel maintains the counters).
        self._ready_count = 0
        self._stalled = False
        self.in_flight_count = 0
        self.message_count = 0
        self.finish_count = 0
        self.requeue_count = 0
        self.msg_timeout = options.msg_timeout
        self.sample_rate = 0
        # Identity (IDENTIFY replaces the defaults, which are the remote host as in nsqd).
        host = remote_address.rpartition(":")[0].strip("[]")
        self.client_id = host
        self.hostname = host
        self.user_agent = ""
        self.pub_counts: dict[str, int] = {}
        self.channel: Channel | None = None
        # Output side.
        self._output: list[bytes] = []
        self._output_bytes = 0
        self._holds: deque[_Hold] = deque()
        self._held_bytes = 0
        self._wake_writer = trio.Event()
        self._drained = trio.Event()
        self._closing = False
        self._writer_done = False
        self._reader_scope = trio.CancelScope()
        self._heartbeat_interval = options.default_heartbeat_interval
        self._next_heartbeat = trio.current_time() + self._heartbeat_interval

    # -- Subscriber --------------------------------------------------------------------------

    @property
    def ready_count(self) -> int:
        """The RDY window the channel sees: 0 while this client's output is backed up."""
        return 0 if self._stalled else self._ready_count

    @ready_count.setter
    def ready_count(self, count: int) -> None:
        self._ready_count = count

    def close(self) -> None:
        """End the connection (its channel was deleted): the writer flushes, both tasks stop."""
        self._closing = True
        self._reader_scope.cancel()
        self._wake_writer.set()

    def write_messages(self, messages: Sequence[Message]) -> None:
        parts: list[bytes] = []
        self._write_parts(parts, message_frame_parts(messages, parts))
        if self._output_bytes + self._held_bytes > OUTPUT_HIGH_WATER:
            self._stalled = True

    def statistics(self) -> ClientStats:
        return ClientStats(
            client_id=self.client_id,
            hostname=self.hostname,
            version="V2",
            remote_address=self.remote_address,
            state=int(self.conn.state),
            ready_count=self._ready_count,
            in_flight_count=self.in_flight_count,
            message_count=self.message_count,
            finish_count=self.finish_count,
            requeue_count=self.requeue_count,
            connect_ts=self.connect_ts,
            sample_rate=self.sample_rate,
            deflate=False,
            snappy=False,
            user_agent=self.user_agent,
            tls=False,
            tls_cipher_suite="",
            tls_version="",
            tls_negotiated_protocol="",
            tls_negotiated_protocol_is_mutual=False,
            pub_counts=tuple(PubCount(topic=t, count=n) for t, n in self.pub_counts.items()),
        )

    # -- output ------------------------------------------------------------------------------

    def _write(self, frame: bytes) -> None:
        self._write_parts([frame], len(frame))

    def _write_parts(self, parts: list[bytes], nbytes: int) -> None:
        """Queue ``parts`` (``nbytes`` in all) for the writer, behind any durable hold."""
        if self._holds:
            hold = self._holds[-1]
            hold.frames += parts
            hold.nbytes += nbytes
            self._held_bytes += nbytes
            return
        self._output += parts
        self._output_bytes += nbytes
        self._wake_writer.set()

    def _write_oks(self, kind: str, topic: str, count: int) -> None:
        """Answer ``count`` publishes to ``topic``: now, or (durable) once they are fsynced."""
        frames = [OK_FRAME] * count
        hold = _Hold(kind, frames)
        if self.daemon.after_durable(topic, partial(self._synced, hold)):
            self._holds.append(hold)
            self._held_bytes += hold.nbytes
            return
        if self._holds:
            self._holds[-1].frames.extend(frames)
            self._holds[-1].nbytes += hold.nbytes
            self._held_bytes += hold.nbytes
            return
        self._output.extend(frames)
        self._output_bytes += hold.nbytes
        self._wake_writer.set()

    def _synced(self, hold: _Hold, error: OSError | None) -> None:
        # Syncer callback: release every hold resolved so far, in order.
        hold.done = True
        hold.error = error
        holds = self._holds
        while holds and holds[0].done:
            first = holds.popleft()
            self._held_bytes -= first.nbytes
            if first.error is not None:
                exc = errors.publish_failed(first.kind, str(first.error))
                log.error("CLIENT(%s): %s", self.remote_address, exc)
                # Fatal, as nsqd's: nothing after it is sent and the connection closes.
                holds.clear()
                self._held_bytes = 0
                self._output.append(exc.frame())
                self._closing = True
                self._reader_scope.cancel()
                break
            self._output.extend(first.frames)
            self._output_bytes += first.nbytes
        self._wake_writer.set()

    @property
    def has_unsent_output(self) -> bool:
        """Whether responses or messages wait to be sent (or for a durable publish's fsync)."""
        return bool(self._output or self._holds)

    async def wait_sent(self) -> None:
        """Return once nothing waits to be sent (or the connection has ended)."""
        while self.has_unsent_output and not self._writer_done:
            await self._drained.wait()

    async def _writer(self, cancel_reader: trio.CancelScope) -> None:
        try:
            while True:
                if not self._output:
                    if self._closing and not self._holds:
                        return
                    deadline = self._next_heartbeat if self._heartbeat_interval > 0 else math.inf
                    with trio.move_on_at(deadline):
                        await self._wake_writer.wait()
                self._wake_writer = trio.Event()
                # nsqd's heartbeat is a ticker: it fires on time whatever else is being sent.
                if self._heartbeat_interval > 0:
                    now = trio.current_time()
                    if now >= self._next_heartbeat:
                        self._output.append(HEARTBEAT_FRAME)
                        self._next_heartbeat += self._heartbeat_interval
                        if self._next_heartbeat <= now:  # fell behind: skip, don't burst
                            self._next_heartbeat = now + self._heartbeat_interval
                if not self._output:
                    continue
                data = b"".join(self._output)
                self._output.clear()
                self._output_bytes = 0
                timeout = self._heartbeat_interval if self._heartbeat_interval > 0 else math.inf
                if self._closing:
                    timeout = min(timeout, CLOSE_FLUSH_TIMEOUT)
                with trio.move_on_after(timeout) as scope:
                    await self.stream.send_all(data)
                if scope.cancelled_caught:
                    log.warning("CLIENT(%s): write timed out, closing", self.remote_address)
                    return
                self._drained.set()
                self._drained = trio.Event()
                if self._stalled and self._output_bytes + self._held_bytes <= OUTPUT_HIGH_WATER:
                    self._stalled = False
                    channel = self.channel
                    if channel is not None:
                        channel.client_ready(self)
                        channel.deliver(trio.current_time())
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            log.debug("CLIENT(%s): peer gone while writing", self.remote_address)
        finally:
            # The writer is done: nothing more can be sent, so the reader must stop too.
            self._closing = True
            self._writer_done = True
            self._drained.set()
            cancel_reader.cancel()

    # -- reading and applying commands ----------------------------------------------------------

    async def serve(self) -> None:
        """Run the connection until either side ends it, then leave the channel."""
        self.daemon.clients[self.id] = self
        log.info("CLIENT(%s): connected", self.remote_address)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._writer, self._reader_scope)
                with self._reader_scope:
                    await self._reader()
                self._closing = True
                self._wake_writer.set()
        finally:
            self.daemon.clients.pop(self.id, None)
            channel = self.channel
            if channel is not None:
                self.channel = None
                now = trio.current_time()
                channel.remove_client(self, now)
                channel.deliver(now)
            log.info("CLIENT(%s): closed", self.remote_address)

    async def _reader(self) -> None:
        conn = self.conn
        receive = self.stream.receive_some
        while not self._closing:
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
            conn.receive_data(data)
            if not self._apply_buffer():
                return
            if not data:
                return
            if self._output_bytes + self._held_bytes > READ_PAUSE_WATER:
                await self._drained.wait()

    def _apply_buffer(self) -> bool:
        """Apply every complete command received; False once the connection must end."""
        now = trio.current_time()
        try:
            while True:
                events = self.conn.next_events()
                if not events:
                    break
                self._apply(events, now)
        except ProtocolError as exc:
            self._fail(exc)
            return False
        finally:
            if self.channel is not None:
                self.channel.deliver(now)
        return True

    def _fail(self, exc: ProtocolError) -> None:
        log.info("CLIENT(%s): %s", self.remote_address, exc.body.decode("utf-8", "replace"))
        self._write(exc.frame())
        if exc.fatal:
            self._closing = True

    def _apply(self, events: Sequence[Event], now: float) -> None:
        # Runs of consecutive PUB/MPUBs to one topic become one publish, their OKs written only
        # once it succeeded (a failure answers with the error and closes); FINs (the parser
        # gives each run as one Fins event) become one finish_many. Everything else is applied
        # in order between the runs.
        pub_topic: str | None = None
        pub_kind = "PUB"
        pub_bodies: list[bytes] = []
        pub_count = 0
        fins: list[bytes] = []

        def flush() -> None:
            nonlocal pub_topic, pub_count
            if fins:
                self._finish_many(fins, now)
                fins.clear()
            if pub_topic is not None:
                topic, count = pub_topic, pub_count
                pub_topic, pub_count = None, 0
                self._publish(pub_kind, topic, pub_bodies, 0.0)
                pub_bodies.clear()
                self._write_oks(pub_kind, topic, count)

        for event in events:
            if isinstance(event, Fins):
                if pub_topic is not None:
                    flush()
                fins += event.ids
                continue
            if isinstance(event, Pub | Mpub):
                if fins or event.topic != pub_topic:
                    flush()
                    pub_topic = event.topic
                    pub_kind = "PUB" if isinstance(event, Pub) else "MPUB"
                if isinstance(event, Pub):
                    pub_bodies.append(event.body)
                else:
                    pub_bodies.extend(event.bodies)
                pub_count += 1
                continue
            flush()
            match event:
                case Rdy(count=count):
                    self._ready(count)
                case Req(id=msg_id, timeout_ms=timeout_ms):
                    self._requeue(msg_id, timeout_ms, now)
                case Touch(id=msg_id):
                    self._touch(msg_id, now)
                case Nop():
                    pass
                case Dpub(topic=topic, defer_ms=defer_ms, body=body):
                    self._publish("DPUB", topic, [body], defer_ms / 1000)
                    self._write_oks("DPUB", topic, 1)
                case Sub(topic=topic, channel=channel):
                    self._subscribe(topic, channel)
                case Identify():
                    self._identify(event, now)
                case Auth():
                    raise errors.auth_disabled()
                case Cls():
                    self.ready_count = 0
                    self._write(CLOSE_WAIT_FRAME)
                case _:
                    raise AssertionError(f"unhandled event {event!r}")
        flush()

    def _publish(self, kind: str, topic: str, bodies: Sequence[bytes], defer: float) -> None:
        try:
            self.daemon.publish(topic, bodies, defer)
        except (BackendError, TopicExiting) as exc:
            raise errors.publish_failed(kind, str(exc) or "exiting") from exc
        # Messages, as nsqd counts them (an MPUB adds its length), however the run was coalesced.
        self.pub_counts[topic] = self.pub_counts.get(topic, 0) + len(bodies)

    def _identify(self, event: Identify, now: float) -> None:
        settings = event.settings
        self.client_id = settings.client_id or self.client_id
        self.hostname = settings.hostname or self.hostname
        self.user_agent = settings.user_agent
        self.msg_timeout = settings.msg_timeout_ms / 1000
        self.sample_rate = settings.sample_rate
        interval = settings.heartbeat_interval_ms
        self._heartbeat_interval = interval / 1000 if interval > 0 else 0.0
        self._next_heartbeat = now + self._heartbeat_interval
        self._wake_writer.set()  # the writer re-reads its heartbeat deadline
        limits = self.conn.limits
        if settings.feature_negotiation:
            self._write_response(identify_response(settings, limits))
        else:
            self._write(OK_FRAME)

    def _write_response(self, data: bytes) -> None:
        from lmqd.protocol import encode_response

        self._write(encode_response(data))

    def _subscribe(self, topic_name: str, channel_name: str) -> None:
        try:
            channel = self.daemon.get_topic(topic_name).get_channel(channel_name)
            channel.add_client(self)
        except TooManyConsumers as exc:
            raise errors.sub_failed(str(exc)) from exc
        except TopicExiting as exc:
            raise errors.sub_failed("exiting") from exc
        except BackendError as exc:  # its disk queue could not be opened
            raise errors.sub_failed(str(exc)) from exc
        self.channel = channel
        self._write(OK_FRAME)

    def _ready(self, count: int) -> None:
        if self.conn.state is ClientState.CLOSING:  # nsqd ignores RDY after CLS
            return
        self.ready_count = count
        if self.channel is not None:
            self.channel.client_ready(self)

    def _finish_many(self, msg_ids: list[bytes], now: float) -> None:
        assert self.channel is not None  # the state table allows FIN only once subscribed
        for msg_id, exc in self.channel.finish_many(self, msg_ids, now):
            self._fail(errors.fin_failed(msg_id, str(exc)))

    def _requeue(self, msg_id: bytes, timeout_ms: int, now: float) -> None:
        assert self.channel is not None
        # REQ clamps its delay to [0, --max-req-timeout] instead of failing (nsqd).
        delay = min(timeout_ms / 1000, self.daemon.options.max_req_timeout)
        try:
            self.channel.requeue(self, msg_id, delay, now)
        except (NotInFlight, NotOwner) as exc:
            self._fail(errors.req_failed(msg_id, str(exc)))

    def _touch(self, msg_id: bytes, now: float) -> None:
        assert self.channel is not None
        try:
            self.channel.touch(self, msg_id, now)
        except (NotInFlight, NotOwner) as exc:
            self._fail(errors.touch_failed(msg_id, str(exc)))

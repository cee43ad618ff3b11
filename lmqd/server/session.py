"""A V2 client's session: the commands it sends, applied to the broker; what it is as a consumer.

Trio-free. ``apply`` takes every event parsed from one receive buffer (``ServerConnection``) and
applies them with plain calls: runs of consecutive PUB/MPUBs to one topic become one
``broker.publish`` (their ``OK``s written once it succeeded), and so do runs of XPUBs to one
topic that are not deferred and carry no dedup id (``_joins_runs``), runs of FINs one
``finish_many``;
everything else in order between the runs. Responses go to the connection's ``OutputBuffer``;
the connection's I/O loops (``lmqd.server.connection``) only move bytes.

Waiting for I/O without awaiting. Three things a command can need are not plain calls: the
stream upgrade an IDENTIFY negotiates (TLS, snappy, deflate), an answer from the auth servers
(AUTH, or a cached answer whose ttl has passed when PUB/MPUB/DPUB/SUB is checked), and time, for
a publish to a topic with a rate limit whose tokens are not there yet. The session then stops
applying, keeps the commands not yet applied, and sets ``waiting`` to an ``Upgrade``, an
``AuthQuery`` or a ``Throttle``; the connection performs it, reports back (``upgraded``,
``auth_answered``; a throttle is only a sleep) and calls ``resume``, which applies the kept
commands and goes on parsing.

Publish policies (``lmqd.engine.admission``). A run of publishes to a topic with a publish gate
keeps its commands apart (MPUBs are accepted or refused whole, and a refusal is per command):
the run's tokens are reserved at once (``gate.reserve``), the connection sleeps the wait that
returns (one ``Throttle`` per run, at most ``PUBLISH_WAIT_MAX``; the reserved commands are
``_prepaid`` when they are applied again), the topic accepts a prefix of them (dedup, depth), and
the first command refused gets its ``E_<CMD>_FAILED`` after the ``OK`` of those before it. A run
to a topic without a gate costs one dict lookup more than nsqd's path. The authorization
check itself is a plain call on the cached answer (``lmqd.transport.auth.check_authorized``),
done once per run of publishes to one topic, so there is no await per message. The fourth wait
is ``Backpressure``: while the daemon is past ``--max-buffered-bytes`` (``hold_publishes``) a
PUB, MPUB or DPUB stops applying, and the connection reads nothing more from this client until
the total is back under the bound; every other command (FIN, REQ, RDY, ...) is still applied.

A subscribed session is the channel's ``Consumer``: its RDY window, message timeout and sample
rate, its byte room, and ``write_messages``, which turns a delivery round's messages into
frames. Its output is bounded in bytes, not only by RDY: a delivery round gives it messages only
while their bodies fit the room left below ``OUTPUT_HIGH_WATER`` (``byte_room``; the last one
may pass it), and once that much waits to be sent it is *stalled* (an RDY window of 0) until its
writer drains it. Messages it has no room for stay in the channel, not in flight. So a consumer
that stops reading holds at most ``OUTPUT_HIGH_WATER`` plus one message of output, whatever its
RDY and the message size.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from functools import partial

import attrs

from lmqd.broker import Broker, NotPrimary
from lmqd.engine.admission import PublishGate, PublishRefused
from lmqd.engine.backend import BackendError
from lmqd.engine.channel import Channel
from lmqd.engine.errors import TooManyConsumers, TopicExiting
from lmqd.engine.inflight import NotInFlight, NotOwner
from lmqd.engine.insync import NotEnoughMirrors
from lmqd.engine.subscription import Subscription
from lmqd.message import Message
from lmqd.message_ext import MessageExt, any_set
from lmqd.net import format_address, split_address
from lmqd.protocol import (
    CLOSE_WAIT_FRAME,
    OK_FRAME,
    Auth,
    ClientState,
    Cls,
    Dpub,
    Event,
    Fins,
    Identify,
    Mpub,
    Nop,
    ProtocolError,
    Pub,
    Rdy,
    Req,
    ServerConnection,
    Sub,
    Touch,
    Xpub,
    encode_response,
    errors,
    ext_message_frame_parts,
    identify_response,
    message_frame_parts,
)
from lmqd.protocol.extension import EXT_VERSION
from lmqd.server.output import Hold, OutputBuffer
from lmqd.stats import ClientStats, PubCount
from lmqd.transport.auth import (
    AuthExpired,
    AuthState,
    auth_outcome,
    auth_response_body,
    check_authorized,
)
from lmqd.transport.tls import TLSState

log = logging.getLogger("lmqd.server")

# A subscriber with this much unsent output gets no more messages until its writer catches up
# (it reports an RDY window of 0), and no delivery round gives it more than the room left below
# it plus one message: a consumer that stops reading costs at most this much plus one message
# (5 MiB at the default --max-msg-size), whatever its RDY, instead of a whole RDY window of big
# messages (2500 x 1 MiB) or every redelivery of its own timed-out messages. 4 MiB (the value
# since the first build): a full RDY window of 2500 x 1 KiB messages fits in one round, so small
# messages never meet the byte bound, and a thousand stuck consumers still fit in ~5 GiB.
OUTPUT_HIGH_WATER = 4 * 1024 * 1024


@attrs.frozen
class Upgrade:
    """IDENTIFY negotiated stream upgrades: TLS first, then at most one codec (nsqd's order)."""

    tls: bool
    snappy: bool
    deflate: bool
    deflate_level: int


@attrs.frozen
class AuthQuery:
    """The session needs the auth servers' answer for ``secret``.

    ``cmd`` is None for AUTH itself; otherwise the cached answer expired while checking ``cmd``
    on ``topic`` (and ``channel`` for SUB), which is checked again on the new answer.
    """

    secret: bytes
    cmd: str | None = None
    topic: str = ""
    channel: str | None = None


@attrs.frozen
class Throttle:
    """A publish run waits for its rate-limit tokens until ``until`` (trio time)."""

    until: float


@attrs.frozen
class Backpressure:
    """Past the daemon-wide buffer bound (``lmqd.server.budget``) a publish was reached: it and
    everything after it wait until the total is back under the bound."""


BACKPRESSURE = Backpressure()

Wait = Upgrade | AuthQuery | Throttle | Backpressure


class Session:
    """One connection's protocol state and command handling (no I/O)."""

    def __init__(
        self,
        broker: Broker,
        conn: ServerConnection,
        output: OutputBuffer,
        remote_address: str,
        *,
        on_close: Callable[[], None],
        on_heartbeat_interval: Callable[[float, float], None],
    ) -> None:
        options = broker.options
        self.broker = broker
        self.conn = conn
        self.output = output
        self.remote_address = remote_address
        self.id = broker.new_client_id()
        self.connect_ts = int(time.time())
        self._on_close = on_close
        self._on_heartbeat_interval = on_heartbeat_interval
        # Consumer fields (the channel keeps the counters on the subscription).
        self._ready_count = 0
        self.stalled = False
        self.msg_timeout = options.msg_timeout
        self.sample_rate = 0
        self.ext_frames = False
        """The client negotiated lmq's extension: its messages may come in frame type 3."""
        # Identity (IDENTIFY replaces the defaults, which are the remote host as in nsqd).
        host = split_address(remote_address)[0]
        self.client_id = host
        self.hostname = host
        self.user_agent = ""
        self.pub_counts: dict[str, int] = {}
        self.channel: Channel | None = None
        self.subscription: Subscription | None = None
        self.closing = False
        """Set once the connection must end: nothing more is read or applied."""
        # Upgrades and AUTH (see the module docstring).
        self.waiting: Wait | None = None
        """What the connection must do before this session applies more commands."""
        self.hold_publishes = False
        """Set by the connection while the daemon is past its buffer bound: a PUB, MPUB or DPUB
        stops applying (``Backpressure``); every other command is still applied."""
        self._pending: list[Event] = []
        self.auth_enabled = conn.limits.auth_required
        self.auth_state: AuthState | None = None
        self._auth_secret = b""
        self.tls_state: TLSState | None = None
        self.codec_name = ""
        """``"snappy"`` or ``"deflate"`` once the stream is compressed."""
        self._prepaid = 0
        """Publish commands at the head of the kept commands whose rate-limit tokens are
        already reserved (a ``Throttle`` ended)."""

    # -- Consumer ----------------------------------------------------------------------------

    @property
    def ready_count(self) -> int:
        """The RDY window the channel sees: 0 while this client's output is backed up."""
        return 0 if self.stalled else self._ready_count

    @ready_count.setter
    def ready_count(self, count: int) -> None:
        self._ready_count = count

    def byte_room(self) -> int:
        """Bytes of messages a delivery round may give this consumer now (<= 0: stalled until
        its writer drains, which asks the channel for a round)."""
        room = OUTPUT_HIGH_WATER - self.output.pending_bytes
        if room <= 0:
            self.stalled = True
        return room

    def write_messages(self, messages: Sequence[Message]) -> None:
        output = self.output
        parts: list[bytes] = []
        frames = ext_message_frame_parts if self.ext_frames else message_frame_parts
        output.write_parts(parts, frames(messages, parts))
        if output.pending_bytes >= OUTPUT_HIGH_WATER:
            self.stalled = True

    def close(self) -> None:
        """End the connection (its channel was deleted, or shutdown): stop applying commands;
        the writer flushes what is owed."""
        self.closing = True
        self._on_close()

    def output_drained(self) -> None:
        """The writer sent what was ready: a stalled consumer may take messages again."""
        if self.stalled and self.output.pending_bytes < OUTPUT_HIGH_WATER:
            self.stalled = False
            if self.channel is not None:
                self.channel.consumer_ready()

    def leave(self, now: float) -> None:
        """The connection ended: unsubscribe (in-flight messages are requeued at once)."""
        channel, subscription = self.channel, self.subscription
        if channel is not None and subscription is not None:
            self.channel = self.subscription = None
            channel.remove_consumer(subscription, now)

    def statistics(self) -> ClientStats:
        sub = self.subscription
        tls = self.tls_state
        auth = self.auth_state
        return ClientStats(
            client_id=self.client_id,
            hostname=self.hostname,
            version="V2",
            remote_address=self.remote_address,
            state=int(self.conn.state),
            ready_count=self._ready_count,
            in_flight_count=sub.in_flight_count if sub is not None else 0,
            message_count=sub.message_count if sub is not None else 0,
            finish_count=sub.finish_count if sub is not None else 0,
            requeue_count=sub.requeue_count if sub is not None else 0,
            connect_ts=self.connect_ts,
            sample_rate=self.sample_rate,
            deflate=self.codec_name == "deflate",
            snappy=self.codec_name == "snappy",
            user_agent=self.user_agent,
            tls=tls is not None,
            tls_cipher_suite=tls.cipher_suite if tls else "",
            tls_version=tls.version if tls else "",
            tls_negotiated_protocol=tls.negotiated_protocol if tls else "",
            tls_negotiated_protocol_is_mutual=tls.negotiated_protocol_is_mutual if tls else False,
            pub_counts=tuple(PubCount(topic=t, count=n) for t, n in self.pub_counts.items()),
            authed=auth.has_authorizations if auth else None,
            auth_identity=auth.identity if auth else None,
            auth_identity_url=auth.identity_url if auth else None,
        )

    # -- applying commands -------------------------------------------------------------------

    def receive(self, data: bytes | bytearray, now: float) -> bool:
        """Apply every complete command in what was received so far (``b""``: EOF), until one
        needs the connection (``waiting``); False once the connection must end."""
        self.conn.receive_data(data)
        if self.waiting is not None:
            return not self.closing  # kept for ``resume``
        return self._apply_parsed([], now)

    def resume(self, now: float) -> bool:
        """The connection did what ``waiting`` asked: apply the commands kept back, then every
        complete command received since; False once the connection must end."""
        self.waiting = None
        if self.conn.upgrading:
            self.conn.resume()
        pending, self._pending = self._pending, []
        return self._apply_parsed(pending, now)

    def _apply_parsed(self, events: list[Event], now: float) -> bool:
        conn = self.conn
        try:
            while True:
                if events:
                    self.apply(events, now)
                if self.waiting is not None or self.closing:
                    break
                events = conn.next_events()
                if not events:
                    break
        except ProtocolError as exc:
            self.fail(exc)
            return False
        return not self.closing

    def _wait(self, events: Sequence[Event], event: Event, wait: Wait, *, after: bool) -> None:
        """Stop applying at ``event`` (or just ``after`` it) until the connection did ``wait``."""
        index = next(i for i, e in enumerate(events) if e is event)
        self._pending = list(events[index + 1 if after else index :])
        self.waiting = wait

    def _auth_checked(self, cmd: str, topic: str, channel: str | None, now: float) -> bool:
        """nsqd's ``CheckAuth`` on the cached answer: True if allowed, False if it expired (ask
        again), ``ProtocolError`` (fatal) if refused."""
        try:
            check_authorized(self.auth_state, cmd, topic, channel, now)
        except AuthExpired:
            return False
        return True

    def upgraded(self, tls: TLSState | None, codec_name: str) -> None:
        """The connection now runs through TLS and/or a codec (``Upgrade`` done)."""
        if tls is not None:
            self.tls_state = tls
            self.conn.tls_established()
        self.codec_name = codec_name

    def auth_answered(self, state: AuthState | None) -> None:
        """The auth servers' answer to ``waiting`` (None: none answered validly, which refuses:
        ``E_AUTH_FAILED``). AUTH gets its JSON answer; a re-check goes on in ``resume``."""
        query = self.waiting
        assert isinstance(query, AuthQuery)
        if state is None:
            self.fail(errors.auth_failed())
            return
        self.auth_state = state
        if query.cmd is None:
            outcome = auth_outcome(state)
            if outcome is not None:
                self.fail(outcome)
                return
            self.output.write(encode_response(auth_response_body(state)))
        elif not state.has_authorizations:
            # nsqd re-asks inside the check: an answer that now grants nothing refuses the
            # command itself (not "AUTH first").
            self.fail(errors.auth_unauthorized(query.cmd, query.topic, query.channel or ""))

    def fail(self, exc: ProtocolError) -> None:
        """Answer a protocol error; a fatal one ends the connection."""
        log.info("CLIENT(%s): %s", self.remote_address, exc.body.decode("utf-8", "replace"))
        self.output.write(exc.frame())
        if exc.fatal:
            self.closing = True

    def apply(self, events: Sequence[Event], now: float) -> None:
        """Apply parsed commands in order (see the module docstring for the runs)."""
        pub_topic: str | None = None
        pub_kind = "PUB"
        pub_bodies: list[bytes] = []
        pub_exts: list[MessageExt | None] = []  # an XPUB run's (``_joins_runs``)
        pub_count = 0
        pub_gate: PublishGate | None = None
        pub_commands: list[Pub | Mpub | Dpub] = []
        fins: list[bytes] = []

        def flush() -> bool:
            # False: a gated run must wait (``waiting`` is set): stop applying.
            nonlocal pub_topic, pub_count, pub_gate
            if fins:
                self._finish_many(fins, now)
                fins.clear()
            if pub_topic is not None:
                topic, count, gate = pub_topic, pub_count, pub_gate
                pub_topic, pub_count, pub_gate = None, 0, None
                if gate is not None:
                    commands = pub_commands[:]
                    pub_commands.clear()
                    return self._publish_gated(gate, topic, commands, events, now)
                if pub_kind == "XPUB":
                    self._publish(pub_kind, topic, pub_bodies, 0.0, pub_exts)
                    pub_exts.clear()
                else:
                    self._publish(pub_kind, topic, pub_bodies, 0.0)
                pub_bodies.clear()
                self._write_oks(pub_kind, topic, count)
            return True

        for event in events:
            if isinstance(event, Fins):
                if pub_topic is not None and not flush():
                    return
                fins += event.ids
                continue
            if isinstance(event, Pub | Mpub) or (
                isinstance(event, Xpub) and self._joins_runs(event)
            ):
                xpub = isinstance(event, Xpub)
                if fins or event.topic != pub_topic or xpub != (pub_kind == "XPUB"):
                    if not flush():
                        return
                    if self.hold_publishes:
                        self._wait(events, event, BACKPRESSURE, after=False)
                        return
                    kind = _kind(event)
                    if self.auth_enabled and not self._auth_checked(kind, event.topic, None, now):
                        self._wait(events, event, self._refresh(kind, event.topic), after=False)
                        return
                    pub_topic = event.topic
                    pub_kind = kind
                    pub_gate = self.broker.publish_gate(event.topic)
                if pub_gate is not None:
                    assert not isinstance(event, Xpub)  # a gated topic's XPUB is alone
                    pub_commands.append(event)
                elif isinstance(event, Pub):
                    pub_bodies.append(event.body)
                else:
                    pub_bodies += event.bodies
                    if isinstance(event, Xpub):
                        pub_exts += event.exts
                pub_count += 1
                continue
            if not flush():
                return
            match event:
                case Rdy(count=count):
                    self._ready(count)
                case Req(id=msg_id, timeout_ms=timeout_ms):
                    self._requeue(msg_id, timeout_ms, now)
                case Touch(id=msg_id):
                    self._touch(msg_id, now)
                case Nop():
                    pass
                case Dpub() | Xpub():
                    if not self._publish_alone(event, events, now):
                        return
                case Sub(topic=topic, channel=channel):
                    if self.auth_enabled and not self._auth_checked("SUB", topic, channel, now):
                        wait = self._refresh("SUB", topic, channel)
                        self._wait(events, event, wait, after=False)
                        return
                    self._subscribe(topic, channel)
                case Identify():
                    self._identify(event, now)
                    if self.waiting is not None:
                        return  # the parser stopped after it: nothing follows in ``events``
                case Auth(secret=secret):
                    if not self.auth_enabled:
                        raise errors.auth_disabled()
                    self._auth_secret = secret
                    self._wait(events, event, AuthQuery(secret=secret), after=True)
                    return
                case Cls():
                    self.ready_count = 0
                    self.output.write(CLOSE_WAIT_FRAME)
                case _:
                    raise AssertionError(f"unhandled event {event!r}")
        flush()

    def _joins_runs(self, event: Xpub) -> bool:
        """Whether an XPUB is coalesced with the XPUBs around it to the same topic, as runs of
        PUB/MPUB are (one ``broker.publish`` for the run, its ``OK``s written once it
        succeeded): one not deferred, without dedup ids, to a topic without publish policies.
        Any other is applied alone (``_publish_alone``): a deferral is per command, dedup ids
        and policies count per command."""
        return (
            event.defer_ms == 0
            and not any_set(event.exts, "dedup_id")
            and self.broker.publish_gate(event.topic) is None
        )

    def _publish_alone(self, event: Dpub | Xpub, events: Sequence[Event], now: float) -> bool:
        """A DPUB or an XPUB, applied by itself (runs of PUB/MPUB, and of XPUBs that
        ``_joins_runs``, are coalesced elsewhere); False once the session waits (backpressure,
        auth, a rate limit's tokens)."""
        kind = _kind(event)
        topic = event.topic
        if self.hold_publishes:
            self._wait(events, event, BACKPRESSURE, after=False)
            return False
        if self.auth_enabled and not self._auth_checked(kind, topic, None, now):
            self._wait(events, event, self._refresh(kind, topic), after=False)
            return False
        gate = self.broker.publish_gate(topic)
        if gate is not None:
            return self._publish_gated(gate, topic, [event], events, now)
        if isinstance(event, Dpub):
            self._publish(kind, topic, [event.body], event.defer_ms / 1000)
        else:
            self._publish(kind, topic, event.bodies, event.defer_ms / 1000, event.exts)
        self._write_oks(kind, topic, 1)
        return True

    def _publish(
        self,
        kind: str,
        topic: str,
        bodies: Sequence[bytes],
        defer: float,
        exts: Sequence[MessageExt | None] | None = None,
    ) -> None:
        self._prepaid = 0  # reserved for a gate the topic no longer has
        try:
            self.broker.publish(topic, bodies, defer, exts)
        except PublishRefused as exc:  # the policy came on since the run started
            raise errors.publish_failed(kind, str(exc)) from exc
        except (BackendError, TopicExiting, NotPrimary, NotEnoughMirrors) as exc:
            raise errors.publish_failed(kind, str(exc) or "exiting") from exc
        # Messages, as nsqd counts them (an MPUB adds its length), however the run was coalesced.
        self.pub_counts[topic] = self.pub_counts.get(topic, 0) + len(bodies)

    def _publish_gated(
        self,
        gate: PublishGate,
        topic: str,
        commands: Sequence[Pub | Mpub | Dpub | Xpub],
        events: Sequence[Event],
        now: float,
    ) -> bool:
        """Publish a run of commands through the topic's publish policies (see the module
        docstring); False once the session waits for tokens. A refused command raises its
        ``E_<CMD>_FAILED`` after the ``OK`` of the commands accepted before it."""
        while commands:
            sizes = [_size(c) for c in commands]
            if self._prepaid:
                paid, wait = min(self._prepaid, len(commands)), 0.0
                self._prepaid = 0
            else:
                paid, wait = gate.reserve(sizes, now)
                if paid == 0:
                    refusal = gate.refuse_rate(sizes[0], now)
                    raise errors.publish_failed(_kind(commands[0]), str(refusal))
                if wait > 0:
                    self._prepaid = paid
                    self._wait(events, commands[0], Throttle(until=now + wait), after=False)
                    return False
            batch = commands[:paid]
            commands = commands[paid:]
            bodies: list[bytes] = []
            exts: list[MessageExt | None] | None = None
            for command in batch:
                if isinstance(command, Mpub):
                    bodies += command.bodies
                elif isinstance(command, Xpub):
                    # An XPUB is always alone in its run (the event loop gates it by itself).
                    bodies += command.bodies
                    exts = command.exts
                else:
                    bodies.append(command.body)
            first = batch[0]
            defer = first.defer_ms / 1000 if isinstance(first, Dpub | Xpub) else 0.0
            try:
                outcome = self.broker.publish_run(topic, bodies, sizes[:paid], defer, exts)
            except (BackendError, TopicExiting, NotPrimary, NotEnoughMirrors) as exc:
                raise errors.publish_failed(_kind(first), str(exc) or "exiting") from exc
            accepted = outcome.accepted
            if accepted:
                self.pub_counts[topic] = self.pub_counts.get(topic, 0) + sum(sizes[:accepted])
                self._write_oks(_kind(first), topic, accepted)
            if outcome.refusal is not None:
                raise errors.publish_failed(_kind(batch[accepted]), str(outcome.refusal))
        return True

    def _write_oks(self, kind: str, topic: str, count: int) -> None:
        """Answer ``count`` publishes to ``topic``: now, or once they are fsynced (durable) and
        stored by the mirrors (``--min-insync-mirrors``)."""
        frames = [OK_FRAME] * count
        output = self.output
        hold = output.hold(kind, frames)
        if not self.broker.after_published(topic, partial(self._synced, hold)):
            # Nothing to wait for: the hold resolves at once (behind any earlier hold).
            self._synced(hold, None)

    def _synced(self, hold: Hold, error: OSError | None) -> None:
        # Syncer callback (or an immediate release): a failed sync is fatal, as nsqd's.
        failure = self.output.release(hold, error)
        if failure is not None:
            log.error("CLIENT(%s): %s", self.remote_address, failure)
            self.close()

    def _identify(self, event: Identify, now: float) -> None:
        settings = event.settings
        self.client_id = settings.client_id or self.client_id
        self.hostname = settings.hostname or self.hostname
        self.user_agent = settings.user_agent
        self.msg_timeout = settings.msg_timeout_ms / 1000
        self.sample_rate = settings.sample_rate
        self.ext_frames = settings.lmq_ext == EXT_VERSION
        interval = settings.heartbeat_interval_ms
        self._on_heartbeat_interval(interval / 1000 if interval > 0 else 0.0, now)
        if settings.feature_negotiation:
            bound = self.broker.addresses
            http = format_address(bound.http) if bound is not None and bound.http else ""
            answer = identify_response(settings, self.conn.limits, http_address=http)
            self.output.write(encode_response(answer))
        else:
            self.output.write(OK_FRAME)
        if settings.tls_v1 or settings.snappy or settings.deflate:
            self.waiting = Upgrade(
                tls=settings.tls_v1,
                snappy=settings.snappy,
                deflate=settings.deflate,
                deflate_level=settings.deflate_level,
            )

    def _refresh(self, cmd: str, topic: str, channel: str | None = None) -> AuthQuery:
        return AuthQuery(secret=self._auth_secret, cmd=cmd, topic=topic, channel=channel)

    def _subscribe(self, topic_name: str, channel_name: str) -> None:
        try:
            self.broker.check_channel_write(topic_name, channel_name)
            topic = self.broker.get_topic(topic_name)
            created = topic.channel_or_none(channel_name) is None
            channel = topic.get_channel(channel_name)
            self.subscription = channel.add_consumer(self)
        except (TooManyConsumers, NotPrimary) as exc:
            raise errors.sub_failed(str(exc)) from exc
        except TopicExiting as exc:
            raise errors.sub_failed("exiting") from exc
        except BackendError as exc:  # its disk queue could not be opened
            raise errors.sub_failed(str(exc)) from exc
        self.channel = channel
        if not created:
            self.output.write(OK_FRAME)
            return
        # --durable: a new channel's OK (and what follows it) waits until its start in the
        # topic's log is fsynced, so a crash after the OK never gives it messages the topic
        # handed on before it existed.
        hold = self.output.hold("SUB", [OK_FRAME])
        if not self.broker.after_durable(topic_name, partial(self._synced, hold)):
            self._synced(hold, None)

    def _ready(self, count: int) -> None:
        if self.conn.state is ClientState.CLOSING:  # nsqd ignores RDY after CLS
            return
        self.ready_count = count
        if self.channel is not None:
            self.channel.consumer_ready()

    def _finish_many(self, msg_ids: list[bytes], now: float) -> None:
        channel, sub = self.channel, self.subscription
        assert channel is not None and sub is not None  # the state table allows FIN once subscribed
        for msg_id, exc in channel.finish_many(sub, msg_ids, now):
            self.fail(errors.fin_failed(msg_id, str(exc)))

    def _requeue(self, msg_id: bytes, timeout_ms: int, now: float) -> None:
        channel, sub = self.channel, self.subscription
        assert channel is not None and sub is not None
        # REQ clamps its delay to [0, --max-req-timeout] instead of failing (nsqd).
        delay = min(timeout_ms / 1000, self.broker.options.max_req_timeout)
        try:
            channel.requeue(sub, msg_id, delay, now)
        except (NotInFlight, NotOwner) as exc:
            self.fail(errors.req_failed(msg_id, str(exc)))

    def _touch(self, msg_id: bytes, now: float) -> None:
        channel, sub = self.channel, self.subscription
        assert channel is not None and sub is not None
        try:
            channel.touch(sub, msg_id, now)
        except (NotInFlight, NotOwner) as exc:
            self.fail(errors.touch_failed(msg_id, str(exc)))


def _kind(command: Pub | Mpub | Dpub | Xpub) -> str:
    """The command's name, as its ``E_<CMD>_FAILED`` says it."""
    match command:
        case Pub():
            return "PUB"
        case Mpub():
            return "MPUB"
        case Dpub():
            return "DPUB"
    return "XPUB"


def _size(command: Pub | Mpub | Dpub | Xpub) -> int:
    """Messages the command publishes."""
    if isinstance(command, Mpub):
        return len(command.bodies)
    if isinstance(command, Xpub):
        return len(command.bodies)
    return 1
